"""Smoke tests of the benchmark harness at tiny sizes (tests of the harness, never of speed).

They check that each benchmark does the work it claims (every scheduled task comes back, every
simulated request ends exactly once, the figures are present and positive, the report files are
written), so the published numbers measure what their labels say. No assertion depends on time.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path

import pytest

from tests.benchmarks._baselines import HeapqPurgatory, HeapTimer
from tests.benchmarks.bench_purgatory import PURGATORIES, SimOp, make_workload, simulate
from tests.benchmarks.bench_realtime import run_realtime
from tests.benchmarks.bench_timer import IMPLS, TimerResult, bench_timer, make_deadlines
from tests.benchmarks.run import BenchConfig, render, run_all

TINY = 2_000


def _positive(value: float | None) -> bool:
    return value is not None and value > 0 and math.isfinite(value)


@pytest.mark.parametrize("impl", IMPLS)
def test_timer_benchmark_returns_every_task_and_positive_figures(impl: str) -> None:
    deadlines = make_deadlines(TINY, seed=3)
    result = bench_timer(impl, deadlines, repeats=1)
    assert result.impl == impl
    assert result.pending == TINY
    assert result.returned
    assert all(count == TINY for count in result.returned.values()), result.returned
    assert _positive(result.schedule_constructed_per_s)
    assert _positive(result.cancel_per_s)
    assert _positive(result.expire_jump_per_s)
    assert _positive(result.bytes_per_entry)
    if impl == "asyncio":
        assert result.schedule_prebuilt_per_s is None
        assert set(result.returned) == {"jump"}
    else:
        assert _positive(result.schedule_prebuilt_per_s)
        assert _positive(result.expire_1ms_per_s)
        assert _positive(result.expire_10ms_per_s)
        assert set(result.returned) == {"1ms", "10ms", "jump"}


def test_heap_timer_expires_in_deadline_order_and_skips_cancelled() -> None:
    heap = HeapTimer()
    tasks = [SimOp(deadline_ms=d) for d in (30, 10, 20, 10)]
    entries = [heap.add(task.deadline_ms, task) for task in tasks]
    heap.cancel(entries[2])
    assert len(heap) == 3
    assert heap.advance_clock(9) == []
    assert heap.advance_clock(25) == [tasks[1], tasks[3]]
    assert heap.advance_clock(30) == [tasks[0]]
    assert len(heap) == 0


@pytest.mark.parametrize(("pct50_ms", "pct75_ms"), [(20, 60), (200, 400)])
def test_simulation_ends_every_request_exactly_once(pct50_ms: int, pct75_ms: int) -> None:
    workload = make_workload(20_000, 150, pct50_ms=pct50_ms, pct75_ms=pct75_ms, seed=5)
    assert 2_000 < workload.requests < 4_000
    assert 0 < workload.expected_completed < workload.requests
    outcomes = set()
    for impl in PURGATORIES:
        result = simulate(impl, workload)
        assert result.requests == workload.requests
        assert result.completed + result.expired == result.requests
        assert result.completed == workload.expected_completed
        assert _positive(result.requests_per_cpu_s)
        assert _positive(result.cpu_us_per_request)
        outcomes.add((result.completed, result.expired))
    assert len(outcomes) == 1


def test_workload_is_sorted_with_arrivals_first_and_completions_before_deadline() -> None:
    workload = make_workload(5_000, 400, pct50_ms=20, pct75_ms=60, seed=11)
    events = workload.events
    assert events == sorted(events)
    arrival_ms: dict[int, int] = {}
    for time_ms, kind, index in events:
        if kind == 0:
            arrival_ms[index] = time_ms
        else:
            assert index in arrival_ms
            assert time_ms < arrival_ms[index] + workload.timeout_ms
    assert len(arrival_ms) == workload.requests
    assert all(len(set(keys)) == 4 for keys in workload.keys)


def test_heapq_purgatory_keeps_completed_operations_until_their_deadline() -> None:
    purgatory = HeapqPurgatory(purge_interval=0)
    op = SimOp(deadline_ms=100)
    assert not purgatory.try_complete_else_watch(op, ["a", "b", "a"])
    assert purgatory.watched() == 2
    op.done = True
    assert purgatory.check_and_complete("a") == 1
    assert purgatory.heap_size() == 1
    assert purgatory.advance_clock(100) == []
    assert purgatory.heap_size() == 0
    assert purgatory.watched() == 0


def test_run_all_writes_json_and_plot(tmp_path: Path) -> None:
    config = BenchConfig(
        timer_sizes=(1_000,),
        rates_per_s=(2_000, 10_000),
        duration_ms=200,
        cases=((20, 60),),
        timer_repeats=1,
        realtime_rates=(2_000,),
        realtime_ms=200,
    )
    report = run_all(config, tmp_path)
    data = json.loads((tmp_path / "bench-results.json").read_text())
    assert {"machine", "config", "timer", "purgatory", "realtime", "targets", "units"} <= set(data)
    assert [r["rate_per_s"] for r in data["realtime"]] == [2_000, 2_000]
    assert len(data["timer"]) == len(IMPLS)
    expected_fields = {f.name for f in fields(TimerResult)}
    assert all(set(row) == expected_fields for row in data["timer"])
    assert len(data["purgatory"]) == 2 * len(PURGATORIES)
    assert data["targets"]
    png = (tmp_path / "timer-throughput.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    text = render(report)
    assert "| wheel |" in text
    assert "MISMATCH" not in text


def test_realtime_run_through_the_reaper_accounts_for_every_request() -> None:
    result = run_realtime(2_000, 300, pct50_ms=20, pct75_ms=60)
    assert result.requests > 0
    assert result.completed == result.expected_completed
    assert result.completed + result.expired == result.requests
    assert result.driver_lag_max_ms >= result.driver_lag_p99_ms >= result.driver_lag_p50_ms >= 0
