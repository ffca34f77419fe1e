"""The reaper (reaper layer concept: the task that advances the timing wheel in time).

Theory of operation
-------------------
Kafka's reaper polls its delay queue every 200 ms; here 200 ms (``max_sleep_ms``) is only the
upper bound of a sleep, not a tick. Each round the reaper asks its source when the next bucket
expires, sleeps until then (or ``max_sleep_ms``, whichever is sooner), reads the clock once,
advances the source to that time and hands what it returned on: a ``Timer``'s expired tasks
(their ``run``) to the :class:`~reaper.CompletionExecutor`, with each task's deadline as the time
the work was due; or, when the reaper is given a ``hand_off`` coroutine instead, the list itself
(the engine's ``expired`` outcomes, which the service's outbox delivers). It never runs a
callback itself, so a slow callback can delay other callbacks (visible in the executor's lag and
queue depth) but never the wheel.

The sleep sits inside a ``trio.CancelScope`` whose deadline :meth:`Reaper.wake_if_earlier`
lowers when a task that just registered an operation needs an earlier wake-up; trio honours a
deadline changed while the scope is sleeping. Because core state changes only in synchronous
calls, nothing is lost between two rounds: the next expiration is read again after the hand-off,
right before the next sleep, with no ``await`` in between.

Worked example (replayed by ``tests/reaper/test_reaper.py``), ``max_sleep_ms=200``, the source a
``Timer(wheel_size=512)`` (so each deadline is its own bucket), one operation due at 450, another
added at 120 for 130:

====  ======================================================================================
time  effect
====  ======================================================================================
0     next expiration 450 is beyond 0 + 200: sleep until 200
120   an operation due at 130 is added; ``wake_if_earlier(130)`` moves the sleep to 130
130   wakes for 130 (lateness 0), advances to 130, hands the operation due at 130 to the
      executor;
      next expiration 450 > 330: sleep until 330
330   wakes on the bound (no lateness recorded), advances to 330: nothing; sleep until 450
450   wakes for 450, advances, hands the operation due at 450 off; nothing left: sleep until 650
====  ======================================================================================
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio

from purgatory._core.engine.validate import check_positive_int
from reaper._clock import Clock
from reaper._executor import CompletionExecutor

__all__ = ["Expirable", "Reaper", "ReaperStatistics"]

_MAX_SLEEP_LIMIT_MS = 24 * 3600 * 1000


class Expirable(Protocol):
    """What the reaper advances: a ``Timer``, a purgatory, or anything with a schedule."""

    def advance_clock(self, now_ms: int) -> list[Any]:
        """Move to ``now_ms`` and return what became due (tasks, or decided outcomes)."""
        ...

    def next_expiration_ms(self) -> int | None:
        """When the next task may be due (possibly already past), or None if nothing waits."""
        ...


@dataclass(frozen=True, slots=True)
class ReaperStatistics:
    """Counts describing a :class:`Reaper` at one instant.

    Lateness is how long after the deadline it woke for the reaper advanced the source; it is
    recorded only for wake-ups that were for a deadline (not for the ``max_sleep_ms`` bound or
    :meth:`Reaper.wake`), and not for tasks that were already overdue when they were added.
    """

    #: times the reaper advanced its source
    wakeups: int
    #: expired tasks handed to the executor
    handed_off: int
    last_lateness_ms: int
    max_lateness_ms: int
    #: the time the reaper sleeps until, or None while it is awake
    sleeping_until_ms: int | None
    #: the time the source was last advanced to, or None before the first wake-up
    advanced_to_ms: int | None


class Reaper:
    """Advances an :class:`Expirable` in time and hands expired tasks to the executor.

    Run :meth:`run` in a nursery; cancel the nursery to stop it (then close the executor).

    Args:
        source: what to advance (a ``Timer``, or a purgatory with ``next_expiration_ms``).
        executor: where expired tasks' ``run`` is sent; or a coroutine function that takes
            the list each advance returned (back-pressure: the reaper waits for it).
        clock: the clock that tells the time and converts it for trio's sleeps.
        max_sleep_ms: the longest the reaper sleeps without re-reading the clock.

    Raises:
        UsageError: (a ``ValueError``) if ``max_sleep_ms`` is not an int in
            ``[1, 86_400_000]``.
    """

    def __init__(
        self,
        source: Expirable,
        executor: CompletionExecutor | Callable[[list[Any]], Awaitable[None]],
        clock: Clock,
        *,
        max_sleep_ms: int = 200,
    ) -> None:
        check_positive_int("max_sleep_ms", max_sleep_ms, maximum=_MAX_SLEEP_LIMIT_MS)
        self._source = source
        self._hand_off = (
            executor.submit_tasks if isinstance(executor, CompletionExecutor) else executor
        )
        self._clock = clock
        self._max_sleep_ms = max_sleep_ms
        self._started = False
        self._scope: trio.CancelScope | None = None
        self._sleeping_until_ms: int | None = None
        self._waking_for_ms: int | None = None
        self._advanced_to_ms: int | None = None
        self._wakeups = 0
        self._handed_off = 0
        self._last_lateness_ms = 0
        self._max_lateness_ms = 0

    @property
    def max_sleep_ms(self) -> int:
        """The longest the reaper sleeps without re-reading the clock."""
        return self._max_sleep_ms

    def wake_if_earlier(self, deadline_ms: int) -> None:
        """Make the reaper wake by ``deadline_ms`` if it is sleeping past it.

        Call it after adding a task to the source (from any trio task, synchronously). A
        no-op while the reaper is awake: it reads the next expiration before it sleeps again.

        Args:
            deadline_ms: the deadline of the task just added.
        """
        scope = self._scope
        until = self._sleeping_until_ms
        if scope is None or until is None or deadline_ms >= until:
            return
        scope.deadline = self._clock.to_trio_seconds(deadline_ms)
        self._sleeping_until_ms = deadline_ms
        # A deadline already past when it was added is not the reaper's lateness.
        self._waking_for_ms = deadline_ms if deadline_ms >= self._clock.now_ms() else None

    def wake(self) -> None:
        """Make a sleeping reaper re-read the clock and the next expiration now."""
        scope = self._scope
        if scope is not None:
            self._waking_for_ms = None
            scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Advance the source forever; return only by cancellation.

        Args:
            task_status: ``started()`` is called once the reaper is about to sleep the first
                time (``wake_if_earlier`` works from then on).

        Raises:
            RuntimeError: if ``run`` was already called.
            trio.ClosedResourceError: if the executor was closed while the reaper ran (stop the
                reaper before closing the executor).
        """
        if self._started:
            raise RuntimeError("Reaper.run() may only be called once")
        self._started = True
        clock, source = self._clock, self._source
        ready = False
        found_nothing_due = False
        while True:
            now_ms = clock.now_ms()
            next_ms = source.next_expiration_ms()
            bound_ms = now_ms + self._max_sleep_ms
            if next_ms is None or next_ms > bound_ms:
                until_ms, waking_for_ms = bound_ms, None
            else:
                until_ms = next_ms
                # Due before the last advance: added overdue, so not the reaper's lateness.
                last_ms = self._advanced_to_ms
                waking_for_ms = next_ms if last_ms is None or next_ms > last_ms else None
            if until_ms <= now_ms and found_nothing_due:
                # The last advance returned nothing and nothing was added since (no await in
                # between), yet the source claims a task is due: never spin on that claim.
                until_ms, waking_for_ms = now_ms + 1, None
            if not ready:
                ready = True
                task_status.started()
            if until_ms > now_ms:
                waking_for_ms = await self._sleep_until(until_ms, waking_for_ms)
            else:
                await trio.lowlevel.checkpoint()
            now_ms = clock.now_ms()
            expired = source.advance_clock(now_ms)
            self._wakeups += 1
            self._advanced_to_ms = now_ms
            if waking_for_ms is not None and now_ms >= waking_for_ms:
                self._last_lateness_ms = now_ms - waking_for_ms
                self._max_lateness_ms = max(self._max_lateness_ms, self._last_lateness_ms)
            found_nothing_due = not expired
            if expired:
                # One hand-off per advance; the executor still runs them one at a time.
                await self._hand_off(expired)
                self._handed_off += len(expired)

    def statistics(self) -> ReaperStatistics:
        """A frozen record of the reaper's counts (cheap: call it at every scrape)."""
        return ReaperStatistics(
            wakeups=self._wakeups,
            handed_off=self._handed_off,
            last_lateness_ms=self._last_lateness_ms,
            max_lateness_ms=self._max_lateness_ms,
            sleeping_until_ms=self._sleeping_until_ms,
            advanced_to_ms=self._advanced_to_ms,
        )

    async def _sleep_until(self, until_ms: int, waking_for_ms: int | None) -> int | None:
        """Sleep until ``until_ms`` or an earlier wake-up; return the deadline it woke for."""
        self._waking_for_ms = waking_for_ms
        self._sleeping_until_ms = until_ms
        try:
            with trio.move_on_at(self._clock.to_trio_seconds(until_ms)) as scope:
                self._scope = scope
                await trio.sleep_forever()
        finally:
            self._scope = None
            self._sleeping_until_ms = None
        return self._waking_for_ms
