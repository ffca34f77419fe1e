"""Run every benchmark, print a markdown report, write JSON and a plot (harness entry point).

``python -m tests.benchmarks.run [--quick] [--out DIR] [--service [--broker kafka|tansu|both]]``
runs the timer micro-benchmarks (:mod:`tests.benchmarks.bench_timer`) and the purgatory
simulation (:mod:`tests.benchmarks.bench_purgatory`), each beside its baselines in the same
process, prints markdown tables, the machine and the DESIGN.md targets met or missed, and writes
``DIR/bench-results.json`` and ``DIR/timer-throughput.png`` (``DIR`` defaults to ``docs``).
``--quick`` uses small sizes and finishes in well under a minute; the full run takes a few
minutes on a 2-core machine. ``--service`` also runs :mod:`tests.benchmarks.bench_service` (the
service as a process of its own, with its journal and without it, to show the cost of
durability, beside its baselines) on both brokers, Apache Kafka first, then the embedded Tansu,
each broker alone with its own baselines, and writes ``DIR/bench-service.json`` with both;
``--broker kafka`` or ``--broker tansu`` measures the service on that one only. Its quick sizes
add about a minute per broker.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tests.benchmarks._measure import machine_info
from tests.benchmarks.bench_purgatory import CASES, SimResult, run_purgatory_benchmarks
from tests.benchmarks.bench_realtime import RealtimeResult, run_realtime_benchmarks
from tests.benchmarks.bench_timer import IMPLS, TimerResult, run_timer_benchmarks
from tests.benchmarks.plot import plot_timer

__all__ = ["FULL", "QUICK", "BenchConfig", "Report", "Target", "main", "run_all"]

#: The purgatory arrival rate at which DESIGN.md's capacity targets are checked.
TARGET_RATE_PER_S = 100_000


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """What to run: timer pending counts, purgatory rates, simulated duration."""

    timer_sizes: tuple[int, ...]
    rates_per_s: tuple[int, ...]
    duration_ms: int
    cases: tuple[tuple[int, int], ...] = CASES
    timer_repeats: int | None = None
    memory: bool = True
    realtime_rates: tuple[int, ...] = (10_000, 50_000, 100_000)
    realtime_ms: int = 3_000


FULL = BenchConfig(
    timer_sizes=(10_000, 100_000, 1_000_000),
    rates_per_s=(1_000, 5_000, 10_000, 20_000, 30_000, 50_000, 70_000, 100_000, 150_000, 200_000),
    duration_ms=2_000,
)
QUICK = BenchConfig(
    timer_sizes=(10_000, 100_000),
    rates_per_s=(1_000, 10_000, 50_000, 100_000),
    duration_ms=500,
    timer_repeats=1,
    realtime_rates=(10_000,),
    realtime_ms=500,
)


@dataclass(frozen=True, slots=True)
class Target:
    """One DESIGN.md performance target and whether this run met it."""

    name: str
    measured: str
    required: str
    met: bool


@dataclass(frozen=True, slots=True)
class Report:
    """Everything one run produced."""

    machine: dict[str, str | int]
    config: BenchConfig
    timer: list[TimerResult]
    purgatory: list[SimResult]
    realtime: list[RealtimeResult]
    targets: list[Target]


def _fmt_rate(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 1e6:
        return f"{value / 1e6:.2f} M"
    return f"{value / 1e3:.0f} k"


def _fmt_count(value: int) -> str:
    if value >= 1_000_000 and value % 1_000_000 == 0:
        return f"{value // 1_000_000}M"
    if value >= 1_000 and value % 1_000 == 0:
        return f"{value // 1_000}k"
    return str(value)


def timer_table(results: Sequence[TimerResult]) -> str:
    """The timer results as a markdown table (rates in operations per CPU second)."""
    lines = [
        "| structure | pending | schedule, prebuilt | schedule, incl. construction | cancel "
        "| expire, 1 ms steps | expire, 10 ms steps | expire, one jump | bytes/entry |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        mem = "n/a" if r.bytes_per_entry is None else f"{r.bytes_per_entry:.0f}"
        lines.append(
            f"| {r.impl} | {_fmt_count(r.pending)} | {_fmt_rate(r.schedule_prebuilt_per_s)} "
            f"| {_fmt_rate(r.schedule_constructed_per_s)} | {_fmt_rate(r.cancel_per_s)} "
            f"| {_fmt_rate(r.expire_1ms_per_s)} | {_fmt_rate(r.expire_10ms_per_s)} "
            f"| {_fmt_rate(r.expire_jump_per_s)} | {mem} |"
        )
    return "\n".join(lines)


def _pairs(results: Sequence[SimResult]) -> list[tuple[SimResult, SimResult | None]]:
    by_run = {(r.pct50_ms, r.pct75_ms, r.rate_per_s, r.impl): r for r in results}
    pairs: list[tuple[SimResult, SimResult | None]] = []
    for r in results:
        if r.impl == "wheel":
            pairs.append((r, by_run.get((r.pct50_ms, r.pct75_ms, r.rate_per_s, "heapq"))))
    return pairs


def _counts_ok(r: SimResult) -> bool:
    return r.completed + r.expired == r.requests and r.completed == r.expected_completed


def purgatory_table(results: Sequence[SimResult]) -> str:
    """The purgatory simulation as a markdown table, the wheel beside the heapq baseline."""
    lines = [
        "| pct50/pct75 ms | rate/s | requests | wheel req/CPU s | wheel us/req | wheel load "
        "| heapq req/CPU s | heapq us/req | heapq load | wheel/heapq | completed | expired "
        "| counts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for wheel, heap in _pairs(results):
        ok = _counts_ok(wheel) and (
            heap is None or (_counts_ok(heap) and heap.expired == wheel.expired)
        )
        heap_cells = (
            f"{_fmt_rate(heap.requests_per_cpu_s)} | {heap.cpu_us_per_request:.1f} "
            f"| {heap.load:.2f} | {wheel.requests_per_cpu_s / heap.requests_per_cpu_s:.2f}x"
            if heap is not None
            else "n/a | n/a | n/a | n/a"
        )
        lines.append(
            f"| {wheel.pct50_ms}/{wheel.pct75_ms} | {_fmt_count(wheel.rate_per_s)} "
            f"| {wheel.requests:,} | {_fmt_rate(wheel.requests_per_cpu_s)} "
            f"| {wheel.cpu_us_per_request:.1f} | {wheel.load:.2f} | {heap_cells} "
            f"| {wheel.completed:,} | {wheel.expired:,} | {'ok' if ok else 'MISMATCH'} |"
        )
    return "\n".join(lines)


def highest_sustained(results: Sequence[SimResult], impl: str, case: tuple[int, int]) -> int | None:
    """The highest arrival rate whose replay took less CPU time than simulated time."""
    rates = [
        r.rate_per_s
        for r in results
        if r.impl == impl and (r.pct50_ms, r.pct75_ms) == case and r.sustained
    ]
    return max(rates) if rates else None


def evaluate_targets(timer: Sequence[TimerResult], sims: Sequence[SimResult]) -> list[Target]:
    """Check DESIGN.md's performance targets against this run's figures."""
    targets: list[Target] = []
    asyncio_by_n = {r.pending: r for r in timer if r.impl == "asyncio"}
    largest = max((r.pending for r in timer), default=0)
    for impl in ("wheel", "wheel-512"):
        rows = [r for r in timer if r.impl == impl]
        if not rows:
            continue
        picks: tuple[tuple[str, Callable[[TimerResult], float]], ...] = (
            ("incl. construction", lambda r: r.schedule_constructed_per_s),
            ("prebuilt tasks", lambda r: r.schedule_prebuilt_per_s or 0.0),
        )
        for label, pick in picks:
            ratios = [
                pick(r) / asyncio_by_n[r.pending].schedule_constructed_per_s
                for r in rows
                if r.pending in asyncio_by_n
            ]
            if ratios:
                worst = min(ratios)
                targets.append(
                    Target(
                        f"{impl}: schedule ({label}) vs asyncio call_later",
                        f"{worst:.2f}x (worst size)",
                        ">= 2x",
                        worst >= 2,
                    )
                )
        worst_schedule = min(r.schedule_constructed_per_s for r in rows)
        targets.append(
            Target(
                f"{impl}: schedule rate, incl. construction",
                f"{_fmt_rate(worst_schedule)}/s (worst size)",
                ">= 500 k/s",
                worst_schedule >= 500_000,
            )
        )
        worst_cancel = min(r.cancel_per_s for r in rows)
        targets.append(
            Target(
                f"{impl}: cancel rate",
                f"{_fmt_rate(worst_cancel)}/s (worst size)",
                ">= 2 M/s",
                worst_cancel >= 2_000_000,
            )
        )
        for row in rows:
            if row.pending != largest:
                continue
            for label, value in (("1 ms", row.expire_1ms_per_s), ("10 ms", row.expire_10ms_per_s)):
                if value is not None:
                    targets.append(
                        Target(
                            f"{impl}: expire in {label} steps at {_fmt_count(largest)} pending",
                            f"{_fmt_rate(value)}/s",
                            ">= 1 M/s at 1M pending",
                            value >= 1_000_000,
                        )
                    )
        sizes = [r.bytes_per_entry for r in rows if r.bytes_per_entry is not None]
        if sizes:
            targets.append(
                Target(
                    f"{impl}: bytes per pending entry",
                    f"{max(sizes):.0f} B (worst size)",
                    "<= 150 B",
                    max(sizes) <= 150,
                )
            )
    for wheel, heap in _pairs(sims):
        if wheel.rate_per_s != TARGET_RATE_PER_S:
            continue
        case = f"{wheel.pct50_ms}/{wheel.pct75_ms} ms at {_fmt_count(wheel.rate_per_s)}/s"
        targets.append(
            Target(
                f"purgatory {case}: capacity",
                f"{_fmt_rate(wheel.requests_per_cpu_s)} req/CPU s",
                ">= 100 k req/CPU s",
                wheel.requests_per_cpu_s >= 100_000,
            )
        )
        if heap is not None:
            ratio = wheel.requests_per_cpu_s / heap.requests_per_cpu_s
            targets.append(
                Target(
                    f"purgatory {case}: vs heapq purgatory", f"{ratio:.2f}x", ">= 4x", ratio >= 4
                )
            )
    return targets


def targets_table(targets: Sequence[Target]) -> str:
    """The targets as a markdown table."""
    lines = ["| target | measured | required | met |", "|---|---:|---:|:---:|"]
    lines += [
        f"| {t.name} | {t.measured} | {t.required} | {'yes' if t.met else 'NO'} |" for t in targets
    ]
    return "\n".join(lines)


def realtime_table(results: Sequence[RealtimeResult]) -> str:
    """The real-time runs as a markdown table.

    Every request must get exactly one outcome (``one outcome each``); completions land before
    their deadline only while the process keeps up (``no completion lost to lag``): a lagging
    run turns late completions into expirations, as the service would.
    """
    lines = [
        "| pct50/75 ms | offered/s | achieved/s | driver lag p50/p99/max ms "
        "| reaper lateness max ms | executor lag max ms | one outcome each "
        "| no completion lost to lag |",
        "|---|---:|---:|---:|---:|---:|:---:|:---:|",
    ]
    for r in results:
        whole = r.completed + r.expired == r.requests
        on_time = r.completed == r.expected_completed
        lines.append(
            f"| {r.pct50_ms}/{r.pct75_ms} | {_fmt_count(r.rate_per_s)} "
            f"| {_fmt_count(int(r.requests_per_s))} "
            f"| {r.driver_lag_p50_ms}/{r.driver_lag_p99_ms}/{r.driver_lag_max_ms} "
            f"| {r.reaper_max_lateness_ms} | {r.executor_max_lag_ms} "
            f"| {'yes' if whole else 'NO'} | {'yes' if on_time else 'no'} |"
        )
    return "\n".join(lines)


def render(report: Report) -> str:
    """The whole report as markdown."""
    m = report.machine
    cases = sorted({(r.pct50_ms, r.pct75_ms) for r in report.purgatory})
    sustained_lines = []
    for case in cases:
        cells = []
        for impl in ("wheel", "heapq"):
            best = highest_sustained(report.purgatory, impl, case)
            cells.append(f"{impl} {_fmt_count(best) + '/s' if best else 'none'}")
        sustained_lines.append(f"- {case[0]}/{case[1]} ms: " + ", ".join(cells))
    return "\n".join(
        [
            f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, "
            f"{m['implementation']} {m['python']}, {m['platform']}",
            "",
            "## Timer (operations per CPU second; bytes per pending entry beyond the task)",
            "",
            timer_table(report.timer),
            "",
            "## Purgatory, Kafka's TestPurgatoryPerformance in simulated time "
            f"({report.config.duration_ms} ms of traffic per rate)",
            "",
            purgatory_table(report.purgatory),
            "",
            "Highest arrival rate sustained on one core (CPU time < simulated time):",
            *sustained_lines,
            "",
            "## Purgatory in real time through the reaper and executor "
            f"({report.config.realtime_ms} ms of traffic per rate)",
            "",
            realtime_table(report.realtime),
            "",
            "## Targets (DESIGN.md)",
            "",
            targets_table(report.targets),
            "",
        ]
    )


def run_all(
    config: BenchConfig,
    out_dir: Path,
    *,
    progress: Callable[[str], None] | None = None,
    command: str = "",
) -> Report:
    """Run the benchmarks of ``config``, write JSON and the plot into ``out_dir``."""
    timer = run_timer_benchmarks(
        config.timer_sizes, memory=config.memory, repeats=config.timer_repeats, progress=progress
    )
    sims = run_purgatory_benchmarks(
        config.rates_per_s, config.duration_ms, cases=config.cases, progress=progress
    )
    if progress:
        progress("purgatory in real time through the reaper")
    realtime = run_realtime_benchmarks(config.realtime_rates, config.realtime_ms)
    report = Report(
        machine=machine_info(),
        config=config,
        timer=timer,
        purgatory=sims,
        realtime=realtime,
        targets=evaluate_targets(timer, sims),
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {"command": command, **asdict(report)}
    payload["units"] = {
        "rates": "operations (or requests) per CPU second, time.process_time",
        "bytes_per_entry": "tracemalloc bytes per scheduled task beyond the task object",
        "timer_impls": list(IMPLS),
    }
    (out_dir / "bench-results.json").write_text(json.dumps(payload, indent=2) + "\n")
    plot_timer(
        timer,
        out_dir / "timer-throughput.png",
        title=f"Timer throughput, {report.machine['cpu_model']}, Python {report.machine['python']}",
    )
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``python -m tests.benchmarks.run [--quick] [--out DIR] [--service
    [--broker kafka|tansu|both]]``."""
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (under a minute)")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="output directory")
    parser.add_argument(
        "--service",
        action="store_true",
        help="also run the service end to end (tests.benchmarks.bench_service), on Apache "
        "Kafka and on Tansu",
    )
    parser.add_argument(
        "--broker",
        choices=("kafka", "tansu", "both"),
        default=None,
        help="with --service: the broker(s) to measure the service on (default: both, Kafka first)",
    )
    args = parser.parse_args(argv)
    if args.broker is not None and not args.service:
        parser.error("--broker: only with --service")
    config = QUICK if args.quick else FULL

    def progress(message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)

    command = " ".join(
        ["python -m tests.benchmarks.run", *(argv if argv is not None else sys.argv[1:])]
    )
    report = run_all(config, args.out, progress=progress, command=command)
    print(render(report))
    print(f"Wrote {args.out / 'bench-results.json'} and {args.out / 'timer-throughput.png'}")
    if args.service:
        # Imported only when asked: it brings in the Kafka and HTTP clients.
        from tests.benchmarks import bench_service  # noqa: PLC0415

        brokers = bench_service.brokers_of(args.broker or "both")
        service = bench_service.run_service_benchmarks(
            bench_service.QUICK if args.quick else bench_service.FULL,
            progress=progress,
            brokers=brokers,
        )
        on = " and ".join(bench_service.BROKER_TITLES[b] for b in brokers)
        print(f"\n## The service end to end over loopback ({on}, HTTP)\n")
        print(bench_service.render(service, command, heading="###"))
        bench_service.write_json(service, args.out / "bench-service.json", command)
        print(f"Wrote {args.out / 'bench-service.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
