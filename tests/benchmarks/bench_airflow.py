"""Waiting in Airflow: N deferred purgatory waits against N reschedule sensors (harness).

``python -m tests.benchmarks.bench_airflow [--waits N] [--quick] [--out DIR]`` starts the
embedded broker, one ``purgatory serve`` (:func:`purgatory.devtools.child.service_process`) with
an API token, and a real Airflow (``.venv-airflow``: a SQLite database migrated in a temporary
``AIRFLOW_HOME``, the api-server's execution API, LocalExecutor), the recipe of
tests/airflow/conftest.py. Airflow is never imported here: its parts run in the Airflow
environment, as processes, from the scripts below.

1. **N deferred waits in the triggerer's shape.** ``N`` operations (one key each, an hour's
   deadline) are registered in one ``register_many``. A process of the Airflow environment
   (``AIRFLOW_CONN_PURGATORY_DEFAULT`` set, as a secrets backend would hand it over) makes ``N``
   :class:`purgatory.airflow.triggers.PurgatoryTrigger` (the real class, default ``poll_ms``
   30 s) and runs each as Airflow's triggerer does: an asyncio task awaiting
   ``anext(trigger.run())``, all in one loop. The tasks start spread evenly over one poll
   interval (triggers reach a triggerer over time; spread, every window sees the steady rate of
   long polls, not one burst). One trigger on an operation already decided runs first, so every
   module the path needs is imported before the baseline. Once all ``N`` hold a long poll, an
   idle window (60 s; 10 s with ``--quick``) measures the process's CPU seconds per second
   (``getrusage``), its RSS (before the triggers were made, at the window's end, and its peak,
   ``VmHWM``) and the HTTP requests it sent (``httpx.AsyncClient.send`` counted in the process),
   beside what the service answered on ``/v1/operation/wait`` (its Prometheus counter) and the
   service's own CPU (and, for comparison, its CPU over a window before any wait). Then all ``N``
   keys are signalled in one request from this process; the latency of each wait is the
   wall-clock moment its event was yielded minus the moment just before the signals were sent
   (one machine, one clock). Last, a fresh process measures the RSS one
   ``AsyncPurgatoryClient`` adds (each trigger's ``run()`` makes its own), to explain the memory
   per wait.
2. **N reschedule sensors poking every 30 s, per poke measured, then scaled.** A DAG of one
   ``PythonSensor`` (``mode="reschedule"``, ``poke_interval=1``; its callable is False for
   ``K`` pokes, then True, and writes each call's time to a file) and one downstream task runs
   with ``dag.test(use_executor=True)`` (tests/airflow/_run_dag.py's runner), with ``K`` (10;
   3 with ``--quick``) and with ``K = 1``, interleaved, twice each (once with ``--quick``),
   after an untimed warm-up run. Each run's CPU is everything it used: the ``dag.test`` process
   and its reaped descendants (LocalExecutor's workers and the task process each of them forks
   per attempt) from ``getrusage(RUSAGE_CHILDREN)`` here, plus the api-server's process tree
   (``/proc``). CPU per poke = (mean cpu_K - mean cpu_1) / (K - 1); the execution API requests
   per poke come the same way from the api-server's access log, which also times each poke
   (its ``PATCH .../run`` to its ``PATCH .../state``). The run's process tree is sampled every
   0.1 s for the RSS and private memory (USS, ``smaps_rollup``) of the task processes and of the
   workers that forked them. The cost of ``N`` sensors poking every 30 s is then ``N / 30``
   pokes per second times the measured cost of one poke: a product, stated as such; the memory
   is the pokes running at once (rate x a poke's duration) times a task process's and its
   worker's private memory. ``dag.test`` schedules in its own loop (a second's sleep when
   nothing is runnable), not the scheduler's, so part of the ``cpu_K - cpu_1`` difference is
   that loop's, as the scheduler's would be in production. A sensor notices data that arrived
   at a uniformly random moment of its poke interval: 15 s late on average, 30 s at worst, plus
   the measured time from the sensor's end to the downstream task's start.
3. **Last signal -> a deferred task resumed** (unless ``--no-barrier``): with Airflow's
   triggerer running too, the ``purgatory_barrier`` DAG of tests/airflow/dags runs once (from a
   copy in the temporary DAGs folder); its ``wait`` task's end minus its ``signal_events`` task's
   end.

The broker, the service, Airflow's processes and this one share the machine's CPUs. The report
is a markdown table with the machine and the command, and ``DIR/bench-airflow.json`` (``DIR``
defaults to ``docs``). A default run (N = 1,000) takes about five minutes on 2 cores; every wait
is bounded and every process started is stopped on the way out.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import os
import re
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from purgatory.client import PurgatoryClient, operation
from purgatory.devtools.broker import EmbeddedBroker
from purgatory.devtools.child import ServiceChild, own_names, service_process
from tests.airflow._harness import (
    AIRFLOW,
    PYTHON,
    ROOT,
    AirflowProcesses,
    airflow_env,
    result_of,
)
from tests.benchmarks._measure import machine_info

__all__ = [
    "FULL",
    "QUICK",
    "AirflowBenchConfig",
    "AirflowReport",
    "BarrierResult",
    "DeferredResult",
    "SensorResult",
    "main",
    "render",
    "run_airflow_benchmarks",
    "write_json",
]

BARRIER_DAGS = ROOT / "tests" / "airflow" / "dags" / "purgatory_dags.py"

_POLL_S = 30.0  # PurgatoryTrigger's default poll_ms, and the sensors' poke interval scaled to
_DEADLINE_MS = 3_600_000
_SETTLE_S = 2.0
_START_TIMEOUT_S = 120.0
_EVENTS_TIMEOUT_S = 120.0
_DAG_TIMEOUT_S = 300.0
_SAMPLE_S = 0.1
_TICK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_SENSOR_DAG_ID = "bench_reschedule_sensor"
_SENSOR_TRIES = 3


@dataclass(frozen=True, slots=True)
class AirflowBenchConfig:
    """One run's sizes: ``waits`` deferred waits held for ``idle_s``, started over ``spread_s``;
    the sensor DAG run with ``pokes`` False pokes (and with 1); the barrier DAG or not."""

    waits: int
    idle_s: float
    pokes: int
    spread_s: float = _POLL_S
    repeats: int = 2
    barrier: bool = True


FULL = AirflowBenchConfig(waits=1_000, idle_s=60.0, pokes=10)
QUICK = AirflowBenchConfig(waits=50, idle_s=10.0, pokes=3, repeats=1)


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeferredResult:
    """Part 1: ``waits`` PurgatoryTriggers in one asyncio loop."""

    waits: int
    how: str  # what ran the waits
    start_cpu_s: float  # CPU to make and start the N triggers, until all hold a long poll
    poll_ms: int
    spread_s: float
    idle_s: float
    cpu_s_per_s: float  # the triggers' process, over the idle window
    service_cpu_s_per_s: float  # the service, over the same window
    service_idle_cpu_s_per_s: float  # the service before the triggers, nobody waiting
    rss_before_mib: float  # after the imports and one warm-up trigger, before the N triggers
    rss_end_mib: float  # at the idle window's end
    rss_peak_mib: float  # VmHWM of the process
    per_wait_kib: float  # (rss_end - rss_before) / waits
    client_kib: float  # one AsyncPurgatoryClient (each trigger makes its own), measured apart
    service_rss_growth_mib: float  # the service's RSS, window's end minus before the triggers
    requests_sent: int  # HTTP requests the process sent in the idle window
    requests_per_s: float
    service_waits_answered: int  # GET /v1/operation/wait answered by the service in the window
    events: int
    statuses: dict[str, int]
    latency_p50_ms: float
    latency_p90_ms: float
    latency_p99_ms: float
    latency_max_ms: float
    all_in_ms: float  # the signals' send time to the last event
    signal_request_ms: float  # the signals' request, sent to answered


@dataclass(frozen=True, slots=True)
class DagRun:
    """One ``dag.test`` run of the sensor DAG, and what it used."""

    false_pokes: int
    state: str
    wall_s: float
    cpu_dag_test_s: float  # getrusage(RUSAGE_CHILDREN) around it: dag.test and descendants
    cpu_api_server_s: float  # the api-server's process tree, /proc
    api_requests: int  # execution API requests in the api-server's access log
    api_writes: int  # those that write (PATCH, PUT, POST)
    attempts_s: list[float]  # the sensor's attempts (pokes): PATCH .../run to PATCH .../state
    logged_attempts_s: list[float]  # the same in its task log: Pre Execute to Post Execute's end
    workloads: list[tuple[float, str]]  # each attempt's executor workload: seconds, final state
    pokes_seen: int  # the callable's calls, counted in a file
    poke_times: list[float]  # epoch seconds of each call
    sensor_end_to_downstream_start_s: float | None
    peak_tree_rss_mib: float  # the dag.test process tree's RSS, sampled
    processes: list[dict[str, Any]]  # the run's processes, sampled (see _TreeSampler)


@dataclass(frozen=True, slots=True)
class SensorResult:
    """Part 2: the reschedule sensor's per-poke cost, and ``waits`` sensors scaled from it."""

    waits: int
    poke_interval_s: float
    warm_up: DagRun  # one False poke, untimed
    runs_1: list[DagRun]  # one False poke, then True (2 pokes)
    runs_k: list[DagRun]  # K False pokes, then True
    failed_runs: list[DagRun]  # runs that did not end in success (run again), if any
    cpu_per_poke_s: float
    api_requests_per_poke: float
    api_writes_per_poke: float  # PATCH/PUT/POST: each a write to Airflow's database
    poke_cycle_s: float  # median wall time between two pokes with poke_interval=1
    poke_run_s: float  # median attempt (poke) in its task log: Pre Execute to Post Execute
    slot_s_per_poke: float  # mean "Workload finished" duration of a reschedule: the worker
    slot_s_median: float
    slot_s_max: float
    slots_over_1s: int  # reschedules that held their worker over a second (about 5 s)
    slots_measured: int
    task_processes: int  # task processes seen in the run with K False pokes
    task_process_peak_rss_mib: float  # the largest RSS of one (mostly shared with its worker)
    task_process_uss_mib: float  # their median peak of private memory
    worker_uss_mib: float  # the private memory of a LocalExecutor worker that ran a poke
    pokes_per_s: float  # waits / poke interval
    cpu_s_per_s: float  # pokes_per_s * cpu_per_poke_s
    api_requests_per_s: float
    concurrent_slots: float  # pokes_per_s * slot_s_per_poke: executor workers busy (Little)
    concurrent_pokes: float  # pokes_per_s * poke_run_s: task processes running at once
    memory_mib: float  # concurrent_slots * worker_uss_mib + concurrent_pokes * task_uss_mib
    notice_delay_mean_s: float
    notice_delay_worst_s: float
    sensor_end_to_downstream_start_s: float | None


@dataclass(frozen=True, slots=True)
class BarrierResult:
    """Part 3: the barrier DAG, its last signal to its deferred task's end."""

    state: str
    signal_to_resumed_s: float | None
    tasks: dict[str, Any]


@dataclass(frozen=True, slots=True)
class AirflowReport:
    """Everything one run produced."""

    machine: dict[str, str | int]
    config: AirflowBenchConfig
    deferred: DeferredResult
    sensors: SensorResult
    barrier: BarrierResult | None
    notes: list[str]
    wall_s: float


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return percentile(ordered, 0.5)


# -- /proc ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Proc:
    ppid: int
    cpu_s: float  # its own and its reaped children's
    rss_bytes: int
    state: str  # "Z": exited, not yet reaped


def _proc(pid: int) -> _Proc | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()  # from field 3 (state) on
    ticks = sum(int(rest[i]) for i in (11, 12, 13, 14))  # utime stime cutime cstime
    return _Proc(int(rest[1]), ticks / _TICK, int(rest[21]) * _PAGE, rest[0])


def _tree(root: int) -> dict[int, _Proc]:
    """``root`` and its live descendants."""
    procs = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := _proc(int(entry.name))) is not None:
            procs[int(entry.name)] = found
    children: dict[int, list[int]] = {}
    for pid, proc in procs.items():
        children.setdefault(proc.ppid, []).append(pid)
    tree, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in procs and pid not in tree:
            tree[pid] = procs[pid]
            todo.extend(children.get(pid, []))
    return tree


def _tree_cpu_s(root: int) -> float:
    return sum(p.cpu_s for p in _tree(root).values())


def _title(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()[:120]


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _uss_bytes(pid: int) -> int:
    """Memory only this process holds (private pages, ``smaps_rollup``): a forked process
    shares the rest with its parent."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return 0
    return 1024 * sum(
        int(line.split()[1]) for line in text.splitlines() if line.startswith("Private_")
    )


def _started_s(pid: int) -> float | None:
    """When ``pid`` started, in seconds since boot."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text[text.rindex(")") + 2 :].split()[19]) / _TICK


def _uptime_s() -> float:
    return float(Path("/proc/uptime").read_text().split()[0])


class _TreeSampler:
    """Samples a process tree every 0.1 s in a thread: its RSS, and each process's depth under
    the root, peak RSS and USS, and life (from its start time to the last sample before it
    exited)."""

    def __init__(self, root: int) -> None:
        self._root = root
        self._stop = threading.Event()
        self.peak_rss = 0
        self.seen: dict[int, dict[str, Any]] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            tree = _tree(self._root)
            now = _uptime_s()
            self.peak_rss = max(self.peak_rss, sum(p.rss_bytes for p in tree.values()))
            for pid, proc in tree.items():
                info = self.seen.get(pid)
                if info is None:
                    parent = self.seen.get(proc.ppid)
                    depth = 0 if pid == self._root else (parent["depth"] + 1 if parent else 1)
                    info = self.seen[pid] = {
                        "ppid": proc.ppid, "depth": depth, "started": _started_s(pid) or now,
                        "alive": now, "rss": 0, "uss": 0, "title": "",
                    }  # fmt: skip
                if proc.state == "Z":
                    continue
                info["title"] = _title(pid) or info["title"]
                info["alive"] = now
                info["rss"] = max(info["rss"], proc.rss_bytes)
                info["uss"] = max(info["uss"], _uss_bytes(pid))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def processes(self) -> list[dict[str, Any]]:
        """Every process seen but the root: pid, parent, depth, title, peaks (MiB), life (s)."""
        return [
            {
                "pid": pid, "ppid": info["ppid"], "depth": info["depth"], "title": info["title"],
                "peak_rss_mib": round(info["rss"] / 2**20, 1),
                "peak_uss_mib": round(info["uss"] / 2**20, 1),
                "lifetime_s": round(info["alive"] - info["started"], 2),
            }
            for pid, info in self.seen.items()
            if pid != self._root
        ]  # fmt: skip


# -- the service ----------------------------------------------------------------------------------


def _service_env(tag: str, token: str) -> dict[str, str]:
    return {
        **own_names("bench-af-", tag),
        "PURGATORY_API_TOKEN": token,
        "PURGATORY_LOG_LEVEL": "warning",
        # Nothing bounds the long polls one replica holds; a wait's poll stays within this.
        "PURGATORY_MAX_WAIT_MS": "60000",
    }


_WAIT_METRIC = re.compile(r"^purgatory_http_requests_total\{([^}]*)\}\s+([0-9.eE+]+)$", re.M)


def _waits_answered(url: str, token: str) -> int:
    """``GET /v1/operation/wait`` answered so far (the service's Prometheus counter)."""
    response = httpx.get(f"{url}/metrics", headers={"authorization": f"Bearer {token}"}, timeout=10)
    response.raise_for_status()
    return sum(
        int(float(value))
        for labels, value in _WAIT_METRIC.findall(response.text)
        if "/v1/operation/wait" in labels
    )


def _rss_bytes(pid: int) -> int:
    found = _proc(pid)
    return found.rss_bytes if found else 0


# -- part 1: deferred waits -----------------------------------------------------------------------

# Runs in the Airflow environment. Reads a JSON config on argv[1]; writes one JSON line per
# phase on stdout ("ready", "window", "idle", "done"); Airflow's own logging goes to stderr.
_TRIGGERS_SCRIPT = r"""
import asyncio, gc, json, resource, sys, time

import httpx

SENT = [0]
_send = httpx.AsyncClient.send


async def _counted_send(self, request, **kwargs):
    SENT[0] += 1
    return await _send(self, request, **kwargs)


httpx.AsyncClient.send = _counted_send


def say(**fields):
    print(json.dumps(fields), flush=True)


def cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def status_kib(name):
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    return 0


async def one(trigger, index, events):
    generator = trigger.run()  # what Airflow's triggerer runs, then anext() on it
    try:
        event = await anext(generator)
        events[index] = (time.time(), event.payload.get("status"), event.payload.get("message"))
    except Exception as exc:
        events[index] = (time.time(), "exception", repr(exc))
    finally:
        await generator.aclose()


async def main(cfg):
    from purgatory.airflow.triggers import PurgatoryTrigger

    warm = [None]
    await one(PurgatoryTrigger(cfg["scope"], cfg["warm_op"], time.time() + 60), 0, warm)
    if warm[0][1] != "completed":
        say(phase="failed", why=f"the warm-up trigger ended with {warm[0]}")
        return
    gc.collect()
    rss_before, cpu_before = status_kib("VmRSS"), cpu_s()
    say(phase="ready", rss_kib=rss_before)
    n, spread, until = cfg["waits"], cfg["spread_s"], time.time() + cfg["limit_s"]
    triggers = [PurgatoryTrigger(cfg["scope"], f"{cfg['prefix']}{i}", until) for i in range(n)]
    events = [None] * n
    tasks = []
    start, sent_before = time.monotonic(), SENT[0]
    for i, trigger in enumerate(triggers):
        pause = start + spread * i / n - time.monotonic()
        if pause > 0:
            await asyncio.sleep(pause)
        tasks.append(asyncio.create_task(one(trigger, i, events)))
    end = time.monotonic() + cfg["start_timeout_s"]
    while SENT[0] - sent_before < n and time.monotonic() < end:
        await asyncio.sleep(0.05)
    if SENT[0] - sent_before < n:
        say(phase="failed", why=f"{SENT[0] - sent_before} of {n} long polls sent")
        return
    await asyncio.sleep(cfg["settle_s"])
    t0, c0, s0 = time.monotonic(), cpu_s(), SENT[0]
    say(phase="window", ramp_cpu_s=c0 - cpu_before, ramp_s=t0 - start,
        done_early=sum(e is not None for e in events))
    await asyncio.sleep(cfg["idle_s"])
    t1, c1, s1 = time.monotonic(), cpu_s(), SENT[0]
    say(phase="idle", seconds=t1 - t0, cpu_s=c1 - c0, sent=s1 - s0, rss_kib=status_kib("VmRSS"),
        hwm_kib=status_kib("VmHWM"), rss_before_kib=rss_before,
        done_early=sum(e is not None for e in events))
    await asyncio.wait(tasks, timeout=cfg["events_timeout_s"])
    say(phase="done", events=events)
    for task in tasks:
        task.cancel()


asyncio.run(main(json.loads(sys.argv[1])))
"""


# Runs in the Airflow environment, a fresh process: the RSS one AsyncPurgatoryClient (and the
# httpx.AsyncClient in it) adds; each trigger's run() makes its own.
_CLIENT_SCRIPT = """
import gc

from purgatory.client import AsyncPurgatoryClient

def rss_kib():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))

keep = [AsyncPurgatoryClient("http://127.0.0.1:1", token="t")]
gc.collect()
before = rss_kib()
keep += [AsyncPurgatoryClient("http://127.0.0.1:1", token="t") for _ in range(200)]
print((rss_kib() - before) / 200)
"""


def _client_kib() -> float:
    out = subprocess.run(
        [str(PYTHON), "-c", _CLIENT_SCRIPT],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return float(out.stdout.strip())


class _Lines:
    """A child's stdout, one JSON line at a time, each read bounded."""

    def __init__(self, stream: IO[str]) -> None:
        self._lines: list[str] = []
        self._ready = threading.Condition()
        self._closed = False
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            with self._ready:
                self._lines.append(line)
                self._ready.notify_all()
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def next(self, phase: str, timeout_s: float) -> dict[str, Any]:
        end = time.monotonic() + timeout_s
        with self._ready:
            while True:
                while self._lines:
                    line = self._lines.pop(0).strip()
                    if not line.startswith("{"):
                        continue
                    message: dict[str, Any] = json.loads(line)
                    if message.get("phase") == "failed":
                        raise RuntimeError(f"the triggers' process: {message.get('why')}")
                    if message.get("phase") == phase:
                        return message
                left = end - time.monotonic()
                if self._closed or left <= 0:
                    raise RuntimeError(f"the triggers' process gave no {phase!r} line")
                self._ready.wait(left)


def bench_deferred(
    service: ServiceChild,
    token: str,
    env: dict[str, str],
    *,
    config: AirflowBenchConfig,
    work: Path,
    say: Callable[[str], None],
) -> DeferredResult:
    """Part 1 (see the module's documentation)."""
    n, scope, prefix = config.waits, f"bench-airflow-{uuid.uuid4().hex[:6]}", "op-"
    service_url, service_pid = service.url, service.pid
    with PurgatoryClient(service_url, token=token, timeout_s=60) as client:
        say(f"deferred: registering {n} operations and a warm-up one")
        for first in range(0, n, 1_000):
            client.register_many(
                [
                    operation(scope=scope, op_id=f"{prefix}{i}", keys=[f"k{i}"],
                              timeout_ms=_DEADLINE_MS)
                    for i in range(first, min(n, first + 1_000))
                ]
            )  # fmt: skip
        client.register(scope=scope, op_id="warm", keys=["warm"], timeout_ms=_DEADLINE_MS)
        client.signal(scope, "warm")
        baseline_s = min(config.idle_s, 10.0)
        say(f"deferred: the service's CPU with no wait, {baseline_s:g} s")
        cpu0 = _tree_cpu_s(service_pid)
        time.sleep(baseline_s)
        service_idle = (_tree_cpu_s(service_pid) - cpu0) / baseline_s
        script = work / "triggers.py"
        script.write_text(_TRIGGERS_SCRIPT)
        cfg = {
            "scope": scope, "prefix": prefix, "warm_op": "warm", "waits": n,
            "spread_s": config.spread_s, "idle_s": config.idle_s, "settle_s": _SETTLE_S,
            "limit_s": _DEADLINE_MS / 1000, "start_timeout_s": config.spread_s + _START_TIMEOUT_S,
            "events_timeout_s": _EVENTS_TIMEOUT_S,
        }  # fmt: skip
        with (work / "triggers.log").open("wb") as log:
            child = subprocess.Popen(
                [str(PYTHON), str(script), json.dumps(cfg)],
                env=env, cwd=work, stdout=subprocess.PIPE, stderr=log, text=True,
                start_new_session=True,
            )  # fmt: skip
            try:
                assert child.stdout is not None
                lines = _Lines(child.stdout)
                lines.next("ready", _START_TIMEOUT_S)
                service_rss_before = _rss_bytes(service_pid)
                say(f"deferred: starting {n} triggers over {config.spread_s:g} s")
                window = lines.next("window", config.spread_s + _START_TIMEOUT_S)
                answered0, service_cpu0 = (
                    _waits_answered(service_url, token),
                    _tree_cpu_s(service_pid),
                )
                say(f"deferred: all {n} wait; idle window of {config.idle_s:g} s")
                idle = lines.next("idle", config.idle_s + 30)
                answered1, service_cpu1 = (
                    _waits_answered(service_url, token),
                    _tree_cpu_s(service_pid),
                )
                service_rss_end = _rss_bytes(service_pid)
                if window["done_early"] or idle["done_early"]:
                    raise RuntimeError(f"{idle['done_early']} waits ended before any signal")
                say(f"deferred: signalling the {n} keys in one request")
                sent = time.time()
                client.signals([{"scope": scope, "key": f"k{i}"} for i in range(n)])
                answered = time.time()
                done = lines.next("done", _EVENTS_TIMEOUT_S + 30)
                child.wait(timeout=30)
            finally:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, signal.SIGKILL)
                child.wait(timeout=30)
    events = [e for e in done["events"] if e is not None]
    statuses: dict[str, int] = {}
    for _, status, _ in events:
        statuses[status] = statuses.get(status, 0) + 1
    if statuses.get("completed", 0) != n:
        messages = {status: message for _, status, message in events if status != "completed"}
        raise RuntimeError(f"deferred waits ended {statuses} of {n}: {messages}")
    latencies = sorted((at - sent) * 1000 for at, _, _ in events)
    seconds = idle["seconds"]
    before, end = idle["rss_before_kib"], idle["rss_kib"]
    return DeferredResult(
        waits=n,
        how="the real PurgatoryTrigger.run(), its connection read by BaseHook.aget_connection"
        " from AIRFLOW_CONN_PURGATORY_DEFAULT (no fallback needed)",
        start_cpu_s=window["ramp_cpu_s"],
        poll_ms=int(_POLL_S * 1000),
        spread_s=config.spread_s,
        idle_s=round(seconds, 3),
        cpu_s_per_s=idle["cpu_s"] / seconds,
        service_cpu_s_per_s=(service_cpu1 - service_cpu0) / seconds,
        service_idle_cpu_s_per_s=service_idle,
        rss_before_mib=before / 1024,
        rss_end_mib=end / 1024,
        rss_peak_mib=idle["hwm_kib"] / 1024,
        per_wait_kib=(end - before) / n,
        client_kib=_client_kib(),
        service_rss_growth_mib=(service_rss_end - service_rss_before) / 2**20,
        requests_sent=idle["sent"],
        requests_per_s=idle["sent"] / seconds,
        service_waits_answered=answered1 - answered0,
        events=len(events),
        statuses=statuses,
        latency_p50_ms=percentile(latencies, 0.5),
        latency_p90_ms=percentile(latencies, 0.9),
        latency_p99_ms=percentile(latencies, 0.99),
        latency_max_ms=latencies[-1],
        all_in_ms=latencies[-1],
        signal_request_ms=(answered - sent) * 1000,
    )


# -- Airflow --------------------------------------------------------------------------------------

_SENSOR_DAG = '''"""bench_airflow's reschedule sensor: False for params.pokes pokes, then True."""

from __future__ import annotations

import time
from pathlib import Path

import pendulum
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import dag, task

COUNTS = Path(__file__).resolve().parent.parent / "pokes"


def _poke(pokes: str, run_id: str) -> bool:
    COUNTS.mkdir(exist_ok=True)
    path = COUNTS / "".join(c if c.isalnum() else "_" for c in run_id)
    with path.open("a") as counts:
        counts.write(f"{time.time()}\\n")
    return len(path.read_text().splitlines()) > int(pokes)


@dag(
    dag_id="bench_reschedule_sensor", schedule=None, catchup=False, params={"pokes": 1},
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
)
def _sensor() -> None:
    sense = PythonSensor(
        task_id="sense", python_callable=_poke, mode="reschedule", poke_interval=1,
        op_kwargs={"pokes": "{{ params.pokes }}", "run_id": "{{ run_id }}"},
    )

    @task
    def after() -> float:
        return time.time()

    sense >> after()


bench_reschedule_sensor = _sensor()
'''

# tests/airflow/_run_dag.py's runner on a DAG file given on the command line.
_RUNNER = """
import json, sys
from pathlib import Path

from tests.airflow import _run_dag

_run_dag.DAGS = Path(sys.argv[1])
_run_dag.main(sys.argv[2], json.loads(sys.argv[3]), None)
"""


class _Airflow(AirflowProcesses):
    """The benchmark's Airflow: a DAG of any file, run with ``dag.test(use_executor=True)``."""

    def run_dag(
        self, dag_file: Path, dag_id: str, conf: dict[str, Any], timeout_s: float = _DAG_TIMEOUT_S
    ) -> tuple[dict[str, Any], subprocess.Popen[str], Callable[[], str]]:
        """Start ``dag_id`` of ``dag_file``; the caller finishes it with the returned function
        (bounded), which gives its output."""
        run = self.begin("-c", _RUNNER, str(dag_file), dag_id, json.dumps(conf))
        return conf, run, lambda: self.finish(run, dag_id, timeout_s)


_ACCESS = re.compile(
    r"^(\S+) .*request finished.* method=([A-Z]+) path=(/execution/\S*)", re.MULTILINE
)
# LocalExecutor's worker, once the supervisor it ran for an attempt returned.
_WORKLOAD = re.compile(r"Workload finished .*?duration=([0-9.]+) .*?final_state=(\w+)")
_TI_CALL = re.compile(r"/execution/task-instances/([0-9a-f-]+)/(run|state)$")


def _api_calls(log: str) -> list[tuple[float, str, str]]:
    """The execution API requests in (a slice of) the api-server's log: (epoch s, method, path),
    from its ``request finished`` lines (Airflow's HttpAccessLogMiddleware)."""
    calls = []
    for stamp, method, path in _ACCESS.findall(log):
        with contextlib.suppress(ValueError):
            calls.append((dt.datetime.fromisoformat(stamp).timestamp(), method, path))
    return calls


def _task_log_attempts_s(log: Path) -> list[float]:
    """Each attempt of a task as its log shows it: from its ``Pre Execute`` group's start (the
    task process has started) to the end of its ``Post Execute`` group, per attempt."""
    if not log.exists():
        return []
    spans: list[list[float]] = []
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(ValueError, KeyError, TypeError):
            entry = json.loads(line)
            at = dt.datetime.fromisoformat(entry["timestamp"]).timestamp()
            if entry.get("event") == "::group::Pre Execute":
                spans.append([at, at])
            elif spans:
                spans[-1][1] = at
    return [end - start for start, end in spans]


def _attempts_s(calls: Sequence[tuple[float, str, str]]) -> list[float]:
    """How long each attempt of the task with the most attempts ran: its ``PATCH .../run`` (the
    task process starts running it) to its ``PATCH .../state`` (reschedule, or success)."""
    started: dict[str, list[float]] = {}
    ended: dict[str, list[float]] = {}
    for at, method, path in calls:
        if method == "PATCH" and (found := _TI_CALL.search(path)):
            (started if found.group(2) == "run" else ended).setdefault(found.group(1), []).append(
                at
            )
    if not started:
        return []
    ti = max(started, key=lambda t: len(started[t]))
    return [end - start for start, end in zip(started[ti], ended.get(ti, []), strict=False)]


# -- part 2: reschedule sensors -------------------------------------------------------------------


def _sensor_run(
    airflow: _Airflow, dag_file: Path, false_pokes: int, pokes_dir: Path, api_pid: int
) -> DagRun:
    _, run, finish = airflow.run_dag(dag_file, _SENSOR_DAG_ID, {"pokes": false_pokes})
    cpu0, api0, log0 = _children_cpu_s(), _tree_cpu_s(api_pid), len(airflow.log("api-server"))
    start = time.monotonic()
    sampler = _TreeSampler(run.pid)
    try:
        output = finish()
    finally:
        sampler.stop()
    wall = time.monotonic() - start
    with (airflow.home / "dag-runs.log").open("a") as runs_log:
        runs_log.write(f"=== {_SENSOR_DAG_ID}, {false_pokes} False pokes\n{output}\n")
    cpu = _children_cpu_s() - cpu0
    time.sleep(0.5)  # the api-server writes its last access lines
    api_cpu, calls = _tree_cpu_s(api_pid) - api0, _api_calls(airflow.log("api-server")[log0:])
    result = result_of(output, _SENSOR_DAG_ID)
    run_id = result["run_id"]
    counts = pokes_dir / "".join(c if c.isalnum() else "_" for c in run_id)
    poke_times = [float(t) for t in counts.read_text().split()] if counts.exists() else []
    log = (
        airflow.home / "logs" / f"dag_id={_SENSOR_DAG_ID}" / f"run_id={run_id}"
        / "task_id=sense" / "attempt=1.log"
    )  # fmt: skip
    tasks = result["tasks"]
    sense, after = tasks.get("sense", {}), tasks.get("after", {})
    gap = after["start"] - sense["end"] if after.get("start") and sense.get("end") else None
    return DagRun(
        false_pokes=false_pokes,
        state=result["state"],
        wall_s=round(wall, 2),
        cpu_dag_test_s=round(cpu, 3),
        cpu_api_server_s=round(api_cpu, 3),
        api_requests=len(calls),
        api_writes=sum(method != "GET" for _, method, _ in calls),
        attempts_s=[round(a, 4) for a in _attempts_s(calls)],
        logged_attempts_s=[round(a, 4) for a in _task_log_attempts_s(log)],
        workloads=[(float(d), state) for d, state in _WORKLOAD.findall(output)],
        pokes_seen=len(poke_times),
        poke_times=poke_times,
        sensor_end_to_downstream_start_s=gap,
        peak_tree_rss_mib=round(sampler.peak_rss / 2**20, 1),
        processes=sampler.processes(),
    )


def _cpu(run: DagRun) -> float:
    return run.cpu_dag_test_s + run.cpu_api_server_s


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def bench_sensors(
    airflow: _Airflow,
    dag_file: Path,
    *,
    pokes_dir: Path,
    api_pid: int,
    config: AirflowBenchConfig,
    say: Callable[[str], None],
) -> SensorResult:
    """Part 2 (see the module's documentation)."""
    say("sensors: warm-up run (1 False poke)")
    warm = _sensor_run(airflow, dag_file, 1, pokes_dir, api_pid)
    if warm.state != "success":
        raise RuntimeError(f"the sensor DAG's warm-up run ended {warm.state}")
    runs: dict[int, list[DagRun]] = {1: [], config.pokes: []}
    failed: list[DagRun] = []
    for repeat in range(config.repeats):
        for pokes, done in runs.items():  # interleaved: a drift of the machine touches both
            for attempt in range(_SENSOR_TRIES):  # dag.test's loop now and then fails a run
                say(f"sensors: {pokes} False poke(s) then True, run {repeat + 1}.{attempt + 1}")
                run = _sensor_run(airflow, dag_file, pokes, pokes_dir, api_pid)
                if run.state == "success" and run.pokes_seen == pokes + 1:
                    done.append(run)
                    break
                failed.append(run)
            else:
                raise RuntimeError(f"sensor run ended {run.state} after {run.pokes_seen} pokes")
    ones, manys = runs[1], runs[config.pokes]
    extra = config.pokes - 1
    cpu_per_poke = (_mean([_cpu(r) for r in manys]) - _mean([_cpu(r) for r in ones])) / extra
    requests_per_poke = (
        _mean([r.api_requests for r in manys]) - _mean([r.api_requests for r in ones])
    ) / extra
    writes_per_poke = (
        _mean([r.api_writes for r in manys]) - _mean([r.api_writes for r in ones])
    ) / extra
    many = manys[-1]
    cycles = [b - a for a, b in zip(many.poke_times, many.poke_times[1:], strict=False)]
    # LocalExecutor's workers are the run's children; each task attempt (a poke) is a process
    # a worker forks, the worker supervising it.
    tasks = [p for p in many.processes if p["depth"] >= 2 and p["peak_uss_mib"] > 0]
    parents = {p["ppid"] for p in tasks}
    workers = [p for p in many.processes if p["depth"] == 1 and p["pid"] in parents]
    pokes_per_s = config.waits / _POLL_S
    poke_run = _median([a for r in manys for a in r.logged_attempts_s or r.attempts_s])
    slots_s = [d for r in manys for d, state in r.workloads if state == "up_for_reschedule"]
    slot_s = _mean(slots_s)
    task_uss = _median([p["peak_uss_mib"] for p in tasks])
    worker_uss = _median([p["peak_uss_mib"] for p in workers])
    concurrent = pokes_per_s * poke_run
    slots = pokes_per_s * slot_s
    known = [r.sensor_end_to_downstream_start_s for r in [*ones, *manys]]
    gaps = [g for g in known if g is not None]
    return SensorResult(
        waits=config.waits,
        poke_interval_s=_POLL_S,
        warm_up=warm,
        runs_1=ones,
        runs_k=manys,
        failed_runs=failed,
        cpu_per_poke_s=cpu_per_poke,
        api_requests_per_poke=requests_per_poke,
        api_writes_per_poke=writes_per_poke,
        poke_cycle_s=_median(cycles),
        poke_run_s=poke_run,
        slot_s_per_poke=slot_s,
        slot_s_median=_median(slots_s),
        slot_s_max=max(slots_s, default=0.0),
        slots_over_1s=sum(d > 1 for d in slots_s),
        slots_measured=len(slots_s),
        task_processes=len(tasks),
        task_process_peak_rss_mib=max((p["peak_rss_mib"] for p in tasks), default=0.0),
        task_process_uss_mib=task_uss,
        worker_uss_mib=worker_uss,
        pokes_per_s=pokes_per_s,
        cpu_s_per_s=pokes_per_s * cpu_per_poke,
        api_requests_per_s=pokes_per_s * requests_per_poke,
        concurrent_slots=slots,
        concurrent_pokes=concurrent,
        memory_mib=slots * worker_uss + concurrent * task_uss,
        notice_delay_mean_s=_POLL_S / 2,
        notice_delay_worst_s=_POLL_S,
        sensor_end_to_downstream_start_s=_median(gaps) if gaps else None,
    )


# -- part 3: the barrier DAG ----------------------------------------------------------------------


def bench_barrier(airflow: _Airflow, dag_file: Path, say: Callable[[str], None]) -> BarrierResult:
    """Part 3 (see the module's documentation)."""
    say("barrier: running purgatory_barrier with the triggerer")
    conf = {"scope": f"bench-barrier-{uuid.uuid4().hex[:6]}", "delay_s": 1.0}
    _, _, finish = airflow.run_dag(dag_file, "purgatory_barrier", conf)
    result = result_of(finish(), "purgatory_barrier")
    tasks = result["tasks"]
    wait, signalled = tasks.get("wait", {}), tasks.get("signal_events", {})
    gap = wait["end"] - signalled["end"] if wait.get("end") and signalled.get("end") else None
    return BarrierResult(state=result["state"], signal_to_resumed_s=gap, tasks=tasks)


# -- the run --------------------------------------------------------------------------------------


def _airflow_version() -> str:
    out = subprocess.run(
        [str(PYTHON), "-c",
         "import importlib.metadata as m; print(m.version('apache-airflow'))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return out.stdout.strip()


def _loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _keep_logs(work: Path, keep: Path) -> None:
    """Copy the run's logs (service, triggers, Airflow's processes and tasks) to ``keep``."""
    keep.mkdir(parents=True, exist_ok=True)
    for path in work.rglob("*.log"):
        target = keep / path.relative_to(work)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target)


def run_airflow_benchmarks(
    config: AirflowBenchConfig,
    *,
    progress: Callable[[str], None] | None = None,
    keep_logs: Path | None = None,
) -> AirflowReport:
    """Run every measurement of ``config`` on a broker, a service and an Airflow started here."""
    say = progress or (lambda _message: None)
    if not AIRFLOW.exists():
        raise RuntimeError("Airflow's environment is missing: run `make airflow`")
    start = time.perf_counter()
    notes: list[str] = []
    machine: dict[str, str | int] = {**machine_info(), "airflow": _airflow_version()}
    machine["loadavg_at_start"] = _loadavg()
    tag, token = uuid.uuid4().hex[:6], secrets.token_urlsafe(24)
    with contextlib.ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-airflow-")))
        if keep_logs is not None:
            stack.callback(_keep_logs, work, keep_logs)
        broker = stack.enter_context(EmbeddedBroker(die_with_parent=True))
        env = _service_env(tag, token)
        broker.create_topics({topic: 2 for name, topic in env.items() if "TOPIC" in name})
        say("starting the service")
        service = stack.enter_context(
            service_process(broker.bootstrap_servers, work / "service.log", env)
        )
        home, dags = work / "airflow", work / "dags"
        home.mkdir()
        dags.mkdir()
        dag_file = dags / "bench_sensor_dag.py"
        dag_file.write_text(_SENSOR_DAG)
        barrier_file = dags / "purgatory_dags.py"
        shutil.copy(BARRIER_DAGS, barrier_file)
        airflow = _Airflow(home, airflow_env(home, dags, service.url, token))
        stack.callback(airflow.close)
        say("airflow db migrate")
        airflow.migrate()
        deferred = bench_deferred(service, token, airflow.env, config=config, work=work, say=say)
        say("starting Airflow's api-server (execution API)")
        api = airflow.serve()
        sensors = bench_sensors(
            airflow, dag_file, pokes_dir=work / "pokes", api_pid=api.pid, config=config, say=say
        )
        if sensors.failed_runs:
            notes.append(
                f"{len(sensors.failed_runs)} sensor run(s) did not end in success and were run"
                " again (see sensors.failed_runs)"
            )
        if not sensors.runs_k[-1].api_requests:
            notes.append("the api-server's log held no access lines: API requests not counted")
        barrier = None
        if config.barrier:
            say("starting Airflow's triggerer")
            airflow.start("triggerer", "triggerer")
            barrier = bench_barrier(airflow, barrier_file, say)
        machine["loadavg_at_end"] = _loadavg()
    return AirflowReport(
        machine=machine,
        config=config,
        deferred=deferred,
        sensors=sensors,
        barrier=barrier,
        notes=notes,
        wall_s=time.perf_counter() - start,
    )


# -- the report -----------------------------------------------------------------------------------


def _ms(value: float) -> str:
    return f"{value:,.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _runs_cpu(runs: Sequence[DagRun]) -> str:
    return ", ".join(f"{r.cpu_dag_test_s:.2f} + {r.cpu_api_server_s:.2f}" for r in runs)


def render(report: AirflowReport, command: str) -> str:
    """The report as markdown: machine, command, the comparison table, the parts' details."""
    m, d, s, b = report.machine, report.deferred, report.sensors, report.barrier
    n = d.waits
    one, many = s.runs_1, s.runs_k
    gap = s.sensor_end_to_downstream_start_s
    gap_text = f" + {gap:.1f} s poke->downstream start" if gap is not None else ""
    lines = [
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['implementation']} {m['python']}, "
        f"Airflow {m['airflow']} (SQLite, LocalExecutor), {m['platform']}. The broker, the "
        "service, Airflow's processes and this one share these CPUs, over loopback.",
        "",
        f"Command: `{command}` ({report.wall_s:.0f} s; load average {m['loadavg_at_start']} at "
        f"the start, {m['loadavg_at_end']} at the end). N = {n:,}.",
        "",
        f"| {n:,} waits | N deferred purgatory waits (one asyncio loop, the triggerer's) "
        "| N reschedule sensors, poke every 30 s (per-poke cost measured, scaled) |",
        "|---|---|---|",
        f"| CPU | **{d.cpu_s_per_s:.4f} CPU s/s** (the loop's process; the service: "
        f"{d.service_cpu_s_per_s:.3f}, {d.service_idle_cpu_s_per_s:.3f} with no wait) "
        f"| **{s.cpu_s_per_s:.1f} CPU s/s** = {s.pokes_per_s:.1f} pokes/s x "
        f"{s.cpu_per_poke_s:.2f} CPU s per poke |",
        f"| memory | **{d.rss_end_mib - d.rss_before_mib:.0f} MiB** over the loop's "
        f"{d.rss_before_mib:.0f} MiB ({d.per_wait_kib:.0f} KiB per wait; the client each wait "
        f"makes, an AsyncPurgatoryClient, ~{d.client_kib:.0f} KiB of it; RSS "
        f"{d.rss_end_mib:.0f} MiB, peak {d.rss_peak_mib:.0f} MiB) | **~{s.memory_mib:,.0f} MiB** "
        f"= {s.concurrent_slots:.0f} executor workers busy ({s.pokes_per_s:.1f} pokes/s x "
        f"{s.slot_s_per_poke:.1f} s each) x {s.worker_uss_mib:.0f} MiB private + "
        f"{s.concurrent_pokes:.1f} task processes running x {s.task_process_uss_mib:.0f} MiB; "
        "between pokes a sensor holds none |",
        f"| requests | **{d.requests_per_s:.1f}/s** long polls to the service ({d.requests_sent:,}"
        f" sent in {d.idle_s:.0f} s; service answered {d.service_waits_answered:,}) "
        f"| **{s.api_requests_per_s:.0f}/s** to the execution API "
        f"({s.api_requests_per_poke:.1f} per poke, {s.api_writes_per_poke:.1f} of them writes "
        "to Airflow's DB) |",
        f"| signal -> resume | **p50 {_ms(d.latency_p50_ms)}, p99 {_ms(d.latency_p99_ms)}** "
        f"(all {n:,} in {_ms(d.all_in_ms)}) | mean **{s.notice_delay_mean_s:.0f} s**, worst "
        f"{s.notice_delay_worst_s:.0f} s (uniform over the poke interval){gap_text} |",
        "",
        f"1. Deferred: {d.waits:,} waits, {d.how}; started over {d.spread_s:g} s "
        f"({d.start_cpu_s:.1f} CPU s to make and start them all), poll {d.poll_ms / 1000:g} s, "
        f"idle window {d.idle_s:.0f} s; latency from the signals' "
        f"send to each event yielded: p50 {_ms(d.latency_p50_ms)}, p90 {_ms(d.latency_p90_ms)}, "
        f"p99 {_ms(d.latency_p99_ms)}, max {_ms(d.latency_max_ms)} (the one signals request of "
        f"{n:,} keys took {_ms(d.signal_request_ms)}); events {d.statuses}. Service RSS grew "
        f"{d.service_rss_growth_mib:.0f} MiB while the {n:,} polls were held.",
        f"2. Sensor runs (dag.test, use_executor; CPU s of the run's tree + the api-server's): "
        f"2 pokes {_runs_cpu(one)}, {many[0].pokes_seen} pokes {_runs_cpu(many)} "
        f"-> {s.cpu_per_poke_s:.2f} CPU s per poke; {s.api_requests_per_poke:.1f} execution API "
        f"requests per poke; one poke every {s.poke_cycle_s:.1f} s with poke_interval=1; "
        f"a poke runs {s.poke_run_s:.2f} s in its task process (median, its task log's Pre "
        f"Execute to Post Execute) but holds its LocalExecutor worker {s.slot_s_per_poke:.2f} s "
        f"on average (the supervisor's 'Workload finished' duration of a reschedule: median "
        f"{s.slot_s_median:.2f} s, but {s.slots_over_1s} of {s.slots_measured} over 1 s, max "
        f"{s.slot_s_max:.2f} s); "
        f"its task process (forked by a LocalExecutor worker; {s.task_processes} sampled) peaks "
        f"at {s.task_process_peak_rss_mib:.0f} MiB RSS, {s.task_process_uss_mib:.0f} MiB of it "
        f"private; the run's process tree peaked at {many[-1].peak_tree_rss_mib:.0f} MiB RSS.",
    ]
    if b is not None:
        resumed = f"{b.signal_to_resumed_s:.2f} s" if b.signal_to_resumed_s is not None else "n/a"
        lines.append(
            f"3. purgatory_barrier ({b.state}): last signal (signal_events ended) -> the deferred "
            f"`wait` task ended: {resumed} (triggerer's event, the scheduler's, dag.test's loop, "
            "a new task process resuming)."
        )
    lines += [*(f"Note: {note}" for note in report.notes), ""]
    return "\n".join(lines)


def write_json(report: AirflowReport, path: Path, command: str) -> None:
    """Write the report (with the command and the units) as JSON."""
    payload: dict[str, Any] = {"command": command, **asdict(report)}
    payload["units"] = {
        "cpu_s_per_s": "CPU seconds per wall second (getrusage, /proc)",
        "latency_ms": "event yielded in the triggers' process (time.time) minus the moment just "
        "before the signals request was sent, wall-clock ms, one machine",
        "rss_mib": "resident set size, MiB (/proc)",
        "sensors": "per-poke cost = (run with K False pokes - run with 1) / (K - 1), then times "
        "N / 30 pokes per second",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.benchmarks.bench_airflow [--waits N] [--quick] [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_airflow", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="N=50, short windows")
    parser.add_argument("--waits", type=int, help=f"deferred waits (default {FULL.waits:,})")
    parser.add_argument("--idle-s", type=float, help=f"idle window (default {FULL.idle_s:g} s)")
    parser.add_argument("--pokes", type=int, help=f"False pokes (default {FULL.pokes})")
    parser.add_argument("--repeats", type=int, help="sensor runs per K (default 2)")
    parser.add_argument("--no-barrier", action="store_true", help="skip the barrier DAG")
    parser.add_argument("--keep-logs", type=Path, help="copy the run's logs to this directory")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="output directory")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    config = AirflowBenchConfig(
        waits=args.waits or base.waits,
        idle_s=args.idle_s or base.idle_s,
        pokes=max(2, args.pokes or base.pokes),
        repeats=args.repeats or base.repeats,
        barrier=not args.no_barrier,
    )
    command = " ".join(
        ["python -m tests.benchmarks.bench_airflow", *(argv if argv is not None else sys.argv[1:])]
    )

    def progress(message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)

    report = run_airflow_benchmarks(config, progress=progress, keep_logs=args.keep_logs)
    print(render(report, command))
    out = args.out / "bench-airflow.json"
    write_json(report, out, command)
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
