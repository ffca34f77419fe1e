"""The engine demo (service layer): the typical uses of purgatory, live, in a few seconds.

It runs the real engine under the real reaper and completion executor on trio's clock, and
prints each callback as the executor delivers it:

* a nightly **barrier** that completes when three ingest jobs have signalled, and one that
  expires at its deadline naming the key that never arrived;
* a signal that arrives **before** its waiter and still counts;
* a **quorum** (2 of 3 replicas);
* an **inactivity timer** re-armed by each event, which fires once the events stop;
* an **event-time** wait that expires when the scope's watermark passes its deadline.

Times in the scenario are offsets in ms from the start of the run.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import trio

from purgatory._core import Condition, Engine, OperationSpec, Outcome, TimeDomain
from reaper import Clock, CompletionExecutor, Reaper

__all__ = ["DemoResult", "run_demo"]

_RUN = "2026-11-22"
_NIGHT = f"ingest@{_RUN}"


@dataclass(frozen=True, slots=True)
class DemoResult:
    """What the demo delivered, for the caller and the tests."""

    outcomes: list[Outcome]
    max_reaper_lateness_ms: int
    max_executor_lag_ms: int
    start_ms: int


def _op(
    op_id: str, scope: str, keys: tuple[str, ...], deadline_ms: int, **kw: object
) -> OperationSpec:
    return OperationSpec(op_id=op_id, scope=scope, keys=keys, deadline_ms=deadline_ms, **kw)  # type: ignore[arg-type]


async def run_demo(
    clock: Clock, *, show: Callable[[str], None] = print, speed: float = 1.0
) -> DemoResult:
    """Play the scenario in (trio) real time and return what was delivered.

    Args:
        clock: the time source (its ms are the engine's).
        show: where each line goes.
        speed: >1 plays the scenario faster.
    """
    start = clock.now_ms()
    delivered: list[Outcome] = []
    executor = CompletionExecutor(clock, capacity=1024)

    def deliver(outcome: Outcome) -> None:
        delivered.append(outcome)
        show("callback " + json.dumps(_callback_line(outcome, clock.now_ms(), start)))

    engine = Engine(start_ms=start)

    def hand(outcomes: list[Outcome]) -> None:
        for o in outcomes:
            executor.submit_nowait(functools.partial(deliver, o), due_ms=o.outcome_ms)

    async def expired(outcomes: list[Outcome]) -> None:
        hand(outcomes)
        await trio.lowlevel.checkpoint()

    reaper = Reaper(engine, expired, clock, max_sleep_ms=200)

    def at(offset_ms: int) -> float:
        return clock.to_trio_seconds(start + int(offset_ms / speed))

    def ms(offset_ms: int) -> int:
        return start + int(offset_ms / speed)

    def register(spec: OperationSpec) -> None:
        reg = engine.register(spec, now_ms=clock.now_ms())
        show(f"register {spec.op_id!r} in {spec.scope!r}: {reg.status.value}")
        if reg.status.value == "completed" and reg.outcome is not None:
            hand([reg.outcome])
        reaper.wake_if_earlier(spec.deadline_ms)

    def signal(scope: str, key: str) -> None:
        done = engine.signal(scope, key, now_ms=clock.now_ms())
        hand(done)
        show(f"signal {key!r} in {scope!r}: completed {len(done)}")

    def watermark(scope: str, watermark_ms: int) -> None:
        engine.advance_watermark(scope, watermark_ms)
        reaper.wake()  # event-time deadlines it passed are due now
        show(f"watermark {scope}={watermark_ms}")

    script = _script(_Actions(register, signal, watermark), ms)
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        await nursery.start(reaper.run)
        for offset, action in script:
            await trio.sleep_until(at(offset))
            action()
        await trio.sleep_until(at(2_200))
        nursery.cancel_scope.cancel()
    stats = executor.statistics()
    return DemoResult(delivered, reaper.statistics().max_lateness_ms, stats.max_lag_ms, start)


class _Actions(NamedTuple):
    """What a step of the scenario does to the engine."""

    register: Callable[[OperationSpec], None]
    signal: Callable[[str, str], None]
    watermark: Callable[[str, int], None]


def _script(act: _Actions, ms: Callable[[int], int]) -> list[tuple[int, Callable[[], None]]]:
    """The scenario: at each offset (ms from the start, before the speed-up), one action."""
    keys = ("ingest/orders", "ingest/users", "ingest/stock")
    return [
        (
            0,
            lambda: act.register(
                _op("nightly-report", _NIGHT, keys, ms(1_500), payload='{"job": "report"}')
            ),
        ),
        (
            0,
            lambda: act.register(
                _op("nightly-audit", _NIGHT, (*keys, "ingest/returns"), ms(1_200))
            ),
        ),
        (
            0,
            lambda: act.register(
                _op(
                    "replicas",
                    "orders-v2",
                    ("r1", "r2", "r3"),
                    ms(2_000),
                    condition=Condition.COUNT,
                    count=2,
                )
            ),
        ),
        (0, lambda: act.register(_op("session/alice", "clicks", (), ms(600)))),
        (
            0,
            lambda: act.register(
                _op(
                    "hourly-rollup",
                    "clicks",
                    ("rollup",),
                    10_000,
                    time_domain=TimeDomain.EVENT_TIME,
                )
            ),
        ),
        (100, lambda: act.signal(_NIGHT, "ingest/orders")),
        (200, lambda: act.register(_op("session/alice", "clicks", (), ms(800)))),
        (250, lambda: act.signal("orders-v2", "r3")),
        (300, lambda: act.signal(_NIGHT, "ingest/users")),
        (400, lambda: act.register(_op("session/alice", "clicks", (), ms(1_000)))),
        (450, lambda: act.signal("orders-v2", "r1")),
        (500, lambda: act.signal(_NIGHT, "ingest/stock")),
        (600, lambda: act.register(_op("dashboard", _NIGHT, ("ingest/users",), ms(3_000)))),
        (1_300, lambda: act.watermark("clicks", 9_000)),
        (1_700, lambda: act.watermark("clicks", 10_000)),
    ]


def _callback_line(outcome: Outcome, now_ms: int, start_ms: int) -> dict[str, object]:
    return {
        "t_ms": now_ms - start_ms,
        "op_id": outcome.op_id,
        "scope": outcome.scope,
        "outcome": outcome.outcome.value,
        "keys": list(outcome.keys),
        "missing": list(outcome.missing),
        "late_by_ms": now_ms - outcome.outcome_ms,
        "sequence": outcome.sequence,
    }


def summarize(result: DemoResult) -> str:
    """A short summary of a demo run."""
    counts = Counter(o.outcome.value for o in result.outcomes)
    parts = ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items()))
    return (
        f"summary: {len(result.outcomes)} callbacks ({parts}); "
        f"max reaper lateness {result.max_reaper_lateness_ms} ms; "
        f"max executor lag {result.max_executor_lag_ms} ms"
    )
