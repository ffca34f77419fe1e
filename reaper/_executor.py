"""The completion executor (reaper layer concept: one ordered lane for expirations and callbacks).

Kafka runs expirations on a single executor thread so that they never run on the reaper's path
and never run concurrently with each other. Here that lane is ONE trio task draining a bounded
memory channel: submitted zero-argument callables run in submission order, one at a time. A full
channel blocks :meth:`CompletionExecutor.submit` (back-pressure, not buffering), and a slow
callable shows up as queue depth and lag in :meth:`CompletionExecutor.statistics`, never as a
silent stall. A callable's ``Exception`` is logged (``callback_failed``) and counted, and the
lane goes on. Shutdown: :meth:`CompletionExecutor.close` stops intake, and
:meth:`CompletionExecutor.run` drains what the channel holds, then returns.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
import trio

from purgatory._core.engine.validate import check_ms, check_positive_int
from purgatory._core.wheel.timer import TimerTask
from reaper._clock import Clock

__all__ = ["CompletionExecutor", "ExecutorStatistics", "Work"]

#: A unit of work: a zero-argument callable. If it returns an awaitable (an ``async def``
#: function, for instance), the executor awaits it before starting the next one.
Work = Callable[[], object]

_log = structlog.get_logger("reaper.executor")

_MAX_CAPACITY = 1 << 24


@dataclass(frozen=True, slots=True)
class ExecutorStatistics:
    """Counts describing a :class:`CompletionExecutor` at one instant.

    Lag is how late a callable started: ``now_ms`` when it started minus its ``due_ms``
    (0 when it started early).
    """

    #: callables waiting, across queued batches (not counting the one running)
    queued: int
    #: the channel's bound, in batches (a plain submit is a batch of one)
    capacity: int
    #: tasks blocked in :meth:`CompletionExecutor.submit` because the channel is full
    blocked_submitters: int
    #: True while a callable is running
    busy: bool
    #: callables accepted by ``submit``/``submit_nowait``
    submitted: int
    #: callables that ran to the end, including those that raised
    executed: int
    #: callables that raised an ``Exception``
    errors: int
    last_lag_ms: int
    max_lag_ms: int
    #: the sum of every started callable's lag (mean lag = total / started)
    total_lag_ms: int
    #: False once :meth:`CompletionExecutor.close` was called
    accepting: bool


class CompletionExecutor:
    """Runs submitted callables in order, one at a time, in a single trio task.

    Start :meth:`run` in a nursery, then :meth:`submit` work; :meth:`close` to shut down.

    Args:
        clock: the clock that measures lag.
        capacity: how many callables the channel holds before ``submit`` blocks.

    Raises:
        UsageError: (a ``ValueError``) if ``capacity`` is not an int in ``[1, 2**24]``.
    """

    def __init__(self, clock: Clock, *, capacity: int = 1024) -> None:
        check_positive_int("capacity", capacity, maximum=_MAX_CAPACITY)
        self._clock = clock
        self._capacity = capacity
        self._send, self._receive = trio.open_memory_channel[list[tuple[Work, int]]](capacity)
        self._accepting = True
        self._started = False
        self._finished = trio.Event()
        self._busy = False
        self._submitted = 0
        self._queued = 0  # callables waiting, across batches
        self._executed = 0
        self._errors = 0
        self._last_lag_ms = 0
        self._max_lag_ms = 0
        self._total_lag_ms = 0

    async def submit(self, fn: Work, *, due_ms: int) -> None:
        """Queue ``fn``, waiting while the channel is full (back-pressure).

        Args:
            fn: the zero-argument callable to run.
            due_ms: when it should ideally run (an expiration's deadline, a completion's
                arrival time), on the executor's clock; lag is measured from it.

        Raises:
            UsageError: if ``due_ms`` is not an int in ``[0, MAX_TIME_MS]``.
            trio.ClosedResourceError: if the executor was closed (even while this call waited).
            trio.BrokenResourceError: if :meth:`run` ended without a close (it was cancelled).
        """
        await self.submit_batch([(fn, due_ms)])

    async def submit_batch(self, batch: Sequence[tuple[Work, int]]) -> None:
        """Queue several callables as one channel item; they still run one at a time, in order.

        The reaper hands over everything one advance returned this way: one channel send per
        batch, not per task. Each callable's error is isolated and counted as for :meth:`submit`,
        and the executor yields to other tasks every few callables within a batch.

        Args:
            batch: ``(fn, due_ms)`` pairs, in the order they must run.

        Raises:
            UsageError: if a ``due_ms`` is not an int in ``[0, MAX_TIME_MS]``.
            trio.ClosedResourceError: if the executor was closed (even while this call waited).
            trio.BrokenResourceError: if :meth:`run` ended without a close (it was cancelled).
        """
        items = [(fn, _check_due_ms(due)) for fn, due in batch]
        if not items:
            return
        try:
            await self._send.send(items)
        except trio.ClosedResourceError:
            raise trio.ClosedResourceError(_CLOSED) from None
        except trio.BrokenResourceError:
            raise trio.BrokenResourceError(_STOPPED) from None
        self._submitted += len(items)
        self._queued += len(items)

    async def submit_tasks(self, tasks: Sequence[TimerTask]) -> None:
        """Queue the ``run`` of each expired task, due at its deadline (the reaper's hand-off).

        Raises:
            trio.ClosedResourceError: if the executor was closed (even while this call waited).
            trio.BrokenResourceError: if :meth:`run` ended without a close (it was cancelled).
        """
        await self.submit_batch([(task.run, task.deadline_ms) for task in tasks])

    def submit_nowait(self, fn: Work, *, due_ms: int) -> None:
        """Queue ``fn`` if the channel has room.

        Args:
            fn: the zero-argument callable to run.
            due_ms: when it should ideally run, on the executor's clock.

        Raises:
            trio.WouldBlock: if the channel is full.
            UsageError: if ``due_ms`` is not an int in ``[0, MAX_TIME_MS]``.
            trio.ClosedResourceError: if the executor was closed.
            trio.BrokenResourceError: if :meth:`run` ended without a close (it was cancelled).
        """
        items = [(fn, _check_due_ms(due_ms))]
        try:
            self._send.send_nowait(items)
        except trio.ClosedResourceError:
            raise trio.ClosedResourceError(_CLOSED) from None
        except trio.BrokenResourceError:
            raise trio.BrokenResourceError(_STOPPED) from None
        self._submitted += 1
        self._queued += 1

    def close(self) -> None:
        """Stop intake: later submits raise; :meth:`run` drains what is queued, then returns.

        Idempotent. Submitters blocked on a full channel get ``trio.ClosedResourceError``.
        """
        self._accepting = False
        self._send.close()

    async def aclose(self) -> None:
        """:meth:`close`, then wait until :meth:`run` has drained the queue and returned.

        If :meth:`run` was never started, only closes: nobody would drain the queue.
        """
        self.close()
        if self._started:
            await self._finished.wait()
        else:
            await trio.lowlevel.checkpoint()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run queued callables in order until the executor is closed and drained.

        Every batch starts with a checkpoint, and a long batch yields every 64 callables, so the
        reaper and the intake run between callables. Cancelling this task drops what is still
        queued.

        Args:
            task_status: ``started()`` is called once the executor is ready.

        Raises:
            RuntimeError: if ``run`` was already called.
        """
        if self._started:
            raise RuntimeError("CompletionExecutor.run() may only be called once")
        self._started = True
        try:
            async with self._receive:
                task_status.started()
                async for batch in self._receive:
                    for index, (fn, due_ms) in enumerate(batch):
                        if index and not index % _YIELD_EVERY:
                            await trio.lowlevel.checkpoint()
                        self._queued -= 1
                        await self._execute(fn, due_ms)
        finally:
            self._finished.set()

    def statistics(self) -> ExecutorStatistics:
        """A frozen record of the executor's counts (cheap: call it at every scrape)."""
        channel = self._send.statistics()
        return ExecutorStatistics(
            queued=self._queued,
            capacity=self._capacity,
            blocked_submitters=channel.tasks_waiting_send,
            busy=self._busy,
            submitted=self._submitted,
            executed=self._executed,
            errors=self._errors,
            last_lag_ms=self._last_lag_ms,
            max_lag_ms=self._max_lag_ms,
            total_lag_ms=self._total_lag_ms,
            accepting=self._accepting,
        )

    async def _execute(self, fn: Work, due_ms: int) -> None:
        lag_ms = max(0, self._clock.now_ms() - due_ms)
        self._last_lag_ms = lag_ms
        self._max_lag_ms = max(self._max_lag_ms, lag_ms)
        self._total_lag_ms += lag_ms
        self._busy = True
        try:
            result = fn()
            if inspect.isawaitable(result):
                await result
        except Exception as exc:
            self._errors += 1
            _log.error(
                "callback_failed",
                callback=getattr(fn, "__qualname__", repr(fn)),
                error=repr(exc),
                due_ms=due_ms,
                lag_ms=lag_ms,
                exc_info=exc,
            )
        finally:
            self._busy = False
        self._executed += 1


#: Within a batch, let the other tasks (intake, the reaper) run every this many callables.
_YIELD_EVERY = 64

_CLOSED = "the CompletionExecutor is closed: it accepts no more work"
_STOPPED = "the CompletionExecutor is not running any more: its run() task was cancelled"


def _check_due_ms(due_ms: object) -> int:
    return check_ms("due_ms", due_ms)
