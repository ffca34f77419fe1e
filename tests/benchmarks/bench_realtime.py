"""Kafka's purgatory workload in real time through the reaper and executor (harness).

The simulated-time benchmark measures CPU capacity; this one confirms the rate holds when the
wheel is driven as the service drives it: on trio's real clock, with the :class:`Reaper` sleeping
until the next bucket and the :class:`CompletionExecutor` running every expiration. A driver task
replays the same event list as :mod:`tests.benchmarks.bench_purgatory` at wall-clock speed:
every event is applied as soon as its time has come (events due together are applied in one
batch, as a consumer poll would hand them over), arrivals call ``try_complete_else_watch`` and
``wake_if_earlier``, completions ``check_and_complete`` on the private key.

Reported per run: requests per wall second (over the window in which arrivals were applied),
how far the driver fell behind the schedule (p50, p99, max of ``applied_at - due_at``), the
reaper's lateness and the executor's lag, and the outcome counts, which must match the event
list.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import trio

from purgatory import DelayedOperationPurgatory
from reaper import Clock, CompletionExecutor, Reaper
from tests.benchmarks.bench_purgatory import SimOp, Workload, make_workload

__all__ = ["RealtimeResult", "run_realtime", "run_realtime_benchmarks"]

_ARRIVAL = 0


@dataclass(frozen=True, slots=True)
class RealtimeResult:
    """One real-time run."""

    rate_per_s: int
    pct50_ms: int
    pct75_ms: int
    requests: int
    wall_s: float
    requests_per_s: float
    driver_lag_p50_ms: int
    driver_lag_p99_ms: int
    driver_lag_max_ms: int
    reaper_max_lateness_ms: int
    executor_max_lag_ms: int
    completed: int
    expired: int
    expected_completed: int

    def as_dict(self) -> dict[str, object]:
        """The result as plain data."""
        return asdict(self)


def _percentile(sorted_values: list[int], q: float) -> int:
    if not sorted_values:
        return 0
    return sorted_values[min(len(sorted_values) - 1, math.ceil(q * len(sorted_values)) - 1)]


async def _drive(workload: Workload) -> RealtimeResult:
    clock = Clock()
    purgatory = DelayedOperationPurgatory("realtime")
    executor = CompletionExecutor(clock, capacity=65_536)
    reaper = Reaper(purgatory, executor, clock)
    ops: list[SimOp | None] = [None] * workload.requests
    lags: list[int] = []
    SimOp.expirations = 0
    completed = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        await nursery.start(reaper.run)
        start = clock.now_ms() + 10
        last_arrival = start
        events = workload.events
        i = 0
        while i < len(events):
            due_at = start + events[i][0]
            now = clock.now_ms()
            if due_at > now:
                await trio.sleep_until(clock.to_trio_seconds(due_at))
                now = clock.now_ms()
            # Everything due by now is one batch, as one consumer poll would deliver it.
            while i < len(events) and start + events[i][0] <= now:
                at_ms, kind, index = events[i]
                lags.append(now - (start + at_ms))
                if kind == _ARRIVAL:
                    last_arrival = now
                    op = SimOp(deadline_ms=start + at_ms + workload.timeout_ms)
                    ops[index] = op
                    purgatory.try_complete_else_watch(op, workload.keys[index])
                    reaper.wake_if_earlier(op.deadline_ms)
                else:
                    target = ops[index]
                    assert target is not None
                    target.done = True
                    completed += purgatory.check_and_complete(workload.private_keys[index])
                i += 1
            await trio.lowlevel.checkpoint()  # let the reaper and the executor run
        # Wait (bounded) until every operation has its outcome: a reaper that fell behind is
        # still handing expirations over after the last event (possibly from a batch it has
        # already taken out of the timer, so the timer's size says nothing).
        with trio.move_on_after(60):
            while completed + SimOp.expirations < workload.requests:
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()
    lags.sort()
    wall_s = (last_arrival - start) / 1000  # the arrival window, as applied
    return RealtimeResult(
        rate_per_s=workload.rate_per_s,
        pct50_ms=workload.pct50_ms,
        pct75_ms=workload.pct75_ms,
        requests=workload.requests,
        wall_s=wall_s,
        requests_per_s=workload.requests / wall_s if wall_s > 0 else 0.0,
        driver_lag_p50_ms=_percentile(lags, 0.50),
        driver_lag_p99_ms=_percentile(lags, 0.99),
        driver_lag_max_ms=lags[-1] if lags else 0,
        reaper_max_lateness_ms=reaper.statistics().max_lateness_ms,
        executor_max_lag_ms=executor.statistics().max_lag_ms,
        completed=completed,
        expired=SimOp.expirations,
        expected_completed=workload.expected_completed,
    )


def run_realtime(
    rate_per_s: int, duration_ms: int, *, pct50_ms: int, pct75_ms: int
) -> RealtimeResult:
    """Replay ``duration_ms`` of the workload at ``rate_per_s`` in real time."""
    workload = make_workload(rate_per_s, duration_ms, pct50_ms=pct50_ms, pct75_ms=pct75_ms)
    return trio.run(_drive, workload)


def run_realtime_benchmarks(
    rates: tuple[int, ...] = (10_000, 50_000, 100_000), duration_ms: int = 3_000
) -> list[RealtimeResult]:
    """The real-time runs for both of Kafka's latency cases."""
    return [
        run_realtime(rate, duration_ms, pct50_ms=p50, pct75_ms=p75)
        for p50, p75 in ((20, 60), (200, 400))
        for rate in rates
    ]
