"""The cost of transactional delivery against acknowledged delivery, on Apache Kafka (harness).

``python -m tests.benchmarks.bench_delivery [--quick] [--out DIR]`` starts Apache Kafka once
(:func:`~purgatory.devtools.dev_broker.open_dev_broker`: one KRaft node in a JVM, its log in a
temporary data dir; Java 17 and the jars ``make kafka`` resolves) and, on it, measures the
service in each delivery mode (``PURGATORY_DELIVERY``) in turn: **acknowledged** (the default:
journal first, then each callback by the broker's acknowledgement), **transactional** (each
input partition's journal record, the callbacks it released and the input offsets in one Kafka
transaction), then **acknowledged again**. Acknowledged runs before and after transactional so
that a machine whose speed drifts during the run shows it (the two acknowledged runs' spread)
and weighs on both sides alike: every ratio is to the mean of the acknowledged runs. The second
acknowledged run costs about a third of the run's time.

For each mode, measurements 1 and 2 of :mod:`tests.benchmarks.bench_service`, reused as they
are (:func:`~tests.benchmarks.bench_service.bench_throughput`,
:func:`~tests.benchmarks.bench_service.bench_latency`), each on a fresh service process
(``purgatory serve``, journal and snapshotter as configured by default, topics of its own, 2
static partitions) in that mode:

1. **Signals per second**: ``N`` operations registered over HTTP, then ``N`` signals produced
   as fast as kafka-python sends them; the rate is ``N`` over the time from the first send to
   the arrival of the last callback (bench_service's sizes: 100,000 signals; ``--quick``
   30,000). Beside it, the CPU seconds the ``serve`` process used during the burst (its
   snapshotter child apart), per signal: less noisy than the rate on a shared machine; and the
   broker's (the JVM), per signal, since transactions also cost the broker.
2. **Latency at 1,000 signals/s**: a paced producer, each signal carrying its send time; p50
   and p99 of signal-to-callback (10 s of signals; ``--quick`` 5 s).

The callbacks are read by a reader process of their own, ``isolation_level="read_committed"``
in transactional mode (only committed transactions are visible), ``read_uncommitted`` (as in
bench_service) otherwise. Every measurement checks what it measured, as bench_service does:
each signal produced one ``completed`` callback for its own operation, none is missing, none
is a stranger; **duplicates are counted and reported** (a second callback for an operation:
none may reach a ``read_committed`` reader of a transactional service, and none is expected
from an acknowledged one either, since nothing crashes). And that the mode took effect: the
transactional ids the broker's transaction coordinator knows (``ListTransactions``) before and
after each measurement; a transactional service adds at least one per partition, an
acknowledged one none.

The report is markdown: the machine, the command, one row per run (mode, signals/s, ratio to
acknowledged, CPU µs per signal, p50 / p99 at 1 k/s, the broker's CPU per signal, duplicates,
checks), then transactional over acknowledged. ``--out DIR`` writes the figures to
``DIR/bench-delivery.json`` (nothing is written without it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from purgatory.devtools.broker import Broker
from purgatory.devtools.dev_broker import open_dev_broker
from purgatory.service.settings import Delivery
from tests.benchmarks._measure import machine_info, quiet_kafka_warnings
from tests.benchmarks.bench_service import FULL as SERVICE_FULL
from tests.benchmarks.bench_service import QUICK as SERVICE_QUICK
from tests.benchmarks.bench_service import (
    LatencyResult,
    ServiceBenchConfig,
    ThroughputResult,
    _on_main_thread,
    bench_latency,
    bench_throughput,
)

__all__ = [
    "ACKNOWLEDGED",
    "FULL",
    "MODES",
    "QUICK",
    "TRANSACTIONAL",
    "DeliveryBenchConfig",
    "DeliveryReport",
    "ModeResult",
    "Summary",
    "bench_mode",
    "main",
    "render",
    "run_delivery_benchmarks",
    "summarize",
    "transactional_ids",
    "write_json",
]

ACKNOWLEDGED = Delivery.ACKNOWLEDGED.value
TRANSACTIONAL = Delivery.TRANSACTIONAL.value
#: The runs, in order: acknowledged on both sides of transactional (see the module's text).
MODES = (ACKNOWLEDGED, TRANSACTIONAL, ACKNOWLEDGED)
LATENCY_RATE_PER_S = 1_000


@dataclass(frozen=True, slots=True)
class DeliveryBenchConfig:
    """Sizes of one run: measurement 1's signals (registered ``register_batch`` per HTTP
    batch), measurement 2's rate and duration, the input topics' partitions, the scopes, and
    the delivery modes measured, in order (names of :class:`~purgatory.service.settings.Delivery`).
    """

    throughput_signals: int
    register_batch: int
    latency_duration_s: float
    latency_rate_per_s: int = LATENCY_RATE_PER_S
    partitions: int = 2
    scopes: int = 8
    modes: tuple[str, ...] = MODES


def _from_service(service: ServiceBenchConfig) -> DeliveryBenchConfig:
    """bench_service's sizes for measurements 1 and 2."""
    return DeliveryBenchConfig(
        throughput_signals=service.throughput_signals,
        register_batch=service.register_batch,
        latency_duration_s=service.latency_duration_s,
        partitions=service.partitions,
        scopes=service.scopes,
    )


FULL = _from_service(SERVICE_FULL)
QUICK = _from_service(SERVICE_QUICK)


# -- the measurements ---------------------------------------------------------------------------


def transactional_ids(bootstrap: str) -> frozenset[str]:
    """The transactional ids the broker's transaction coordinator knows (``ListTransactions``:
    every id a producer initialised, whatever the state of its last transaction)."""
    from kafka import KafkaAdminClient  # noqa: PLC0415 (after the warning filters of pytest)

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        listed = admin.list_transactions()
    finally:
        admin.close()
    return frozenset(t.transactional_id for listings in listed.values() for t in listings)


@contextlib.contextmanager
def _new_transactional_ids(bootstrap: str) -> Iterator[list[int]]:
    """Count the transactional ids that appear during the block (in the list it yields, once
    the block is over)."""
    before = transactional_ids(bootstrap)
    counted: list[int] = []
    yield counted
    counted.append(len(transactional_ids(bootstrap) - before))


@dataclass(frozen=True, slots=True)
class ModeResult:
    """One mode's measurements 1 and 2, each on a service of its own; ``*_transactional_ids``:
    the transactional ids that service added to the broker's coordinator."""

    mode: str
    throughput: ThroughputResult
    latency: LatencyResult
    throughput_transactional_ids: int
    latency_transactional_ids: int

    @property
    def cpu_us_per_signal(self) -> float:
        """CPU microseconds of the ``serve`` process per signal during measurement 1."""
        return self.throughput.service_cpu_s / self.throughput.signals * 1e6

    @property
    def broker_cpu_us_per_signal(self) -> float:
        """CPU microseconds of the broker per signal during measurement 1."""
        return self.throughput.broker_cpu_s / self.throughput.signals * 1e6

    @property
    def duplicates(self) -> tuple[int, int]:
        """Second callbacks for an operation, in measurements 1 and 2."""
        return self.throughput.duplicates, self.latency.duplicates

    def problems(self, partitions: int) -> list[str]:
        """What the measurements found wrong (empty: every signal produced exactly one
        ``completed`` callback for its own operation, and the mode took effect)."""
        found = []
        for label, r in (("1", self.throughput), ("2", self.latency)):
            for count, what in (
                (r.missing, "missing"),
                (r.unexpected, "not for an operation of the run"),
                (r.not_completed, "not completed"),
                (r.duplicates, "duplicates"),
            ):
                if count:
                    found.append(f"{label}: {count:,} {what}")
        if self.latency.without_send_time:
            found.append(f"2: {self.latency.without_send_time:,} without their send time")
        ids = (self.throughput_transactional_ids, self.latency_transactional_ids)
        if self.mode == TRANSACTIONAL and min(ids) < partitions:
            found.append(f"transactional ids added {ids[0]} / {ids[1]}: fewer than {partitions}")
        if self.mode != TRANSACTIONAL and max(ids) > 0:
            found.append(f"transactional ids added {ids[0]} / {ids[1]} by {self.mode} delivery")
        return found


def bench_mode(
    broker: Broker, mode: str, config: DeliveryBenchConfig, *, log_dir: Path
) -> ModeResult:
    """Measurements 1 and 2 of ``config`` on a service in delivery ``mode``, on ``broker``
    (Apache Kafka, running)."""
    common: dict[str, Any] = {
        "register_batch": config.register_batch,
        "partitions": config.partitions,
        "scopes": config.scopes,
        "log_dir": log_dir,
        "delivery": mode,
    }
    with _new_transactional_ids(broker.bootstrap_servers) as throughput_ids:
        throughput = bench_throughput(broker, config.throughput_signals, **common)
    with _new_transactional_ids(broker.bootstrap_servers) as latency_ids:
        latency = bench_latency(
            broker, config.latency_rate_per_s, config.latency_duration_s, **common
        )
    return ModeResult(
        mode=mode,
        throughput=throughput,
        latency=latency,
        throughput_transactional_ids=throughput_ids[0],
        latency_transactional_ids=latency_ids[0],
    )


# -- the report ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """Transactional against acknowledged: each side the mean of its runs.

    ``throughput_ratio`` and ``cpu_ratio``: transactional signals/s and serve CPU per signal
    over acknowledged's; ``p50_added_ms`` and ``p99_added_ms``: transactional minus
    acknowledged at 1 k/s. ``acknowledged_spread``: the acknowledged runs' signals/s, highest
    minus lowest over their mean (0 with one run): how much the machine alone moved the rate.
    """

    acknowledged_runs: int
    transactional_runs: int
    acknowledged_signals_per_s: float
    transactional_signals_per_s: float
    throughput_ratio: float
    acknowledged_spread: float
    acknowledged_cpu_us_per_signal: float
    transactional_cpu_us_per_signal: float
    cpu_ratio: float
    acknowledged_broker_cpu_us_per_signal: float
    transactional_broker_cpu_us_per_signal: float
    acknowledged_p50_ms: float
    acknowledged_p99_ms: float
    transactional_p50_ms: float
    transactional_p99_ms: float
    p50_added_ms: float
    p99_added_ms: float


def summarize(runs: Sequence[ModeResult]) -> Summary:
    """Transactional over acknowledged, each the mean of its runs.

    Raises:
        ValueError: ``runs`` lacks an acknowledged or a transactional run.
    """
    ack = [r for r in runs if r.mode == ACKNOWLEDGED]
    tx = [r for r in runs if r.mode == TRANSACTIONAL]
    if not ack or not tx:
        raise ValueError("runs: at least one acknowledged and one transactional run")

    def mean(results: Sequence[ModeResult], figure: Callable[[ModeResult], float]) -> float:
        return statistics.fmean(figure(r) for r in results)

    ack_rates = [r.throughput.signals_per_s for r in ack]
    ack_rate = statistics.fmean(ack_rates)
    tx_rate = mean(tx, lambda r: r.throughput.signals_per_s)
    ack_cpu = mean(ack, lambda r: r.cpu_us_per_signal)
    tx_cpu = mean(tx, lambda r: r.cpu_us_per_signal)
    ack_p50, tx_p50 = mean(ack, lambda r: r.latency.p50_ms), mean(tx, lambda r: r.latency.p50_ms)
    ack_p99, tx_p99 = mean(ack, lambda r: r.latency.p99_ms), mean(tx, lambda r: r.latency.p99_ms)
    return Summary(
        acknowledged_runs=len(ack),
        transactional_runs=len(tx),
        acknowledged_signals_per_s=ack_rate,
        transactional_signals_per_s=tx_rate,
        throughput_ratio=tx_rate / ack_rate if ack_rate > 0 else 0.0,
        acknowledged_spread=(max(ack_rates) - min(ack_rates)) / ack_rate if ack_rate > 0 else 0.0,
        acknowledged_cpu_us_per_signal=ack_cpu,
        transactional_cpu_us_per_signal=tx_cpu,
        cpu_ratio=tx_cpu / ack_cpu if ack_cpu > 0 else 0.0,
        acknowledged_broker_cpu_us_per_signal=mean(ack, lambda r: r.broker_cpu_us_per_signal),
        transactional_broker_cpu_us_per_signal=mean(tx, lambda r: r.broker_cpu_us_per_signal),
        acknowledged_p50_ms=ack_p50,
        acknowledged_p99_ms=ack_p99,
        transactional_p50_ms=tx_p50,
        transactional_p99_ms=tx_p99,
        p50_added_ms=tx_p50 - ack_p50,
        p99_added_ms=tx_p99 - ack_p99,
    )


@dataclass(frozen=True, slots=True)
class DeliveryReport:
    """One run of the benchmark: every mode's results, in the order they ran."""

    machine: dict[str, Any]
    config: DeliveryBenchConfig
    runs: list[ModeResult]
    summary: Summary


def run_delivery_benchmarks(
    config: DeliveryBenchConfig,
    *,
    progress: Callable[[str], None] | None = None,
    broker: Broker | None = None,
) -> DeliveryReport:
    """Run measurements 1 and 2 in each mode of ``config.modes``, in order, on ``broker``
    (Apache Kafka, running: a test session's, say) or, without it, on an Apache Kafka started
    here for the whole run (tied to this process when called from the main thread).

    Raises:
        ValueError: ``config.modes`` lacks an acknowledged or a transactional run, or names
            an unknown mode.
        DevBrokerError: Kafka did not start (no Java, or no jars: ``make kafka``).
    """
    known = {d.value for d in Delivery}
    if not set(config.modes) <= known or not {ACKNOWLEDGED, TRANSACTIONAL} <= set(config.modes):
        raise ValueError(
            f"modes: {ACKNOWLEDGED} and {TRANSACTIONAL}, in some order, got {config.modes!r}"
        )
    say = progress or (lambda _message: None)
    runs = []
    with contextlib.ExitStack() as stack:
        if broker is None:
            say("starting Apache Kafka")
            broker = stack.enter_context(
                open_dev_broker("kafka", die_with_parent=_on_main_thread())
            )
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-delivery-")))
        for index, mode in enumerate(config.modes, 1):
            say(
                f"run {index} of {len(config.modes)}, {mode}: {config.throughput_signals} "
                f"signals, then {config.latency_rate_per_s} signals/s for "
                f"{config.latency_duration_s:g} s"
            )
            runs.append(bench_mode(broker, mode, config, log_dir=log_dir))
    return DeliveryReport(machine=machine_info(), config=config, runs=runs, summary=summarize(runs))


def _ms(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _labels(runs: Sequence[ModeResult]) -> list[str]:
    """Each run's mode, ``again`` after a mode that ran before."""
    seen: set[str] = set()
    labels = []
    for r in runs:
        labels.append(f"{r.mode}, again" if r.mode in seen else r.mode)
        seen.add(r.mode)
    return labels


def _row(label: str, run: ModeResult, summary: Summary, partitions: int) -> str:
    ratio = (
        run.throughput.signals_per_s / summary.acknowledged_signals_per_s
        if summary.acknowledged_signals_per_s > 0
        else 0.0
    )
    ratio_cell = f"**{ratio:.2f}x**" if run.mode == TRANSACTIONAL else f"{ratio:.2f}x"
    problems = run.problems(partitions)
    cells = [
        label,
        f"{run.throughput.signals_per_s / 1e3:.2f} k/s",
        ratio_cell,
        f"{run.cpu_us_per_signal:,.0f}",
        f"{_ms(run.latency.p50_ms)} / {_ms(run.latency.p99_ms)} ms",
        f"{run.broker_cpu_us_per_signal:,.0f}",
        " / ".join(f"{d:,}" for d in run.duplicates),
        "ok" if not problems else "**" + "; ".join(problems) + "**",
    ]
    return f"| {' | '.join(cells)} |"


def render(report: DeliveryReport, command: str) -> str:
    """The report as markdown: machine, command, one row per run, then transactional over
    acknowledged."""
    m, cfg, s = report.machine, report.config, report.summary
    rate = f"{cfg.latency_rate_per_s / 1e3:g}k/s"
    spread = (
        f"; the {s.acknowledged_runs} acknowledged runs differ by "
        f"{s.acknowledged_spread:.0%} of their mean signals/s (the machine's own noise)"
        if s.acknowledged_runs > 1
        else ""
    )
    lines = [
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['implementation']} {m['python']}, "
        f"{m['platform']}. Apache Kafka (one KRaft node in a JVM, its log on local disk), the "
        "service (a process of its own, and its snapshotter) and the load generator (this "
        "process, plus a reader process) share these CPUs, over loopback.",
        "",
        f"Command: `{command}`",
        "",
        f"Measurement 1: {cfg.throughput_signals:,} signals as fast as the producer sends them; "
        f"measurement 2: {cfg.latency_rate_per_s:,} signals/s for {cfg.latency_duration_s:g} s; "
        f"{cfg.partitions} partitions; each on a fresh service in the row's delivery mode, the "
        "rows in the order they ran. Callbacks read read_committed in transactional mode.",
        "",
        f"| mode | signals/s | ratio to acknowledged | CPU µs per signal (serve) | "
        f"p50 / p99 at {rate} | broker CPU µs per signal | duplicates (1 / 2) | checks |",
        "|---|---:|---:|---:|---:|---:|---:|:---:|",
        *(
            _row(label, run, s, cfg.partitions)
            for label, run in zip(_labels(report.runs), report.runs, strict=True)
        ),
        "",
        f"Transactional over acknowledged (each the mean of its runs{spread}): signals/s "
        f"**{s.throughput_ratio:.2f}x** ({s.transactional_signals_per_s / 1e3:.2f} k/s against "
        f"{s.acknowledged_signals_per_s / 1e3:.2f} k/s); serve CPU per signal "
        f"**{s.cpu_ratio:.2f}x** ({s.transactional_cpu_us_per_signal:,.0f} µs against "
        f"{s.acknowledged_cpu_us_per_signal:,.0f} µs); broker CPU per signal "
        f"{s.transactional_broker_cpu_us_per_signal:,.0f} µs against "
        f"{s.acknowledged_broker_cpu_us_per_signal:,.0f} µs; at {rate}, p50 "
        f"{s.p50_added_ms:+,.1f} ms and p99 **{s.p99_added_ms:+,.1f} ms**.",
    ]
    return "\n".join(lines)


def write_json(report: DeliveryReport, path: Path, command: str) -> None:
    """Write the report (with the command and the units) as JSON: the machine and the sizes
    once, every run in the order it ran (its figures per signal beside its results), then
    transactional over acknowledged."""
    runs = [
        {
            "mode": r.mode,
            "cpu_us_per_signal": r.cpu_us_per_signal,
            "broker_cpu_us_per_signal": r.broker_cpu_us_per_signal,
            "duplicates": list(r.duplicates),
            "problems": r.problems(report.config.partitions),
            "throughput_transactional_ids": r.throughput_transactional_ids,
            "latency_transactional_ids": r.latency_transactional_ids,
            "throughput": asdict(r.throughput),
            "latency": asdict(r.latency),
        }
        for r in report.runs
    ]
    payload: dict[str, Any] = {
        "command": command,
        "machine": report.machine,
        "config": asdict(report.config),
        "runs": runs,
        "summary": asdict(report.summary),
        "units": {
            "broker": "Apache Kafka, one KRaft node (a JVM), started once for the whole run",
            "mode": "PURGATORY_DELIVERY of the service measured; callbacks read read_committed "
            "in transactional mode",
            "seconds": "wall seconds (time.perf_counter) unless named cpu",
            "cpu_s": "user + system CPU seconds of the process, from /proc/<pid>/stat",
            "cpu_us_per_signal": "the serve process's CPU during measurement 1 (its snapshotter "
            "child apart), microseconds per signal",
            "broker_cpu_us_per_signal": "the broker's CPU during measurement 1, microseconds "
            "per signal",
            "latency_ms": "callback arrival in the reader minus the signal's send time",
            "duplicates": "second callbacks for an operation, measurements 1 and 2",
            "transactional_ids": "transactional ids the measurement's service added to the "
            "broker's transaction coordinator (ListTransactions)",
            "summary": "transactional over acknowledged, each the mean of its runs",
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.benchmarks.bench_delivery [--quick] [--out DIR]``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_delivery",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smaller sizes, for a smoke run (about a minute and a half)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write DIR/bench-delivery.json (nothing is written without it)",
    )
    args = parser.parse_args(argv)
    command = " ".join(
        ["python -m tests.benchmarks.bench_delivery", *(argv if argv is not None else sys.argv[1:])]
    )

    def progress(message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)

    with quiet_kafka_warnings():
        report = run_delivery_benchmarks(QUICK if args.quick else FULL, progress=progress)
    print(render(report, command))
    if args.out is not None:
        out = args.out / "bench-delivery.json"
        write_json(report, out, command)
        print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
