"""What a restart of the service costs, measured from outside (harness).

``python -m tests.benchmarks.bench_restart [--broker kafka|tansu|both] [--pending N] [--out DIR]``
runs, on each broker in turn (Apache Kafka first, then Tansu, each alone, started as
:mod:`tests.benchmarks.bench_service` starts them), the service as its own process the way
:class:`~tests.benchmarks.bench_service.ServiceProcess` configures it: its defaults (journal on,
``serve`` with its snapshotter child, snapshots every 60 s, log level ``info``, which writes no
event per operation), topics of its own with :data:`PARTITIONS` partitions and **static
assignment** of all of them (``PURGATORY_KAFKA_STATIC_PARTITIONS=0,1``: no consumer group to
join). :class:`~tests.benchmarks.bench_service.ServiceProcess` starts the child in this process's
session and waits on ``/readyz`` every 250 ms; a restart needs the same child in a session of its
own, on the same port, its exec time, and finer waits, so :class:`ServiceLauncher` starts it with
the same environment.

1. **Memory and registrations.** A warm-up batch (``--warmup``, scope ``warmup``), then ``VmRSS``
   of ``serve``; ``N`` operations registered through ``/v1/operations:batch`` in batches of
   10,000 (:func:`~tests.benchmarks.bench_service.register_range`: 64 scopes, one key each, a
   deadline an hour away); ``VmRSS`` again: bytes per pending operation = the growth / ``N``.
2. **A snapshot that covers them.** Waits until the snapshotter has logged, for every partition,
   a ``snapshot_written`` whose ``pending`` add up to every operation registered (the service's
   own gauges, ``purgatory_snapshot_*``, are looked at only every 30 s, so they are recorded, not
   waited on). Then the changelog records after each partition's latest snapshot are counted
   exactly (:class:`~purgatory.service.snapshots.snapshot_watch.SnapshotWatch`, this process's
   own, reading the topics as the service's does): what the restore will replay.
3. **SIGKILL and restart.** ``serve``'s process group and its snapshotter (a session of its own,
   so it is killed by its pid) get SIGKILL at the same instant; once both are gone, ``serve``
   starts again with the same settings and port. From the SIGKILL and from the new process's
   exec (``Popen`` returns after ``execve``): the first HTTP answer on the port (``/readyz``,
   polled every 50 ms), each partition first ``serving`` in ``/readyz``, and ``/readyz`` 200.
   Then ``purgatory_partition_restore_seconds`` / ``_records`` and ``VmRSS``, and
   ``purgatory_pending_operations``, which must equal ``N`` plus the warm-up.
4. **SIGTERM and restart.** ``serve`` gets SIGTERM; the seconds until it and its snapshotter
   have exited (and, from its log, until ``service_stopping``, ``service_stopped``,
   ``service_closed`` and ``snapshotter_stopped``), then the same start and waits as in 3.
5. **Where a restart's seconds go**, from each start's structured log (timestamps relative to the
   exec): the first line, ``snapshotter_started``, ``partition_restoring`` and
   ``partition_serving`` (``restore_s``, records, snapshot pending) per partition,
   ``service_ready``, and the restarted snapshotter's own ``standby_restored``, which rebuilds
   the same operations beside the service. The log does not split a restore into the snapshot's
   fetch, the rebuild and the journal's tail (``Progress`` holds them; no event carries them),
   so, after the service stopped, this process runs the same
   :func:`~purgatory.service.journal.restore.restore_partition` on the same topics, one
   partition at a time (in parallel, one's rebuild holds the event loop and the other's fetch
   would count it), and reports its ``fetch_s``, ``rebuild_s`` and ``tail_s``. Beside
   them: the interpreter and the imports ``serve`` pays before its first line
   (``python -c 'import purgatory.service.cli'``, the median of 3).

Every wait is bounded and says what it waited for when it runs out. Times are wall seconds
(``time.perf_counter``; log timestamps are the wall clock, set against ``time.time()`` read at
the exec). The report is a markdown table with the machine and the command, and
``DIR/bench-restart.json`` (``DIR`` defaults to ``docs``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import trio

import purgatory
from purgatory.devtools.broker import Broker, free_port
from purgatory.devtools.dev_broker import open_dev_broker
from purgatory.service.app import topics_of
from purgatory.service.journal.restore import Progress, restore_partition
from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.reader import KafkaLogReader
from purgatory.service.snapshots.snapshot_watch import SnapshotWatch
from purgatory.service.telemetry.stats import SnapshotStatus
from tests.benchmarks._measure import machine_info, quiet_kafka_warnings
from tests.benchmarks.bench_service import (
    BROKER_CHOICES,
    BROKER_TITLES,
    BROKERS,
    ServiceProcess,
    alive,
    brokers_of,
    child_pids,
    process_cpu_s,
    process_rss_bytes,
    register_range,
)

__all__ = [
    "PARTITIONS",
    "BrokerRestart",
    "LogTimeline",
    "ReadyTimes",
    "RestartBenchConfig",
    "RestartResult",
    "ServiceLauncher",
    "Started",
    "import_seconds",
    "journal_after_snapshots",
    "main",
    "metric_samples",
    "parse_log",
    "read_events",
    "render",
    "restore_in_harness",
    "run_broker",
    "scrape",
    "source_revision",
    "wait_logged",
    "wait_ready",
    "wait_snapshot_covering",
    "write_json",
]

#: Input partitions, as :mod:`tests.benchmarks.bench_service` runs the service: static, all held.
PARTITIONS = 2
_WARMUP_SCOPE = "warmup"
_HTTP_TIMEOUT_S = 300.0  # a registration batch
_POLL_TIMEOUT = httpx.Timeout(10.0, connect=0.5)  # a /readyz while a restore holds the loop
_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class RestartBenchConfig:
    """Sizes and bounds of one run (seconds are the longest each wait may take)."""

    pending: int = 1_000_000
    scopes: int = 64
    batch: int = 10_000
    warmup: int = 10_000
    partitions: int = PARTITIONS
    poll_s: float = 0.05
    first_ready_s: float = 120.0
    snapshot_s: float = 420.0
    kill_s: float = 15.0
    stop_s: float = 90.0
    restart_s: float = 600.0


# -- the process --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    """One start of ``serve``: its process, when it was spawned and exec'd, where it logs."""

    popen: subprocess.Popen[bytes]
    spawn_s: float  # perf_counter before Popen
    exec_s: float  # perf_counter once Popen returned (the child has exec'd)
    exec_wall_s: float  # time.time() at exec_s, to place the log's timestamps
    log_path: Path

    @property
    def pid(self) -> int:
        """``serve``'s process id (and its process group's)."""
        return self.popen.pid


class ServiceLauncher:
    """Starts ``purgatory serve`` as :func:`purgatory.devtools.child.service_process` does (the
    same environment: the service's settings, the broker, static partitions, loopback), but in
    a session of its own so that its process group can be killed, on one port for every start,
    with a log per start.

    Args:
        service: the settings and topics (its :meth:`ServiceProcess.environment`), log level
            ``info`` (the service's default) instead of its ``warning``.
        log_dir: where each start's output goes (``<label>.log``).
    """

    def __init__(self, service: ServiceProcess, log_dir: Path) -> None:
        self.service = service
        self.log_dir = log_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        partitions = ",".join(str(p) for p in range(service.partitions))
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")},
            **service.environment(),
            "PURGATORY_LOG_LEVEL": "info",
            "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": service.broker.bootstrap_servers,
            "PURGATORY_KAFKA_STATIC_PARTITIONS": partitions,
            "PURGATORY_HTTP_HOST": "127.0.0.1",
            "PURGATORY_HTTP_PORT": str(self.port),
        }
        self.running: Started | None = None

    def start(self, label: str) -> Started:
        """Start ``serve`` (the caller waits for what it needs)."""
        log_path = self.log_dir / f"{label}.log"
        command = [sys.executable, "-m", "purgatory.service.cli", "serve"]
        with log_path.open("wb") as log:
            spawn_s = time.perf_counter()
            popen = subprocess.Popen(
                command,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            exec_s, exec_wall_s = time.perf_counter(), time.time()
        self.running = Started(popen, spawn_s, exec_s, exec_wall_s, log_path)
        return self.running

    def snapshotters(self) -> list[int]:
        """The running ``serve``'s children: its snapshotter."""
        return [] if self.running is None else child_pids(self.running.pid)

    def kill(self, bound_s: float) -> float:
        """SIGKILL ``serve``'s process group and its snapshotter at once; wait until both are
        gone. Returns ``perf_counter`` at the kill.

        Raises:
            RuntimeError: a process outlived ``bound_s``.
        """
        started = self._take()
        snapshotters = child_pids(started.pid)
        killed_s = time.perf_counter()
        os.killpg(started.pid, signal.SIGKILL)
        for pid in snapshotters:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_gone(started, snapshotters, killed_s + bound_s, "SIGKILL")
        return killed_s

    def terminate(self, bound_s: float) -> tuple[float, float, dict[str, float]]:
        """SIGTERM to ``serve`` (it stops its snapshotter); wait until both exited. Returns
        ``perf_counter`` at the signal, the seconds until both were gone, and the seconds from
        the signal to each of the stop's events in the log.

        Raises:
            RuntimeError: a process outlived ``bound_s`` (both are killed then).
        """
        started = self._take()
        snapshotters = child_pids(started.pid)
        sent_s, sent_wall_s = time.perf_counter(), time.time()
        started.popen.send_signal(signal.SIGTERM)
        try:
            _wait_gone(started, snapshotters, sent_s + bound_s, "SIGTERM")
        except RuntimeError:
            self.running = started
            self.close()
            raise
        gone_s = time.perf_counter() - sent_s
        stop_log = {
            str(e["event"]): round(_wall(e) - sent_wall_s, 3)
            for e in read_events(started.log_path)
            if e.get("event") in _STOP_EVENTS and _wall(e) >= sent_wall_s
        }
        return sent_s, gone_s, stop_log

    def close(self) -> None:
        """Kill whatever still runs (leaving on an error); idempotent."""
        if self.running is None:
            return
        with contextlib.suppress(RuntimeError, ProcessLookupError):
            self.kill(10.0)

    def _take(self) -> Started:
        started, self.running = self.running, None
        if started is None:
            raise RuntimeError("the service is not running")
        return started


#: A graceful stop's events, in their order.
_STOP_EVENTS = ("service_stopping", "service_stopped", "service_closed", "snapshotter_stopped")


def _wait_gone(started: Started, others: Sequence[int], deadline_s: float, after: str) -> None:
    while True:
        rest = [p for p in others if alive(p)]
        if started.popen.poll() is not None and not rest:
            return
        if time.perf_counter() >= deadline_s:
            raise RuntimeError(
                f"after {after}: serve (pid {started.pid}, exit {started.popen.poll()}) or its "
                f"snapshotter {rest} still ran when the bound ran out (log: {started.log_path})"
            )
        time.sleep(0.005)


def _log_tail(path: Path) -> str:
    return path.read_bytes()[-3000:].decode(errors="replace").strip() if path.exists() else ""


# -- waiting for ready --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadyTimes:
    """Seconds from the exec of a start to what ``/readyz`` showed (``None``: never seen)."""

    first_answer_s: float
    ready_s: float
    serving_s: dict[str, float]  # partition -> first seen serving
    readyz_restore_s: dict[str, float]  # partition -> its restore_seconds in /readyz
    polls: int
    slowest_answer_s: float  # the longest /readyz took once the port answered (the loop held)


def wait_ready(
    launcher: ServiceLauncher, started: Started, bound_s: float, poll_s: float, what: str
) -> ReadyTimes:
    """Poll ``/readyz`` every ``poll_s`` until it answers 200; the times are from the exec.

    Raises:
        RuntimeError: ``serve`` exited, or ``/readyz`` was not 200 within ``bound_s`` (naming
            the last answer and the log).
    """
    deadline_s = started.exec_s + bound_s
    first: float | None = None
    serving: dict[str, float] = {}
    restore_s: dict[str, float] = {}
    last = "no answer (connection refused)"
    polls = 0
    slowest_s = 0.0
    with httpx.Client(base_url=launcher.url, timeout=_POLL_TIMEOUT) as http:
        while True:
            polls += 1
            answered_before, asked_s = first is not None, time.perf_counter()
            response: httpx.Response | None = None
            try:
                response = http.get("/readyz")
            except httpx.TransportError as exc:
                last = f"no answer ({type(exc).__name__})"
            if answered_before:
                slowest_s = max(slowest_s, time.perf_counter() - asked_s)
            if response is not None:
                now = time.perf_counter() - started.exec_s
                first = now if first is None else first
                body = response.json()
                for name, part in body.get("partitions", {}).items():
                    if part.get("state") == "serving" and name not in serving:
                        serving[name] = now
                        restore_s[name] = float(part.get("restore_seconds", 0.0))
                last = f"HTTP {response.status_code} {json.dumps(body)[:400]}"
                if response.status_code == 200:
                    return ReadyTimes(first, now, serving, restore_s, polls, round(slowest_s, 3))
            if started.popen.poll() is not None:
                raise RuntimeError(
                    f"{what}: serve exited with {started.popen.returncode} before /readyz "
                    f"answered 200:\n{_log_tail(started.log_path)}"
                )
            if time.perf_counter() >= deadline_s:
                raise RuntimeError(
                    f"{what}: /readyz of {launcher.url} was not 200 within {bound_s} s of the "
                    f"exec; last: {last} (log: {started.log_path})"
                )
            time.sleep(poll_s)


# -- metrics and the log ------------------------------------------------------------------------


def metric_samples(exposition: str, name: str) -> dict[str, float]:
    """The samples of metric ``name`` in a Prometheus text exposition, by their ``partition``
    label (``""`` without one)."""
    samples: dict[str, float] = {}
    for line in exposition.splitlines():
        if not line.startswith(name) or line[len(name) : len(name) + 1] not in ("{", " "):
            continue
        sample, _, value = line.rpartition(" ")
        label = ""
        if 'partition="' in sample:
            label = sample.split('partition="', 1)[1].split('"', 1)[0]
        samples[label] = samples.get(label, 0.0) + float(value)
    return samples


def scrape(url: str) -> str:
    """``GET /metrics``.

    Raises:
        RuntimeError: not 200.
    """
    response = httpx.get(f"{url}/metrics", timeout=30.0)
    if response.status_code != 200:
        raise RuntimeError(f"/metrics: HTTP {response.status_code}")
    return response.text


def _pending(url: str) -> int:
    return round(sum(metric_samples(scrape(url), "purgatory_pending_operations").values()))


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a start's output (the service's and its snapshotter's)."""
    events: list[dict[str, Any]] = []
    if not path.exists():
        return events
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                events.append(json.loads(line))
    return events


def _wall(event: Mapping[str, Any]) -> float:
    return datetime.fromisoformat(str(event["timestamp"]).replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True, slots=True)
class LogTimeline:
    """One start's structured log, in seconds from the exec (see the module's docstring, 5)."""

    first_line_s: float | None
    snapshotter_started_s: float | None
    service_ready_s: float | None
    restoring_s: dict[str, float]  # partition -> partition_restoring
    serving_s: dict[str, float]  # partition -> partition_serving
    serving: dict[str, dict[str, Any]]  # partition -> partition_serving's fields
    standby_restored_s: dict[str, float]  # partition -> the snapshotter's standby_restored
    warnings: list[str]


_SERVING_FIELDS = (
    "restore_s",
    "journal_records",
    "journal_entries",
    "void_records",
    "snapshot_pending",
    "pending",
    "resent",
    "overdue",
)


#: Warnings every run logs: no API token, on loopback (ServiceProcess's setting).
_EXPECTED = frozenset({"api_open"})


def parse_log(events: Sequence[Mapping[str, Any]], exec_wall_s: float) -> LogTimeline:
    """The restore's events of one start, timed from its exec."""

    def at(event: Mapping[str, Any]) -> float:
        return round(_wall(event) - exec_wall_s, 3)

    def first(name: str) -> float | None:
        return next((at(e) for e in events if e.get("event") == name), None)

    def per_partition(name: str) -> dict[str, Mapping[str, Any]]:
        found: dict[str, Mapping[str, Any]] = {}
        for e in events:
            if e.get("event") == name:
                found.setdefault(str(e.get("partition")), e)
        return found

    serving = per_partition("partition_serving")
    return LogTimeline(
        first_line_s=at(events[0]) if events else None,
        snapshotter_started_s=first("snapshotter_started"),
        service_ready_s=first("service_ready"),
        restoring_s={p: at(e) for p, e in per_partition("partition_restoring").items()},
        serving_s={p: at(e) for p, e in serving.items()},
        serving={p: {k: e.get(k) for k in _SERVING_FIELDS} for p, e in serving.items()},
        standby_restored_s={p: at(e) for p, e in per_partition("standby_restored").items()},
        warnings=[
            f"{e.get('event')}: {json.dumps(e)[:300]}"
            for e in events
            if e.get("level") in ("warning", "error", "critical")
            and e.get("event") not in _EXPECTED
        ],
    )


def _latest_snapshots(paths: Sequence[Path]) -> dict[str, Mapping[str, Any]]:
    """Each partition's latest ``snapshot_written`` across these logs."""
    latest: dict[str, Mapping[str, Any]] = {}
    for path in paths:
        for e in read_events(path):
            if e.get("event") == "snapshot_written":
                latest[str(e.get("partition"))] = e
    return latest


def wait_logged(started: Started, event: str, partitions: int, bound_s: float) -> float:
    """Wait until ``event`` was logged for each of ``partitions``; returns the seconds waited.

    Raises:
        RuntimeError: not within ``bound_s`` (naming the partitions that logged it).
    """
    began = time.perf_counter()
    while True:
        seen = {
            e.get("partition") for e in read_events(started.log_path) if e.get("event") == event
        }
        if len(seen) >= partitions:
            return time.perf_counter() - began
        if started.popen.poll() is not None:
            raise RuntimeError(f"serve exited while waiting for {event}: {started.log_path}")
        if time.perf_counter() - began >= bound_s:
            raise RuntimeError(
                f"{event} logged for partitions {sorted(map(str, seen))} only, not all "
                f"{partitions}, within {bound_s} s (log: {started.log_path})"
            )
        time.sleep(0.1)


def wait_snapshot_covering(
    started: Started, expected: int, partitions: int, bound_s: float
) -> tuple[float, dict[str, Mapping[str, Any]]]:
    """Wait until each partition's latest ``snapshot_written`` together hold ``expected``
    pending operations; returns the seconds waited and those events.

    Raises:
        RuntimeError: not within ``bound_s`` (naming the latest snapshots seen).
    """
    began = time.perf_counter()
    while True:
        latest = _latest_snapshots([started.log_path])
        covered = sum(int(e.get("pending", 0)) for e in latest.values())
        if len(latest) == partitions and covered == expected:
            return time.perf_counter() - began, latest
        if started.popen.poll() is not None:
            raise RuntimeError(f"serve exited while waiting for a snapshot: {started.log_path}")
        if time.perf_counter() - began >= bound_s:
            seen = {p: (e.get("pending"), e.get("journal_offset")) for p, e in latest.items()}
            raise RuntimeError(
                f"no snapshot covering {expected} pending operations within {bound_s} s: "
                f"latest snapshot_written per partition (pending, journal offset): {seen} "
                f"(log: {started.log_path})"
            )
        time.sleep(0.5)


def journal_after_snapshots(service: ServiceProcess) -> list[SnapshotStatus]:
    """Each partition's latest snapshot and the changelog records after it, read now from the
    topics (a :class:`SnapshotWatch` of this process, with the service's reader)."""
    s = service.settings
    reader = KafkaLogReader(KafkaClientConfig.from_settings(s))
    watch = SnapshotWatch(
        reader,
        snapshots_topic=s.topic_snapshots,
        changelog_topic=s.topic_changelog,
        partitions=list(range(service.partitions)),
        now_ms=lambda: int(time.time() * 1000),
        every_s=1.0,
    )
    trio.run(watch.look)
    return watch.statistics()


def restore_in_harness(service: ServiceProcess) -> dict[str, dict[str, float]]:
    """Every partition restored by :func:`restore_partition` in this process (no journal
    attached), one after the other: each one's phases, in seconds.

    One at a time, not in parallel as the service restores them: the rebuild runs on the event
    loop's thread, so in parallel one partition's rebuild holds the other's fetch or tail, and
    their phases would measure each other.
    """
    s = service.settings
    reader = KafkaLogReader(KafkaClientConfig.from_settings(s))
    phases: dict[str, dict[str, float]] = {}

    async def restore(partition: int) -> None:
        status = Progress(partition)
        restored = await restore_partition(
            reader,
            topic=s.topic_changelog,
            snapshots_topic=s.topic_snapshots,
            partition=partition,
            config=s.to_engine_config(),
            journal=None,
            progress=status,
        )
        phases[str(partition)] = {
            "fetch_s": round(status.fetch_s, 3),
            "rebuild_s": round(status.rebuild_s, 3),
            "tail_s": round(status.tail_s, 3),
            "seconds": round(status.seconds or 0.0, 3),
            "snapshot_bytes": status.snapshot_bytes,
            "snapshot_pending": status.snapshot_pending,
            "tail_records": status.records,
            "pending": restored.engine.statistics().pending,
        }

    for partition in range(service.partitions):
        trio.run(restore, partition)
    return phases


def source_revision() -> str:
    """The commit of the code measured (``git describe --always --dirty`` of the checkout that
    holds :mod:`purgatory`), or ``unknown``."""
    root = Path(purgatory.__file__).resolve().parent.parent
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip() or "unknown"


def import_seconds(repeats: int = 3) -> dict[str, float]:
    """Median wall seconds of a bare interpreter, and of one importing what ``serve`` runs."""

    def median(code: str) -> float:
        times = []
        for _ in range(repeats):
            began = time.perf_counter()
            subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
            times.append(time.perf_counter() - began)
        return round(statistics.median(times), 3)

    return {"python": median("pass"), "python_import_serve": median("import purgatory.service.cli")}


# -- one broker ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RestartResult:
    """One restart (after SIGKILL or SIGTERM): times from the signal and from the exec."""

    how: str
    stop_s: float  # signal -> serve and its snapshotter gone
    signal_to_exec_s: float
    signal_to_first_answer_s: float
    signal_to_ready_s: float
    exec_to_first_answer_s: float
    exec_to_ready_s: float
    exec_to_serving_s: dict[str, float]
    signal_to_serving_s: dict[str, float]
    readyz_restore_s: dict[str, float]
    slowest_readyz_s: float
    load_average: float  # the machine's 1-minute load average at the start
    metric_restore_s: dict[str, float]
    metric_restore_records: dict[str, float]
    rss_after_bytes: int
    snapshotter_rss_after_bytes: int
    cpu_s_at_ready: float
    snapshotter_cpu_s_at_ready: float
    pending_after: int
    journal_after_snapshot_records: dict[str, int]
    log: LogTimeline


@dataclass(frozen=True, slots=True)
class BrokerRestart:
    """Everything measured on one broker."""

    broker: str
    partitions: int
    static_partitions: str
    first_ready_s: float
    registered: int
    register_s: float
    registrations_per_s: float
    rss_before_bytes: int
    rss_after_bytes: int
    bytes_per_op: float
    rss_at_kill_bytes: int
    snapshotter_rss_at_kill_bytes: int
    snapshot_wait_s: float
    snapshots: dict[str, dict[str, Any]]
    service_snapshot_lag_records: dict[str, float]
    service_snapshot_age_s: dict[str, float]
    restarts: list[RestartResult]
    harness_restore: dict[str, dict[str, float]]
    sigterm_stop_log_s: dict[str, float]
    checks: dict[str, bool] = field(default_factory=dict)


def _restart(
    launcher: ServiceLauncher,
    how: str,
    *,
    signalled_s: float,
    stop_s: float,
    expected: int,
    lag: Sequence[SnapshotStatus],
    cfg: RestartBenchConfig,
) -> RestartResult:
    load = os.getloadavg()[0]
    started = launcher.start(f"after-{how.lower()}")
    times = wait_ready(launcher, started, cfg.restart_s, cfg.poll_s, f"restart after {how}")
    rss = process_rss_bytes(started.pid)
    cpu = process_cpu_s(started.pid)
    snapshotters = launcher.snapshotters()
    snap_rss = sum(process_rss_bytes(p) for p in snapshotters)
    snap_cpu = sum(process_cpu_s(p) for p in snapshotters)
    text = scrape(launcher.url)
    pending = round(sum(metric_samples(text, "purgatory_pending_operations").values()))
    if pending != expected:
        raise RuntimeError(f"after {how}: {pending} pending operations restored, not {expected}")
    # The restarted snapshotter rebuilds the same operations beside the service: let it finish
    # (its times are in the log), so that the next signal meets a settled pair.
    wait_logged(started, "standby_restored", cfg.partitions, cfg.restart_s)
    to_exec = started.exec_s - signalled_s
    return RestartResult(
        how=how,
        stop_s=round(stop_s, 3),
        signal_to_exec_s=round(to_exec, 3),
        signal_to_first_answer_s=round(to_exec + times.first_answer_s, 3),
        signal_to_ready_s=round(to_exec + times.ready_s, 3),
        exec_to_first_answer_s=round(times.first_answer_s, 3),
        exec_to_ready_s=round(times.ready_s, 3),
        exec_to_serving_s={p: round(t, 3) for p, t in times.serving_s.items()},
        signal_to_serving_s={p: round(to_exec + t, 3) for p, t in times.serving_s.items()},
        readyz_restore_s=times.readyz_restore_s,
        slowest_readyz_s=times.slowest_answer_s,
        load_average=round(load, 2),
        metric_restore_s=metric_samples(text, "purgatory_partition_restore_seconds"),
        metric_restore_records=metric_samples(text, "purgatory_partition_restore_records"),
        rss_after_bytes=rss,
        snapshotter_rss_after_bytes=snap_rss,
        cpu_s_at_ready=round(cpu, 2),
        snapshotter_cpu_s_at_ready=round(snap_cpu, 2),
        pending_after=pending,
        journal_after_snapshot_records={str(s.partition): s.lag_records for s in lag},
        log=parse_log(read_events(started.log_path), started.exec_wall_s),
    )


def run_broker(
    broker: Broker,
    name: str,
    cfg: RestartBenchConfig,
    log_dir: Path,
    say: Callable[[str], None],
) -> BrokerRestart:
    """Steps 1 to 5 of the module's docstring on ``broker`` (running)."""
    service = ServiceProcess(broker, partitions=cfg.partitions, log_dir=log_dir)
    broker.create_topics({t: cfg.partitions for t in topics_of(service.settings)})
    launcher = ServiceLauncher(service, log_dir)
    try:
        return _run(launcher, service, name, cfg, say)
    finally:
        launcher.close()


def _run(
    launcher: ServiceLauncher,
    service: ServiceProcess,
    name: str,
    cfg: RestartBenchConfig,
    say: Callable[[str], None],
) -> BrokerRestart:
    expected = cfg.warmup + cfg.pending
    say(f"starting serve (static partitions {launcher.env['PURGATORY_KAFKA_STATIC_PARTITIONS']})")
    first = launcher.start("first")
    first_ready = wait_ready(launcher, first, cfg.first_ready_s, cfg.poll_s, "first start")
    with httpx.Client(base_url=launcher.url, timeout=_HTTP_TIMEOUT_S) as http:
        register_range(http, range(cfg.warmup), batch=cfg.batch, scopes=1, prefix=_WARMUP_SCOPE)
        rss_before = process_rss_bytes(first.pid)
        say(f"registering {cfg.pending} operations")
        register_s = register_range(
            http, range(cfg.warmup, expected), batch=cfg.batch, scopes=cfg.scopes
        )
        rss_after = process_rss_bytes(first.pid)
    if (pending := _pending(launcher.url)) != expected:
        raise RuntimeError(f"{pending} pending operations after registering, not {expected}")
    say(f"registered in {register_s:.1f} s; waiting for a snapshot covering {expected}")
    waited_s, snapshots = wait_snapshot_covering(first, expected, cfg.partitions, cfg.snapshot_s)
    text = scrape(launcher.url)
    lag = journal_after_snapshots(service)
    rss_at_kill = process_rss_bytes(first.pid)
    snap_rss = sum(process_rss_bytes(p) for p in launcher.snapshotters())
    say(f"snapshot after {waited_s:.1f} s; journal after it {[s.lag_records for s in lag]}; kill")
    killed_s = launcher.kill(cfg.kill_s)
    gone_s = time.perf_counter() - killed_s
    common: dict[str, Any] = {"expected": expected, "cfg": cfg}
    restarts = [
        _restart(launcher, "SIGKILL", signalled_s=killed_s, stop_s=gone_s, lag=lag, **common)
    ]
    say(f"ready {restarts[0].signal_to_ready_s} s after SIGKILL; SIGTERM")
    lag = journal_after_snapshots(service)
    sent_s, stop_s, stop_log = launcher.terminate(cfg.stop_s)
    restarts.append(
        _restart(launcher, "SIGTERM", signalled_s=sent_s, stop_s=stop_s, lag=lag, **common)
    )
    say(f"ready {restarts[1].signal_to_ready_s} s after SIGTERM; stopping")
    launcher.terminate(cfg.stop_s)
    say("the same restore in this process, one partition at a time")
    harness = restore_in_harness(service)
    if (restored := sum(int(h["pending"]) for h in harness.values())) != expected:
        raise RuntimeError(f"the harness restored {restored} pending operations, not {expected}")
    return BrokerRestart(
        broker=name,
        partitions=cfg.partitions,
        static_partitions=launcher.env["PURGATORY_KAFKA_STATIC_PARTITIONS"],
        first_ready_s=round(first_ready.ready_s, 3),
        registered=expected,
        register_s=round(register_s, 3),
        registrations_per_s=round(cfg.pending / register_s, 1),
        rss_before_bytes=rss_before,
        rss_after_bytes=rss_after,
        bytes_per_op=round((rss_after - rss_before) / cfg.pending, 1),
        rss_at_kill_bytes=rss_at_kill,
        snapshotter_rss_at_kill_bytes=snap_rss,
        snapshot_wait_s=round(waited_s, 3),
        snapshots={
            p: {k: e.get(k) for k in ("pending", "bytes", "chunks", "journal_offset")}
            for p, e in sorted(snapshots.items())
        },
        service_snapshot_lag_records=metric_samples(text, "purgatory_snapshot_lag_records"),
        service_snapshot_age_s=metric_samples(text, "purgatory_snapshot_age_seconds"),
        restarts=restarts,
        harness_restore=harness,
        sigterm_stop_log_s=stop_log,
        checks={
            "pending_after_sigkill": restarts[0].pending_after == expected,
            "pending_after_sigterm": restarts[1].pending_after == expected,
        },
    )


# -- the report ---------------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _per_partition(values: Mapping[str, Any], fmt: Callable[[Any], str] = _s) -> str:
    return ", ".join(f"p{p} {fmt(v)}" for p, v in sorted(values.items())) or "n/a"


def _mib(value: float) -> str:
    return f"{value / _MIB:,.0f} MiB"


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f} MB"


def _rows(r: BrokerRestart) -> list[tuple[str, str]]:
    kill, term = r.restarts
    rows = [
        ("input partitions (static, all held)", f"{r.partitions} ({r.static_partitions})"),
        ("first start: exec -> /readyz 200 (empty topics)", _s(r.first_ready_s) + " s"),
        ("pending operations (incl. warm-up)", f"{r.registered:,}"),
        ("registrations/s (HTTP batches of 10k)", f"{r.registrations_per_s:,.0f}"),
        (
            "RSS of serve: before / after registering",
            f"{_mib(r.rss_before_bytes)} / {_mib(r.rss_after_bytes)}",
        ),
        ("**bytes per pending operation**", f"**{r.bytes_per_op:,.0f} B**"),
        (
            "RSS at the kill: serve / its snapshotter",
            f"{_mib(r.rss_at_kill_bytes)} / {_mib(r.snapshotter_rss_at_kill_bytes)}",
        ),
        ("wait for a snapshot covering every operation", _s(r.snapshot_wait_s) + " s"),
        (
            "snapshot bytes per partition",
            _per_partition({p: v["bytes"] for p, v in r.snapshots.items()}, _mb),
        ),
        (
            "journal records after the snapshot at the kill",
            _per_partition(kill.journal_after_snapshot_records, str),
        ),
    ]
    for res in (kill, term):
        h = res.how
        log = res.log
        if h == "SIGTERM":
            rows.append(
                (
                    "SIGTERM: log from the signal: " + " / ".join(_STOP_EVENTS),
                    " / ".join(_s(r.sigterm_stop_log_s.get(e)) for e in _STOP_EVENTS) + " s",
                )
            )
        rows += [
            (f"**{h}**: signal -> serve and snapshotter gone", _s(res.stop_s) + " s"),
            (f"{h}: signal -> exec of the new serve", _s(res.signal_to_exec_s) + " s"),
            (
                f"{h}: -> port answers (from signal / exec)",
                f"{_s(res.signal_to_first_answer_s)} / {_s(res.exec_to_first_answer_s)} s",
            ),
            (
                f"**{h}: -> /readyz 200** (from signal / exec)",
                f"**{_s(res.signal_to_ready_s)}** / {_s(res.exec_to_ready_s)} s",
            ),
            (
                f"{h}: slowest /readyz answer once the port answered",
                _s(res.slowest_readyz_s) + " s",
            ),
            (
                f"{h}: -> each partition serving (from signal)",
                _per_partition(res.signal_to_serving_s),
            ),
            (
                f"{h}: purgatory_partition_restore_seconds",
                _per_partition(res.metric_restore_s),
            ),
            (
                f"{h}: restore records (journal tail) / snapshot pending",
                _per_partition(
                    {
                        p: f"{v['journal_records']} / {v['snapshot_pending']}"
                        for p, v in log.serving.items()
                    },
                    str,
                ),
            ),
            (
                f"{h}: log from exec: first line / snapshotter_started",
                f"{_s(log.first_line_s)} / {_s(log.snapshotter_started_s)} s",
            ),
            (f"{h}: log: partition_restoring", _per_partition(log.restoring_s)),
            (f"{h}: log: partition_serving", _per_partition(log.serving_s)),
            (f"{h}: log: service_ready", _s(log.service_ready_s) + " s"),
            (f"{h}: log: snapshotter's standby_restored", _per_partition(log.standby_restored_s)),
            (
                f"{h}: RSS after the restore: serve / snapshotter",
                f"{_mib(res.rss_after_bytes)} / {_mib(res.snapshotter_rss_after_bytes)}",
            ),
            (
                f"{h}: CPU s at ready: serve / snapshotter",
                f"{res.cpu_s_at_ready:.1f} / {res.snapshotter_cpu_s_at_ready:.1f}",
            ),
            (f"{h}: pending after the restore", f"{res.pending_after:,}"),
            (f"{h}: 1-minute load average at the start", f"{res.load_average:.2f}"),
        ]
    rows += [
        (
            "restore_partition in the harness, alone: fetch / rebuild / tail",
            _per_partition(
                r.harness_restore,
                lambda v: f"{v['fetch_s']:.2f} / {v['rebuild_s']:.2f} / {v['tail_s']:.2f} s",
            ),
        ),
    ]
    return rows


def render(
    results: Sequence[BrokerRestart],
    machine: Mapping[str, Any],
    imports: Mapping[str, float],
    command: str,
) -> str:
    """The markdown report: the machine, the command, one column per broker."""
    lines = [
        f"Machine: {machine['cpus']} CPUs ({machine['cpu_model']}), Python {machine['python']}, "
        f"{machine['platform']}.",
        f"Command: `{command}` (at {source_revision()}).",
        f"Interpreter start {imports['python']:.2f} s; with serve's imports "
        f"{imports['python_import_serve']:.2f} s (median of 3).",
        "",
        "| | " + " | ".join(BROKER_TITLES[r.broker] for r in results) + " |",
        "| --- |" + " ---: |" * len(results),
    ]
    tables = [_rows(r) for r in results]
    for i, (label, _value) in enumerate(tables[0]):
        lines.append(f"| {label} | " + " | ".join(t[i][1] for t in tables) + " |")
    for r in results:
        for res in r.restarts:
            for warning in res.log.warnings:
                lines.append(f"- {BROKER_TITLES[r.broker]}, after {res.how}: {warning}")
    return "\n".join(lines)


def write_json(
    results: Sequence[BrokerRestart],
    *,
    cfg: RestartBenchConfig,
    machine: Mapping[str, Any],
    imports: Mapping[str, float],
    path: Path,
    command: str,
) -> None:
    """``bench-restart.json``: the command, the machine, the sizes, each broker's results."""
    payload = {
        "command": command,
        "revision": source_revision(),
        "machine": dict(machine),
        "config": asdict(cfg),
        "imports_s": dict(imports),
        "brokers": {
            r.broker: {k: v for k, v in asdict(r).items() if k != "broker"} for r in results
        },
        "units": {
            "*_s": "wall seconds (time.perf_counter); log times from the exec of that start",
            "*_bytes": "VmRSS, bytes",
            "journal_after_snapshot_records": "changelog records after the partition's latest "
            "snapshot manifest, read from the topics just before the signal",
            "harness_restore": "restore_partition in the harness's process after the service "
            "stopped, one partition at a time",
            "sigterm_stop_log_s": "seconds from the SIGTERM to each stop event in serve's log",
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _prefixed(say: Callable[[str], None], prefix: str) -> Callable[[str], None]:
    return lambda message: say(f"{prefix}: {message}")


@contextlib.contextmanager
def _logs(keep: Path | None) -> Iterator[Path]:
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        yield keep
        return
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        yield Path(tmp)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.benchmarks.bench_restart [--broker B] [--pending N] [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_restart",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--broker",
        choices=BROKER_CHOICES,
        default="both",
        help="the broker(s) to measure on: Apache Kafka, Tansu, or both, Kafka first (default)",
    )
    parser.add_argument(
        "--pending",
        type=int,
        default=RestartBenchConfig().pending,
        help="operations registered before the restarts (default 1,000,000; plus a warm-up)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs"), help="output directory")
    parser.add_argument("--logs", type=Path, default=None, help="keep the services' logs here")
    args = parser.parse_args(argv)
    command = " ".join(
        ["python -m tests.benchmarks.bench_restart", *(argv if argv is not None else sys.argv[1:])]
    )
    cfg = RestartBenchConfig(pending=args.pending)

    def say(message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)

    imports = import_seconds()
    results = []
    with quiet_kafka_warnings(), _logs(args.logs) as log_root:
        for name in (b for b in BROKERS if b in brokers_of(args.broker)):
            say(f"{name}: starting {BROKER_TITLES[name]}")
            log_dir = log_root / name
            log_dir.mkdir(parents=True, exist_ok=True)
            with open_dev_broker(name, die_with_parent=True) as broker:
                results.append(run_broker(broker, name, cfg, log_dir, _prefixed(say, name)))
    machine = machine_info()
    print(render(results, machine, imports, command))
    out = args.out / "bench-restart.json"
    write_json(results, cfg=cfg, machine=machine, imports=imports, path=out, command=command)
    print(f"Wrote {out}")
    return 0 if all(all(r.checks.values()) for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
