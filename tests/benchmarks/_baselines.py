"""The baselines the timing wheel and the purgatory are measured against (benchmark harness).

:class:`HeapTimer` is the textbook timer of the :mod:`heapq` documentation: a binary heap of
``[deadline_ms, seq, task]`` entries, ``O(log n)`` add and expire, lazy ``O(1)`` cancel (the
entry's task is blanked and skipped when it reaches the top), so cancelled entries keep their
memory until their deadline. :class:`HeapqPurgatory` is Kafka's first purgatory design on top of
such a heap (a ``DelayQueue``): every watched operation is pushed on the heap keyed by its
deadline and stays there, completed or not, until the deadline pops it; watch lists are a dict
of lists cleaned exactly as :class:`purgatory.DelayedOperationPurgatory` cleans them (on check,
and a full purge once more than ``purge_interval`` operations have left since the last one).
Both drive the same :class:`purgatory.DelayedOperation` objects as the real purgatory, so an
operation's own costs (construction, ``try_complete``, ``force_complete``) are identical and
only the data structures differ. Keys are not validated here; the real purgatory checks each.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from heapq import heappop, heappush
from typing import Any

from purgatory import DelayedOperation, TimerTask

__all__ = ["HeapTimer", "HeapqPurgatory"]

#: A heap entry: ``[deadline_ms, seq, task]``; the task slot is None once cancelled.
Entry = list[Any]


class HeapTimer:
    """A heapq priority queue of ``[deadline_ms, seq, task]`` with lazy cancellation."""

    __slots__ = ("_cancelled", "_heap", "_seq")

    def __init__(self) -> None:
        self._heap: list[Entry] = []
        self._seq = 0
        self._cancelled = 0

    def __len__(self) -> int:
        """Live entries: added, not returned, not cancelled."""
        return len(self._heap) - self._cancelled

    def add(self, deadline_ms: int, task: TimerTask) -> Entry:
        """Schedule ``task`` at ``deadline_ms``; the returned entry is the cancel handle."""
        self._seq += 1
        entry: Entry = [deadline_ms, self._seq, task]
        heappush(self._heap, entry)
        return entry

    def cancel(self, entry: Entry) -> None:
        """Blank the entry in O(1); it is dropped when it reaches the top of the heap."""
        if entry[2] is not None:
            entry[2] = None
            self._cancelled += 1

    def advance_clock(self, now_ms: int) -> list[TimerTask]:
        """Pop and return every live task with ``deadline_ms <= now_ms``, in deadline order."""
        heap = self._heap
        due: list[TimerTask] = []
        while heap and heap[0][0] <= now_ms:
            task = heappop(heap)[2]
            if task is None:
                self._cancelled -= 1
            else:
                due.append(task)
        return due


class HeapqPurgatory:
    """Kafka's first purgatory: watch lists plus one heap of every watched operation.

    Args:
        purge_interval: how many operations may leave (complete or expire) between two purges
            of the watch lists.
    """

    def __init__(self, *, purge_interval: int = 1000) -> None:
        self.purge_interval = purge_interval
        self._heap: list[tuple[int, int, DelayedOperation]] = []
        self._watchers: dict[Hashable, list[DelayedOperation]] = {}
        self._seq = 0
        self._watched = 0
        self._left_since_purge = 0
        self.purges = 0

    def try_complete_else_watch(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """Check, watch every key, check again; push the operation on the heap if still pending.

        Raises:
            ValueError: if ``keys`` is empty.
        """
        unique = list(dict.fromkeys(keys))
        if not unique:
            raise ValueError("keys must hold at least one watch key")
        if op.try_complete():
            return True
        watchers = self._watchers
        for key in unique:
            if op.is_completed:
                return False
            lst = watchers.get(key)
            if lst is None:
                watchers[key] = [op]
            else:
                lst.append(op)
            self._watched += 1
        if op.try_complete():
            self._left_since_purge += 1
            return True
        if not op.is_completed:
            self._seq += 1
            heappush(self._heap, (op.deadline_ms, self._seq, op))
        return False

    def check_and_complete(self, key: Hashable) -> int:
        """Try every operation watching ``key``; keep the ones still pending.

        Returns:
            How many operations this call completed.
        """
        lst = self._watchers.pop(key, None)
        if lst is None:
            return 0
        completed = 0
        survivors: list[DelayedOperation] = []
        for op in lst:
            if op.is_completed:
                continue
            if op.try_complete():
                completed += 1
            elif not op.is_completed:
                survivors.append(op)
        added = self._watchers.pop(key, None)
        if added:
            survivors.extend(added)
        self._watched -= len(lst) + (len(added) if added else 0) - len(survivors)
        if survivors:
            self._watchers[key] = survivors
        self._left_since_purge += completed
        return completed

    def advance_clock(self, now_ms: int) -> list[DelayedOperation]:
        """Pop every operation whose deadline passed; return those not yet completed."""
        heap = self._heap
        expired: list[DelayedOperation] = []
        while heap and heap[0][0] <= now_ms:
            op = heappop(heap)[2]
            if not op.is_completed:
                expired.append(op)
        self._left_since_purge += len(expired)
        if self._left_since_purge > self.purge_interval:
            self._left_since_purge = 0
            self.purge_completed()
        return expired

    def purge_completed(self) -> int:
        """Remove completed operations from every watch list; return how many were removed."""
        removed = 0
        watchers = self._watchers
        for key in list(watchers):
            lst = watchers[key]
            alive = [op for op in lst if not op.is_completed]
            if len(alive) != len(lst):
                removed += len(lst) - len(alive)
                if alive:
                    watchers[key] = alive
                else:
                    del watchers[key]
        self._watched -= removed
        self.purges += 1
        return removed

    def watched(self) -> int:
        """The sum of the watch lists' lengths."""
        return self._watched

    def heap_size(self) -> int:
        """Entries on the heap, completed operations included (they leave at their deadline)."""
        return len(self._heap)
