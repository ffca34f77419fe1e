"""The service end to end over loopback, on Apache Kafka and on Tansu: signals, latency,
memory, HTTP (harness).

``python -m tests.benchmarks.bench_service [--quick] [--broker kafka|tansu|both] [--out DIR]``
measures everything below on each broker in turn, Apache Kafka first, then Tansu:

- **Apache Kafka** (:class:`~purgatory.devtools.kafka_broker.KafkaBroker`): the broker users
  run, one KRaft node in a JVM (heap 512 MiB) with its log in a temporary data dir; it needs
  Java 17 and the jars ``make kafka`` resolves.
- **Tansu** (:class:`~purgatory.devtools.broker.EmbeddedBroker`): the embedded broker of
  ``purgatory dev``, in memory.

Each broker runs alone: it is started for its half and stopped before the next one starts, so
the two never share the CPUs. Every measurement and every baseline runs on each broker, and each
broker's ratios are to its own baselines; ``--broker`` runs one of them only (default ``both``).
For each measurement the service runs as a separate process (``python -m purgatory.service.cli
serve`` configured by ``PURGATORY_*`` variables: that broker, topics of its own, static
partitions, ``PURGATORY_LOG_LEVEL=warning``), so the load generator (kafka-python producer and
consumer, httpx) never shares the service's interpreter. On a 2-core machine the broker, the
service and the load generator still share the two cores; the CPU seconds each of them used
(the broker's: its process, the JVM for Kafka) are reported beside the figures.

1. **Signals per second through Kafka**: ``N`` operations are registered over HTTP
   (``/v1/operations:batch``), each waiting for one distinct key with a long timeout; then ``N``
   signal records are produced to the signals topic as fast as kafka-python sends them, and
   the callbacks topic is read until ``N`` callbacks arrived. The rate is ``N`` over the time
   from the first send to the arrival of the last callback.
   Baseline, no service: **a bare consume -> decode -> produce pipe**, one kafka-python process
   that reads the same ``N`` signal records (produced the same way to a signals topic of its
   own, with as many partitions), decodes each with :func:`purgatory._codec.decode_signal`,
   encodes one callback per signal (:func:`purgatory._codec.encode_callback`) and produces it;
   its rate is measured the same way. The pipe is **tuned for throughput**, as one
   kafka-python process goes fastest: ``max_poll_records`` 20,000 (a poll takes everything
   fetched, so the per-poll cost is paid once per thousands of records), ``linger_ms`` 5 and
   ``batch_size`` 512 KiB (the producer's I/O thread sends few, full requests instead of one
   per ``send`` it is woken for), ``fetch_max_wait_ms`` 100 (no empty fetches during a
   burst), ``acks=all`` as the service. Each of these settings alone was measured against
   the service's own client settings (``max_poll_records`` 500, ``linger_ms`` 0), which
   halve a pipe's rate: a baseline run with them would flatter the service.
2. **Latency at a fixed rate**: a paced producer sends signals at ``rate`` per second, each
   completing one pre-registered operation and carrying its send time (``perf_counter_ns``) in
   its payload, which comes back in the callback's ``signals``. The latency of a signal is the
   time its callback arrived in the consumer minus that send time (one clock, one process).
   Baseline, no service: **one hop tuned for latency**, producer -> broker -> consumer, at
   the rate of the latency run it is compared with (1 k/s): the hop runs with each
   ``(linger_ms, fetch_max_wait_ms)`` of ``hops`` (5/5, 0/5, 0/100) and the one with the
   lowest p99 is the reference. Measured on these machines, no single setting is best on
   both brokers: ``linger_ms`` 0 sends a request per record and queues them at 1 k/s;
   Kafka answers a fetch as soon as data arrives, so a long ``fetch_max_wait_ms`` costs it
   nothing, while Tansu holds a fetch for its whole wait; ``fetch_max_wait_ms`` 1 makes
   either spin (p99 of seconds on Tansu). The latency run's producer and reader use 5/5.
3. **RSS with pending operations**: ``VmRSS`` of the service process before and after
   registering ``N`` operations (one key each, far deadline) in HTTP batches.
4. **HTTP registrations per second**: sequential single ``POST /v1/operations`` on one
   keep-alive connection, and ``/v1/operations:batch`` in batches.

The service is measured as configured by default: it journals every input to its changelog
topic before it answers, calls back or commits (write-ahead, group-committed), and ``serve``
runs a snapshotter child process beside it. **The cost of durability** is measured against its
own baseline in the same run: measurements 1 and 2 (each rate) run a second time on the service
with ``PURGATORY_JOURNAL=false`` (no journal, no restore, no snapshotter: state in memory
only); the report sets signals/s, p50 and p99 side by side, with the journal's size from the
journaled throughput run's ``/metrics`` (``purgatory_journal_bytes_total`` over
``purgatory_journal_entries_total``: bytes per input journaled; and per signal over the burst).
Every other figure and ratio is the journaled service's.

Every run checks what it measured: each signal produced exactly one ``completed`` callback for
its own operation (in the pipe too), each hop record arrived exactly once, every registration
was answered 201. DESIGN.md's service targets are ratios to the baselines of the same run:
service signals/s >= 0.5x the pipe's, service p99 at 1 k/s <= 3x the hop's; and the journal's
cost: signals/s with the journal >= 0.8x without it. The report is markdown: the machine and the
command, a table setting the brokers' figures and ratios side by side, then one section per
broker (its measurements, the targets against its own baselines, the cost of durability); and
``DIR/bench-service.json`` holds both brokers' results (``brokers.kafka``, ``brokers.tansu``;
``DIR`` defaults to ``docs``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

from purgatory._codec import SignalInput, SignalRecord, encode_callback, encode_signal
from purgatory._core import Outcome, OutcomeKind, TimeDomain
from purgatory.devtools.broker import Broker
from purgatory.devtools.child import service_process
from purgatory.devtools.dev_broker import open_dev_broker
from purgatory.service.app import topics_of
from purgatory.service.settings import Delivery, Settings, env_name
from tests.benchmarks._measure import machine_info, quiet_kafka_warnings

__all__ = [
    "BROKERS",
    "BROKER_CHOICES",
    "BROKER_TITLES",
    "FULL",
    "QUICK",
    "BrokerReport",
    "CallbackReader",
    "DurabilityCost",
    "HopResult",
    "HttpResult",
    "JournalCounters",
    "LatencyCost",
    "LatencyResult",
    "PipeProcess",
    "PipeResult",
    "Ratios",
    "RssResult",
    "ServiceBenchConfig",
    "ServiceProcess",
    "ServiceReport",
    "Target",
    "ThroughputResult",
    "alive",
    "bench_http",
    "bench_kafka_hop",
    "bench_latency",
    "bench_pipe",
    "bench_rss",
    "bench_throughput",
    "brokers_of",
    "child_pids",
    "compute_durability",
    "compute_ratios",
    "evaluate_targets",
    "main",
    "parse_journal_counters",
    "pipe_output",
    "render",
    "run_broker_benchmarks",
    "run_service_benchmarks",
    "scrape_journal",
]

#: DESIGN.md's service targets: ratios to the bare kafka-python baselines of the same run.
TARGET_PIPE_RATIO = 0.5  # service signals/s over the consume->decode->produce pipe's, at least
TARGET_HOP_P99_RATIO = 3.0  # service p99 over the tuned hop's p99, at the same rate, at most
TARGET_RSS_BYTES = 1 << 30
#: The cost of durability: signals/s with the journal over the same service without it, at least.
TARGET_JOURNAL_RATIO = 0.8

#: The brokers measured, in the order they run: Apache Kafka (the broker users run, and the
#: reference), then the embedded Tansu. The names are ``purgatory dev --broker``'s.
BROKERS = ("kafka", "tansu")
#: ``--broker``'s choices: one broker, or both in the order of :data:`BROKERS`.
BROKER_CHOICES = (*BROKERS, "both")
BROKER_TITLES = {"kafka": "Apache Kafka", "tansu": "Tansu"}
_BROKER_DETAILS = {
    "kafka": "one KRaft node in a JVM, heap 512 MiB, its log on local disk",
    "tansu": "embedded, in memory",
}

_LONG_TIMEOUT_MS = 3_600_000  # registered operations never expire during a run
_WARMUP_OPS = 200
_WARMUP_SCOPE = "warmup"
_WARMUP_KEY = b"warmup0"  # the warm-up operations' scope, and so their records' key
_SETTLE_S = 0.5  # extra reading after the last expected callback, to catch duplicates
_HTTP_TIMEOUT_S = 300.0
_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class ServiceBenchConfig:
    """Sizes of one run.

    ``hop_rate_per_s``: the rate of the Kafka hop baselines (``hop_duration_s`` each), one per
    ``(producer linger_ms, consumer fetch_max_wait_ms)`` pair of ``hops``; the one with the
    lowest p99 is the reference of DESIGN.md's p99 ratio, checked against the latency run at
    that rate (one of ``latency_rates_per_s``); the latency run's load generator uses the
    first pair.
    ``pipe_*`` are the pipe's client settings: tuned for throughput (see :data:`TUNED_PIPE`).
    """

    throughput_signals: int
    latency_rates_per_s: tuple[int, ...]
    latency_duration_s: float
    rss_pending: int
    http_single: int
    http_batched_ops: int
    register_batch: int = 10_000
    rss_batch: int = 10_000
    http_batch: int = 1_000
    hop_duration_s: float = 5.0
    hop_rate_per_s: int = 1_000
    hops: tuple[tuple[int, int], ...] = ((5, 5), (0, 5), (0, 100))
    pipe_fetch_max_wait_ms: int = 100
    pipe_max_poll_records: int = 20_000
    pipe_linger_ms: int = 5
    pipe_batch_bytes: int = 512 * 1024
    partitions: int = 2
    scopes: int = 8


FULL = ServiceBenchConfig(
    throughput_signals=100_000,
    latency_rates_per_s=(5_000, 1_000),
    latency_duration_s=10.0,
    rss_pending=1_000_000,
    http_single=5_000,
    http_batched_ops=100_000,
)
QUICK = ServiceBenchConfig(
    throughput_signals=30_000,
    latency_rates_per_s=(1_000,),
    latency_duration_s=5.0,
    rss_pending=20_000,
    http_single=300,
    http_batched_ops=5_000,
    register_batch=5_000,
    rss_batch=5_000,
    hop_duration_s=2.0,
)


# -- processes ----------------------------------------------------------------------------------


def _clock_ticks() -> int:
    return os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """User plus system CPU seconds of process ``pid`` (every thread), from ``/proc``."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields_after_name = stat.read().rsplit(")", 1)[1].split()
    utime, stime = int(fields_after_name[11]), int(fields_after_name[12])
    return (utime + stime) / _clock_ticks()


def _cpu_or_zero(pid: int) -> float:
    try:
        return process_cpu_s(pid)
    except OSError:  # it exited meanwhile
        return 0.0


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid``, from ``/proc``."""
    children = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", encoding="ascii") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if parent == pid:
            children.append(int(entry.name))
    return children


@dataclass(frozen=True, slots=True)
class JournalCounters:
    """The service's ``purgatory_journal_*_total`` counters: inputs journaled (entries),
    changelog records written (one per partition per group-committed batch) and their bytes."""

    entries: int = 0
    records: int = 0
    bytes: int = 0

    def __sub__(self, other: JournalCounters) -> JournalCounters:
        return JournalCounters(
            self.entries - other.entries, self.records - other.records, self.bytes - other.bytes
        )


_JOURNAL_METRICS = {
    "purgatory_journal_entries_total": "entries",
    "purgatory_journal_records_total": "records",
    "purgatory_journal_bytes_total": "bytes",
}


def parse_journal_counters(exposition: str) -> JournalCounters:
    """The journal counters of a Prometheus text exposition (absent ones are 0)."""
    values = dict.fromkeys(_JOURNAL_METRICS.values(), 0)
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        field_name = _JOURNAL_METRICS.get(sample.split("{", 1)[0])
        if field_name is not None:
            values[field_name] += round(float(value))
    return JournalCounters(**values)


def scrape_journal(http: httpx.Client) -> JournalCounters:
    """``GET /metrics`` of the service behind ``http``: its journal counters.

    Raises:
        RuntimeError: the scrape failed.
    """
    response = http.get("/metrics")
    if response.status_code != 200:
        raise RuntimeError(f"/metrics: HTTP {response.status_code} {response.text[:300]}")
    return parse_journal_counters(response.text)


def process_rss_bytes(pid: int) -> int:
    """``VmRSS`` of process ``pid``, in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


class ServiceProcess:
    """The service as a child process on ``broker``, with topics of its own; a context manager.

    Entering creates the topics and starts the service with
    :func:`purgatory.devtools.child.service_process` (``purgatory serve``, ready once
    ``/readyz`` answers 200); leaving sends SIGTERM and waits for the exit (killing it if it
    does not stop in time). ``journal`` is ``PURGATORY_JOURNAL``: with it (the default) the
    service journals every input to its changelog topic and ``serve`` starts a snapshotter
    child process; without it the state is in memory only. ``delivery`` is
    ``PURGATORY_DELIVERY`` (``acknowledged``, the default, or ``transactional``: Apache Kafka
    only, and its callbacks are read ``read_committed``).
    """

    def __init__(
        self,
        broker: Broker,
        *,
        partitions: int,
        log_dir: Path,
        journal: bool = True,
        delivery: str = Delivery.ACKNOWLEDGED.value,
    ) -> None:
        prefix = f"b{uuid.uuid4().hex[:10]}"
        self.broker = broker
        self.partitions = partitions
        self.settings = Settings.from_env(
            {},
            kafka_bootstrap_servers=broker.bootstrap_servers,
            kafka_group_id=f"{prefix}-group",
            topic_requests=f"{prefix}.requests",
            topic_signals=f"{prefix}.signals",
            topic_callbacks=f"{prefix}.callbacks",
            topic_dead_letters=f"{prefix}.dead-letters",
            topic_changelog=f"{prefix}.changelog",
            topic_snapshots=f"{prefix}.snapshots",
            topic_partitions=partitions,
            journal=journal,
            delivery=delivery,
            log_level="warning",
        )
        self.url = ""  # known once started (service_process picks a free port)
        self.log_path = log_dir / f"service-{prefix}.log"
        self._stack: contextlib.ExitStack | None = None
        self._pid: int | None = None

    @property
    def pid(self) -> int:
        """The service's process id.

        Raises:
            RuntimeError: it is not running.
        """
        if self._pid is None:
            raise RuntimeError("the service is not running")
        return self._pid

    def environment(self) -> dict[str, str]:
        """The child's settings, as ``PURGATORY_*`` variables (its topics, group, journal,
        delivery, log level)."""
        s = self.settings
        names = (
            "kafka_group_id",
            "topic_requests",
            "topic_signals",
            "topic_callbacks",
            "topic_dead_letters",
            "topic_changelog",
            "topic_snapshots",
            "topic_partitions",
        )
        env = {env_name(name): str(getattr(s, name)) for name in names}
        env[env_name("journal")] = "true" if s.journal else "false"
        env[env_name("delivery")] = s.delivery.value
        env[env_name("log_level")] = "warning"
        return env

    def start(self) -> None:
        """Create the topics, start the service, wait until it is ready.

        Raises:
            ConfigError: the service exited or was not ready in time (with its log's tail).
        """
        self.broker.create_topics({t: self.partitions for t in topics_of(self.settings)})
        self._stack = contextlib.ExitStack()
        child = self._stack.enter_context(
            service_process(
                self.broker.bootstrap_servers,
                self.log_path,
                self.environment(),
                partitions=self.partitions,
            )
        )
        self.url, self._pid = child.url, child.pid

    def stop(self) -> None:
        """SIGTERM, wait, kill if needed; idempotent."""
        stack, self._stack = self._stack, None
        self._pid = None
        if stack is not None:
            stack.close()

    def log_tail(self) -> str:
        """The end of the service's output."""
        if not self.log_path.exists():
            return "(no log)"
        return self.log_path.read_bytes()[-3000:].decode(errors="replace").strip() or "(empty)"

    def cpu_s(self) -> float:
        """CPU seconds the service has used so far."""
        return process_cpu_s(self.pid)

    def children_cpu_s(self) -> float:
        """CPU seconds the service's running child processes (the snapshotter, with the
        journal) have used so far."""
        return sum((_cpu_or_zero(pid) for pid in child_pids(self.pid)), 0.0)

    def rss_bytes(self) -> int:
        """The service's resident set size."""
        return process_rss_bytes(self.pid)

    def __enter__(self) -> ServiceProcess:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


# -- load generation ----------------------------------------------------------------------------


def _op(index: int, scopes: int, prefix: str) -> dict[str, Any]:
    return {
        "scope": f"{prefix}{index % scopes}",
        "op_id": f"o{index}",
        "keys": [f"k{index}"],
        "timeout_ms": _LONG_TIMEOUT_MS,
    }


def register_range(
    http: httpx.Client,
    indexes: range,
    *,
    batch: int,
    scopes: int,
    prefix: str = "s",
) -> float:
    """Register operation ``i`` (scope ``{prefix}{i % scopes}``, key ``k{i}``) for every ``i``
    in ``indexes`` through ``/v1/operations:batch``; returns the wall seconds it took.

    Raises:
        RuntimeError: a request failed or an operation was not answered 201.
    """
    start = time.perf_counter()
    for first in range(indexes.start, indexes.stop, batch):
        last = min(first + batch, indexes.stop)
        body = json.dumps({"operations": [_op(i, scopes, prefix) for i in range(first, last)]})
        response = http.post(
            "/v1/operations:batch",
            content=body.encode(),
            headers={"content-type": "application/json"},
        )
        if response.status_code != 200:
            raise RuntimeError(f"batch {first}: HTTP {response.status_code} {response.text[:300]}")
        results = response.json()["results"]
        created = sum(1 for r in results if r["http_status"] == 201)
        if created != last - first:
            bad = next(r for r in results if r["http_status"] != 201)
            raise RuntimeError(f"batch {first}: {last - first - created} not created, e.g. {bad}")
    return time.perf_counter() - start


def signal_value(scope: str, key: str, payload: str | None = None) -> bytes:
    """The signals-topic record value of signal ``key`` in ``scope``."""
    return encode_signal(SignalRecord(scope, key, None, payload))


def _producer(bootstrap: str, **options: Any) -> Any:
    from kafka import KafkaProducer  # noqa: PLC0415 (after the warning filters of pytest)

    return KafkaProducer(bootstrap_servers=bootstrap, acks=1, **options)


Arrival = tuple[int, bytes | None, bytes]
"""One polled record: when the poll returned it (``perf_counter_ns``), its key, its value."""


@dataclass(frozen=True, slots=True)
class _ReaderSpec:
    bootstrap: str
    topic: str
    partitions: int
    ignore_key: bytes
    fetch_max_wait_ms: int
    isolation_level: str = "read_uncommitted"


def _reader_main(spec: _ReaderSpec, counts: Any, ready: Any, stop: Any, conn: Connection) -> None:
    """The reader process: poll ``topic`` from its start until ``stop``, then send what came."""
    import warnings  # noqa: PLC0415

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from kafka import KafkaConsumer, TopicPartition  # noqa: PLC0415

    arrivals: list[Arrival] = []
    try:
        consumer = KafkaConsumer(
            bootstrap_servers=spec.bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=spec.fetch_max_wait_ms,
            max_poll_records=20_000,
            isolation_level=spec.isolation_level,
        )
        try:
            parts = [TopicPartition(spec.topic, p) for p in range(spec.partitions)]
            consumer.assign(parts)
            consumer.seek_to_beginning(*parts)
            consumer.poll(timeout_ms=0)
            ready.set()
            counted = ignored = 0
            while not stop.is_set():
                polled = consumer.poll(timeout_ms=50)
                if not polled:
                    continue
                now = time.perf_counter_ns()
                for records in polled.values():
                    for r in records:
                        arrivals.append((now, r.key, r.value))
                        if r.key == spec.ignore_key:
                            ignored += 1
                        else:
                            counted += 1
                counts[0], counts[1] = counted, ignored
        finally:
            consumer.close()
        conn.send(("ok", arrivals))
    except Exception as exc:
        ready.set()
        conn.send(("error", repr(exc)))
    finally:
        conn.close()


class _ChildProcess:
    """A helper process (``spawn``): it sets ``ready`` once it is reading, works until ``stop``,
    then sends ``("ok", result)`` (or ``("error", repr)``) through a pipe; meanwhile it reports
    progress in two shared counters. A context manager: entering starts it and waits until it
    is ready; leaving stops it (killing it if it does not stop in time)."""

    def __init__(self, target: Callable[..., None], spec: object, name: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._counts = ctx.Array("q", 2, lock=False)
        self._ready = ctx.Event()
        self._stop = ctx.Event()
        self._conn, child = ctx.Pipe(duplex=False)
        self._process = ctx.Process(
            target=target,
            args=(spec, self._counts, self._ready, self._stop, child),
            name=name,
            daemon=True,
        )
        self._child_conn = child
        self._label = name.replace("-", " ")
        self._finished = False
        self._value: Any = None

    @property
    def pid(self) -> int | None:
        """The process's id."""
        return self._process.pid

    def __enter__(self) -> Self:
        self._process.start()
        self._child_conn.close()
        end = time.perf_counter() + 60
        while not self._ready.wait(0.05):
            if not self._process.is_alive() or time.perf_counter() >= end:
                self._process.kill()
                self._process.join(5)
                raise RuntimeError(
                    f"the {self._label} did not start (exit code {self._process.exitcode})"
                )
        if self._conn.poll(0):
            self._raise_error()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self._finished:
            self._stop.set()
            self._process.join(30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)

    def _raise_error(self) -> None:
        status, value = self._conn.recv()
        raise RuntimeError(f"the {self._label} failed: {value if status == 'error' else '?'}")

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        """Wait until ``predicate()`` holds (checked every few ms) or ``timeout_s`` passes."""
        end = time.perf_counter() + timeout_s
        while not predicate():
            if not self._process.is_alive() or self._conn.poll(0):
                self._raise_error()
            if time.perf_counter() >= end:
                return False
            time.sleep(0.002)
        return True

    def _finish(self) -> Any:
        """Stop the process; what it sent back."""
        if not self._finished:
            self._stop.set()
            if not self._conn.poll(60):
                raise RuntimeError(f"the {self._label} did not answer in 60 s")
            status, value = self._conn.recv()
            self._process.join(30)
            if status != "ok":
                raise RuntimeError(f"the {self._label} failed: {value}")
            self._finished, self._value = True, value
        return self._value


class CallbackReader(_ChildProcess):
    """Reads a topic from its start in a process of its own, stamping each poll's arrival.

    A separate process keeps the reader from competing with the producer for this process's
    interpreter lock (which would add its own delays to the latencies measured); its clock,
    ``perf_counter_ns`` (``CLOCK_MONOTONIC``), is the producer's. ``counted`` is the number of
    records whose key is not ``ignore_key`` (the warm-up scope), ``ignored`` the others; the
    records themselves come back from :meth:`finish`. ``read_committed``: read only the records
    of committed transactions (a transactional service's callbacks).
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        ignore_key: bytes = b"",
        *,
        fetch_max_wait_ms: int = 20,
        read_committed: bool = False,
    ) -> None:
        isolation = "read_committed" if read_committed else "read_uncommitted"
        spec = _ReaderSpec(bootstrap, topic, partitions, ignore_key, fetch_max_wait_ms, isolation)
        super().__init__(_reader_main, spec, "callback-reader")

    @property
    def counted(self) -> int:
        """Records read so far whose key is not ``ignore_key``."""
        return int(self._counts[0])

    @property
    def ignored(self) -> int:
        """Records read so far whose key is ``ignore_key``."""
        return int(self._counts[1])

    def finish(self) -> list[Arrival]:
        """Stop reading; every record read, in arrival order."""
        arrivals: list[Arrival] = self._finish()
        return arrivals


def pipe_output(signal: SignalInput, sequence: int) -> bytes:
    """The pipe baseline's output record for one decoded signal: the callback the service
    would send for operation ``o{i}`` waiting for the signal's key ``k{i}`` alone (the same
    fields and size, so :func:`tally` checks the pipe's output as it checks the service's).

    Raises:
        RuntimeError: ``signal`` is a watermark (the benchmark sends none).
    """
    if not isinstance(signal, SignalRecord):
        raise RuntimeError(f"the pipe expects signals, got {signal!r}")
    key = signal.key
    return encode_callback(
        Outcome(
            op_id="o" + key[1:],
            scope=signal.scope,
            outcome=OutcomeKind.COMPLETED,
            registered_ms=0,
            outcome_ms=0,
            deadline_ms=_LONG_TIMEOUT_MS,
            time_domain=TimeDomain.PROCESSING_TIME,
            sequence=sequence,
            keys=(key,),
            signals={key: signal.payload},
        )
    )


@dataclass(frozen=True, slots=True)
class _PipeSpec:
    bootstrap: str
    source: str
    sink: str
    partitions: int
    fetch_max_wait_ms: int
    max_poll_records: int
    linger_ms: int
    batch_bytes: int


def _pipe_main(spec: _PipeSpec, counts: Any, ready: Any, stop: Any, conn: Connection) -> None:
    """The pipe process: consume ``source`` from its start, decode each signal, produce one
    output record to ``sink`` (same key) until ``stop``; then flush and send the count."""
    import warnings  # noqa: PLC0415

    warnings.filterwarnings("ignore", category=DeprecationWarning)
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: PLC0415

    from purgatory._codec import decode_signal  # noqa: PLC0415

    try:
        consumer = KafkaConsumer(
            bootstrap_servers=spec.bootstrap,
            enable_auto_commit=False,
            fetch_max_wait_ms=spec.fetch_max_wait_ms,
            max_poll_records=spec.max_poll_records,
        )
        producer = KafkaProducer(
            bootstrap_servers=spec.bootstrap,
            acks="all",
            linger_ms=spec.linger_ms,
            batch_size=spec.batch_bytes,
        )
        piped = 0
        try:
            parts = [TopicPartition(spec.source, p) for p in range(spec.partitions)]
            consumer.assign(parts)
            consumer.seek_to_beginning(*parts)
            consumer.poll(timeout_ms=0)
            producer.partitions_for(spec.sink)  # metadata before the first record
            ready.set()
            send, sink = producer.send, spec.sink
            while not stop.is_set():
                for records in consumer.poll(timeout_ms=50).values():
                    for r in records:
                        piped += 1
                        send(sink, key=r.key, value=pipe_output(decode_signal(r.value), piped))
                counts[0] = piped
            producer.flush(60)
        finally:
            producer.close(5)
            consumer.close()
        conn.send(("ok", piped))
    except Exception as exc:
        ready.set()
        conn.send(("error", repr(exc)))
    finally:
        conn.close()


class PipeProcess(_ChildProcess):
    """The pipe baseline: a bare kafka-python consume -> decode -> produce loop in a process
    of its own (one consumer, one producer, tuned for throughput by default: see
    :data:`TUNED_PIPE`), reading ``source`` from its start and writing one record per signal
    to ``sink``."""

    def __init__(
        self,
        bootstrap: str,
        source: str,
        sink: str,
        partitions: int,
        *,
        fetch_max_wait_ms: int = 100,
        max_poll_records: int = 20_000,
        linger_ms: int = 5,
        batch_bytes: int = 512 * 1024,
    ) -> None:
        spec = _PipeSpec(
            bootstrap,
            source,
            sink,
            partitions,
            fetch_max_wait_ms,
            max_poll_records,
            linger_ms,
            batch_bytes,
        )
        super().__init__(_pipe_main, spec, "consume-decode-produce-pipe")

    @property
    def piped(self) -> int:
        """Signals consumed and produced so far."""
        return int(self._counts[0])

    def finish(self) -> int:
        """Stop the pipe (after it flushed); how many signals it piped."""
        piped: int = self._finish()
        return piped


def nth_arrival_ns(arrivals: Sequence[Arrival], n: int, ignore_key: bytes) -> int:
    """When the ``n``-th record (1-based) whose key is not ``ignore_key`` arrived."""
    seen = 0
    for at_ns, key, _ in arrivals:
        if key != ignore_key:
            seen += 1
            if seen == n:
                return at_ns
    raise RuntimeError(f"only {seen} records arrived, not {n}")


@dataclass(frozen=True, slots=True)
class Tally:
    """What the callbacks of a run say: counts, and for each operation its first callback's
    arrival time and the payload of its key's signal."""

    callbacks: int
    distinct_ops: int
    duplicates: int
    unexpected: int
    not_completed: int
    missing: int
    first: dict[str, tuple[int, Any]]  # op_id -> (arrival ns, payload of its key's signal)


def tally(arrivals: Sequence[Arrival], expected_ops: int, ignore_key: bytes) -> Tally:
    """Check the callbacks against operations ``o0`` .. ``o{expected_ops - 1}``: each must
    come exactly once, ``completed``, with its own key ``k{i}``."""
    first: dict[str, tuple[int, Any]] = {}
    callbacks = duplicates = unexpected = not_completed = 0
    for at_ns, key, value in arrivals:
        if key == ignore_key:
            continue
        callbacks += 1
        cb = json.loads(value)
        op_id = cb["op_id"]
        index = int(op_id[1:]) if op_id[:1] == "o" and op_id[1:].isdigit() else -1
        if not 0 <= index < expected_ops or cb["keys"] != [f"k{index}"]:
            unexpected += 1
            continue
        if cb["outcome"] != "completed":
            not_completed += 1
        if op_id in first:
            duplicates += 1
            continue
        first[op_id] = (at_ns, cb["signals"].get(f"k{index}"))
    return Tally(
        callbacks=callbacks,
        distinct_ops=len(first),
        duplicates=duplicates,
        unexpected=unexpected,
        not_completed=not_completed,
        missing=expected_ops - len(first),
        first=first,
    )


def _warm_up_signals(
    bootstrap: str, topic: str, reader: CallbackReader, context: Callable[[], str]
) -> None:
    """Send the warm-up scope's signals ``k0`` .. to ``topic``; wait for as many records (of
    the warm-up scope) in ``reader``, so connections and metadata are in place.

    Raises:
        RuntimeError: they did not all come in time (with ``context()``).
    """
    producer = _producer(bootstrap, linger_ms=0)
    try:
        for i in range(_WARMUP_OPS):
            producer.send(topic, key=_WARMUP_KEY, value=signal_value(_WARMUP_KEY.decode(), f"k{i}"))
        producer.flush(30)
    finally:
        producer.close(5)
    if not reader.wait(lambda: reader.ignored >= _WARMUP_OPS, 60):
        raise RuntimeError(f"warm-up: {reader.ignored} of {_WARMUP_OPS} records; {context()}")


def _warm_up(service: ServiceProcess, http: httpx.Client, reader: CallbackReader) -> None:
    """Complete a few operations end to end, so connections and metadata are in place."""
    register_range(http, range(_WARMUP_OPS), batch=_WARMUP_OPS, scopes=1, prefix=_WARMUP_SCOPE)
    _warm_up_signals(
        service.broker.bootstrap_servers,
        service.settings.topic_signals,
        reader,
        service.log_tail,
    )


def _scope_key(index: int, scopes: int) -> tuple[bytes, str, str]:
    scope = f"s{index % scopes}"
    return scope.encode(), scope, f"k{index}"


def _broker_cpu(broker: Broker) -> float:
    """CPU seconds the broker has used so far: Tansu's process, or Kafka's JVM (its pid
    whether or not it was started tied to this process: the launcher execs ``java``)."""
    pid = broker.pid
    return 0.0 if pid is None else process_cpu_s(pid)


def _child_cpu(child: _ChildProcess) -> float:
    pid = child.pid
    return 0.0 if pid is None else process_cpu_s(pid)


def _signal_records(signals: int, scopes: int) -> list[tuple[bytes, bytes]]:
    """The throughput runs' signals: ``(key, value)`` of ``k{i}`` in scope ``s{i % scopes}``."""
    records = []
    for i in range(signals):
        key, scope, watch = _scope_key(i, scopes)
        records.append((key, signal_value(scope, watch)))
    return records


def _burst_producer(bootstrap: str) -> Any:
    """The throughput runs' producer: large batches, many in flight."""
    return _producer(
        bootstrap, linger_ms=5, batch_size=512 * 1024, max_in_flight_requests_per_connection=10
    )


def _send_burst(
    producer: Any, topic: str, records: Sequence[tuple[bytes, bytes]]
) -> tuple[int, int]:
    """Send ``records`` as fast as ``producer`` takes them, then flush; returns the
    ``perf_counter_ns`` of the first send and of the end of the flush."""
    t0 = time.perf_counter_ns()
    for key, value in records:
        producer.send(topic, key=key, value=value)
    producer.flush(120)
    return t0, time.perf_counter_ns()


# -- the four measurements ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ThroughputResult:
    """Signals through Kafka as fast as the producer sends them.

    ``journal``: whether the service journaled (``PURGATORY_JOURNAL``). ``journal_*``: its
    journal counters (``/metrics``) at the end of the run, warm-up and registrations included;
    ``burst_journal_*``: what the signal burst alone added. ``snapshotter_cpu_s``: the CPU the
    service's child processes (the snapshotter) used during the burst, beside
    ``service_cpu_s`` (the ``serve`` process alone).
    """

    signals: int
    register_s: float
    produce_s: float
    end_to_end_s: float
    signals_per_s: float
    producer_per_s: float
    callbacks: int
    distinct_ops: int
    duplicates: int
    unexpected: int
    not_completed: int
    missing: int
    service_cpu_s: float
    broker_cpu_s: float
    loadgen_cpu_s: float
    journal: bool = True
    snapshotter_cpu_s: float = 0.0
    journal_entries: int = 0
    journal_records: int = 0
    journal_bytes: int = 0
    burst_journal_entries: int = 0
    burst_journal_records: int = 0
    burst_journal_bytes: int = 0

    @property
    def journal_bytes_per_entry(self) -> float:
        """Journal bytes per input journaled, over the whole run (0 without the journal)."""
        return self.journal_bytes / self.journal_entries if self.journal_entries else 0.0

    @property
    def burst_journal_bytes_per_signal(self) -> float:
        """Journal bytes the burst added per signal sent (0 without the journal)."""
        return self.burst_journal_bytes / self.signals if self.burst_journal_entries else 0.0

    @property
    def burst_entries_per_record(self) -> float:
        """Inputs per changelog record during the burst: the group commit's batching."""
        if not self.burst_journal_records:
            return 0.0
        return self.burst_journal_entries / self.burst_journal_records


def _read_committed(delivery: str) -> bool:
    """Whether the callbacks of a service in ``delivery`` are read ``read_committed``: only a
    transactional service's are (an acknowledged one writes no transactions)."""
    return Delivery(delivery.lower()) is Delivery.TRANSACTIONAL


def _timed_burst(
    broker: Broker,
    topic: str,
    records: list[tuple[bytes, bytes]],
    reader: CallbackReader,
    *,
    subject_cpu_s: Callable[[], float],
    missing: Callable[[], str],
    subject_children_cpu_s: Callable[[], float] = lambda: 0.0,
) -> tuple[int, int, list[Arrival], tuple[float, ...], tuple[float, ...]]:
    """Send ``records`` to ``topic`` as fast as the producer goes and wait until the reader
    counted as many outputs; returns the first send's and the last send's ``perf_counter_ns``,
    the arrivals, and the CPU seconds (subject, broker, load generator, reader, the subject's
    child processes) before and after.

    Raises:
        RuntimeError: not every output arrived (``missing()`` says what was expected).
    """
    signals = len(records)
    producer = _burst_producer(broker.bootstrap_servers)

    def cpu_now() -> tuple[float, ...]:
        return (
            subject_cpu_s(),
            _broker_cpu(broker),
            time.process_time(),
            _child_cpu(reader),
            subject_children_cpu_s(),
        )

    try:
        producer.partitions_for(topic)  # metadata before the clock starts
        cpu = cpu_now()
        t0, produced_ns = _send_burst(producer, topic, records)
        done = reader.wait(lambda: reader.counted >= signals, max(60.0, signals / 1_000))
        cpu_after = cpu_now()
    finally:
        producer.close(5)
    if not done:
        raise RuntimeError(f"only {reader.counted} of {signals} {missing()}")
    time.sleep(_SETTLE_S)
    return t0, produced_ns, reader.finish(), cpu, cpu_after


def bench_throughput(
    broker: Broker,
    signals: int,
    *,
    register_batch: int = 10_000,
    partitions: int = 2,
    scopes: int = 8,
    log_dir: Path,
    journal: bool = True,
    delivery: str = Delivery.ACKNOWLEDGED.value,
) -> ThroughputResult:
    """Measurement 1 (see the module's documentation), with the journal or without it, in
    either delivery (``transactional``: the callbacks are read ``read_committed``)."""
    with (
        ServiceProcess(
            broker, partitions=partitions, log_dir=log_dir, journal=journal, delivery=delivery
        ) as service,
        httpx.Client(base_url=service.url, timeout=_HTTP_TIMEOUT_S) as http,
        CallbackReader(
            broker.bootstrap_servers,
            service.settings.topic_callbacks,
            partitions,
            _WARMUP_KEY,
            read_committed=_read_committed(delivery),
        ) as reader,
    ):
        _warm_up(service, http, reader)
        register_s = register_range(http, range(signals), batch=register_batch, scopes=scopes)
        records = _signal_records(signals, scopes)
        topic = service.settings.topic_signals
        before = scrape_journal(http)
        burst = _timed_burst(
            broker,
            topic,
            records,
            reader,
            subject_cpu_s=service.cpu_s,
            missing=lambda: f"callbacks arrived; {service.log_tail()}",
            subject_children_cpu_s=service.children_cpu_s,
        )
        t0, produced_ns, arrivals, cpu, cpu_after = burst
        # Every callback waited for its signal's journal record: the counters include them.
        after = scrape_journal(http)
    added = after - before
    end_ns = nth_arrival_ns(arrivals, signals, _WARMUP_KEY)
    counts = tally(arrivals, signals, _WARMUP_KEY)
    end_to_end_s = (end_ns - t0) / 1e9
    produce_s = (produced_ns - t0) / 1e9
    return ThroughputResult(
        signals=signals,
        register_s=register_s,
        produce_s=produce_s,
        end_to_end_s=end_to_end_s,
        signals_per_s=signals / end_to_end_s,
        producer_per_s=signals / produce_s,
        callbacks=counts.callbacks,
        distinct_ops=counts.distinct_ops,
        duplicates=counts.duplicates,
        unexpected=counts.unexpected,
        not_completed=counts.not_completed,
        missing=counts.missing,
        service_cpu_s=cpu_after[0] - cpu[0],
        broker_cpu_s=cpu_after[1] - cpu[1],
        loadgen_cpu_s=cpu_after[2] - cpu[2] + cpu_after[3] - cpu[3],
        journal=journal,
        snapshotter_cpu_s=cpu_after[4] - cpu[4],
        journal_entries=after.entries,
        journal_records=after.records,
        journal_bytes=after.bytes,
        burst_journal_entries=added.entries,
        burst_journal_records=added.records,
        burst_journal_bytes=added.bytes,
    )


@dataclass(frozen=True, slots=True)
class PipeResult:
    """The throughput baseline: measurement 1's signals through a bare consume -> decode ->
    produce pipe instead of the service (``piped`` counts the warm-up records too)."""

    signals: int
    produce_s: float
    end_to_end_s: float
    signals_per_s: float
    producer_per_s: float
    piped: int
    outputs: int
    distinct_ops: int
    duplicates: int
    unexpected: int
    not_completed: int
    missing: int
    pipe_cpu_s: float
    broker_cpu_s: float
    loadgen_cpu_s: float


def bench_pipe(
    broker: Broker,
    signals: int,
    *,
    partitions: int = 2,
    scopes: int = 8,
    fetch_max_wait_ms: int = 100,
    max_poll_records: int = 20_000,
    linger_ms: int = 5,
    batch_bytes: int = 512 * 1024,
) -> PipeResult:
    """Measurement 1's baseline (see the module's documentation): the same signals, produced
    the same way, piped by :class:`PipeProcess` from a signals topic of its own to an output
    topic, timed from the first send to the arrival of the last output record."""
    prefix = f"p{uuid.uuid4().hex[:10]}"
    source, sink = f"{prefix}.signals", f"{prefix}.out"
    broker.create_topics({source: partitions, sink: partitions})
    bootstrap = broker.bootstrap_servers
    with (
        PipeProcess(
            bootstrap,
            source,
            sink,
            partitions,
            fetch_max_wait_ms=fetch_max_wait_ms,
            max_poll_records=max_poll_records,
            linger_ms=linger_ms,
            batch_bytes=batch_bytes,
        ) as pipe,
        CallbackReader(bootstrap, sink, partitions, _WARMUP_KEY) as reader,
    ):
        _warm_up_signals(bootstrap, source, reader, lambda: f"the pipe piped {pipe.piped}")
        records = _signal_records(signals, scopes)
        burst = _timed_burst(
            broker,
            source,
            records,
            reader,
            subject_cpu_s=lambda: _child_cpu(pipe),
            missing=lambda: f"outputs arrived (the pipe piped {pipe.piped})",
        )
        t0, produced_ns, arrivals, cpu, cpu_after = burst
        piped = pipe.finish()
    end_ns = nth_arrival_ns(arrivals, signals, _WARMUP_KEY)
    counts = tally(arrivals, signals, _WARMUP_KEY)
    end_to_end_s = (end_ns - t0) / 1e9
    produce_s = (produced_ns - t0) / 1e9
    return PipeResult(
        signals=signals,
        produce_s=produce_s,
        end_to_end_s=end_to_end_s,
        signals_per_s=signals / end_to_end_s,
        producer_per_s=signals / produce_s,
        piped=piped,
        outputs=counts.callbacks,
        distinct_ops=counts.distinct_ops,
        duplicates=counts.duplicates,
        unexpected=counts.unexpected,
        not_completed=counts.not_completed,
        missing=counts.missing,
        pipe_cpu_s=cpu_after[0] - cpu[0],
        broker_cpu_s=cpu_after[1] - cpu[1],
        loadgen_cpu_s=cpu_after[2] - cpu[2] + cpu_after[3] - cpu[3],
    )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def _paced_send(
    producer: Any,
    topic: str,
    count: int,
    rate_per_s: int,
    record: Callable[[int], tuple[bytes, bytes]],
) -> float:
    """Send ``record(i)`` for ``i`` in ``range(count)`` at ``rate_per_s``; returns the seconds
    the sends took. ``record`` is called at send time (it may read the clock)."""
    start = time.perf_counter()
    sent = 0
    while sent < count:
        due = min(count, int((time.perf_counter() - start) * rate_per_s) + 1)
        while sent < due:
            key, value = record(sent)
            producer.send(topic, key=key, value=value)
            sent += 1
        pause = start + sent / rate_per_s - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
    return time.perf_counter() - start


@dataclass(frozen=True, slots=True)
class LatencyResult:
    """Signal-to-callback latency at a fixed offered rate (``journal``: whether the service
    journaled; ``snapshotter_cpu_s``: the CPU its child processes used meanwhile)."""

    rate_per_s: int
    duration_s: float
    signals: int
    achieved_per_s: float
    callbacks: int
    distinct_ops: int
    duplicates: int
    unexpected: int
    not_completed: int
    missing: int
    without_send_time: int
    min_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    service_cpu_s: float
    broker_cpu_s: float
    journal: bool = True
    snapshotter_cpu_s: float = 0.0
    #: p50 and p99 of the latency split at the moment of decision (the callback's
    #: ``outcome_ms``, the service's clock): signal sent -> decided (the producer's linger, the
    #: broker, the service's fetch and intake) and decided -> read (the journal's round trip,
    #: the callback's and the reader's fetch). Their p99s need not add up to the whole's.
    to_decision_ms: tuple[float, float] = (0.0, 0.0)
    after_decision_ms: tuple[float, float] = (0.0, 0.0)


def bench_latency(
    broker: Broker,
    rate_per_s: int,
    duration_s: float,
    *,
    register_batch: int = 10_000,
    partitions: int = 2,
    scopes: int = 8,
    log_dir: Path,
    journal: bool = True,
    delivery: str = Delivery.ACKNOWLEDGED.value,
    linger_ms: int = 5,
    fetch_max_wait_ms: int = 5,
) -> LatencyResult:
    """Measurement 2 (see the module's documentation), with the journal or without it, in
    either delivery (``transactional``: the callbacks are read ``read_committed``)."""
    signals = max(1, round(rate_per_s * duration_s))

    def record(i: int) -> tuple[bytes, bytes]:
        key, scope, watch = _scope_key(i, scopes)
        # Both clocks at the send: perf (the reader's) for the whole, wall for the split.
        sent = f'{{"t":{time.perf_counter_ns()},"w":{time.time_ns()}}}'
        return key, signal_value(scope, watch, sent)

    with (
        ServiceProcess(
            broker, partitions=partitions, log_dir=log_dir, journal=journal, delivery=delivery
        ) as service,
        httpx.Client(base_url=service.url, timeout=_HTTP_TIMEOUT_S) as http,
        # The load generator is tuned as the hop baseline it is compared with.
        CallbackReader(
            broker.bootstrap_servers,
            service.settings.topic_callbacks,
            partitions,
            _WARMUP_KEY,
            fetch_max_wait_ms=fetch_max_wait_ms,
            read_committed=_read_committed(delivery),
        ) as reader,
    ):
        _warm_up(service, http, reader)
        register_range(http, range(signals), batch=register_batch, scopes=scopes)
        topic = service.settings.topic_signals
        producer = _producer(broker.bootstrap_servers, linger_ms=linger_ms)
        try:
            producer.partitions_for(topic)
            cpu = (service.cpu_s(), _broker_cpu(broker), service.children_cpu_s())
            send_s = _paced_send(producer, topic, signals, rate_per_s, record)
            producer.flush(60)
            done = reader.wait(lambda: reader.counted >= signals, max(60.0, duration_s * 6))
            cpu_after = (service.cpu_s(), _broker_cpu(broker), service.children_cpu_s())
        finally:
            producer.close(5)
        if not done:
            raise RuntimeError(
                f"only {reader.counted} of {signals} callbacks arrived; {service.log_tail()}"
            )
        time.sleep(_SETTLE_S)
        arrivals = reader.finish()
    counts = tally(arrivals, signals, _WARMUP_KEY)
    latencies = sorted(
        (at_ns - payload["t"]) / 1e6
        for at_ns, payload in counts.first.values()
        if isinstance(payload, dict) and isinstance(payload.get("t"), int)
    )
    to_decision, after_decision = decision_split(arrivals, _WARMUP_KEY)
    return LatencyResult(
        rate_per_s=rate_per_s,
        duration_s=duration_s,
        signals=signals,
        achieved_per_s=signals / send_s,
        callbacks=counts.callbacks,
        distinct_ops=counts.distinct_ops,
        duplicates=counts.duplicates,
        unexpected=counts.unexpected,
        not_completed=counts.not_completed,
        missing=counts.missing,
        without_send_time=counts.distinct_ops - len(latencies),
        min_ms=latencies[0] if latencies else 0.0,
        p50_ms=percentile(latencies, 0.50),
        p90_ms=percentile(latencies, 0.90),
        p99_ms=percentile(latencies, 0.99),
        max_ms=latencies[-1] if latencies else 0.0,
        service_cpu_s=cpu_after[0] - cpu[0],
        broker_cpu_s=cpu_after[1] - cpu[1],
        journal=journal,
        snapshotter_cpu_s=cpu_after[2] - cpu[2],
        to_decision_ms=(percentile(to_decision, 0.50), percentile(to_decision, 0.99)),
        after_decision_ms=(percentile(after_decision, 0.50), percentile(after_decision, 0.99)),
    )


def decision_split(
    arrivals: Sequence[Arrival], ignore_key: bytes
) -> tuple[list[float], list[float]]:
    """Each first callback's latency split at its ``outcome_ms``: (sent -> decided, decided ->
    read), in ms, sorted. A signal's payload carries both its send clocks (``t``, perf ns, and
    ``w``, wall ns); the reader stamps arrivals with the perf clock, so ``w - t`` moves an
    arrival onto the wall clock the service decides by (1 ms resolution)."""
    seen: set[str] = set()
    to_decision: list[float] = []
    after_decision: list[float] = []
    for at_ns, key, value in arrivals:
        if key == ignore_key:
            continue
        cb = json.loads(value)
        if cb["op_id"] in seen:
            continue
        seen.add(cb["op_id"])
        for sent in cb["signals"].values():
            if isinstance(sent, dict) and isinstance(sent.get("w"), int) and "t" in sent:
                decided_ns = cb["outcome_ms"] * 1_000_000
                to_decision.append((decided_ns - sent["w"]) / 1e6)
                after_decision.append((at_ns + sent["w"] - sent["t"] - decided_ns) / 1e6)
    return sorted(to_decision), sorted(after_decision)


@dataclass(frozen=True, slots=True)
class HopResult:
    """The latency baseline: one produce-to-consume hop through the broker, no service in
    between (``received`` counts every arrival, ``distinct`` the records that arrived)."""

    rate_per_s: int
    linger_ms: int
    fetch_max_wait_ms: int
    records: int
    received: int
    distinct: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float


def bench_kafka_hop(
    broker: Broker,
    rate_per_s: int,
    duration_s: float,
    *,
    linger_ms: int = 5,
    fetch_max_wait_ms: int = 5,
    partitions: int = 2,
    scopes: int = 8,
) -> HopResult:
    """Send records ``"{i} {send time}"`` at ``rate_per_s`` with a producer that lingers
    ``linger_ms`` and read them with a consumer that waits ``fetch_max_wait_ms``: what one trip
    through the broker costs with these clients (after a warm-up, as in the latency run)."""
    topic = f"hop-{uuid.uuid4().hex[:10]}"
    broker.create_topics({topic: partitions})
    records = max(1, round(rate_per_s * duration_s))

    def record(i: int) -> tuple[bytes, bytes]:
        return f"s{i % scopes}".encode(), f"{i} {time.perf_counter_ns()}".encode()

    bootstrap = broker.bootstrap_servers
    with CallbackReader(
        bootstrap, topic, partitions, _WARMUP_KEY, fetch_max_wait_ms=fetch_max_wait_ms
    ) as reader:
        _warm_up_signals(bootstrap, topic, reader, lambda: "one hop, no service")
        producer = _producer(bootstrap, linger_ms=linger_ms)
        try:
            producer.partitions_for(topic)
            _paced_send(producer, topic, records, rate_per_s, record)
            producer.flush(60)
        finally:
            producer.close(5)
        reader.wait(lambda: reader.counted >= records, 60)
        time.sleep(_SETTLE_S)
        arrivals = reader.finish()
    first: dict[int, float] = {}
    received = 0
    for at_ns, key, value in arrivals:
        if key == _WARMUP_KEY:
            continue
        received += 1
        index, sent_ns = map(int, value.split())
        first.setdefault(index, (at_ns - sent_ns) / 1e6)
    latencies = sorted(first.values())
    return HopResult(
        rate_per_s=rate_per_s,
        linger_ms=linger_ms,
        fetch_max_wait_ms=fetch_max_wait_ms,
        records=records,
        received=received,
        distinct=len(first.keys() & range(records)),
        p50_ms=percentile(latencies, 0.50),
        p90_ms=percentile(latencies, 0.90),
        p99_ms=percentile(latencies, 0.99),
        max_ms=latencies[-1] if latencies else 0.0,
    )


@dataclass(frozen=True, slots=True)
class RssResult:
    """The service's resident memory with many pending operations."""

    pending: int
    rss_before_bytes: int
    rss_after_bytes: int
    bytes_per_op: float
    register_s: float
    registrations_per_s: float


def bench_rss(
    broker: Broker,
    pending: int,
    *,
    batch: int = 10_000,
    partitions: int = 2,
    scopes: int = 8,
    log_dir: Path,
) -> RssResult:
    """Measurement 3 (see the module's documentation)."""
    with (
        ServiceProcess(broker, partitions=partitions, log_dir=log_dir) as service,
        httpx.Client(base_url=service.url, timeout=_HTTP_TIMEOUT_S) as http,
    ):
        register_range(http, range(batch), batch=batch, scopes=1, prefix=_WARMUP_SCOPE)
        before = service.rss_bytes()
        register_s = register_range(http, range(batch, batch + pending), batch=batch, scopes=scopes)
        time.sleep(0.5)  # let the last response's buffers go
        after = service.rss_bytes()
    return RssResult(
        pending=pending,
        rss_before_bytes=before,
        rss_after_bytes=after,
        bytes_per_op=(after - before) / pending,
        register_s=register_s,
        registrations_per_s=pending / register_s,
    )


@dataclass(frozen=True, slots=True)
class HttpResult:
    """Registrations over HTTP, one per request and in batches."""

    single_requests: int
    single_s: float
    single_per_s: float
    batch_size: int
    batched_ops: int
    batched_s: float
    batched_ops_per_s: float
    service_cpu_s: float


def bench_http(
    broker: Broker,
    single: int,
    batched_ops: int,
    *,
    batch: int = 1_000,
    partitions: int = 2,
    scopes: int = 8,
    log_dir: Path,
) -> HttpResult:
    """Measurement 4 (see the module's documentation)."""
    with (
        ServiceProcess(broker, partitions=partitions, log_dir=log_dir) as service,
        httpx.Client(base_url=service.url, timeout=_HTTP_TIMEOUT_S) as http,
    ):
        register_range(http, range(batch), batch=batch, scopes=1, prefix=_WARMUP_SCOPE)
        bodies = [json.dumps(_op(i, scopes, "s")).encode() for i in range(single)]
        headers = {"content-type": "application/json"}
        cpu = service.cpu_s()
        start = time.perf_counter()
        for body in bodies:
            response = http.post("/v1/operations", content=body, headers=headers)
            if response.status_code != 201:
                raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        single_s = time.perf_counter() - start
        batched_s = register_range(
            http, range(single, single + batched_ops), batch=batch, scopes=scopes
        )
        cpu_s = service.cpu_s() - cpu
    return HttpResult(
        single_requests=single,
        single_s=single_s,
        single_per_s=single / single_s,
        batch_size=batch,
        batched_ops=batched_ops,
        batched_s=batched_s,
        batched_ops_per_s=batched_ops / batched_s,
        service_cpu_s=cpu_s,
    )


# -- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """One DESIGN.md service target and whether this run met it."""

    name: str
    measured: str
    required: str
    met: bool


@dataclass(frozen=True, slots=True)
class Ratios:
    """The service against its baselines of the same run (DESIGN.md's targets are these).

    ``throughput_ratio``: service signals/s over the pipe's (at least ``throughput_target``).
    ``p99_ratio``: service p99 at ``rate_per_s`` over the reference hop's p99 at that rate (at
    most ``p99_target``); None when this run has no latency run or no hop at that rate.
    """

    service_signals_per_s: float
    pipe_signals_per_s: float
    throughput_ratio: float
    throughput_target: float
    rate_per_s: int
    service_p99_ms: float | None
    hop_p99_ms: float | None
    p99_ratio: float | None
    p99_target: float


@dataclass(frozen=True, slots=True)
class LatencyCost:
    """Latency at one rate with the journal and without it (the same run)."""

    rate_per_s: int
    p50_ms: float
    p99_ms: float
    no_journal_p50_ms: float
    no_journal_p99_ms: float
    p50_added_ms: float
    p99_added_ms: float


@dataclass(frozen=True, slots=True)
class DurabilityCost:
    """The journal against its own baseline, the service without it (``PURGATORY_JOURNAL=false``:
    no journal, no restore, no snapshotter), in the same run.

    ``throughput_ratio``: signals/s with the journal over without (at least
    ``throughput_target``). ``journal_*``: the journaled throughput run's counters at its end
    (warm-up and registrations included), ``bytes_per_input`` their bytes per entry;
    ``burst_bytes_per_signal`` and ``burst_entries_per_record``: what the signal burst alone
    wrote, per signal, and how many inputs one changelog record carried (group commit).
    """

    signals_per_s: float
    no_journal_signals_per_s: float
    throughput_ratio: float
    throughput_target: float
    latency: list[LatencyCost]
    journal_entries: int
    journal_records: int
    journal_bytes: int
    bytes_per_input: float
    burst_bytes_per_signal: float
    burst_entries_per_record: float
    service_cpu_s: float
    snapshotter_cpu_s: float
    no_journal_service_cpu_s: float


@dataclass(frozen=True, slots=True)
class BrokerReport:
    """Everything one run produced on one broker (``broker``: a name of :data:`BROKERS`;
    ``throughput`` and ``latency`` with the journal, the service's default; ``*_no_journal``
    the same runs without it). Its ratios and targets are to its own baselines."""

    broker: str
    throughput: ThroughputResult
    pipe: PipeResult
    latency: list[LatencyResult]
    hops: list[HopResult]
    rss: RssResult
    http: HttpResult
    ratios: Ratios
    targets: list[Target] = field(default_factory=list)
    throughput_no_journal: ThroughputResult | None = None
    latency_no_journal: list[LatencyResult] = field(default_factory=list)
    durability: DurabilityCost | None = None


@dataclass(frozen=True, slots=True)
class ServiceReport:
    """Everything one run produced: the machine, the sizes, and one :class:`BrokerReport` per
    broker measured, in the order they ran."""

    machine: dict[str, str | int]
    config: ServiceBenchConfig
    brokers: list[BrokerReport]


def _exact(r: ThroughputResult | PipeResult | LatencyResult | HopResult) -> bool:
    """Whether a run measured what it says: one completed callback (or record) per signal."""
    if isinstance(r, HopResult):
        return r.received == r.distinct == r.records
    extra = r.without_send_time if isinstance(r, LatencyResult) else 0
    if isinstance(r, PipeResult):
        extra = r.piped - r.signals - _WARMUP_OPS
    return not (r.missing or r.duplicates or r.unexpected or r.not_completed or extra)


def _reference(
    config: ServiceBenchConfig, latency: Sequence[LatencyResult], hops: Sequence[HopResult]
) -> tuple[LatencyResult | None, HopResult | None]:
    """The latency run and the hop DESIGN.md's p99 ratio compares: of the hops at the
    latency run's rate, the one with the lowest p99 (the best these clients did)."""
    lat = next((x for x in latency if x.rate_per_s == config.hop_rate_per_s), None)
    at_rate = [h for h in hops if h.rate_per_s == config.hop_rate_per_s]
    hop = min(at_rate, key=lambda h: h.p99_ms) if at_rate else None
    return lat, hop


def compute_ratios(
    config: ServiceBenchConfig,
    throughput: ThroughputResult,
    pipe: PipeResult,
    latency: Sequence[LatencyResult],
    hops: Sequence[HopResult],
) -> Ratios:
    """The service's figures over its baselines' (see :class:`Ratios`)."""
    lat, hop = _reference(config, latency, hops)
    p99_ratio = None
    if lat is not None and hop is not None and hop.p99_ms > 0:
        p99_ratio = lat.p99_ms / hop.p99_ms
    return Ratios(
        service_signals_per_s=throughput.signals_per_s,
        pipe_signals_per_s=pipe.signals_per_s,
        throughput_ratio=throughput.signals_per_s / pipe.signals_per_s,
        throughput_target=TARGET_PIPE_RATIO,
        rate_per_s=config.hop_rate_per_s,
        service_p99_ms=None if lat is None else lat.p99_ms,
        hop_p99_ms=None if hop is None else hop.p99_ms,
        p99_ratio=p99_ratio,
        p99_target=TARGET_HOP_P99_RATIO,
    )


def compute_durability(
    throughput: ThroughputResult,
    no_journal: ThroughputResult,
    latency: Sequence[LatencyResult],
    latency_no_journal: Sequence[LatencyResult],
) -> DurabilityCost:
    """The journaled service's figures beside the unjournaled one's (see
    :class:`DurabilityCost`); latencies are paired by rate."""
    without = {x.rate_per_s: x for x in latency_no_journal}
    costs = [
        LatencyCost(
            rate_per_s=lat.rate_per_s,
            p50_ms=lat.p50_ms,
            p99_ms=lat.p99_ms,
            no_journal_p50_ms=base.p50_ms,
            no_journal_p99_ms=base.p99_ms,
            p50_added_ms=lat.p50_ms - base.p50_ms,
            p99_added_ms=lat.p99_ms - base.p99_ms,
        )
        for lat in latency
        if (base := without.get(lat.rate_per_s)) is not None
    ]
    return DurabilityCost(
        signals_per_s=throughput.signals_per_s,
        no_journal_signals_per_s=no_journal.signals_per_s,
        throughput_ratio=throughput.signals_per_s / no_journal.signals_per_s,
        throughput_target=TARGET_JOURNAL_RATIO,
        latency=costs,
        journal_entries=throughput.journal_entries,
        journal_records=throughput.journal_records,
        journal_bytes=throughput.journal_bytes,
        bytes_per_input=throughput.journal_bytes_per_entry,
        burst_bytes_per_signal=throughput.burst_journal_bytes_per_signal,
        burst_entries_per_record=throughput.burst_entries_per_record,
        service_cpu_s=throughput.service_cpu_s,
        snapshotter_cpu_s=throughput.snapshotter_cpu_s,
        no_journal_service_cpu_s=no_journal.service_cpu_s,
    )


def evaluate_targets(
    config: ServiceBenchConfig,
    throughput: ThroughputResult,
    pipe: PipeResult,
    *,
    latency: Sequence[LatencyResult],
    hops: Sequence[HopResult],
    rss: RssResult,
    throughput_no_journal: ThroughputResult | None = None,
) -> list[Target]:
    """DESIGN.md's service targets against this run (a run with a wrong count never meets),
    and the journal's cost when the run measured the service without it too."""
    r = compute_ratios(config, throughput, pipe, latency, hops)
    targets = [
        Target(
            "signals/s end to end: service / bare consume->decode->produce pipe",
            f"**{r.throughput_ratio:.2f}x** ({r.service_signals_per_s / 1e3:.1f} k/s / "
            f"{r.pipe_signals_per_s / 1e3:.1f} k/s)",
            f">= {r.throughput_target:g}x",
            _exact(throughput) and _exact(pipe) and r.throughput_ratio >= r.throughput_target,
        )
    ]
    if throughput_no_journal is not None:
        ratio = throughput.signals_per_s / throughput_no_journal.signals_per_s
        targets.append(
            Target(
                "signals/s end to end: service with the journal / without it "
                "(PURGATORY_JOURNAL=false)",
                f"**{ratio:.2f}x** ({throughput.signals_per_s / 1e3:.1f} k/s / "
                f"{throughput_no_journal.signals_per_s / 1e3:.1f} k/s)",
                f">= {TARGET_JOURNAL_RATIO:g}x",
                _exact(throughput)
                and _exact(throughput_no_journal)
                and ratio >= TARGET_JOURNAL_RATIO,
            )
        )
    lat, hop = _reference(config, latency, hops)
    if lat is not None and hop is not None and r.p99_ratio is not None:
        targets.append(
            Target(
                f"p99 at {r.rate_per_s / 1e3:g} k/s: service signal-to-callback / bare hop "
                f"(linger {hop.linger_ms} ms -> fetch wait {hop.fetch_max_wait_ms} ms)",
                f"**{r.p99_ratio:.2f}x** ({_ms(lat.p99_ms)} ms / {_ms(hop.p99_ms)} ms)",
                f"<= {r.p99_target:g}x",
                _exact(lat) and _exact(hop) and r.p99_ratio <= r.p99_target,
            )
        )
    targets.append(
        Target(
            f"RSS with {_count(rss.pending)} pending operations",
            f"{rss.rss_after_bytes / _MIB:,.0f} MiB",
            "<= 1024 MiB (with 1M)",
            rss.rss_after_bytes <= TARGET_RSS_BYTES,
        )
    )
    return targets


def _count(value: int) -> str:
    if value >= 1_000_000 and value % 1_000_000 == 0:
        return f"{value // 1_000_000}M"
    if value >= 1_000 and value % 1_000 == 0:
        return f"{value // 1_000}k"
    return str(value)


def _ok(exact: bool) -> str:
    return "ok" if exact else "MISMATCH"


def _us(cpu_s: float, count: int) -> str:
    return f"{cpu_s / max(count, 1) * 1e6:.0f}"


def _ms(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _measurement_rows(report: BrokerReport, cfg: ServiceBenchConfig) -> list[tuple[str, ...]]:
    """One broker's measurements: (measurement, result, CPU s during it, checks)."""
    t, pipe, rss, h = report.throughput, report.pipe, report.rss, report.http
    rows: list[tuple[str, ...]] = [
        (
            f"1. signals through the broker: {_count(t.signals)} signals produced as fast as "
            "kafka-python sends (the service as configured by default: with the journal)",
            f"**{t.signals_per_s / 1e3:.1f} k signals/s**, **{_us(t.service_cpu_s, t.signals)} "
            f"µs CPU per signal** ({t.end_to_end_s:.2f} s first send to last callback; the "
            f"producer alone: {t.producer_per_s / 1e3:.1f} k/s)",
            f"service {t.service_cpu_s:.1f} + snapshotter {t.snapshotter_cpu_s:.1f}, "
            f"broker {t.broker_cpu_s:.1f}, load gen {t.loadgen_cpu_s:.1f}",
            _ok(_exact(t)),
        ),
        (
            f"1'. baseline, no service: the same {_count(pipe.signals)} signals through a bare "
            "kafka-python consume -> decode_signal -> encode_callback -> produce pipe (one "
            f"process, tuned for throughput: max_poll_records={cfg.pipe_max_poll_records}, "
            f"fetch_max_wait_ms={cfg.pipe_fetch_max_wait_ms}, linger_ms={cfg.pipe_linger_ms}, "
            f"batch_size={cfg.pipe_batch_bytes // 1024} KiB)",
            f"**{pipe.signals_per_s / 1e3:.1f} k signals/s**, "
            f"**{_us(pipe.pipe_cpu_s, pipe.signals)} µs CPU per signal** "
            f"({pipe.end_to_end_s:.2f} s first send to last output; the producer alone: "
            f"{pipe.producer_per_s / 1e3:.1f} k/s)",
            f"pipe {pipe.pipe_cpu_s:.1f}, broker {pipe.broker_cpu_s:.1f}, "
            f"load gen {pipe.loadgen_cpu_s:.1f}",
            _ok(_exact(pipe)),
        ),
    ]
    nj = report.throughput_no_journal
    if nj is not None:
        rows.append(
            (
                f"1''. the same {_count(nj.signals)} signals through the service without the "
                "journal (PURGATORY_JOURNAL=false: no journal, restore or snapshotter)",
                f"**{nj.signals_per_s / 1e3:.1f} k signals/s** ({nj.end_to_end_s:.2f} s first "
                f"send to last callback; the producer alone: {nj.producer_per_s / 1e3:.1f} k/s)",
                f"service {nj.service_cpu_s:.1f}, broker {nj.broker_cpu_s:.1f}, "
                f"load gen {nj.loadgen_cpu_s:.1f}",
                _ok(_exact(nj)),
            )
        )
    for lat in [*report.latency, *report.latency_no_journal]:
        number, how, snapshotter = "2.", "with the journal", ""
        if lat.journal:
            snapshotter = f" + snapshotter {lat.snapshotter_cpu_s:.1f}"
        else:
            number, how = "2''.", "without the journal"
        rows.append(
            (
                f"{number} signal-to-callback at {lat.rate_per_s / 1e3:g} k signals/s for "
                f"{lat.duration_s:g} s, {how} ({_count(lat.signals)} signals, sent at "
                f"{lat.achieved_per_s / 1e3:.2f} k/s)",
                f"p50 {_ms(lat.p50_ms)} / p90 {_ms(lat.p90_ms)} / **p99 {_ms(lat.p99_ms)}** / "
                f"max {_ms(lat.max_ms)} ms; sent -> decided p50/p99 "
                f"{_ms(lat.to_decision_ms[0])} / {_ms(lat.to_decision_ms[1])}, decided -> read "
                f"{_ms(lat.after_decision_ms[0])} / {_ms(lat.after_decision_ms[1])} ms",
                f"service {lat.service_cpu_s:.1f}{snapshotter}, broker {lat.broker_cpu_s:.1f}",
                _ok(_exact(lat)),
            )
        )
    for hop in report.hops:
        rows.append(
            (
                f"2'. baseline, no service: one hop producer (linger_ms={hop.linger_ms}) -> "
                f"broker -> consumer (fetch_max_wait_ms={hop.fetch_max_wait_ms}) at "
                f"{hop.rate_per_s / 1e3:g} k/s ({_count(hop.records)} records)",
                f"p50 {_ms(hop.p50_ms)} / p90 {_ms(hop.p90_ms)} / **p99 {_ms(hop.p99_ms)}** / "
                f"max {_ms(hop.max_ms)} ms",
                "",
                _ok(_exact(hop)),
            )
        )
    rows += [
        (
            f"3. RSS with {_count(rss.pending)} pending operations (1 key each, far deadline)",
            f"**{rss.rss_after_bytes / _MIB:,.0f} MiB** (before: {rss.rss_before_bytes / _MIB:.0f}"
            f" MiB; {rss.bytes_per_op:,.0f} B per pending op; registered at "
            f"{rss.registrations_per_s / 1e3:.1f} k/s in batches of "
            f"{_count(cfg.rss_batch)})",
            "",
            "ok",
        ),
        (
            f"4a. HTTP: {_count(h.single_requests)} sequential POST /v1/operations, keep-alive",
            f"**{h.single_per_s:,.0f} req/s** ({h.single_s * 1e3 / h.single_requests:.2f} ms each)",
            "",
            "ok",
        ),
        (
            f"4b. HTTP: {_count(h.batched_ops)} ops via /v1/operations:batch, batches of "
            f"{_count(h.batch_size)}",
            f"**{h.batched_ops_per_s / 1e3:.1f} k ops/s**",
            f"service {h.service_cpu_s:.1f} (4a + 4b)",
            "ok",
        ),
    ]
    return rows


def _checks(report: BrokerReport) -> bool:
    """Whether every run on this broker measured what it says (see :func:`_exact`)."""
    runs: list[ThroughputResult | PipeResult | LatencyResult | HopResult] = [
        report.throughput,
        report.pipe,
        *report.latency,
        *report.latency_no_journal,
        *report.hops,
    ]
    if report.throughput_no_journal is not None:
        runs.append(report.throughput_no_journal)
    return all(_exact(r) for r in runs)


def _summary(brokers: Sequence[BrokerReport]) -> list[str]:
    """The brokers' headline figures and DESIGN.md's ratios side by side, one column each;
    every ratio is to the baselines measured on the same broker."""
    first = brokers[0]
    rows: list[tuple[str, list[str]]] = [
        (
            f"1. signals/s, the service ({_count(first.throughput.signals)} signals, journal)",
            [f"{b.throughput.signals_per_s / 1e3:.1f} k/s" for b in brokers],
        ),
        (
            "1'. signals/s, the bare consume -> decode -> produce pipe",
            [f"{b.pipe.signals_per_s / 1e3:.1f} k/s" for b in brokers],
        ),
    ]
    if first.throughput_no_journal is not None:
        rows.append(
            (
                "1''. signals/s, the service without the journal",
                [
                    "-" if nj is None else f"{nj.signals_per_s / 1e3:.1f} k/s"
                    for nj in (b.throughput_no_journal for b in brokers)
                ],
            )
        )
    rows.append(
        (
            "CPU s during 1: service (+ snapshotter) / broker",
            [
                f"{t.service_cpu_s:.1f} (+ {t.snapshotter_cpu_s:.1f}) / {t.broker_cpu_s:.1f}"
                for t in (b.throughput for b in brokers)
            ],
        )
    )
    for index, lat in enumerate(first.latency):
        rows.append(
            (
                f"2. p50 / p99 at {lat.rate_per_s / 1e3:g} k/s, the service (journal)",
                [_p50_p99(b.latency, index) for b in brokers],
            )
        )
    for index, lat in enumerate(first.latency_no_journal):
        rows.append(
            (
                f"2''. p50 / p99 at {lat.rate_per_s / 1e3:g} k/s, without the journal",
                [_p50_p99(b.latency_no_journal, index) for b in brokers],
            )
        )
    for index, hop in enumerate(first.hops):
        rows.append(
            (
                f"2'. p50 / p99 at {hop.rate_per_s / 1e3:g} k/s, one bare hop (linger "
                f"{hop.linger_ms} ms -> fetch wait {hop.fetch_max_wait_ms} ms)",
                [_p50_p99(b.hops, index) for b in brokers],
            )
        )
    rows += [
        (
            f"3. RSS with {_count(first.rss.pending)} pending operations",
            [f"{b.rss.rss_after_bytes / _MIB:,.0f} MiB" for b in brokers],
        ),
        (
            "4. HTTP: single POST req/s; batched k ops/s",
            [
                f"{b.http.single_per_s:,.0f}; {b.http.batched_ops_per_s / 1e3:.1f} k"
                for b in brokers
            ],
        ),
    ]
    if first.durability is not None:
        rows.append(
            (
                "journal bytes per input (measurement 1)",
                [
                    "-" if d is None else f"{d.bytes_per_input:,.0f} B"
                    for d in (b.durability for b in brokers)
                ],
            )
        )
    for index, target in enumerate(first.targets):
        rows.append(
            (
                f"target: {target.name} ({target.required})",
                [_target_cell(b.targets, index) for b in brokers],
            )
        )
    rows.append(
        ("every signal one callback, every record once", [_ok(_checks(b)) for b in brokers])
    )
    titles = [BROKER_TITLES.get(b.broker, b.broker) for b in brokers]
    return [
        f"| figure (each broker beside its own baselines) | {' | '.join(titles)} |",
        "|---|" + "---:|" * len(brokers),
        *(f"| {label} | {' | '.join(cells)} |" for label, cells in rows),
        "",
    ]


def _p50_p99(results: Sequence[LatencyResult] | Sequence[HopResult], index: int) -> str:
    if index >= len(results):
        return "-"
    r = results[index]
    return f"{_ms(r.p50_ms)} / {_ms(r.p99_ms)} ms"


def _target_cell(targets: Sequence[Target], index: int) -> str:
    if index >= len(targets):
        return "-"
    t = targets[index]
    return f"{t.measured}, {'met' if t.met else '**NOT met**'}"


def render(report: ServiceReport, command: str, *, heading: str = "##") -> str:
    """The report as markdown: machine, command, the brokers side by side (when more than
    one), then one section per broker (``heading`` is its level): figures, the ratios to its
    own baselines, the cost of durability."""
    m, cfg = report.machine, report.config
    names = [BROKER_TITLES.get(b.broker, b.broker) for b in report.brokers]
    lines = [
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['implementation']} {m['python']}, "
        f"{m['platform']}. The broker, the service or a baseline (a process of its own) and the "
        "load generator (this process, plus a reader process) share these CPUs, over loopback. "
        f"Brokers, one at a time in this order: {', '.join(names)}; each is stopped before the "
        "next starts.",
        "",
        f"Command: `{command}`",
        "",
    ]
    if len(report.brokers) > 1:
        lines += [f"{heading} The brokers side by side", "", *_summary(report.brokers)]
    for broker in report.brokers:
        title = BROKER_TITLES.get(broker.broker, broker.broker)
        details = _BROKER_DETAILS.get(broker.broker)
        lines += [
            f"{heading} On {title}" + (f" ({details})" if details else ""),
            "",
            "| measurement | result | CPU s during it | checks |",
            "|---|---|---|:---:|",
            *(f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _measurement_rows(broker, cfg)),
            "",
            f"| target (DESIGN.md: the service beside its baselines on {title}) | measured | "
            "required | met |",
            "|---|---:|---:|:---:|",
            *(
                f"| {x.name} | {x.measured} | {x.required} | {'yes' if x.met else 'NO'} |"
                for x in broker.targets
            ),
            "",
            *_render_durability(broker),
        ]
    return "\n".join(lines).rstrip("\n")


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base > 0 else "-"


def _render_durability(report: BrokerReport) -> list[str]:
    """The journal beside the service without it (nothing when the run did not measure it)."""
    d = report.durability
    if d is None:
        return []
    rows = [
        (
            "signals/s (measurement 1)",
            f"{d.signals_per_s / 1e3:.1f} k/s",
            f"{d.no_journal_signals_per_s / 1e3:.1f} k/s",
            f"**{d.throughput_ratio:.2f}x**",
        ),
        (
            "CPU s of the service during 1 (less noisy than signals/s on a shared machine)",
            f"{d.service_cpu_s:.2f} + snapshotter {d.snapshotter_cpu_s:.2f}",
            f"{d.no_journal_service_cpu_s:.2f}",
            f"{_ratio(d.service_cpu_s, d.no_journal_service_cpu_s)} (serve alone), "
            f"{_ratio(d.service_cpu_s + d.snapshotter_cpu_s, d.no_journal_service_cpu_s)} "
            "(with the snapshotter)",
        ),
    ]
    for c in d.latency:
        rate = f"{c.rate_per_s / 1e3:g} k/s"
        rows += [
            (
                f"p50 at {rate} (measurement 2)",
                f"{_ms(c.p50_ms)} ms",
                f"{_ms(c.no_journal_p50_ms)} ms",
                f"{c.p50_added_ms:+,.1f} ms",
            ),
            (
                f"p99 at {rate} (measurement 2)",
                f"{_ms(c.p99_ms)} ms",
                f"{_ms(c.no_journal_p99_ms)} ms",
                f"**{c.p99_added_ms:+,.1f} ms**",
            ),
        ]
    rows.append(
        (
            "journal written by measurement 1 (/metrics: purgatory_journal_*_total)",
            f"**{d.bytes_per_input:,.0f} B per input** ({d.journal_entries:,} inputs in "
            f"{d.journal_records:,} records, {d.journal_bytes / _MIB:,.2f} MiB); the signal "
            f"burst alone: {d.burst_bytes_per_signal:,.0f} B per signal, "
            f"{d.burst_entries_per_record:,.1f} inputs per record",
            "none",
            "",
        )
    )
    return [
        "| the cost of durability (the same run, the same broker) | with the journal (default) | "
        "without (PURGATORY_JOURNAL=false) | with / without |",
        "|---|---:|---:|---:|",
        *(f"| {a} | {b} | {c} | {e} |" for a, b, c, e in rows),
        "",
    ]


def _on_main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _prefixed(say: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    return lambda message: say(f"{prefix}: {message}")


def brokers_of(choice: str) -> tuple[str, ...]:
    """The brokers ``--broker`` names: one of :data:`BROKERS`, or ``both`` (all, in order).

    Raises:
        ValueError: ``choice`` is not one of :data:`BROKER_CHOICES`.
    """
    if choice == "both":
        return BROKERS
    if choice in BROKERS:
        return (choice,)
    raise ValueError(f"--broker: one of {', '.join(BROKER_CHOICES)}, got {choice!r}")


def run_service_benchmarks(
    config: ServiceBenchConfig,
    *,
    progress: Callable[[str], None] | None = None,
    brokers: Sequence[str] = BROKERS,
    running: Mapping[str, Broker] | None = None,
) -> ServiceReport:
    """Run every measurement of ``config`` and its baselines on each broker of ``brokers``
    (names of :data:`BROKERS`; run in that tuple's order, Kafka first), one broker at a time.

    A broker in ``running`` (by name: a test session's, say) is used as it is; any other is
    started here (:func:`~purgatory.devtools.dev_broker.open_dev_broker`, tied to this process
    when called from the main thread) for its half alone and stopped before the next starts.

    Raises:
        ValueError: ``brokers`` is empty or names an unknown broker.
        DevBrokerError: a broker did not start (for Kafka: no Java, or no jars: ``make kafka``).
    """
    if not brokers or not set(brokers) <= set(BROKERS):
        raise ValueError(f"brokers: some of {', '.join(BROKERS)}, got {list(brokers)!r}")
    say = progress or (lambda _message: None)
    reports = []
    for name in (b for b in BROKERS if b in brokers):
        with contextlib.ExitStack() as stack:
            broker = (running or {}).get(name)
            if broker is None:
                say(f"{name}: starting {BROKER_TITLES[name]}")
                broker = stack.enter_context(
                    open_dev_broker(name, die_with_parent=_on_main_thread())
                )
            reports.append(
                run_broker_benchmarks(config, broker, name, progress=_prefixed(say, name))
            )
    return ServiceReport(machine=machine_info(), config=config, brokers=reports)


def run_broker_benchmarks(
    config: ServiceBenchConfig,
    broker: Broker,
    name: str,
    *,
    progress: Callable[[str], None] | None = None,
) -> BrokerReport:
    """Run every measurement of ``config`` and its baselines on ``broker`` (running; ``name``
    labels the results)."""
    say = progress or (lambda _message: None)
    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp:
        log_dir = Path(tmp)
        common: dict[str, Any] = {
            "partitions": config.partitions,
            "scopes": config.scopes,
            "log_dir": log_dir,
        }
        say(f"signals through the broker: {config.throughput_signals} signals (journal)")
        throughput = bench_throughput(
            broker, config.throughput_signals, register_batch=config.register_batch, **common
        )
        say(f"signals through the broker: {config.throughput_signals} signals (no journal)")
        throughput_no_journal = bench_throughput(
            broker,
            config.throughput_signals,
            register_batch=config.register_batch,
            journal=False,
            **common,
        )
        say(f"baseline: the same {config.throughput_signals} signals through a bare pipe")
        pipe = bench_pipe(
            broker,
            config.throughput_signals,
            partitions=config.partitions,
            scopes=config.scopes,
            fetch_max_wait_ms=config.pipe_fetch_max_wait_ms,
            max_poll_records=config.pipe_max_poll_records,
            linger_ms=config.pipe_linger_ms,
            batch_bytes=config.pipe_batch_bytes,
        )
        latency: list[LatencyResult] = []
        latency_no_journal: list[LatencyResult] = []
        for rate in config.latency_rates_per_s:
            for journal, results in ((True, latency), (False, latency_no_journal)):
                say(
                    f"latency: {rate} signals/s for {config.latency_duration_s} s "
                    f"({'journal' if journal else 'no journal'})"
                )
                results.append(
                    bench_latency(
                        broker,
                        rate,
                        config.latency_duration_s,
                        register_batch=config.register_batch,
                        journal=journal,
                        linger_ms=config.hops[0][0],
                        fetch_max_wait_ms=config.hops[0][1],
                        **common,
                    )
                )
        hops = []
        for linger_ms, wait_ms in config.hops:
            rate = config.hop_rate_per_s
            say(
                f"baseline: one hop at {rate}/s, linger_ms={linger_ms}, fetch_max_wait_ms={wait_ms}"
            )
            hops.append(
                bench_kafka_hop(
                    broker,
                    rate,
                    config.hop_duration_s,
                    linger_ms=linger_ms,
                    fetch_max_wait_ms=wait_ms,
                    partitions=config.partitions,
                    scopes=config.scopes,
                )
            )
        say(f"RSS with {config.rss_pending} pending operations")
        rss = bench_rss(broker, config.rss_pending, batch=config.rss_batch, **common)
        say("HTTP registrations")
        http = bench_http(
            broker, config.http_single, config.http_batched_ops, batch=config.http_batch, **common
        )
    return BrokerReport(
        broker=name,
        throughput=throughput,
        pipe=pipe,
        latency=latency,
        hops=hops,
        rss=rss,
        http=http,
        ratios=compute_ratios(config, throughput, pipe, latency, hops),
        targets=evaluate_targets(
            config,
            throughput,
            pipe,
            latency=latency,
            hops=hops,
            rss=rss,
            throughput_no_journal=throughput_no_journal,
        ),
        throughput_no_journal=throughput_no_journal,
        latency_no_journal=latency_no_journal,
        durability=compute_durability(
            throughput, throughput_no_journal, latency, latency_no_journal
        ),
    )


def write_json(report: ServiceReport, path: Path, command: str) -> None:
    """Write the report (with the command and the units) as JSON: the machine and the sizes
    once, then ``brokers``, each broker's results by name, in the order they ran."""
    payload: dict[str, Any] = {
        "command": command,
        "machine": report.machine,
        "config": asdict(report.config),
        "brokers": {
            b.broker: {k: v for k, v in asdict(b).items() if k != "broker"} for b in report.brokers
        },
    }
    payload["units"] = {
        "brokers": "kafka: Apache Kafka (one KRaft node, a JVM); tansu: the embedded Tansu; "
        "each measured alone, in this order, with its own baselines and ratios",
        "seconds": "wall seconds (time.perf_counter) unless named cpu",
        "cpu_s": "user + system CPU seconds of the process, from /proc/<pid>/stat",
        "broker_cpu_s": "CPU seconds of the broker's process (Kafka's JVM, or Tansu)",
        "latency_ms": "callback arrival in the consumer minus the signal's send time",
        "rss": "VmRSS of the service process, bytes",
        "ratios": "service figure / baseline figure of the same run on the same broker "
        "(see DESIGN.md's targets)",
        "journal": "throughput and latency are the journaled service (the default); "
        "*_no_journal the same runs with PURGATORY_JOURNAL=false",
        "journal_bytes": "purgatory_journal_bytes_total from the service's /metrics, bytes",
        "bytes_per_input": "journal bytes / journal entries (inputs journaled: registrations, "
        "signals, clock advances, ...)",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.benchmarks.bench_service [--quick] [--broker B] [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_service",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick", action="store_true", help="tiny sizes (about a minute per broker)"
    )
    parser.add_argument(
        "--broker",
        choices=BROKER_CHOICES,
        default="both",
        help="the broker(s) to measure on: Apache Kafka, Tansu, or both, Kafka first (default)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs"), help="output directory")
    args = parser.parse_args(argv)
    command = " ".join(
        ["python -m tests.benchmarks.bench_service", *(argv if argv is not None else sys.argv[1:])]
    )

    def progress(message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)

    with quiet_kafka_warnings():
        report = run_service_benchmarks(
            QUICK if args.quick else FULL, progress=progress, brokers=brokers_of(args.broker)
        )
    print(render(report, command))
    out = args.out / "bench-service.json"
    write_json(report, out, command)
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
