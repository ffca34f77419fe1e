"""The Kafka connection options: their rules, and the kafka-python arguments they become
(shared by the service and the Spark bridge; standard library only).

The service reads the connection options from ``PURGATORY_KAFKA_*`` variables, the Spark
bridge from its data source options, and kafka-python takes them as keyword arguments: three
spellings of one set of options. This module holds both halves once, so the service
(:mod:`purgatory.service.kafka.config`), its development tools and the bridge
(``spark_bridge._writer``, ``spark_bridge._callbacks_source``) cannot drift apart; the bridge
may not import the service, hence this module beside the core.

* :func:`kafka_connection_problems` is the rules; each caller says how it names an option
  (``name``), so every problem starts with the name its user wrote.
* :func:`kafka_client_kwargs` is the one place the options become kafka-python's keyword
  arguments (:data:`CLIENT_ARGUMENTS`). Every consumer, producer, admin client and
  transactional producer passes its result with ``**`` beside its own settings (timeouts,
  acks, isolation): a client that named a connection argument itself would then fail with
  "got multiple values for keyword argument", so none can connect differently.
  ``tests/test_kafka_clients.py`` checks every constructor call under ``purgatory/`` and
  ``spark_bridge/`` passes it.

The rules:

* ``bootstrap_servers``: required, a comma-separated list of ``host:port`` (port 1 to 65535);
* ``security_protocol``: ``PLAINTEXT`` (when unset), ``SSL``, ``SASL_PLAINTEXT`` or ``SASL_SSL``;
* ``sasl_mechanism``: required with the ``SASL_*`` protocols, refused with the others; with it,
  ``sasl_username`` and ``sasl_password`` are required;
* ``ssl_cafile``, ``ssl_certfile``, ``ssl_keyfile``: only with ``SSL`` or ``SASL_SSL``; a
  certificate needs its key and a key its certificate (mutual TLS); every file named must be
  readable now, so a wrong path fails where it was written instead of at the first connection.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "CLIENT_ARGUMENTS",
    "HOST_PORTS",
    "OPTIONS",
    "SASL_MECHANISMS",
    "SECURITY_PROTOCOLS",
    "kafka_client_kwargs",
    "kafka_connection_problems",
    "service_variable",
]

#: The connection options, by the names kafka-python's clients and the Spark bridge use.
OPTIONS = (
    "bootstrap_servers",
    "security_protocol",
    "sasl_mechanism",
    "sasl_username",
    "sasl_password",
    "ssl_cafile",
    "ssl_certfile",
    "ssl_keyfile",
)
#: Each connection option a client may be given, and the kafka-python argument it sets (the
#: :data:`OPTIONS`, the client id, and the password of an encrypted SSL key).
CLIENT_ARGUMENTS = {
    "bootstrap_servers": "bootstrap_servers",
    "client_id": "client_id",
    "security_protocol": "security_protocol",
    "sasl_mechanism": "sasl_mechanism",
    "sasl_username": "sasl_plain_username",
    "sasl_password": "sasl_plain_password",
    "ssl_cafile": "ssl_cafile",
    "ssl_certfile": "ssl_certfile",
    "ssl_keyfile": "ssl_keyfile",
    "ssl_password": "ssl_password",
}
_SASL_CREDENTIALS = ("sasl_username", "sasl_password")
SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_SASL_PROTOCOLS = frozenset({"SASL_PLAINTEXT", "SASL_SSL"})
_SSL_PROTOCOLS = frozenset({"SSL", "SASL_SSL"})
_SSL_FILES = ("ssl_cafile", "ssl_certfile", "ssl_keyfile")
_PORT = r"(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3})"
#: ``host:port[,host:port...]``, no white space.
HOST_PORTS = re.compile(rf"[^\s,]+:{_PORT}(,[^\s,]+:{_PORT})*")


def service_variable(option: str) -> str:
    """``PURGATORY_KAFKA_<OPTION>``: the service's environment variable of an option."""
    return "PURGATORY_KAFKA_" + option.upper()


def kafka_client_kwargs(values: Mapping[str, object]) -> dict[str, Any]:
    """kafka-python's keyword arguments for a set of connection options: the one place they
    are built, for every client of the service, its development tools and the bridge.

    Pass the result with ``**`` to the client's constructor, beside the client's own settings.
    Check the options first (:func:`kafka_connection_problems`): this only translates them.

    Args:
        values: option -> value, each option one of :data:`CLIENT_ARGUMENTS`; a missing option,
            None or an empty string is unset, and left to kafka-python's default. Values are
            passed as ``str`` (a ``StrEnum`` member as its value).

    Returns:
        The arguments of the options set: ``bootstrap_servers`` as a list (blanks around the
        commas dropped), the SASL credentials only with a ``sasl_mechanism`` (without one
        they mean nothing).

    Raises:
        ValueError: an option that is not a connection option (a typo would otherwise be
            dropped without a word).
    """
    unknown = sorted(set(values) - set(CLIENT_ARGUMENTS))
    if unknown:
        raise ValueError(f"not Kafka connection options: {', '.join(unknown)}")
    text = {option: _text(value) for option, value in values.items()}
    kwargs: dict[str, Any] = {}
    for option, argument in CLIENT_ARGUMENTS.items():
        value = text.get(option)
        if value is None or (option in _SASL_CREDENTIALS and text.get("sasl_mechanism") is None):
            continue
        kwargs[argument] = value
    if "bootstrap_servers" in kwargs:
        servers = kwargs["bootstrap_servers"].split(",")
        kwargs["bootstrap_servers"] = [s.strip() for s in servers if s.strip()]
    return kwargs


def kafka_connection_problems(
    values: Mapping[str, object],
    *,
    name: Callable[[str], str] = service_variable,
    check_files: bool = True,
) -> list[str]:
    """What is wrong with a set of Kafka connection options, one line per problem.

    Args:
        values: option -> value (see :data:`OPTIONS`); a missing option, None or an empty
            string is unset. Values are read with ``str`` (a ``StrEnum`` member is its value).
        name: how the caller's user names an option (the service's environment variable by
            default); every line starts with it.
        check_files: whether the SSL files named must be readable now (their path and the
            reason are shown when not).

    Returns:
        The problems, in a fixed order; empty when the options are consistent.
    """
    text = {option: _text(values.get(option)) for option in OPTIONS}
    problems: list[str] = []
    servers = text["bootstrap_servers"]
    if servers is None:
        problems.append(
            f"{name('bootstrap_servers')}: required, a comma-separated list of host:port"
        )
    elif not HOST_PORTS.fullmatch(re.sub(r"\s*,\s*", ",", servers.strip())):
        problems.append(
            f"{name('bootstrap_servers')}: must be a comma-separated list of host:port"
            f" (port 1 to 65535), got {servers!r}"
        )
    protocol = text["security_protocol"] or "PLAINTEXT"
    if protocol not in SECURITY_PROTOCOLS:
        problems.append(
            f"{name('security_protocol')}: must be one of {', '.join(SECURITY_PROTOCOLS)},"
            f" got {protocol!r}"
        )
        return problems  # what else is required depends on the protocol
    problems += _sasl_problems(text, protocol, name)
    problems += _ssl_problems(text, protocol, name, check_files=check_files)
    return problems


def _text(value: object) -> str | None:
    # str() of a StrEnum member (the service's protocol and mechanism) is its value.
    return None if value is None else str(value) or None


def _sasl_problems(
    text: Mapping[str, str | None], protocol: str, name: Callable[[str], str]
) -> list[str]:
    problems: list[str] = []
    mechanism = text["sasl_mechanism"]
    if protocol in _SASL_PROTOCOLS and mechanism is None:
        problems.append(
            f"{name('sasl_mechanism')}: required when {name('security_protocol')} is {protocol}"
            f" (one of {', '.join(SASL_MECHANISMS)})"
        )
    if mechanism is None:
        return problems
    if protocol not in _SASL_PROTOCOLS:
        problems.append(
            f"{name('sasl_mechanism')}: only used with SASL_PLAINTEXT or SASL_SSL,"
            f" but {name('security_protocol')} is {protocol}"
        )
    if mechanism not in SASL_MECHANISMS:
        problems.append(
            f"{name('sasl_mechanism')}: must be one of {', '.join(SASL_MECHANISMS)},"
            f" got {mechanism!r}"
        )
    for option in ("sasl_username", "sasl_password"):
        if text[option] is None:
            problems.append(f"{name(option)}: required with {name('sasl_mechanism')} {mechanism}")
    return problems


def _ssl_problems(
    text: Mapping[str, str | None],
    protocol: str,
    name: Callable[[str], str],
    *,
    check_files: bool,
) -> list[str]:
    named = [option for option in _SSL_FILES if text[option] is not None]
    if protocol not in _SSL_PROTOCOLS:
        return [
            f"{name(option)}: only used with SSL or SASL_SSL,"
            f" but {name('security_protocol')} is {protocol}"
            for option in named
        ]
    problems: list[str] = []
    pairs = (("ssl_keyfile", "ssl_certfile"), ("ssl_certfile", "ssl_keyfile"))
    for given, needed in pairs:
        if text[given] is not None and text[needed] is None:
            problems.append(f"{name(given)}: needs {name(needed)} as well")
    if check_files:
        for option in named:
            path = text[option]
            assert path is not None  # named lists the options that are set
            reason = _unreadable(path)
            if reason is not None:
                problems.append(
                    f"{name(option)}: must name a readable file, got {path!r} ({reason})"
                )
    return problems


def _unreadable(path: str) -> str | None:
    """Why ``path`` cannot be read (None: it can)."""
    try:
        with open(path, "rb"):
            return None
    except OSError as exc:
        return exc.strerror or type(exc).__name__
