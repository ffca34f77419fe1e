"""Tests for reaper._executor: one ordered lane, back-pressure, errors counted, drained on close."""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing
from structlog.testing import capture_logs

from purgatory import UsageError
from reaper import Clock, CompletionExecutor


@pytest.mark.parametrize("bad", [0, -1, True, 1.0, "8", 1 << 25])
def test_capacity_is_validated(bad: object) -> None:
    with pytest.raises(UsageError, match="capacity"):
        CompletionExecutor(Clock(), capacity=bad)  # type: ignore[arg-type]


def test_due_ms_is_validated() -> None:
    executor = CompletionExecutor(Clock())
    with pytest.raises(UsageError, match="due_ms"):
        executor.submit_nowait(lambda: None, due_ms=1.5)  # type: ignore[arg-type]


async def test_runs_in_order_and_goes_on_after_an_exception(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    executor = CompletionExecutor(clock, capacity=8)
    ran: list[str] = []

    def fail() -> None:
        ran.append("fail")
        raise RuntimeError("boom")

    async def slow() -> None:
        await trio.sleep(1)
        ran.append("slow")

    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        with capture_logs() as logs:
            executor.submit_nowait(lambda: ran.append("first"), due_ms=0)
            executor.submit_nowait(fail, due_ms=0)
            executor.submit_nowait(slow, due_ms=0)
            executor.submit_nowait(lambda: ran.append("last"), due_ms=0)
            await executor.aclose()

    assert ran == ["first", "fail", "slow", "last"]
    stats = executor.statistics()
    assert (stats.submitted, stats.executed, stats.errors) == (4, 4, 1)
    # "last" waited behind the one-second callable.
    assert stats.last_lag_ms == stats.max_lag_ms == stats.total_lag_ms == 1000
    failures = [entry for entry in logs if entry["event"] == "callback_failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "error"
    assert "boom" in failures[0]["error"]


async def test_close_drains_queued_work_then_run_returns() -> None:
    executor = CompletionExecutor(Clock(), capacity=4)
    ran: list[int] = []
    for i in range(4):
        executor.submit_nowait(functools.partial(ran.append, i), due_ms=0)
    executor.close()
    assert executor.statistics().queued == 4
    assert not executor.statistics().accepting
    await executor.run()  # returns by itself: closed and drained
    assert ran == [0, 1, 2, 3]
    assert executor.statistics().queued == 0


async def test_submit_after_close_raises() -> None:
    executor = CompletionExecutor(Clock())
    executor.close()
    executor.close()  # idempotent
    with pytest.raises(trio.ClosedResourceError, match="closed"):
        await executor.submit(lambda: None, due_ms=0)
    with pytest.raises(trio.ClosedResourceError, match="closed"):
        executor.submit_nowait(lambda: None, due_ms=0)
    assert executor.statistics().submitted == 0


async def test_submit_blocks_when_full_and_nowait_raises_would_block(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock()
    executor = CompletionExecutor(clock, capacity=2)
    ran: list[int] = []
    executor.submit_nowait(lambda: ran.append(0), due_ms=0)
    executor.submit_nowait(lambda: ran.append(1), due_ms=0)
    with pytest.raises(trio.WouldBlock):
        executor.submit_nowait(lambda: ran.append(99), due_ms=0)
    submitted_at_ms: list[int] = []

    async def submit_third() -> None:
        await executor.submit(lambda: ran.append(2), due_ms=0)
        submitted_at_ms.append(clock.now_ms())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit_third)
        await trio.testing.wait_all_tasks_blocked()
        stats = executor.statistics()
        assert (stats.queued, stats.capacity, stats.blocked_submitters) == (2, 2, 1)
        await trio.sleep(5)  # nothing drains the channel: the submitter stays blocked
        assert submitted_at_ms == []
        await nursery.start(executor.run)
        await trio.testing.wait_all_tasks_blocked()
        assert submitted_at_ms == [5000]
        await executor.aclose()
    assert ran == [0, 1, 2]


async def test_close_releases_blocked_submitters_with_a_clear_error() -> None:
    executor = CompletionExecutor(Clock(), capacity=1)
    executor.submit_nowait(lambda: None, due_ms=0)
    errors: list[str] = []

    async def submit_blocked() -> None:
        with pytest.raises(trio.ClosedResourceError) as info:
            await executor.submit(lambda: None, due_ms=0)
        errors.append(str(info.value))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(submit_blocked)
        await trio.testing.wait_all_tasks_blocked()
        executor.close()
    assert errors == ["the CompletionExecutor is closed: it accepts no more work"]


async def test_submit_after_run_was_cancelled_raises_broken() -> None:
    executor = CompletionExecutor(Clock())
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        nursery.cancel_scope.cancel()
    with pytest.raises(trio.BrokenResourceError, match="not running"):
        executor.submit_nowait(lambda: None, due_ms=0)


async def test_lag_is_measured_from_due_ms(autojump_clock: trio.testing.MockClock) -> None:
    clock = Clock(offset_ms=10_000)
    executor = CompletionExecutor(clock)
    await trio.sleep(2)  # now_ms == 12_000
    executor.submit_nowait(lambda: None, due_ms=11_750)
    executor.submit_nowait(lambda: None, due_ms=11_900)
    executor.submit_nowait(lambda: None, due_ms=20_000)  # early work has no lag
    executor.close()
    await executor.run()
    stats = executor.statistics()
    assert (stats.last_lag_ms, stats.max_lag_ms, stats.total_lag_ms) == (0, 250, 350)


async def test_busy_while_a_callable_runs(autojump_clock: trio.testing.MockClock) -> None:
    executor = CompletionExecutor(Clock())
    executor.submit_nowait(trio.sleep_forever, due_ms=0)
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        await trio.testing.wait_all_tasks_blocked()
        assert executor.statistics().busy
        nursery.cancel_scope.cancel()
    stats = executor.statistics()
    assert not stats.busy
    assert stats.executed == 0


async def test_run_twice_is_an_error() -> None:
    executor = CompletionExecutor(Clock())
    executor.close()
    await executor.run()
    with pytest.raises(RuntimeError, match="once"):
        await executor.run()


async def test_a_batch_runs_one_at_a_time_in_order_with_errors_isolated(
    autojump_clock: trio.testing.MockClock,
) -> None:
    executor = CompletionExecutor(Clock(), capacity=1)
    ran: list[int] = []
    others: list[int] = []

    def work(i: int) -> None:
        if i == 70:
            raise RuntimeError("callback 70 failed")
        ran.append(i)

    async def intake() -> None:
        for _ in range(3):
            others.append(len(ran))  # how far the batch had got when intake ran
            await trio.lowlevel.checkpoint()

    with capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await executor.submit_batch([(functools.partial(work, i), 0) for i in range(200)])
            assert executor.statistics().queued == 200  # counted in callables, not batches
            await nursery.start(executor.run)
            nursery.start_soon(intake)
            await executor.aclose()
    assert ran == [i for i in range(200) if i != 70]
    stats = executor.statistics()
    assert (stats.executed, stats.errors, stats.queued, stats.submitted) == (200, 1, 0, 200)
    assert [entry["event"] for entry in logs] == ["callback_failed"]
    assert any(0 < n < 199 for n in others), "intake never ran in the middle of the batch"


async def test_an_empty_batch_is_a_no_op() -> None:
    executor = CompletionExecutor(Clock())
    await executor.submit_batch([])
    assert executor.statistics().submitted == 0
