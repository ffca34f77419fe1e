"""What every Kafka client shares (service layer): how it reaches the brokers, what it may not do.

``KafkaClientConfig`` is the service's connection settings (``KafkaClientConfig.from_settings``
reads them from the ``PURGATORY_KAFKA_*`` settings), and ``kafka_kwargs()`` their kafka-python
keyword arguments, built by :func:`purgatory._kafka_options.kafka_client_kwargs`, the one
builder the Spark bridge uses too: the source, the sink, the reader, the transactional
producers, the transaction probe and the development brokers' admin clients all pass
``**config.kafka_kwargs()`` to their constructor, so they connect the same way (SSL and SASL
arguments are passed only when set). ``raising_single_errors`` keeps the clients' internal
nurseries out of their callers' way.

The connection settings are validated by one function,
:func:`purgatory._kafka_options.kafka_connection_problems` (beside the core, because the Spark
bridge shares it and may not import the service): ``Settings`` calls it naming the
``PURGATORY_KAFKA_*`` variables, ``KafkaClientConfig`` naming its own fields.

No client the service builds creates a topic: a metadata request for a topic that does not exist
would make a broker with ``auto.create.topics.enable`` create it, so a typo in a ``reply_to``
would leave a topic (and a metrics series) behind. Every client merges
:func:`no_topic_creation` into its arguments. kafka-python 3.0.12 documents
``allow_auto_create_topics`` for its producer and consumer but never hands it to the cluster
metadata that builds the metadata requests (``KafkaConnectionManager`` constructs
``ClusterMetadata`` without it, so ``allow_auto_topic_creation`` stays true), hence the
``kafka_client`` factory beside it, which sets it there.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from purgatory._core import ConfigError
from purgatory._kafka_options import OPTIONS, kafka_client_kwargs, kafka_connection_problems
from purgatory.service.settings import Settings

__all__ = ["KafkaClientConfig", "no_topic_creation", "raising_single_errors"]


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
        ConfigError: a setting is missing or invalid; the message names it (the rules of
            ``purgatory._kafka_options``; the files are checked by ``Settings``, where their
            paths are read).
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
        problems = kafka_connection_problems(
            {option: getattr(self, option) for option in OPTIONS}, name=str, check_files=False
        )
        if not self.client_id:
            problems.append("client_id: must not be empty")
        if problems:
            raise ConfigError("\n".join(problems))

    @classmethod
    def from_settings(cls, settings: Settings) -> KafkaClientConfig:
        """The connection settings of ``settings`` (``PURGATORY_KAFKA_*``, TLS and SASL
        included)."""
        return cls(
            bootstrap_servers=settings.kafka_bootstrap_servers,
            client_id=settings.kafka_client_id,
            security_protocol=settings.kafka_security_protocol,
            sasl_mechanism=settings.kafka_sasl_mechanism,
            sasl_username=settings.kafka_sasl_username,
            sasl_password=settings.kafka_sasl_password,
            ssl_cafile=settings.kafka_ssl_cafile,
            ssl_certfile=settings.kafka_ssl_certfile,
            ssl_keyfile=settings.kafka_ssl_keyfile,
        )

    def servers(self) -> list[str]:
        """The bootstrap servers as a list, blanks dropped."""
        return [s.strip() for s in self.bootstrap_servers.split(",") if s.strip()]

    def kafka_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for any kafka-python client (consumer, producer, admin); pass them
        with ``**`` beside the client's own (see the module's docstring).

        Returns:
            The connection arguments; SSL and SASL ones only when they are set.
        """
        return kafka_client_kwargs(
            {"client_id": self.client_id, **{option: getattr(self, option) for option in OPTIONS}}
        )


def no_topic_creation(*, admin: bool = False, short_lived: bool = False) -> dict[str, Any]:
    """Keyword arguments that keep a kafka-python client from creating topics.

    Merge them into every producer's, consumer's and admin client's arguments: a metadata
    request then asks the broker not to create the topics it names
    (``allow_auto_topic_creation=false``), whatever the broker's ``auto.create.topics.enable``.

    Args:
        admin: for a ``KafkaAdminClient``, which refuses ``allow_auto_create_topics`` (only the
            network client's factory then).
        short_lived: for a client made for one read (the reader's): its first metadata lookup
            does not wait the cluster's ``retry_backoff_ms`` (100 ms, which the client's own
            setting does not reach in kafka-python 3.0.12), a wait each read paid on Apache
            Kafka, four of them in a restore.
    """
    factory = _short_lived_net_client if short_lived else _net_client
    if admin:
        return {"kafka_client": factory}
    return {"allow_auto_create_topics": False, "kafka_client": factory}


def no_client_metrics() -> dict[str, Any]:
    """Keyword arguments that turn kafka-python's own metrics off (producers and consumers).

    The service reads none of them, and they are not free: every produce request and every
    fetch records a dozen sensors under locks, which a profile of the signal path put at about
    6% of the service's CPU at 1k signals/s. The service's own metrics are
    :mod:`purgatory.service.telemetry.metrics`. (An admin client refuses the setting.)
    """
    return {"metrics_enabled": False}


def _net_client(**configs: Any) -> Any:
    """kafka-python's network client whose metadata requests never ask for a topic to be
    created (kafka-python 3.0.12 leaves ``allow_auto_create_topics`` true there whatever the
    client was given; see the module's docstring)."""
    from kafka.net.compat import KafkaNetClient  # noqa: PLC0415 (kafka-python only where used)

    client = KafkaNetClient(**configs)
    client.cluster.config["allow_auto_create_topics"] = False
    return client


_SHORT_METADATA_BACKOFF_MS = 10


def _short_lived_net_client(**configs: Any) -> Any:
    """:func:`_net_client` for a client made for one read: its metadata lookups back off 10 ms,
    not 100 (see :func:`no_topic_creation`)."""
    client = _net_client(**configs)
    client.cluster.config["retry_backoff_ms"] = _SHORT_METADATA_BACKOFF_MS
    return client


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
