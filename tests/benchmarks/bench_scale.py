"""Scaling out: one service process against two replicas in ordinal mode (harness).

``python -m tests.benchmarks.bench_scale [--quick] [--out DIR]`` starts one embedded broker
(Tansu) in this process and, on it, the service as separate processes (``purgatory serve``, as
:mod:`tests.benchmarks.bench_service` starts it, with the journal and its snapshotter child as
configured by default). The input topics have **2 partitions**; the benchmark scopes
``s0`` .. ``s7`` split 4/4 between them (checked), so both partitions carry the same load.

1. **Scale**: end-to-end signals per second, measured as bench_service's measurement 1:
   ``N`` operations are registered over HTTP (``/v1/operations:batch``, one key each, scopes of
   both partitions, long timeout); then ``N`` signal records are produced to the signals topic
   as fast as kafka-python sends them, and the callbacks topic is read (in a process of its own)
   until ``N`` callbacks arrived. The rate is ``N`` over the time from the first send to the
   arrival of the last callback; every operation must get exactly one ``completed`` callback,
   from the partition its scope belongs to. Three subjects, on the same broker, in the same run:

   a. **one process** owning both partitions (``PURGATORY_KAFKA_STATIC_PARTITIONS=0,1``, no
      peers);
   b. **two processes** in ordinal mode (``PURGATORY_PEER_URLS`` = both base URLs,
      ``PURGATORY_REPLICA_ORDINAL`` 0 and 1), owning partition 0 and partition 1 (``p * R //
      P``); the registrations all go to replica 0, which forwards the other replica's share of
      each batch to it; the signals go through Kafka straight to the partition's owner;
   c. **the bare consume -> decode -> produce pipe** of bench_service (one kafka-python
      process, no service): the baseline.

   Before each of a and b, a few operations in a warm-up scope of each partition are completed
   end to end (connections and metadata in place on every replica); their callbacks are left
   out of the figures. The CPU seconds (user + system, ``/proc/<pid>/stat``) the service
   processes (``serve``, and their snapshotter children apart), the broker and the load
   generator used during the burst are reported, per signal. The full mode repeats a, b and c
   for several rounds (alternating the order of a and b) and reports every round and the
   median of the ratios.
2. **Forwarding cost**: with two fresh replicas in ordinal mode, ``M`` sequential
   ``POST /v1/operations`` (one keep-alive ``httpx.Client`` per replica), each sent to the
   replica owning its scope (answered there) and one with the same scope to the other replica
   (which forwards it to the owner and returns its answer), interleaved request by request (the
   order alternating), so both see the same conditions; then the same with
   ``GET /v1/operation`` (each operation read from its owner and through the other replica).
   p50 / p90 / p99 / max of the request latencies (``perf_counter`` around each call) and the
   latency a forward adds (forwarded minus direct, at each percentile).

The machine's load average (``os.getloadavg``) before and after the run is kept beside the
figures: the broker, the load generator and the services share the machine's cores, so a
second process only adds throughput if a core is free for it. The report prints what the
measured CPU per signal predicts for more cores (signals/s ~= cores for the services / service
CPU seconds per signal, with one single-threaded process per core and a broker that keeps up),
and writes ``DIR/bench-scale.json`` (``DIR`` defaults to ``docs``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from purgatory.devtools.broker import EmbeddedBroker, free_port
from purgatory.devtools.child import service_process
from purgatory.service.app import topics_of
from purgatory.service.ownership.owners import range_owner
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings, env_name
from tests.benchmarks._measure import machine_info, quiet_kafka_warnings
from tests.benchmarks.bench_service import (
    _HTTP_TIMEOUT_S,
    _LONG_TIMEOUT_MS,
    _SETTLE_S,
    Arrival,
    CallbackReader,
    PipeResult,
    ServiceProcess,
    _burst_producer,
    _send_burst,
    bench_pipe,
    nth_arrival_ns,
    percentile,
    process_cpu_s,
    register_range,
    signal_value,
    tally,
)
from tests.benchmarks.bench_service import FULL as SERVICE_FULL

__all__ = [
    "FULL",
    "QUICK",
    "ForwardingResult",
    "LatencyStats",
    "Prediction",
    "ReplicaProcess",
    "RoundResult",
    "ScaleBenchConfig",
    "ScaleReport",
    "ScaleResult",
    "Summary",
    "bench_forwarding",
    "bench_scale",
    "main",
    "render",
    "replica_pair",
    "run_scale_benchmarks",
    "summarize",
    "write_json",
]

PARTITIONS = 2
_SCOPE_PREFIX = "s"  # the benchmark's scopes: s0 .. s{scopes - 1}, as in bench_service
_FORWARD_WARMUP = 50  # requests of each kind before the timed ones (connections, pools)
_JSON = {"content-type": "application/json"}


@dataclass(frozen=True, slots=True)
class ScaleBenchConfig:
    """Sizes of one run: ``signals`` per scale measurement, ``rounds`` of (a, b, c),
    ``forward_requests`` per kind (direct, forwarded) and route (POST, GET)."""

    signals: int
    rounds: int
    forward_requests: int
    register_batch: int = 10_000
    warmup_ops: int = 200
    scopes: int = 8
    pipe_fetch_max_wait_ms: int = SERVICE_FULL.pipe_fetch_max_wait_ms
    pipe_max_poll_records: int = SERVICE_FULL.pipe_max_poll_records
    pipe_linger_ms: int = SERVICE_FULL.pipe_linger_ms


FULL = ScaleBenchConfig(signals=200_000, rounds=3, forward_requests=5_000)
QUICK = ScaleBenchConfig(signals=50_000, rounds=2, forward_requests=1_000)


# -- replicas -----------------------------------------------------------------------------------


class ReplicaProcess(ServiceProcess):
    """One replica in ordinal mode, as a child process: it owns the partitions ``p`` with
    ``p * R // P == ordinal`` (``R = len(peer_urls)``) and listens on ``port``
    (``peer_urls[ordinal]``). ``shared``: the settings (topics, group) of the first replica,
    which every other replica uses as well. A context manager, as :class:`ServiceProcess`."""

    def __init__(
        self,
        broker: EmbeddedBroker,
        *,
        partitions: int,
        log_dir: Path,
        ordinal: int,
        peer_urls: Sequence[str],
        port: int,
        shared: Settings | None = None,
    ) -> None:
        super().__init__(broker, partitions=partitions, log_dir=log_dir)
        if shared is not None:
            self.settings = shared
        self.ordinal = ordinal
        self.peer_urls = tuple(peer_urls)
        self.port = port
        replicas = len(self.peer_urls)
        self.own = tuple(
            p
            for p in range(partitions)
            if range_owner(p, partitions=partitions, replicas=replicas) == ordinal
        )
        self.log_path = log_dir / f"replica-{ordinal}-{uuid.uuid4().hex[:8]}.log"

    def environment(self) -> dict[str, str]:
        """The shared settings, plus this replica's partitions, peers and ordinal."""
        env = super().environment()
        env[env_name("kafka_static_partitions")] = ",".join(str(p) for p in self.own)
        env[env_name("peer_urls")] = ",".join(self.peer_urls)
        env[env_name("replica_ordinal")] = str(self.ordinal)
        return env

    def start(self) -> None:
        """Create the topics (if the first replica did not), start the replica, wait until it
        is ready.

        Raises:
            ConfigError: it exited or was not ready in time (with its log's tail).
        """
        self.broker.create_topics({t: self.partitions for t in topics_of(self.settings)})
        self._stack = contextlib.ExitStack()
        child = self._stack.enter_context(
            service_process(
                self.broker.bootstrap_servers,
                self.log_path,
                self.environment(),
                static_partitions=self.own,
                port=self.port,
                die_with_parent=True,
            )
        )
        self.url, self._pid = child.url, child.pid


@contextlib.contextmanager
def replica_pair(
    broker: EmbeddedBroker, *, partitions: int, log_dir: Path
) -> Iterator[list[ReplicaProcess]]:
    """Two replicas in ordinal mode on topics of their own, started one after the other."""
    ports = [free_port(), free_port()]
    peers = [f"http://127.0.0.1:{port}" for port in ports]
    first = ReplicaProcess(
        broker, partitions=partitions, log_dir=log_dir, ordinal=0, peer_urls=peers, port=ports[0]
    )
    second = ReplicaProcess(
        broker,
        partitions=partitions,
        log_dir=log_dir,
        ordinal=1,
        peer_urls=peers,
        port=ports[1],
        shared=first.settings,
    )
    with first, second:
        yield [first, second]


# -- measurement 1: scale -----------------------------------------------------------------------


def _scope_in(partition: int, partitions: int, stem: str) -> str:
    """The first register_range prefix ``{stem}{n}-`` whose one scope ``{prefix}0`` is in
    ``partition``."""
    for n in range(10_000):
        prefix = f"{stem}{n}-"
        if partition_for(f"{prefix}0", partitions) == partition:
            return prefix
    raise RuntimeError(f"no scope {stem}*-0 in partition {partition}")  # pragma: no cover


def _check_balanced(scopes: int, partitions: int) -> None:
    """Raise unless the benchmark's scopes spread evenly over the partitions."""
    counts = [0] * partitions
    for j in range(scopes):
        counts[partition_for(f"{_SCOPE_PREFIX}{j}", partitions)] += 1
    if max(counts) - min(counts) > 1:
        raise RuntimeError(f"scopes s0..s{scopes - 1} split {counts} over the partitions")


def _metric(exposition: str, name: str, labels: str = "") -> float:
    """The sum of the samples of ``name`` (whose labels contain ``labels``) in an exposition."""
    total = 0.0
    for line in exposition.splitlines():
        if not line or line.startswith("#"):
            continue
        sample, _, value = line.rpartition(" ")
        if sample.split("{", 1)[0] == name and labels in sample:
            total += float(value)
    return total


def _scrape(http: httpx.Client) -> str:
    response = http.get("/metrics")
    if response.status_code != 200:
        raise RuntimeError(f"/metrics: HTTP {response.status_code} {response.text[:300]}")
    return response.text


@dataclass(frozen=True, slots=True)
class ScaleResult:
    """One scale measurement (a or b) of one round.

    ``serve_cpu_s`` and ``snapshotter_cpu_s``: CPU seconds each service process (by ordinal)
    and its snapshotter child used during the burst. ``completed_by_process``: the
    ``purgatory_outcomes_total{outcome="completed"}`` each process counted during the burst;
    ``wrong_partition``: callbacks whose ``partition`` is not their scope's.
    """

    subject: str
    processes: int
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
    wrong_partition: int
    serve_cpu_s: tuple[float, ...]
    snapshotter_cpu_s: tuple[float, ...]
    broker_cpu_s: float
    loadgen_cpu_s: float
    completed_by_process: tuple[int, ...]

    @property
    def exact(self) -> bool:
        """Every operation got exactly one ``completed`` callback, from its own partition."""
        return (
            self.callbacks == self.signals == self.distinct_ops
            and not self.duplicates + self.unexpected + self.not_completed + self.missing
            and not self.wrong_partition
        )

    @property
    def service_cpu_us(self) -> float:
        """CPU microseconds per signal of every service process and snapshotter."""
        return (sum(self.serve_cpu_s) + sum(self.snapshotter_cpu_s)) / self.signals * 1e6

    @property
    def serve_cpu_us(self) -> float:
        """CPU microseconds per signal of the ``serve`` processes alone."""
        return sum(self.serve_cpu_s) / self.signals * 1e6

    @property
    def broker_cpu_us(self) -> float:
        """The broker's CPU microseconds per signal."""
        return self.broker_cpu_s / self.signals * 1e6

    @property
    def loadgen_cpu_us(self) -> float:
        """The load generator's (this process and the reader's) CPU microseconds per signal."""
        return self.loadgen_cpu_s / self.signals * 1e6


def _wrong_partitions(arrivals: Sequence[Arrival], partitions: int) -> int:
    wrong = 0
    for _, _, value in arrivals:
        callback = json.loads(value)
        if callback["partition"] != partition_for(callback["scope"], partitions):
            wrong += 1
    return wrong


def _warm_up(
    bootstrap: str,
    topic: str,
    http: httpx.Client,
    reader: CallbackReader,
    *,
    ops: int,
    partitions: int,
    log_tail: Callable[[], str],
) -> set[bytes]:
    """Complete ``ops`` operations in a warm-up scope of each partition end to end (registered
    through ``http``, signalled through Kafka); returns the warm-up scopes (the callbacks' keys).

    Raises:
        RuntimeError: their callbacks did not all arrive in time.
    """
    prefixes = [_scope_in(p, partitions, "warm") for p in range(partitions)]
    for prefix in prefixes:
        register_range(http, range(ops), batch=ops, scopes=1, prefix=prefix)
    producer = _burst_producer(bootstrap)
    try:
        for prefix in prefixes:
            scope = f"{prefix}0"
            for i in range(ops):
                producer.send(topic, key=scope.encode(), value=signal_value(scope, f"k{i}"))
        producer.flush(30)
    finally:
        producer.close(5)
    expected = ops * len(prefixes)
    if not reader.wait(lambda: reader.counted >= expected, 60):
        raise RuntimeError(f"warm-up: {reader.counted} of {expected} callbacks; {log_tail()}")
    return {f"{prefix}0".encode() for prefix in prefixes}


def bench_scale(
    broker: EmbeddedBroker,
    services: Sequence[ServiceProcess],
    signals: int,
    *,
    subject: str,
    scopes: int,
    register_batch: int,
    warmup_ops: int,
    partitions: int = PARTITIONS,
) -> ScaleResult:
    """Measurement 1 (see the module's documentation) on running ``services``, which share
    their topics and together own every partition; registrations go to ``services[0]``."""
    first = services[0]
    topic = first.settings.topic_signals

    def log_tail() -> str:
        return "\n".join(f"[{s.url}] {s.log_tail()}" for s in services)

    with contextlib.ExitStack() as stack:
        clients = [
            stack.enter_context(httpx.Client(base_url=s.url, timeout=_HTTP_TIMEOUT_S))
            for s in services
        ]
        reader = stack.enter_context(
            CallbackReader(broker.bootstrap_servers, first.settings.topic_callbacks, partitions)
        )
        warm_keys = _warm_up(
            broker.bootstrap_servers,
            topic,
            clients[0],
            reader,
            ops=warmup_ops,
            partitions=partitions,
            log_tail=log_tail,
        )
        warm = reader.counted
        register_s = register_range(
            clients[0], range(signals), batch=register_batch, scopes=scopes, prefix=_SCOPE_PREFIX
        )
        records = []
        for i in range(signals):
            scope = f"{_SCOPE_PREFIX}{i % scopes}"
            records.append((scope.encode(), signal_value(scope, f"k{i}")))
        completed_before = [
            _metric(_scrape(c), "purgatory_outcomes_total", 'outcome="completed"') for c in clients
        ]
        broker_pid = broker.pid

        def cpu_now() -> list[float]:
            return [
                *(s.cpu_s() for s in services),
                *(s.children_cpu_s() for s in services),
                0.0 if broker_pid is None else process_cpu_s(broker_pid),
                time.process_time(),
                0.0 if reader.pid is None else process_cpu_s(reader.pid),
            ]

        producer = _burst_producer(broker.bootstrap_servers)
        try:
            producer.partitions_for(topic)  # metadata before the clock starts
            cpu = cpu_now()
            t0, produced_ns = _send_burst(producer, topic, records)
            done = reader.wait(lambda: reader.counted >= warm + signals, max(60.0, signals / 500))
            cpu_after = cpu_now()
        finally:
            producer.close(5)
        if not done:
            raise RuntimeError(
                f"{subject}: only {reader.counted - warm} of {signals} callbacks; {log_tail()}"
            )
        time.sleep(_SETTLE_S)
        completed_after = [
            _metric(_scrape(c), "purgatory_outcomes_total", 'outcome="completed"') for c in clients
        ]
        arrivals = [a for a in reader.finish() if a[1] not in warm_keys]
    n = len(services)
    used = [after - before for after, before in zip(cpu_after, cpu, strict=True)]
    end_ns = nth_arrival_ns(arrivals, signals, b"")
    counts = tally(arrivals, signals, b"")
    end_to_end_s = (end_ns - t0) / 1e9
    produce_s = (produced_ns - t0) / 1e9
    return ScaleResult(
        subject=subject,
        processes=n,
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
        wrong_partition=_wrong_partitions(arrivals, partitions),
        serve_cpu_s=tuple(used[:n]),
        snapshotter_cpu_s=tuple(used[n : 2 * n]),
        broker_cpu_s=used[2 * n],
        loadgen_cpu_s=used[2 * n + 1] + used[2 * n + 2],
        completed_by_process=tuple(
            round(after - before)
            for after, before in zip(completed_after, completed_before, strict=True)
        ),
    )


# -- measurement 2: forwarding ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Latencies of one kind of request, in milliseconds."""

    requests: int
    mean_ms: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> LatencyStats:
        """The statistics of ``seconds`` (one per request)."""
        ms = sorted(s * 1e3 for s in seconds)
        return cls(
            requests=len(ms),
            mean_ms=statistics.fmean(ms) if ms else 0.0,
            p50_ms=percentile(ms, 0.50),
            p90_ms=percentile(ms, 0.90),
            p99_ms=percentile(ms, 0.99),
            max_ms=ms[-1] if ms else 0.0,
        )


@dataclass(frozen=True, slots=True)
class ForwardingResult:
    """Measurement 2: each route's latencies sent to the owner (``direct``) and to the other
    replica (``forwarded``); ``*_cpu_s``: both replicas' serve CPU seconds during each route's
    timed requests (both kinds)."""

    requests: int
    post_direct: LatencyStats
    post_forwarded: LatencyStats
    get_direct: LatencyStats
    get_forwarded: LatencyStats
    post_cpu_s: float
    get_cpu_s: float


def _timed(call: Callable[[], httpx.Response], expected: int) -> float:
    start = time.perf_counter()
    response = call()
    elapsed = time.perf_counter() - start
    if response.status_code != expected:
        raise RuntimeError(f"HTTP {response.status_code} (not {expected}): {response.text[:300]}")
    return elapsed


def bench_forwarding(
    broker: EmbeddedBroker,
    requests: int,
    *,
    scopes: int,
    log_dir: Path,
    partitions: int = PARTITIONS,
) -> ForwardingResult:
    """Measurement 2 (see the module's documentation) on two fresh replicas."""
    with (
        replica_pair(broker, partitions=partitions, log_dir=log_dir) as replicas,
        httpx.Client(base_url=replicas[0].url, timeout=_HTTP_TIMEOUT_S) as zero,
        httpx.Client(base_url=replicas[1].url, timeout=_HTTP_TIMEOUT_S) as one,
    ):
        clients = (zero, one)

        def owner_of(scope: str) -> int:
            return range_owner(partition_for(scope, partitions), partitions=partitions, replicas=2)

        def post(client: httpx.Client, scope: str, op_id: str) -> float:
            body = json.dumps(
                {"scope": scope, "op_id": op_id, "keys": ["k"], "timeout_ms": _LONG_TIMEOUT_MS}
            ).encode()
            return _timed(lambda: client.post("/v1/operations", content=body, headers=_JSON), 201)

        def get(client: httpx.Client, scope: str, op_id: str) -> float:
            params = {"scope": scope, "op_id": op_id}
            return _timed(lambda: client.get("/v1/operation", params=params), 200)

        def serve_cpu() -> float:
            return sum(r.cpu_s() for r in replicas)

        def run(
            call: Callable[[httpx.Client, str, str], float], first: int, count: int, tag: str
        ) -> tuple[list[float], list[float]]:
            direct: list[float] = []
            forwarded: list[float] = []
            for i in range(first, first + count):
                scope = f"{_SCOPE_PREFIX}{i % scopes}"
                owner = owner_of(scope)
                pairs = [
                    (direct, clients[owner], f"d{tag}{i}"),
                    (forwarded, clients[1 - owner], f"f{tag}{i}"),
                ]
                for into, client, op_id in pairs if i % 2 == 0 else pairs[::-1]:
                    into.append(call(client, scope, op_id))
            return direct, forwarded

        # Warm-up: connections, the forwarders' pools, the journal's first records.
        run(post, 0, _FORWARD_WARMUP, "w")
        cpu = serve_cpu()
        post_direct, post_forwarded = run(post, 0, requests, "")
        post_cpu_s = serve_cpu() - cpu

        # Read back: each "direct" operation from its owner and through the other replica.
        def read(client: httpx.Client, scope: str, op_id: str) -> float:
            return get(client, scope, "d" + op_id[1:])

        run(read, 0, _FORWARD_WARMUP, "w")
        cpu = serve_cpu()
        get_direct, get_forwarded = run(read, 0, requests, "")
        get_cpu_s = serve_cpu() - cpu
    return ForwardingResult(
        requests=requests,
        post_direct=LatencyStats.of(post_direct),
        post_forwarded=LatencyStats.of(post_forwarded),
        get_direct=LatencyStats.of(get_direct),
        get_forwarded=LatencyStats.of(get_forwarded),
        post_cpu_s=post_cpu_s,
        get_cpu_s=get_cpu_s,
    )


# -- the run and its report ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RoundResult:
    """One round of measurement 1: the one-process service, the two replicas, the pipe."""

    one: ScaleResult
    two: ScaleResult
    pipe: PipeResult
    order: str  # which of one/two ran first

    @property
    def two_over_one(self) -> float:
        """Two processes' signals/s over one process's."""
        return self.two.signals_per_s / self.one.signals_per_s

    @property
    def one_over_pipe(self) -> float:
        """One process's signals/s over the pipe's."""
        return self.one.signals_per_s / self.pipe.signals_per_s

    @property
    def two_over_pipe(self) -> float:
        """Two processes' signals/s over the pipe's."""
        return self.two.signals_per_s / self.pipe.signals_per_s


@dataclass(frozen=True, slots=True)
class Prediction:
    """What a service CPU cost per signal predicts with ``cores`` cores for the services (one
    replica per core): ``signals_per_s`` = cores / CPU s per signal; ``broker_cores``: the
    broker's CPU the same rate needs, at this run's broker CPU per signal."""

    cores: int
    signals_per_s: float
    broker_cores: float


@dataclass(frozen=True, slots=True)
class Summary:
    """Medians over the rounds, and the predictions of the two-replica CPU per signal."""

    one_signals_per_s: float
    two_signals_per_s: float
    pipe_signals_per_s: float
    two_over_one: float
    two_over_one_each: tuple[float, ...]
    one_over_pipe: float
    two_over_pipe: float
    one_service_cpu_us: float
    two_service_cpu_us: float
    one_serve_cpu_us: float
    two_serve_cpu_us: float
    pipe_cpu_us: float
    broker_cpu_us: float
    loadgen_cpu_us: float
    #: This machine's cores over the CPU every process of the two-replica run used per signal:
    #: the rate it would reach if nothing but the CPU bound it.
    cpu_bound_here_per_s: float
    predictions: tuple[Prediction, ...]
    post_added_p50_ms: float
    post_added_p99_ms: float
    get_added_p50_ms: float
    get_added_p99_ms: float


@dataclass(frozen=True, slots=True)
class ScaleReport:
    """Everything one run measured."""

    machine: dict[str, str | int]
    config: ScaleBenchConfig
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    rounds: list[RoundResult]
    forwarding: ForwardingResult
    summary: Summary


def summarize(rounds: Sequence[RoundResult], forwarding: ForwardingResult, cpus: int) -> Summary:
    """The medians of ``rounds`` and what they predict (see :class:`Summary`)."""

    def median(values: Callable[[RoundResult], float]) -> float:
        return statistics.median(values(r) for r in rounds)

    two_cpu_us = median(lambda r: r.two.service_cpu_us)
    broker_us = median(lambda r: r.two.broker_cpu_us)
    everything_us = median(
        lambda r: r.two.service_cpu_us + r.two.broker_cpu_us + r.two.loadgen_cpu_us
    )
    predictions = []
    for cores in (1, 2, 4, 8, 16):
        rate = cores / (two_cpu_us / 1e6)
        predictions.append(Prediction(cores, rate, rate * broker_us / 1e6))
    f = forwarding
    return Summary(
        one_signals_per_s=median(lambda r: r.one.signals_per_s),
        two_signals_per_s=median(lambda r: r.two.signals_per_s),
        pipe_signals_per_s=median(lambda r: r.pipe.signals_per_s),
        two_over_one=median(lambda r: r.two_over_one),
        two_over_one_each=tuple(r.two_over_one for r in rounds),
        one_over_pipe=median(lambda r: r.one_over_pipe),
        two_over_pipe=median(lambda r: r.two_over_pipe),
        one_service_cpu_us=median(lambda r: r.one.service_cpu_us),
        two_service_cpu_us=two_cpu_us,
        one_serve_cpu_us=median(lambda r: r.one.serve_cpu_us),
        two_serve_cpu_us=median(lambda r: r.two.serve_cpu_us),
        pipe_cpu_us=median(lambda r: r.pipe.pipe_cpu_s / r.pipe.signals * 1e6),
        broker_cpu_us=broker_us,
        loadgen_cpu_us=median(lambda r: r.two.loadgen_cpu_us),
        cpu_bound_here_per_s=cpus / (everything_us / 1e6),
        predictions=tuple(predictions),
        post_added_p50_ms=f.post_forwarded.p50_ms - f.post_direct.p50_ms,
        post_added_p99_ms=f.post_forwarded.p99_ms - f.post_direct.p99_ms,
        get_added_p50_ms=f.get_forwarded.p50_ms - f.get_direct.p50_ms,
        get_added_p99_ms=f.get_forwarded.p99_ms - f.get_direct.p99_ms,
    )


def run_scale_benchmarks(
    config: ScaleBenchConfig,
    *,
    progress: Callable[[str], None] | None = None,
    broker: EmbeddedBroker | None = None,
) -> ScaleReport:
    """Run every measurement of ``config`` (on ``broker``, or on one started here)."""
    say = progress or (lambda _message: None)
    _check_balanced(config.scopes, PARTITIONS)
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        if broker is None:
            broker = stack.enter_context(EmbeddedBroker())
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-scale-")))
        common: dict[str, Any] = {
            "scopes": config.scopes,
            "register_batch": config.register_batch,
            "warmup_ops": config.warmup_ops,
        }

        def one_process() -> ScaleResult:
            with ServiceProcess(broker, partitions=PARTITIONS, log_dir=log_dir) as service:
                return bench_scale(
                    broker, [service], config.signals, subject="one process", **common
                )

        def two_processes() -> ScaleResult:
            with replica_pair(broker, partitions=PARTITIONS, log_dir=log_dir) as replicas:
                return bench_scale(
                    broker, replicas, config.signals, subject="two replicas", **common
                )

        rounds = []
        for number in range(config.rounds):
            label = f"round {number + 1}/{config.rounds}"
            results: dict[str, ScaleResult] = {}
            order = ("one", "two") if number % 2 == 0 else ("two", "one")
            for which in order:
                subject = "one process" if which == "one" else "two replicas"
                say(f"{label}: {config.signals} signals, {subject}")
                results[which] = one_process() if which == "one" else two_processes()
            say(f"{label}: the same {config.signals} signals through the bare pipe")
            pipe = bench_pipe(
                broker,
                config.signals,
                partitions=PARTITIONS,
                scopes=config.scopes,
                fetch_max_wait_ms=config.pipe_fetch_max_wait_ms,
                max_poll_records=config.pipe_max_poll_records,
                linger_ms=config.pipe_linger_ms,
            )
            rounds.append(RoundResult(results["one"], results["two"], pipe, ",".join(order)))
        say(f"forwarding: {config.forward_requests} requests of each kind, POST then GET")
        forwarding = bench_forwarding(
            broker, config.forward_requests, scopes=config.scopes, log_dir=log_dir
        )
    machine = machine_info()
    return ScaleReport(
        machine=machine,
        config=config,
        load_before=load_before,
        load_after=os.getloadavg(),
        rounds=rounds,
        forwarding=forwarding,
        summary=summarize(rounds, forwarding, int(machine["cpus"])),
    )


def _k(rate: float) -> str:
    return f"{rate / 1e3:.1f} k/s"


def _ok(result: ScaleResult) -> str:
    return "ok" if result.exact else "MISMATCH"


def _scale_row(number: int, r: ScaleResult) -> str:
    serve = " + ".join(f"{c:.1f}" for c in r.serve_cpu_s)
    snap = " + ".join(f"{c:.1f}" for c in r.snapshotter_cpu_s)
    share = "/".join(str(c) for c in r.completed_by_process)
    return (
        f"| {number} | {r.subject} | **{_k(r.signals_per_s)}** | {r.end_to_end_s:.2f} s "
        f"(producer alone {_k(r.producer_per_s)}) | serve {serve}, snapshotter {snap}, "
        f"broker {r.broker_cpu_s:.1f}, load gen {r.loadgen_cpu_s:.1f} | "
        f"{r.service_cpu_us:.0f} ({r.serve_cpu_us:.0f} serve) | {r.broker_cpu_us:.0f} | "
        f"{share} | {_ok(r)} |"
    )


def _latency_row(route: str, kind: str, s: LatencyStats) -> str:
    return (
        f"| {route} | {kind} | {s.requests:,} | {s.mean_ms:.2f} | {s.p50_ms:.2f} | "
        f"{s.p90_ms:.2f} | {s.p99_ms:.2f} | {s.max_ms:.1f} |"
    )


def render(report: ScaleReport, command: str) -> str:
    """The report as markdown: machine, load, command, the figures, the ratios."""
    m, cfg, s, f = report.machine, report.config, report.summary, report.forwarding
    load = "/".join(f"{x:.2f}" for x in report.load_before)
    load_after = "/".join(f"{x:.2f}" for x in report.load_after)
    lines = [
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['implementation']} {m['python']}, "
        f"{m['platform']}. One broker (Tansu, in-memory), the service process(es), their "
        "snapshotters and the load generator (this process and a reader process) share these "
        f"CPUs, over loopback. Load average (1/5/15 min) before: {load}, after: {load_after}.",
        "",
        f"Command: `{command}`",
        "",
        f"1. {cfg.signals:,} signals produced as fast as kafka-python sends them, "
        f"{PARTITIONS} partitions, scopes s0..s{cfg.scopes - 1} (half in each partition), "
        "the journal on (the default); CPU seconds during the burst.",
        "",
        "| round | subject | signals/s | first send -> last callback | CPU s | "
        "service CPU µs/signal | broker CPU µs/signal | completed by process | checks |",
        "|---:|---|---:|---|---|---:|---:|---|:---:|",
    ]
    for number, r in enumerate(report.rounds, 1):
        p = r.pipe
        pipe_exact = (
            p.outputs == p.signals == p.distinct_ops
            and not p.duplicates + p.unexpected + p.not_completed + p.missing
        )
        lines += [
            _scale_row(number, r.one),
            _scale_row(number, r.two),
            f"| {number} | bare pipe (baseline) | **{_k(p.signals_per_s)}** | "
            f"{p.end_to_end_s:.2f} s (producer alone {_k(p.producer_per_s)}) | "
            f"pipe {p.pipe_cpu_s:.1f}, broker {p.broker_cpu_s:.1f}, "
            f"load gen {p.loadgen_cpu_s:.1f} | {p.pipe_cpu_s / p.signals * 1e6:.0f} (pipe) | "
            f"{p.broker_cpu_s / p.signals * 1e6:.0f} | | {'ok' if pipe_exact else 'MISMATCH'} |",
        ]
    each = ", ".join(f"{x:.2f}x" for x in s.two_over_one_each)
    lines += [
        "",
        "| scale (medians over the rounds) | value |",
        "|---|---:|",
        f"| one process (a) | {_k(s.one_signals_per_s)} |",
        f"| two replicas (b) | {_k(s.two_signals_per_s)} |",
        f"| bare pipe (c) | {_k(s.pipe_signals_per_s)} |",
        f"| **(b) / (a)** | **{s.two_over_one:.2f}x** (rounds: {each}) |",
        f"| (a) / (c), (b) / (c) | {s.one_over_pipe:.2f}x, {s.two_over_pipe:.2f}x |",
        f"| service CPU per signal, (a) / (b) (serve + snapshotter) | "
        f"{s.one_service_cpu_us:.0f} / {s.two_service_cpu_us:.0f} µs "
        f"(serve alone {s.one_serve_cpu_us:.0f} / {s.two_serve_cpu_us:.0f} µs) |",
        f"| pipe, broker, load generator CPU per signal | {s.pipe_cpu_us:.0f}, "
        f"{s.broker_cpu_us:.0f}, {s.loadgen_cpu_us:.0f} µs |",
        f"| this machine, bound by CPU alone: {m['cpus']} cores / (service + broker + load gen "
        f"CPU per signal of (b)) | {_k(s.cpu_bound_here_per_s)} |",
        "",
        "Predicted for more cores, from (b)'s service CPU per signal "
        f"({s.two_service_cpu_us:.0f} µs: signals/s ~= cores for the services / CPU s per "
        "signal, one single-threaded replica per core, partitions >= replicas, the broker and "
        "the load generator on cores of their own that keep up):",
        "",
        "| cores for the services | signals/s | broker cores that rate needs (this broker) |",
        "|---:|---:|---:|",
        *(f"| {p.cores} | {_k(p.signals_per_s)} | {p.broker_cores:.1f} |" for p in s.predictions),
        "",
        f"2. Forwarding: {f.requests:,} sequential requests of each kind on keep-alive "
        "connections, two replicas; direct = sent to the scope's owner, forwarded = the same "
        "scope sent to the other replica (interleaved). Latency in ms.",
        "",
        "| route | sent to | requests | mean | p50 | p90 | p99 | max |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
        _latency_row("POST /v1/operations", "owner", f.post_direct),
        _latency_row("POST /v1/operations", "other (forwards)", f.post_forwarded),
        _latency_row("GET /v1/operation", "owner", f.get_direct),
        _latency_row("GET /v1/operation", "other (forwards)", f.get_forwarded),
        "",
        f"A forward adds: POST **{s.post_added_p50_ms:+.2f} ms at p50**, "
        f"{s.post_added_p99_ms:+.2f} ms at p99; GET **{s.get_added_p50_ms:+.2f} ms at p50**, "
        f"{s.get_added_p99_ms:+.2f} ms at p99. Both replicas' serve CPU: "
        f"{f.post_cpu_s / (2 * f.requests) * 1e3:.2f} ms per POST, "
        f"{f.get_cpu_s / (2 * f.requests) * 1e3:.2f} ms per GET (direct and forwarded "
        "averaged).",
    ]
    return "\n".join(lines)


def write_json(report: ScaleReport, path: Path, command: str) -> None:
    """Write the report (with the command, the derived per-signal figures and the units)."""
    payload: dict[str, Any] = {"command": command, **asdict(report)}
    for number, r in enumerate(report.rounds):
        for which, result in (("one", r.one), ("two", r.two)):
            payload["rounds"][number][which]["per_signal_us"] = {
                "service": result.service_cpu_us,
                "serve": result.serve_cpu_us,
                "broker": result.broker_cpu_us,
                "loadgen": result.loadgen_cpu_us,
            }
            payload["rounds"][number][which]["exact"] = result.exact
        payload["rounds"][number]["two_over_one"] = r.two_over_one
    payload["units"] = {
        "seconds": "wall seconds (time.perf_counter) unless named cpu",
        "cpu_s": "user + system CPU seconds of the process, from /proc/<pid>/stat, during the "
        "signal burst (serve_cpu_s and snapshotter_cpu_s: one entry per service process)",
        "per_signal_us": "CPU microseconds per signal (service = serve + snapshotter)",
        "latency_ms": "wall time of one HTTP request in the client (keep-alive)",
        "load": "os.getloadavg() (1, 5, 15 min) before and after the run",
        "predictions": "cores / (two-replica service CPU s per signal); broker_cores: that "
        "rate times the broker's CPU s per signal",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.benchmarks.bench_scale [--quick] [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_scale", description=__doc__
    )
    parser.add_argument("--quick", action="store_true", help="small sizes (about 90 s)")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="output directory")
    args = parser.parse_args(argv)
    command = " ".join(
        ["python -m tests.benchmarks.bench_scale", *(argv if argv is not None else sys.argv[1:])]
    )

    def progress(message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)

    with quiet_kafka_warnings():
        report = run_scale_benchmarks(QUICK if args.quick else FULL, progress=progress)
    print(render(report, command))
    out = args.out / "bench-scale.json"
    write_json(report, out, command)
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
