"""Tests for reaper._reaper: exact expiry, early wake-ups, no spinning, never blocked by work."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Hashable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from purgatory import DelayedOperation, DelayedOperationPurgatory, Timer, TimerTask, UsageError
from reaper import Clock, CompletionExecutor, Expirable, Reaper

EPOCH_2025_MS = 1_763_769_600_000

Record = tuple[str, float]


class PurgatorySource:
    """A purgatory as the reaper's source, recording every time the reaper advances it."""

    def __init__(self, purgatory: DelayedOperationPurgatory) -> None:
        self.purgatory = purgatory
        self.advanced_to_ms: list[int] = []

    def advance_clock(self, now_ms: int) -> list[TimerTask]:
        self.advanced_to_ms.append(now_ms)
        return self.purgatory.advance_clock(now_ms)

    def next_expiration_ms(self) -> int | None:
        return self.purgatory.next_expiration_ms()


class CountingSource:
    """A source that records every call; ``due_ms`` is what it claims is next, truthfully or not."""

    def __init__(self, due_ms: int | None = None) -> None:
        self.due_ms = due_ms
        self.advanced_to_ms: list[int] = []

    def advance_clock(self, now_ms: int) -> list[TimerTask]:
        self.advanced_to_ms.append(now_ms)
        return []

    def next_expiration_ms(self) -> int | None:
        return self.due_ms


class RecordingOperation(DelayedOperation):
    """Records its name and the trio time at which it expired."""

    def __init__(self, name: str, *, deadline_ms: int, log: list[Record]) -> None:
        super().__init__(deadline_ms=deadline_ms)
        self.name = name
        self.log = log

    def on_expiration(self) -> None:
        self.log.append((self.name, trio.current_time()))


class FailingOperation(RecordingOperation):
    def on_expiration(self) -> None:
        super().on_expiration()
        raise RuntimeError(f"{self.name} failed")


class RecordingTask(TimerTask):
    def __init__(self, name: str, *, deadline_ms: int, log: list[Record]) -> None:
        super().__init__(deadline_ms=deadline_ms)
        self.name = name
        self.log = log

    def run(self) -> None:
        self.log.append((self.name, trio.current_time()))


def as_ms(clock: Clock, trio_seconds: float) -> int:
    return clock.offset_ms + math.floor(trio_seconds * 1000)


@asynccontextmanager
async def running(
    source: Expirable, clock: Clock, *, max_sleep_ms: int = 200, capacity: int = 1024
) -> AsyncIterator[tuple[Reaper, CompletionExecutor]]:
    executor = CompletionExecutor(clock, capacity=capacity)
    reaper = Reaper(source, executor, clock, max_sleep_ms=max_sleep_ms)
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        await nursery.start(reaper.run)
        yield reaper, executor
        nursery.cancel_scope.cancel()


def watch(
    purgatory: DelayedOperationPurgatory, reaper: Reaper, op: DelayedOperation, key: Hashable
) -> None:
    """What the service does to register an operation: watch it, then wake the reaper if needed."""
    assert not purgatory.try_complete_else_watch(op, [key])
    reaper.wake_if_earlier(op.deadline_ms)


async def test_an_operation_expires_exactly_at_its_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock(offset_ms=EPOCH_2025_MS)
    purgatory = DelayedOperationPurgatory("test", timer=Timer(start_ms=clock.now_ms()))
    log: list[Record] = []
    async with running(PurgatorySource(purgatory), clock) as (reaper, _):
        deadline_ms = clock.now_ms() + 30_000
        watch(purgatory, reaper, RecordingOperation("op", deadline_ms=deadline_ms, log=log), "k")
        await trio.sleep(31)
        stats = reaper.statistics()
    [(name, expired_at)] = log
    assert name == "op"
    assert as_ms(clock, expired_at) == deadline_ms
    assert stats.max_lateness_ms == 0
    assert stats.handed_off == 1
    assert purgatory.statistics().expired == 1


async def test_deadlines_that_float_rounding_would_miss_expire_exactly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # 1001 / 1000 * 1000 == 1000.999...: a naive conversion would wake one millisecond early,
    # advance the wheel to 1000 and expire the operation a whole round later.
    clock = Clock()
    purgatory = DelayedOperationPurgatory("test")
    log: list[Record] = []
    deadlines_ms = [1001, 1003, 2005, 4350, 9999, 12_347, 30_000, 30_001]
    async with running(PurgatorySource(purgatory), clock) as (reaper, _):
        for deadline_ms in deadlines_ms:
            op = RecordingOperation(str(deadline_ms), deadline_ms=deadline_ms, log=log)
            watch(purgatory, reaper, op, deadline_ms)
        await trio.sleep(31)
        assert reaper.statistics().max_lateness_ms == 0
    assert [(int(name), as_ms(clock, at)) for name, at in log] == [(d, d) for d in deadlines_ms]


async def test_an_earlier_deadline_wakes_the_sleeping_reaper_on_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    purgatory = DelayedOperationPurgatory("test")
    source = PurgatorySource(purgatory)
    log: list[Record] = []
    async with running(source, clock, max_sleep_ms=60_000) as (reaper, _):
        watch(purgatory, reaper, RecordingOperation("late", deadline_ms=10_000, log=log), "a")
        await trio.sleep(1)
        assert reaper.statistics().sleeping_until_ms == 10_000
        watch(purgatory, reaper, RecordingOperation("early", deadline_ms=3_000, log=log), "b")
        assert reaper.statistics().sleeping_until_ms == 3_000
        await trio.sleep(10)
        stats = reaper.statistics()
    assert [(name, as_ms(clock, at)) for name, at in log] == [("early", 3_000), ("late", 10_000)]
    assert stats.max_lateness_ms == 0
    # It woke for 3 s, then for the overflow bucket that holds 10 s (9 728 ms with the
    # purgatory's 512-slot wheel: tick 512 ms at level 1), then for 10 s: only for buckets,
    # never on a tick.
    assert source.advanced_to_ms == [3_000, 9_728, 10_000]


async def test_wake_if_earlier_ignores_later_deadlines(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    async with running(CountingSource(), clock, max_sleep_ms=1_000) as (reaper, _):
        reaper.wake_if_earlier(5_000)
        reaper.wake_if_earlier(1_000)
        assert reaper.statistics().sleeping_until_ms == 1_000


async def test_a_slow_callback_delays_callbacks_but_never_the_reaper(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    purgatory = DelayedOperationPurgatory("test")
    log: list[Record] = []

    async def slow_callback() -> None:
        await trio.sleep(5)
        log.append(("slow", trio.current_time()))

    async with running(PurgatorySource(purgatory), clock) as (reaper, executor):
        executor.submit_nowait(slow_callback, due_ms=0)
        for second in (1, 2, 3, 4):
            op = RecordingOperation(f"op{second}", deadline_ms=second * 1000, log=log)
            watch(purgatory, reaper, op, second)
        for second in (1, 2, 3, 4):
            await trio.sleep_until(second + 0.5)
            reaper_stats, executor_stats = reaper.statistics(), executor.statistics()
            # The reaper advanced the wheel on time and handed the expiration off...
            assert reaper_stats.handed_off == second
            assert reaper_stats.max_lateness_ms == 0
            # ...where it waits, visibly, behind the slow callback.
            assert executor_stats.busy
            assert executor_stats.queued == second
            assert log == []
        assert reaper.statistics().advanced_to_ms == 4_400  # still waking on its 200 ms bound
        await trio.sleep_until(6)
        executor_stats = executor.statistics()
    assert [(name, as_ms(clock, at)) for name, at in log] == [
        ("slow", 5_000),
        ("op1", 5_000),
        ("op2", 5_000),
        ("op3", 5_000),
        ("op4", 5_000),
    ]
    assert executor_stats.max_lag_ms == 4_000  # op1, due at 1 s, started at 5 s
    assert executor_stats.last_lag_ms == 1_000  # op4, due at 4 s
    assert executor_stats.total_lag_ms == 4_000 + 3_000 + 2_000 + 1_000  # "slow" was on time
    assert executor_stats.queued == 0


async def test_a_full_executor_holds_the_reaper_back_and_shows_as_lateness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    # A wide wheel: every deadline below 8.192 s is its own bucket, so lateness reads simply.
    purgatory = DelayedOperationPurgatory("test", timer=Timer(wheel_size=8192))
    log: list[Record] = []
    async with running(PurgatorySource(purgatory), clock, capacity=1) as (reaper, executor):
        executor.submit_nowait(lambda: trio.sleep(5), due_ms=0)
        await trio.testing.wait_all_tasks_blocked()  # running it: the channel is empty again
        for second in (1, 2, 3):
            op = RecordingOperation(f"op{second}", deadline_ms=second * 1000, log=log)
            watch(purgatory, reaper, op, second)
        await trio.sleep_until(4.5)
        # op1 fills the channel at 1 s; the reaper then waits to hand op2 off (back-pressure).
        assert executor.statistics().blocked_submitters == 1
        assert reaper.statistics().handed_off == 1
        await trio.sleep_until(6)
        stats = reaper.statistics()
    assert [name for name, _ in log] == ["op1", "op2", "op3"]
    assert stats.handed_off == 3
    # Released at 5 s, the reaper found op3's bucket (3 s) two seconds overdue.
    assert stats.max_lateness_ms == 2_000


@pytest.mark.parametrize("max_sleep_ms", [200, 1_000, 10_000])
async def test_the_reaper_does_not_spin_when_nothing_is_due(
    autojump_clock: trio.testing.MockClock, max_sleep_ms: int
) -> None:
    clock = Clock()
    source = CountingSource()
    async with running(source, clock, max_sleep_ms=max_sleep_ms) as (reaper, _):
        await trio.sleep(10)
        await trio.testing.wait_all_tasks_blocked()
        stats = reaper.statistics()
    assert stats.wakeups <= 10_000 // max_sleep_ms + 1
    assert stats.wakeups == len(source.advanced_to_ms)
    assert source.advanced_to_ms == list(range(max_sleep_ms, 10_001, max_sleep_ms))


async def test_a_far_deadline_is_slept_towards_in_max_sleep_steps(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    purgatory = DelayedOperationPurgatory("test")
    log: list[Record] = []
    async with running(PurgatorySource(purgatory), clock) as (reaper, _):
        watch(purgatory, reaper, RecordingOperation("op", deadline_ms=3_600_000, log=log), "k")
        await trio.sleep(10)
        assert reaper.statistics().wakeups <= 10_000 // 200 + 1


async def test_a_source_that_lies_about_being_due_cannot_make_it_spin(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    source = CountingSource(due_ms=0)  # always "due", never returns anything
    async with running(source, clock) as (reaper, _):
        await trio.sleep(1)
        stats = reaper.statistics()
    assert stats.wakeups <= 1_000 + 1
    assert stats.max_lateness_ms <= 1


async def test_exceptions_are_counted_and_later_expirations_still_run_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    purgatory = DelayedOperationPurgatory("test")
    log: list[Record] = []
    async with running(PurgatorySource(purgatory), clock) as (reaper, executor):
        # Same deadline: they expire in the order they were added.
        for name in ("a", "b", "c"):
            cls = FailingOperation if name == "b" else RecordingOperation
            watch(purgatory, reaper, cls(name, deadline_ms=500, log=log), name)
        watch(purgatory, reaper, RecordingOperation("d", deadline_ms=700, log=log), "d")
        await trio.sleep(1)
        stats = executor.statistics()
    assert [name for name, _ in log] == ["a", "b", "c", "d"]
    assert (stats.executed, stats.errors) == (4, 1)


async def test_an_overdue_operation_expires_at_once_without_counting_as_lateness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    purgatory = DelayedOperationPurgatory("test")
    log: list[Record] = []
    async with running(PurgatorySource(purgatory), clock, max_sleep_ms=60_000) as (reaper, _):
        await trio.sleep(5)
        watch(purgatory, reaper, RecordingOperation("op", deadline_ms=1_000, log=log), "k")
        await trio.testing.wait_all_tasks_blocked()
        stats = reaper.statistics()
    assert [(name, as_ms(clock, at)) for name, at in log] == [("op", 5_000)]
    assert stats.max_lateness_ms == 0


async def test_a_completed_operation_is_not_expired(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    purgatory = DelayedOperationPurgatory("test")
    log: list[Record] = []
    async with running(PurgatorySource(purgatory), clock) as (reaper, _):
        op = RecordingOperation("op", deadline_ms=1_000, log=log)
        watch(purgatory, reaper, op, "k")
        await trio.sleep(0.5)
        assert op.force_complete()
        await trio.sleep(1)
        stats = reaper.statistics()
    assert log == []
    assert stats.handed_off == 0


async def test_wake_makes_it_reread_the_clock_now(autojump_clock: trio.testing.MockClock) -> None:
    clock = Clock()
    source = CountingSource()
    async with running(source, clock, max_sleep_ms=60_000) as (reaper, _):
        await trio.sleep(1)
        assert source.advanced_to_ms == []
        reaper.wake()
        await trio.testing.wait_all_tasks_blocked()
        stats = reaper.statistics()
    assert source.advanced_to_ms == [1_000]
    assert (stats.wakeups, stats.max_lateness_ms) == (1, 0)
    assert stats.sleeping_until_ms == 61_000


async def test_the_worked_example(autojump_clock: trio.testing.MockClock) -> None:
    clock = Clock()
    timer = Timer(wheel_size=512)
    log: list[Record] = []
    sleeps: list[tuple[int, int | None]] = []

    async def at(time_ms: int) -> None:
        await trio.sleep_until(clock.to_trio_seconds(time_ms))
        await trio.testing.wait_all_tasks_blocked()
        sleeps.append((time_ms, reaper.statistics().sleeping_until_ms))

    async with running(timer, clock) as (reaper, _):
        timer.add(RecordingTask("op450", deadline_ms=450, log=log))
        reaper.wake_if_earlier(450)
        await at(0)
        await at(120)
        timer.add(RecordingTask("op130", deadline_ms=130, log=log))
        reaper.wake_if_earlier(130)
        sleeps.append((120, reaper.statistics().sleeping_until_ms))
        await at(130)
        await at(330)
        await at(450)
        stats = reaper.statistics()
    assert sleeps == [(0, 200), (120, 200), (120, 130), (130, 330), (330, 450), (450, 650)]
    assert [(name, as_ms(clock, at)) for name, at in log] == [("op130", 130), ("op450", 450)]
    assert (stats.wakeups, stats.handed_off, stats.max_lateness_ms) == (3, 2, 0)


@pytest.mark.parametrize("bad", [0, -200, True, 0.5, None, 24 * 3600 * 1000 + 1])
def test_max_sleep_ms_is_validated(bad: object) -> None:
    clock = Clock()
    with pytest.raises(UsageError, match="max_sleep_ms"):
        Reaper(Timer(), CompletionExecutor(clock), clock, max_sleep_ms=bad)  # type: ignore[arg-type]


async def test_run_twice_is_an_error(autojump_clock: trio.testing.MockClock) -> None:
    clock = Clock()
    async with running(Timer(), clock) as (reaper, _):
        with pytest.raises(RuntimeError, match="once"):
            await reaper.run()


async def test_shutdown_stops_the_reaper_then_drains_the_executor(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    purgatory = DelayedOperationPurgatory("test")
    executor = CompletionExecutor(clock)
    reaper = Reaper(purgatory, executor, clock)  # the purgatory is itself Expirable
    log: list[Record] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        async with trio.open_nursery() as reaper_nursery:
            await reaper_nursery.start(reaper.run)
            executor.submit_nowait(lambda: trio.sleep(10), due_ms=0)
            for name in ("a", "b", "c"):
                watch(purgatory, reaper, RecordingOperation(name, deadline_ms=1_000, log=log), name)
            await trio.sleep(2)
            reaper_nursery.cancel_scope.cancel()
        assert executor.statistics().queued == 3
        await executor.aclose()
        assert [as_ms(clock, at) for _, at in log] == [10_000] * 3
