"""What every Kafka client shares (service layer): the connection settings and the consumed record.

``KafkaClientConfig`` is the one place that turns the service's settings into kafka-python keyword
arguments, so the source, the sink and any admin client connect the same way (SSL and SASL
arguments are passed only when set). ``ConsumedRecord`` is the plain value that crosses from a
consumer thread into trio; nothing from kafka-python leaks past this boundary.
``raising_single_errors`` keeps the clients' internal nurseries out of their callers' way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from purgatory._core import ConfigError

__all__ = ["ConsumedRecord", "KafkaClientConfig", "raising_single_errors"]

_SECURITY_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
_SASL_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """One record read from Kafka, detached from kafka-python.

    ``offset`` is the record's own offset; the offset to commit after applying it is
    ``offset + 1``.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class KafkaClientConfig:
    """How to reach the brokers; shared by every client the service opens.

    Args:
        bootstrap_servers: comma-separated ``host:port`` list.
        client_id: sent to the broker with every request (shows up in its logs and quotas).
        security_protocol: ``PLAINTEXT``, ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``.
        sasl_mechanism: ``PLAIN``, ``SCRAM-SHA-256`` or ``SCRAM-SHA-512``; required with SASL.
        sasl_username: required with a SASL mechanism.
        sasl_password: required with a SASL mechanism; never shown in ``repr``.
        ssl_cafile: CA bundle used to verify the brokers.
        ssl_certfile: client certificate (mutual TLS).
        ssl_keyfile: client key (mutual TLS).

    Raises:
        ConfigError: a setting is missing or invalid; the message names it.
    """

    bootstrap_servers: str
    client_id: str = "purgatory"
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def __post_init__(self) -> None:
        servers = self.servers()
        if not servers or any(":" not in server for server in servers):
            raise ConfigError(
                f"bootstrap_servers must be a comma-separated host:port list, "
                f"got {self.bootstrap_servers!r}"
            )
        if not self.client_id:
            raise ConfigError("client_id must not be empty")
        if self.security_protocol not in _SECURITY_PROTOCOLS:
            raise ConfigError(
                f"security_protocol must be one of {sorted(_SECURITY_PROTOCOLS)}, "
                f"got {self.security_protocol!r}"
            )
        uses_sasl = self.security_protocol.startswith("SASL_")
        if uses_sasl and self.sasl_mechanism is None:
            raise ConfigError(f"sasl_mechanism is required with {self.security_protocol}")
        if self.sasl_mechanism is not None:
            if not uses_sasl:
                raise ConfigError(
                    "sasl_mechanism is set but security_protocol is "
                    f"{self.security_protocol!r} (use SASL_PLAINTEXT or SASL_SSL)"
                )
            if self.sasl_mechanism not in _SASL_MECHANISMS:
                raise ConfigError(
                    f"sasl_mechanism must be one of {sorted(_SASL_MECHANISMS)}, "
                    f"got {self.sasl_mechanism!r}"
                )
            for name in ("sasl_username", "sasl_password"):
                if not getattr(self, name):
                    raise ConfigError(f"{name} is required with sasl_mechanism")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ConfigError("ssl_certfile and ssl_keyfile must be set together")

    def servers(self) -> list[str]:
        """The bootstrap servers as a list, blanks dropped."""
        return [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]

    def kafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for any kafka-python client (consumer, producer, admin).

        Returns:
            The connection arguments; SSL and SASL ones only when they are set.
        """
        kwargs: dict[str, Any] = {
            "bootstrap_servers": self.servers(),
            "client_id": self.client_id,
            "security_protocol": self.security_protocol,
        }
        if self.sasl_mechanism is not None:
            kwargs["sasl_mechanism"] = self.sasl_mechanism
            kwargs["sasl_plain_username"] = self.sasl_username
            kwargs["sasl_plain_password"] = self.sasl_password
        for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            value = getattr(self, name)
            if value is not None:
                kwargs[name] = value
        return kwargs


@contextmanager
def raising_single_errors() -> Iterator[None]:
    """Let one error out of a client's internal nursery as itself, not as an exception group.

    The client context managers own a nursery (for their thread) that callers never see, so a
    ``TransportError`` from the thread or the body must reach them as a ``TransportError``.
    Groups holding several errors, or a cancellation, pass through unchanged.
    """
    try:
        yield
    except ExceptionGroup as group:
        leaves: list[BaseException] = []
        pending: list[BaseException] = [group]
        while pending:
            exc = pending.pop()
            if isinstance(exc, BaseExceptionGroup):
                pending.extend(exc.exceptions)
            else:
                leaves.append(exc)
        if len(leaves) == 1:
            raise leaves[0]  # noqa: B904 (the leaf keeps its own traceback and cause)
        raise
