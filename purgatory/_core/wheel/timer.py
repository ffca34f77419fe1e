"""The hierarchical timing wheel (core concept: the timer; sans-IO, stdlib only).

Theory of operation
-------------------
A wheel of ``wheel_size`` buckets, each ``tick_ms`` wide, covers the next
``tick_ms * wheel_size`` milliseconds (its *span*) from the wheel's current time. A deadline
beyond the span goes to an overflow wheel whose tick is the span of the level below; overflow
wheels are created on demand, so a timer with far deadlines simply grows more levels. Adding a
task is O(1) per level: one integer division picks the bucket. Buckets are plain dicts, so a
task's ``cancel()`` is one ``del`` (O(1)) and a bucket keeps its tasks in insertion order.

Buckets are not scanned tick by tick. A bucket that receives its first task for a round enters a
min-heap keyed by the bucket's expiration (Kafka's ``DelayQueue``); ``advance_clock(now_ms)``
pops the buckets whose expiration is ``<= now_ms``, moves the wheel's clock to each one in turn
and re-inserts its tasks: a task from an overflow bucket drops to a finer level, and a task in
the current tick is due. So the cost of advancing is proportional to the buckets and tasks that
are actually due, never to the time that passed, and ``next_expiration_ms()`` tells the reaper
exactly how long it may sleep.

Precision is the millisecond whatever the tick: a task whose deadline falls inside the current
tick, or is already past when it is added, waits in a small *near* heap ordered by deadline, and
is returned by the first ``advance_clock(now_ms)`` with ``now_ms >= deadline_ms``. Never early,
never late, whatever the jump. Due tasks come back sorted by deadline, ties in the order they were
(last) added.

Worked example (replayed by ``tests/core/test_timer.py``), ``Timer(tick_ms=1, wheel_size=20)``:

====  =========================================================================================
step  effect
====  =========================================================================================
add   A at 5: level 0 covers [0, 20); bucket 5 % 20 = 5, expires at 5
add   B at 30: beyond level 0, level 1 (tick 20) covers [0, 400); bucket 30 // 20 % 20 = 1,
      expires at 20
add   C at 450: level 2 (tick 400) covers [0, 8000); bucket 450 // 400 % 20 = 1, expires at 400
      next_expiration_ms() == 5
20    pops bucket 5: A is due. Pops level-1 bucket 20: the clock moves to 20 and B is re-inserted
      into level 0, which now covers [20, 40): bucket 30 % 20 = 10, expires at 30. Returns [A];
      next_expiration_ms() == 30
29    nothing is due: returns []
30    returns [B]; next_expiration_ms() == 400
1000  pops level-2 bucket 400: clock 400, C (450) lands in level 1, bucket 450 // 20 % 20 = 2,
      expiring at 440, which is already <= 1000, so it pops too: clock 440, C lands in level 0
      bucket 450 % 20 = 10, which pops at 450: C is due. Returns [C]; len(timer) == 0
====  =========================================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from heapq import heappop, heappush
from operator import attrgetter

from purgatory._core.engine.validate import MAX_TIME_MS, check_ms, check_positive_int

__all__ = ["Timer", "TimerStatistics", "TimerTask"]

_NOT_QUEUED = -1
_ABSENT = object()
_NEAR_LEVEL = -1
_BY_SEQ = attrgetter("_seq")
_BY_DEADLINE = attrgetter("_deadline_ms")


class _Bucket(dict["TimerTask", object]):
    """One slot of one wheel level: an insertion-ordered set of tasks.

    Values are unused (None), except in the near bucket, where each task maps to the sequence
    number of its entry in the near heap, so stale heap entries are recognised in O(1).
    """

    __slots__ = ("cascaded", "expiration_ms", "level", "serial", "timer")

    def __init__(self, timer: Timer, level: int, serial: int) -> None:
        super().__init__()
        self.timer = timer
        self.cascaded = False  # received tasks from a coarser level: may be out of add order
        self.level = level
        self.serial = serial
        self.expiration_ms = _NOT_QUEUED


class TimerTask:
    """Something that must happen at ``deadline_ms``; subclass and override :meth:`run`.

    Args:
        deadline_ms: when the task is due, in integer milliseconds on the timer's clock.

    Raises:
        UsageError: (a ``ValueError``) if ``deadline_ms`` is not an int in ``[0, MAX_TIME_MS]``.
    """

    __slots__ = ("_bucket", "_deadline_ms", "_seq")

    def __init__(self, *, deadline_ms: int) -> None:
        if type(deadline_ms) is not int or not 0 <= deadline_ms <= MAX_TIME_MS:
            deadline_ms = check_ms("deadline_ms", deadline_ms)  # raises, naming the argument
        self._deadline_ms = deadline_ms
        self._bucket: _Bucket | None = None
        self._seq = 0

    @property
    def deadline_ms(self) -> int:
        """When the task is due. Setting it moves a scheduled task to the new deadline."""
        return self._deadline_ms

    @deadline_ms.setter
    def deadline_ms(self, value: int) -> None:
        self._deadline_ms = check_ms("deadline_ms", value)
        bucket = self._bucket
        if bucket is not None and self in bucket:
            bucket.timer.add(self)

    @property
    def is_scheduled(self) -> bool:
        """True while the task sits in a timer (added, not yet returned or cancelled)."""
        bucket = self._bucket
        return bucket is not None and self in bucket

    def cancel(self) -> None:
        """Remove the task from its timer in O(1); a no-op when it is not scheduled."""
        # A task returned by advance_clock keeps a stale reference to the bucket it left
        # (clearing it per task would cost the expiry path), so membership decides.
        bucket = self._bucket
        if bucket is not None:
            self._bucket = None
            if bucket.pop(self, _ABSENT) is not _ABSENT:
                bucket.timer._size -= 1

    def run(self) -> None:
        """What to do when the task is due; the executor calls it. Override it."""


@dataclass(frozen=True, slots=True)
class TimerStatistics:
    """Counts describing a :class:`Timer` at one instant."""

    pending: int
    buckets: int
    levels: int
    fired: int
    clock_ms: int


class Timer:
    """A hierarchical timing wheel, told the time in integer milliseconds.

    Args:
        tick_ms: width of a level-0 bucket.
        wheel_size: buckets per level (the overflow level's tick is ``tick_ms * wheel_size``).
        start_ms: the clock's initial time.

    Raises:
        UsageError: (a ``ValueError``) naming the argument that is out of range.
    """

    def __init__(self, *, tick_ms: int = 1, wheel_size: int = 20, start_ms: int = 0) -> None:
        self._tick0 = check_positive_int("tick_ms", tick_ms, maximum=MAX_TIME_MS)
        self._wheel_size = check_positive_int("wheel_size", wheel_size, minimum=2, maximum=1 << 20)
        self._clock_ms = check_ms("start_ms", start_ms)
        self._ticks: list[int] = []
        self._spans: list[int] = []
        self._currents: list[int] = []
        self._wheels: list[list[_Bucket]] = []
        self._queue: list[tuple[int, int, _Bucket]] = []
        self._near = _Bucket(self, _NEAR_LEVEL, -1)
        self._near_heap: list[tuple[int, int, TimerTask]] = []
        self._size = 0
        self._seq = 0
        self._fired = 0
        self._add_level()

    def __len__(self) -> int:
        """The number of live tasks: added, not yet returned, not cancelled."""
        return self._size

    @property
    def clock_ms(self) -> int:
        """The latest time the timer was told (it never moves backward)."""
        return self._clock_ms

    def add(self, task: TimerTask) -> None:
        """Schedule ``task`` at its ``deadline_ms``; re-adding a scheduled task moves it.

        A task already due, or due inside the current tick, is kept and returned by the next
        :meth:`advance_clock` whose ``now_ms`` reaches its deadline.
        """
        if task._bucket is not None:
            task.cancel()
        self._seq += 1
        task._seq = self._seq
        self._size += 1
        deadline = task._deadline_ms
        if deadline < self._currents[0] + self._tick0:
            self._add_near(task)
        else:
            self._insert(task, deadline)

    def _add_all(self, tasks: Sequence[TimerTask]) -> None:
        """:meth:`add` each of ``tasks`` in turn (not yet scheduled), at the cost of one call: a
        restore adds a million. A run of equal deadlines goes to the bucket of the first."""
        seq = self._seq
        near_limit = self._currents[0] + self._tick0
        last_deadline, last_bucket = -1, None
        for task in tasks:
            seq += 1
            task._seq = seq
            deadline = task._deadline_ms
            if deadline == last_deadline and last_bucket is not None:
                last_bucket[task] = None
                task._bucket = last_bucket
            elif deadline < near_limit:
                self._add_near(task)
            else:
                self._insert(task, deadline)
                last_deadline, last_bucket = deadline, task._bucket
                near_limit = self._currents[0] + self._tick0
        self._seq = seq
        self._size += len(tasks)

    def advance_clock(self, now_ms: int) -> list[TimerTask]:
        """Move the clock to ``now_ms`` and return every task with ``deadline_ms <= now_ms``.

        The clock never moves backward: an earlier ``now_ms`` only returns tasks added since
        whose deadline it reaches. Returned tasks are no longer scheduled; the caller runs them.

        Returns:
            The due tasks in ascending ``deadline_ms``, ties in the order they were added.
        """
        now = check_ms("now_ms", now_ms)
        due: list[TimerTask] = []
        queue = self._queue
        exact = self._tick0 == 1
        # 1 ms buckets pop in deadline order, each holding one deadline, so their
        # concatenation needs no sort unless a bucket received cascaded tasks (whose add order
        # may differ) or tasks come from elsewhere.
        in_order = exact
        while queue and queue[0][0] <= now:
            expiration, _, bucket = heappop(queue)
            bucket.expiration_ms = _NOT_QUEUED
            if not bucket:
                continue
            if exact and bucket.level == 0:
                # Every task of a 1 ms bucket is due: no clock move, no re-insertion.
                if bucket.cascaded:
                    bucket.cascaded = in_order = False
                due.extend(bucket)
                bucket.clear()
                continue
            if expiration > self._clock_ms:
                self._set_clock(expiration)
            tasks = list(bucket)
            bucket.clear()
            if self._cascade(tasks, now, due):
                in_order = False
        if now > self._clock_ms:
            self._set_clock(now)
        near_heap = self._near_heap
        if near_heap and near_heap[0][0] <= now:
            near = self._near
            if due:
                in_order = False
            while near_heap and near_heap[0][0] <= now:
                _, seq, task = heappop(near_heap)
                if near.get(task) == seq:
                    del near[task]
                    due.append(task)
        self._size -= len(due)
        self._fired += len(due)
        if not in_order and len(due) > 1:
            due.sort(key=_BY_SEQ)
            due.sort(key=_BY_DEADLINE)
        return due

    def next_expiration_ms(self) -> int | None:
        """When the next task may be due: the earliest queued bucket or near deadline.

        Returns:
            A time in ms (possibly already past: call :meth:`advance_clock` at once), or None
            when the timer holds no task.
        """
        queue = self._queue
        while queue and not queue[0][2]:
            heappop(queue)[2].expiration_ms = _NOT_QUEUED
        near_heap = self._near_heap
        near = self._near
        while near_heap and near.get(near_heap[0][2]) != near_heap[0][1]:
            heappop(near_heap)
        best = queue[0][0] if queue else None
        if near_heap and (best is None or near_heap[0][0] < best):
            best = near_heap[0][0]
        return best

    def statistics(self) -> TimerStatistics:
        """A frozen record of the timer's counts."""
        return TimerStatistics(
            pending=self._size,
            buckets=len(self._queue) + (1 if self._near else 0),
            levels=len(self._ticks),
            fired=self._fired,
            clock_ms=self._clock_ms,
        )

    # -- internals -------------------------------------------------------------------------

    def _add_level(self) -> None:
        tick = self._tick0 if not self._ticks else self._spans[-1]
        level = len(self._ticks)
        self._ticks.append(tick)
        self._spans.append(tick * self._wheel_size)
        self._currents.append(self._clock_ms - self._clock_ms % tick)
        base = level * self._wheel_size
        self._wheels.append([_Bucket(self, level, base + i) for i in range(self._wheel_size)])

    def _set_clock(self, time_ms: int) -> None:
        self._clock_ms = time_ms
        currents = self._currents
        for level, tick in enumerate(self._ticks):
            currents[level] = time_ms - time_ms % tick

    def _add_near(self, task: TimerTask) -> None:
        self._near[task] = task._seq
        task._bucket = self._near
        heappush(self._near_heap, (task._deadline_ms, task._seq, task))

    def _insert(self, task: TimerTask, deadline: int) -> None:
        """Put a task whose deadline is beyond the current tick into the finest level that fits."""
        level = 0
        currents, spans = self._currents, self._spans
        while deadline >= currents[level] + spans[level]:
            level += 1
            if level == len(spans):
                self._add_level()
        tick = self._ticks[level]
        slot = deadline // tick
        bucket = self._wheels[level][slot % self._wheel_size]
        bucket[task] = None
        task._bucket = bucket
        expiration = slot * tick
        if bucket.expiration_ms != expiration:
            bucket.expiration_ms = expiration
            heappush(self._queue, (expiration, bucket.serial, bucket))

    def _cascade(self, tasks: list[TimerTask], now: int, due: list[TimerTask]) -> bool:
        """Re-insert the tasks of an expired bucket relative to the (moved) clock.

        Returns:
            True if some of them were due and appended to ``due``.
        """
        appended = False
        tick0 = self._tick0
        near_limit = self._currents[0] + tick0
        level0_end = self._currents[0] + self._spans[0]
        wheel0, size, queue = self._wheels[0], self._wheel_size, self._queue
        for task in tasks:
            deadline = task._deadline_ms
            if deadline >= level0_end:
                self._insert(task, deadline)
            elif deadline >= near_limit:
                # _insert inlined for level 0, where nearly every cascaded task lands.
                slot = deadline // tick0
                bucket = wheel0[slot % size]
                bucket[task] = None
                bucket.cascaded = True
                task._bucket = bucket
                expiration = slot * tick0
                if bucket.expiration_ms != expiration:
                    bucket.expiration_ms = expiration
                    heappush(queue, (expiration, bucket.serial, bucket))
            elif deadline <= now:
                due.append(task)
                appended = True
            else:
                self._add_near(task)
        return appended
