"""The purgatory: delayed operations watched by key (core concept: watch lists; sans-IO).

Theory of operation
-------------------
An operation that cannot complete at once is *watched* under each of its keys and *scheduled*
in the timer. A signal on a key calls :meth:`DelayedOperationPurgatory.check_and_complete`,
which tries every operation watching that key; the reaper calls :meth:`advance_clock`, which
returns the operations whose deadline passed, for the executor to ``run()``. Completion is
exactly-once (see :mod:`purgatory._core.wheel.operation`), so whichever path comes first wins.

:meth:`try_complete_else_watch` checks, watches every key, then checks again: in Kafka the
second check closes the race with a signal that lands between the first check and the watch.
Here the core is single-threaded, but ``try_complete`` is user code that may consult state that
changed while the keys were being watched, so the second check stays.

An operation completed by one key still sits in the watch lists of its other keys; that is the
classic memory leak of this design. Lists are cleaned when a key is checked, and a full purge of
completed operations runs in :meth:`advance_clock` once more than ``purge_interval`` of them may
be lingering (estimated, as in Kafka, by operations watched since the last purge minus those
still pending). So :meth:`watched` may over-count until the purge; :meth:`num_delayed` is exact.

A key watched by one operation holds that operation itself, not a list of one: most keys of a
pipeline's operations are watched by a single operation (a partition, a file, a run), and a list
would cost 88 bytes per key more. The list appears when a second operation watches the key.

Worked example (replayed by ``tests/core/test_purgatory.py``):

================================  ===========================================================
call                              effect
================================  ===========================================================
try_complete_else_watch(A, [x,y]) A waits for x and y, deadline 100: watched() == 2,
                                  num_delayed() == 1, returns False
try_complete_else_watch(B, [y])   B waits for y, deadline 50: watched() == 3, num_delayed() 2
check_and_complete("x")           A is still missing y: returns 0
check_and_complete("y")           A and B complete: returns 2; y is dropped; A lingers under
                                  x, so watched() == 1 and num_delayed() == 0
advance_clock(100)                nothing expires (both completed): returns []
================================  ===========================================================
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass

from purgatory._core._errors import UsageError
from purgatory._core.engine.validate import check_positive_int
from purgatory._core.wheel.operation import _PENDING, DelayedOperation
from purgatory._core.wheel.timer import Timer, TimerTask

__all__ = ["DelayedOperationPurgatory", "PurgatoryStatistics"]

#: A wider wheel than Kafka's 20 slots: in CPython a cascade costs bytecode, memory is cheap
#: (an empty level is 512 small dicts), and 512 slots of 1 ms cover deadlines up to 37 hours in
#: three levels.
_DEFAULT_WHEEL_SIZE = 512

_Watchers = DelayedOperation | list[DelayedOperation]


@dataclass(frozen=True, slots=True)
class PurgatoryStatistics:
    """Counts describing a :class:`DelayedOperationPurgatory` at one instant."""

    name: str
    pending: int
    watched: int
    keys: int
    completed: int
    expired: int
    cancelled: int
    purged: int
    purges: int


class DelayedOperationPurgatory:
    """Delayed operations watched by key and expired by a timer.

    Args:
        name: a label for statistics and logs.
        timer: the timer to schedule deadlines in (``Timer(wheel_size=512)`` if None).
        purge_interval: how many completed operations may linger in watch lists before a purge.

    Raises:
        UsageError: (a ``ValueError``) naming the argument that is invalid.
    """

    def __init__(
        self, name: str, *, timer: Timer | None = None, purge_interval: int = 1000
    ) -> None:
        if not isinstance(name, str) or not name:
            raise UsageError(f"name must be a non-empty str, got {name!r}")
        self.name = name
        self.timer = timer if timer is not None else Timer(wheel_size=_DEFAULT_WHEEL_SIZE)
        self.purge_interval = check_positive_int("purge_interval", purge_interval, minimum=0)
        # A key's watcher, or its list of watchers when it has more than one.
        self._watchers: dict[Hashable, _Watchers] = {}
        self._watched = 0
        self._estimated_ops = 0
        self._completed = 0
        self._expired = 0
        self._cancelled = 0
        self._purged = 0
        self._purges = 0

    def try_complete_else_watch(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool:
        """Complete ``op`` now if its condition holds; else watch it under ``keys`` and schedule it.

        Args:
            op: the operation.
            keys: one or more watch keys (duplicates are watched once).

        Returns:
            True if ``op`` completed during this call.

        Raises:
            UsageError: (a ``ValueError``) if ``keys`` is empty or holds an invalid key.
        """
        unique = _unique_keys(keys)
        if op.try_complete():
            self._completed += 1
            return True
        watchers = self._watchers
        for key in unique:
            if op._state != _PENDING:
                return False
            _add_watcher(watchers, key, op)
            self._watched += 1
        self._estimated_ops += 1
        if op.try_complete():
            self._completed += 1
            return True
        if op._state == _PENDING:
            self.timer.add(op)
            if op._state != _PENDING:
                op.cancel()
        return False

    def _restore_all(
        self,
        keys: list[Hashable],
        ops: list[DelayedOperation],
        scheduled: Sequence[DelayedOperation],
        *,
        watched_ops: int,
    ) -> None:
        """Watch and schedule operations restored from a snapshot, which were pending (so not
        completable) when it was taken, without checking them: ``ops[i]`` watches ``keys[i]``
        (valid, distinct per operation), in order; ``scheduled`` are the operations to add to
        the timer, in order; ``watched_ops`` how many operations ``ops`` holds."""
        watchers = self._watchers
        for key, op in zip(keys, ops, strict=True):
            _add_watcher(watchers, key, op)
        self._watched += len(keys)
        self._estimated_ops += watched_ops
        self.timer._add_all(scheduled)

    def check_and_complete(self, key: Hashable) -> int:
        """Try to complete every operation watching ``key``; drop completed ones from its list.

        Returns:
            How many operations this call completed.
        """
        held = self._watchers.pop(key, None)
        if held is None:
            return 0
        lst = _as_list(held)
        completed = 0
        survivors: list[DelayedOperation] = []
        for op in lst:
            if op._state != _PENDING:
                continue
            if op.try_complete():
                completed += 1
            elif op._state == _PENDING:
                survivors.append(op)
        # try_complete may have watched new operations under this key meanwhile.
        added = self._watchers.pop(key, None)
        more = 0
        if added is not None:
            if isinstance(added, list):
                survivors.extend(added)
                more = len(added)
            else:
                survivors.append(added)
                more = 1
        self._watched -= len(lst) + more - len(survivors)
        if survivors:
            self._watchers[key] = survivors if len(survivors) > 1 else survivors[0]
        self._completed += completed
        return completed

    def cancel_for_key(self, key: Hashable) -> list[DelayedOperation]:
        """Stop watching ``key``: remove its watchers and cancel their timers, completing none.

        The operations are cancelled for good (``is_cancelled``): unlike Kafka, where they stay
        completable through their other keys, they never complete nor expire afterwards, and
        the purge drops them from their other keys' lists.

        Returns:
            The pending operations that were watching ``key``, now cancelled.
        """
        held = self._watchers.pop(key, None)
        if held is None:
            return []
        lst = _as_list(held)
        self._watched -= len(lst)
        cancelled = [op for op in lst if op.cancel_operation()]
        self._cancelled += len(cancelled)
        return cancelled

    def watched(self) -> int:
        """The sum of the watch lists' lengths (may over-count completed operations)."""
        return self._watched

    def num_delayed(self) -> int:
        """The exact number of operations scheduled in the timer (pending)."""
        return len(self.timer)

    def watchers_of(self, key: Hashable) -> list[DelayedOperation]:
        """The operations watching ``key`` (completed ones may linger until a purge)."""
        held = self._watchers.get(key)
        if held is None:
            return []
        return list(_as_list(held))

    def watch_keys(self) -> list[Hashable]:
        """The keys that currently have a watch list."""
        return list(self._watchers)

    def next_expiration_ms(self) -> int | None:
        """When the reaper must wake next: the timer's earliest bucket (None when empty)."""
        return self.timer.next_expiration_ms()

    def advance_clock(self, now_ms: int) -> list[TimerTask]:
        """Advance the timer and return the expired tasks for the executor to ``run()``.

        Afterwards, purge completed operations from every watch list if more than
        ``purge_interval`` of them may be lingering, and at least as many as are pending.
        """
        expired = self.timer.advance_clock(now_ms)
        self._expired += len(expired)
        pending = len(self.timer)
        # Kafka purges as soon as purge_interval operations may linger; with many pending
        # operations each purge (a pass over every watch list) then costs far more than the
        # completions that made it necessary. Waiting until the lingering ones also outnumber
        # the pending ones keeps a purge's cost proportional to what it removes, and bounds
        # the memory they hold by that of the live ones.
        if self._estimated_ops - pending > max(self.purge_interval, pending):
            self._estimated_ops = pending
            self.purge_completed()
        return expired

    def purge_completed(self) -> int:
        """Remove completed and cancelled operations from every watch list now.

        Returns:
            How many watch-list entries were removed.
        """
        removed = 0
        watchers = self._watchers
        for key in list(watchers):
            held = watchers[key]
            if not isinstance(held, list):
                if held._state != _PENDING:
                    removed += 1
                    del watchers[key]
                continue
            alive = [op for op in held if op._state == _PENDING]
            if len(alive) != len(held):
                removed += len(held) - len(alive)
                if len(alive) > 1:
                    watchers[key] = alive
                elif alive:
                    watchers[key] = alive[0]
                else:
                    del watchers[key]
        self._watched -= removed
        self._purged += removed
        self._purges += 1
        return removed

    def statistics(self) -> PurgatoryStatistics:
        """A frozen record of the purgatory's counts."""
        return PurgatoryStatistics(
            name=self.name,
            pending=len(self.timer),
            watched=self._watched,
            keys=len(self._watchers),
            completed=self._completed,
            expired=self._expired,
            cancelled=self._cancelled,
            purged=self._purged,
            purges=self._purges,
        )


def _add_watcher(watchers: dict[Hashable, _Watchers], key: Hashable, op: DelayedOperation) -> None:
    """Watch ``key`` with ``op``: the operation itself for a first watcher, a list from the
    second on."""
    held = watchers.get(key)
    if held is None:
        watchers[key] = op
    elif isinstance(held, list):
        held.append(op)
    else:
        watchers[key] = [held, op]


def _as_list(held: _Watchers) -> list[DelayedOperation]:
    """A key's watchers as a list (the held list itself when there are several)."""
    return held if isinstance(held, list) else [held]


def _unique_keys(keys: Iterable[Hashable]) -> list[Hashable]:
    """The keys without repeats, in order; raises UsageError naming ``keys`` if one is invalid."""
    if isinstance(keys, str | bytes):
        raise UsageError("keys must be a collection of watch keys, not a single str or bytes")
    try:
        unique = list(dict.fromkeys(keys))
    except TypeError:
        raise UsageError("keys must hold hashable watch keys") from None
    if not unique:
        raise UsageError("keys must hold at least one watch key")
    if None in unique or "" in unique or b"" in unique:
        raise UsageError("keys must not hold None or an empty key")
    return unique
