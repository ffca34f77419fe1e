"""Apache Kafka as a development broker (service layer; development and tests only).

``KafkaBroker`` runs the real Apache Kafka broker, the one users run, where ``EmbeddedBroker``
(``broker``) runs Tansu; the two are interchangeable (``purgatory.devtools.broker.Broker``): same
attributes,
same readiness rule (a kafka-python metadata request answers), same ``create_topics``, a
context manager, gone when ``stop`` returns and gone with its owner however the owner dies
(``die_with_parent``, with the same main-thread rule and the same ``with_pdeathsig`` wrapper).
What Kafka adds is a log on disk: ``start`` after ``stop``, or after ``kill`` (SIGKILL, a crash
for tests), serves the same data dir again, on the same ports.

Its jars are not a Python package: ``make kafka`` resolves ``org.apache.kafka:kafka_2.13`` with
its runtime dependencies and a log4j2 binding from Maven Central, as pinned by
``.ci/kafka/pom.xml``, into ``.venv/kafka/libs``; ``start`` names that command when they are
missing. Java (17 or later) comes from ``JAVA_HOME``, else ``PATH``. Decisions:

- One KRaft node that is both broker and controller (``process.roles=broker,controller``), on
  two free ports (PLAINTEXT for clients, CONTROLLER for the quorum), both kept across restarts
  so that clients reconnect to the same address. PLAINTEXT listens on and advertises ``host``
  (loopback by default); CONTROLLER stays on the loopback of wherever the JVM runs, since only
  the node itself talks to it. Replication factors and the
  transaction log's min ISR are 1, ``group.initial.rebalance.delay.ms=0`` so a group's first
  join is not held back 3 s. ``auto.create.topics.enable`` is left on, Kafka's default and what
  many clusters run: a metadata request for a missing topic creates it unless the client asks
  not to, so it is the service's own clients (``purgatory.service.kafka.config.no_topic_creation``)
  that the tests
  show create nothing, not the broker's setting.
- Storage is formatted once, on the first start on an empty data dir, by
  ``kafka.tools.StorageTool format --standalone`` (a dynamic quorum of this one controller,
  with a fresh cluster id); a formatted dir is served as it is.
- The command is ``java -Xmx512m <G1 options> -cp '<libs>/*' kafka.Kafka server.properties``,
  after ``command_prefix`` when one is given (``ip netns exec <ns>`` runs the broker in a
  network namespace of its own, as the nemesis of ``tests/nemesis`` does); the heap is bounded
  and an OutOfMemoryError ends the JVM rather than leaving it half alive.
  The broker's log4j2 output goes to stdout and from there to the log file (``broker.log`` in
  the data dir unless ``log_path`` says otherwise), with the storage tool's output and anything
  the JVM prints; nothing reaches the terminal. ``JAVA_TOOL_OPTIONS``, ``JDK_JAVA_OPTIONS`` and
  ``_JAVA_OPTIONS`` are dropped from its environment: what runs is what the command line says.
- ``stop`` sends SIGTERM to the broker's process group (a controlled shutdown, about 2 s) and
  SIGKILL after 15 s. ``kill`` sends SIGKILL at once. Neither touches the data dir; ``close``
  (and leaving the ``with`` block) also removes it if the broker created it.

Known behaviours of a single-node Kafka, and how the code copes:

- After a SIGKILL the restarted broker cannot register until the controller expires the dead
  one's session (``DUPLICATE_BROKER_REGISTRATION`` in the log), ``broker.session.timeout.ms``,
  9 s by default; it is 3 s here (heartbeats every 0.5 s), so a restart after ``kill`` serves
  within about 5 s. The logs are then recovered ("no clean shutdown file") and the partitions'
  leaders re-elected, which the log reports as UNCLEAN since the only replica was fenced: no
  record is lost, there is no other replica to lose it to.
- The first consumer group or transactional id creates ``__consumer_offsets`` or
  ``__transaction_state`` (50 partitions each, as in production), which takes a second or so.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from purgatory._core import TransportError, UsageError
from purgatory.devtools.broker import (
    BrokerProcess,
    free_port,
    log_tail,
    signal_group,
    terminate_group,
    wait_until_serving,
)
from purgatory.service.supervisors.supervisor import with_pdeathsig

__all__ = ["KafkaBroker", "default_libs"]

_HOST = "127.0.0.1"
_MAIN = "kafka.Kafka"
_STORAGE_TOOL = "kafka.tools.StorageTool"
# Kafka's own JVM options (kafka-run-class.sh) but the heap, which the constructor bounds.
_JVM_OPTIONS = (
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.awt.headless=true",
)
_JAVA_ENV = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")
_STOP_TIMEOUT_S = 15.0
_ROOT = Path(__file__).resolve().parents[2]
_LOG4J2 = """\
# Written by purgatory's KafkaBroker: everything to stdout, which goes to the broker's log file.
status = warn
shutdownHook = disable
appender.out.type = Console
appender.out.name = out
appender.out.target = SYSTEM_OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = out
"""


def default_libs() -> tuple[Path, ...]:
    """Where ``make kafka`` puts the jars: the running venv's, then the repository's ``.venv``."""
    return (Path(sys.prefix) / "kafka" / "libs", _ROOT / ".venv" / "kafka" / "libs")


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):  # the storage tool would read it as an option
            return text


def _server_properties(host: str, port: int, controller_port: int, log_dir: Path) -> str:
    plaintext = f"PLAINTEXT://{host}:{port}"
    controller = f"CONTROLLER://{_HOST}:{controller_port}"
    settings = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.bootstrap.servers": f"{_HOST}:{controller_port}",
        "listeners": f"{plaintext},{controller}",
        "advertised.listeners": f"{plaintext},{controller}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "controller.listener.names": "CONTROLLER",
        "log.dirs": str(log_dir),
        "num.partitions": "1",
        "offsets.topic.replication.factor": "1",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true",  # Kafka's default: see the module docstring
        # A restart after a SIGKILL waits for the dead broker's session to expire.
        "broker.heartbeat.interval.ms": "500",
        "broker.session.timeout.ms": "3000",
    }
    lines = [f"{key}={value}" for key, value in settings.items()]
    return "# Written by purgatory's KafkaBroker on every start.\n" + "\n".join(lines) + "\n"


class KafkaBroker(BrokerProcess):
    """An Apache Kafka broker (one KRaft node) on free ports; a context manager.

    Args:
        start_timeout_s: how long ``start`` waits for the broker to answer (an attribute of the
            same name: a later start may be given longer; and, on a first
            start, for the storage tool).
        data_dir: holds the broker's configuration, its log (``kafka-logs``) and, by default,
            its output; kept by ``stop``, ``kill`` and ``close``. A temporary directory,
            removed by ``close``, when omitted.
        log_path: where the broker's output goes; ``broker.log`` in the data dir when omitted.
        libs: the folder of Kafka's jars; the first of :func:`default_libs` that holds them when
            omitted.
        java: the ``java`` executable; ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``.
        heap_mb: the JVM's maximum heap.
        die_with_parent: on Linux, the kernel kills the broker when this process dies, even by
            SIGKILL; ``start`` must then run on the main thread (see ``broker``).
        host: the address clients reach it at: its PLAINTEXT listener binds it and advertises
            it. The ports are picked free on this process's loopback, so with a
            ``command_prefix`` that moves the JVM into another network namespace they must be
            free there too (a fresh namespace has every port free).
        command_prefix: put before the JVM's command line (and the storage tool's), e.g.
            ``["ip", "netns", "exec", "<ns>"]``: a prefix that ends by executing the rest, so
            that the broker's pid, process group and ``die_with_parent`` stay its own. Readiness
            and ``create_topics`` still talk to ``host`` from this process.
    """

    def __init__(
        self,
        *,
        start_timeout_s: float = 60.0,
        data_dir: Path | None = None,
        log_path: Path | None = None,
        libs: Path | None = None,
        java: str | None = None,
        heap_mb: int = 512,
        die_with_parent: bool = False,
        host: str = _HOST,
        command_prefix: Sequence[str] = (),
    ) -> None:
        if start_timeout_s <= 0:
            raise UsageError(f"start_timeout_s must be > 0, got {start_timeout_s}")
        if heap_mb < 128:
            raise UsageError(f"heap_mb must be >= 128, got {heap_mb}")
        if not host:
            raise UsageError("host must be an address, got an empty string")
        self.start_timeout_s = start_timeout_s
        self._data_dir = data_dir
        self._log_path_arg = log_path
        self._libs = libs
        self._java = java
        self._heap_mb = heap_mb
        self._die_with_parent = die_with_parent
        self._host = host
        self._command_prefix = tuple(command_prefix)
        self._ports: tuple[int, int] | None = None  # (PLAINTEXT, CONTROLLER), kept by restarts
        self._remove_data: weakref.finalize[Any, Any] | None = None

    @property
    def bootstrap_servers(self) -> str:
        """``HOST:PORT`` of the running broker (``127.0.0.1:PORT`` unless ``host`` was given).

        Raises:
            UsageError: the broker is not running.
        """
        if self._process is None or self._ports is None:
            raise UsageError("the Kafka broker is not running: call start() first")
        return f"{self._host}:{self._ports[0]}"

    @property
    def log_path(self) -> Path | None:
        """Where the broker's output goes, once a data dir is chosen."""
        if self._log_path_arg is not None:
            return self._log_path_arg
        return None if self._data_dir is None else self._data_dir / "broker.log"

    @property
    def data_dir(self) -> Path | None:
        """The broker's data dir, once chosen."""
        return self._data_dir

    def start(self) -> None:
        """Start the broker (formatting an empty data dir first) and wait until it answers.

        Raises:
            UsageError: it is already running, or ``die_with_parent`` is set and this is not
                the main thread.
            TransportError: Java or Kafka's jars are missing, the storage tool failed, the
                broker exited, or it did not answer within ``start_timeout_s`` (the message
                ends with its log).
        """
        if self._process is not None:
            raise UsageError("the Kafka broker is already running")
        java, libs = self._resolve_java(), self._resolve_libs()
        # Off the main thread this raises UsageError before anything is created.
        launcher = [
            *self._command_prefix,
            *(with_pdeathsig([java]) if self._die_with_parent else [java]),
        ]
        data_dir = self._ensure_data_dir()
        if self._ports is None:
            self._ports = (free_port(), free_port())
        log_dir = data_dir / "kafka-logs"
        server_properties = data_dir / "server.properties"
        server_properties.write_text(_server_properties(self._host, *self._ports, log_dir))
        log4j2 = data_dir / "log4j2.properties"
        log4j2.write_text(_LOG4J2)
        jvm = [*launcher, f"-Xmx{self._heap_mb}m", *_JVM_OPTIONS]
        jvm += [f"-Dlog4j2.configurationFile={log4j2}", "-cp", str(libs / "*")]
        env = {k: v for k, v in os.environ.items() if k not in _JAVA_ENV}
        log_path = self._log_path_arg or data_dir / "broker.log"
        log = log_path.open("ab")
        try:
            if not (log_dir / "meta.properties").exists():
                self._format(jvm, server_properties, log, env, log_path)
            try:
                process = subprocess.Popen(
                    [*jvm, _MAIN, str(server_properties)],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    process_group=0,  # its own group, away from a terminal's Ctrl-C: see _broker
                )
            except OSError as exc:
                raise TransportError(f"cannot run the Kafka broker with {java!r}: {exc}") from exc
        except BaseException:
            log.close()
            raise
        self._process = process
        self._finalizer = weakref.finalize(
            self, terminate_group, process, log, signal.SIGTERM, _STOP_TIMEOUT_S
        )
        ready = False
        try:
            wait_until_serving(
                process, self.bootstrap_servers, self.start_timeout_s, "Kafka broker", log_path
            )
            ready = True
        finally:
            if not ready:
                self.stop()

    def kill(self) -> None:
        """SIGKILL the broker, as a crash would, and reap it; the data dir stays for ``start``.

        Raises:
            UsageError: the broker is not running.
        """
        if self._process is None:
            raise UsageError("the Kafka broker is not running: call start() first")
        signal_group(self._process, signal.SIGKILL)
        self._process.wait()
        self.stop()  # closes the log

    def close(self) -> None:
        """``stop``, then remove the data dir if this broker created it; idempotent."""
        self.stop()
        if self._remove_data is not None:
            self._remove_data()
            self._remove_data = self._data_dir = None
            self._ports = None

    def _resolve_java(self) -> str:
        if self._java is not None:
            candidates = [self._java]
        else:
            home = os.environ.get("JAVA_HOME")
            candidates = [str(Path(home) / "bin" / "java")] if home else []
            candidates += [found] if (found := shutil.which("java")) else []
        for candidate in candidates:
            if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
                return candidate
        tried = ", ".join(candidates) or "no JAVA_HOME, no java on PATH"
        raise TransportError(
            f"Java is missing ({tried}): the Kafka broker needs Java 17 or later; "
            "set JAVA_HOME or put java on PATH"
        )

    def _resolve_libs(self) -> Path:
        candidates = (self._libs,) if self._libs is not None else default_libs()
        for libs in candidates:
            if any(libs.glob("kafka_2.13-*.jar")):
                return libs
        raise TransportError(
            f"Apache Kafka's jars are missing (looked in {', '.join(map(str, candidates))}): "
            "run `make kafka`, which resolves them from Maven Central with .ci/kafka/pom.xml"
        )

    def _ensure_data_dir(self) -> Path:
        if self._data_dir is None:
            self._data_dir = Path(tempfile.mkdtemp(prefix="purgatory-kafka-"))
            self._remove_data = weakref.finalize(
                self, shutil.rmtree, self._data_dir, ignore_errors=True
            )
        self._data_dir.mkdir(parents=True, exist_ok=True)
        return self._data_dir

    def _format(
        self,
        jvm: list[str],
        server_properties: Path,
        log: IO[bytes],
        env: Mapping[str, str],
        log_path: Path,
    ) -> None:
        command = [*jvm, _STORAGE_TOOL, "format", "--standalone"]
        command += ["--cluster-id", _cluster_id(), "--config", str(server_properties)]
        try:
            done = subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=self.start_timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise TransportError(f"formatting the Kafka broker's storage failed: {exc}") from exc
        if done.returncode != 0:
            log.flush()
            raise TransportError(
                f"formatting the Kafka broker's storage failed with code {done.returncode}; "
                f"log: {log_tail(log_path)}"
            )
