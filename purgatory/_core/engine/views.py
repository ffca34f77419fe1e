"""What the engine answers (core concept: queries and operators' views; sans-IO, stdlib only).

:class:`Views` is the read side of the :class:`~purgatory._core.engine.engine.Engine`: a part the
engine builds, handing it the live collections it reads (the pending operations and their page
index, the tally of what is held, the purgatory and its wheel, the keyed timers, the signal and
finished stores), and whose queries it binds as its own. It answers questions about that state
without deciding anything: what is pending (one operation, a scope's page in ``op_id`` order,
the counts), the statistics, and the operators' views that may read many items (the busiest
scopes, the next deadlines). Those are each a :data:`View`, a generator of bounded steps that a
shell interleaves with other work; ``_read_live``, ``_in_order`` and ``_wheel_runs`` read the
live collections and the timing wheel for them without changing or copying them.

A part rather than a base class of the engine: it reads the engine's shared state
(:class:`~purgatory._core.engine.state.EngineState`, its clock and outcome counters included),
given at construction; it decides nothing, and the engine's inputs never reach it.
"""

from __future__ import annotations

from collections.abc import Collection, Generator, Iterable, Iterator
from heapq import heappop, heappush, merge, nlargest, nsmallest
from itertools import chain, islice
from operator import attrgetter, itemgetter
from typing import TypeVar

from purgatory._core.engine.engine_types import EngineStatistics, _Op
from purgatory._core.engine.model import OperationSpec, Outcome, OutcomeKind
from purgatory._core.engine.sorted_ids import _ids_after
from purgatory._core.engine.state import EngineState
from purgatory._core.engine.validate import MAX_TIME_MS
from purgatory._core.wheel.timer import Timer, TimerTask, _Bucket

__all__ = ["View", "Views"]

_VIEW_STEP = 10_000  # items one step of an operator's view reads (1 to 3 ms in CPython)

_T = TypeVar("_T")
#: A read-only view computed in bounded steps, so that a shell can interleave other work
#: between them: drive it with ``next()`` until ``StopIteration``, whose value is the answer
#: and whether it is complete. The engine may change between two steps (inputs applied): what
#: a step reads is as of that step, and an item finished or moved since is left out or placed
#: anew at the end. A collection that changed size while it was read over several steps is not
#: read further (its iterator says so), and the answer says it is not complete; the caller may
#: ask again. Nothing is changed, nothing is copied whole: a step's pause stays bounded.
View = Generator[None, None, tuple[list[_T], bool]]
_BY_DEADLINE = attrgetter("_deadline_ms")
_COUNT = itemgetter(1)
_DUE_ORDER = attrgetter("_deadline_ms", "_seq")
_Entry = TypeVar("_Entry", tuple[int, int, _Bucket], tuple[int, int, TimerTask])


def _read_live(items: Iterable[_T], step: int) -> Generator[list[_T], None, bool]:
    """Slices of at most ``step`` items of a live collection; returns whether it was read to
    the end (False: it changed size between two slices)."""
    iterator = iter(items)
    try:
        while part := list(islice(iterator, step)):
            yield part
    except RuntimeError:  # "changed size during iteration"
        return False
    return True


def _in_order(heap: list[_Entry]) -> Iterator[_Entry]:
    """The entries of a binary heap in ascending order, without changing it: O(log k) each
    for the first k (a second heap holds the frontier)."""
    frontier: list[tuple[_Entry, int]] = [(heap[0], 0)] if heap else []
    while frontier:
        entry, at = heappop(frontier)
        yield entry
        for child in (2 * at + 1, 2 * at + 2):
            if child < len(heap):
                heappush(frontier, (heap[child], child))


def _wheel_runs(timer: Timer) -> Iterator[tuple[int, int, Collection[TimerTask]]]:
    """The wheel's tasks in groups, by the least deadline a group may hold: each live queued
    bucket (its deadlines lie in its tick: first and last ms), and each live near task alone."""
    ticks, near = timer._ticks, timer._near
    buckets = (
        (expiration, expiration + ticks[bucket.level] - 1, bucket)
        for expiration, _, bucket in _in_order(timer._queue)
        if bucket and bucket.expiration_ms == expiration
    )
    nears = (
        (deadline, deadline, (task,))
        for deadline, seq, task in _in_order(timer._near_heap)
        if near.get(task) == seq
    )
    return merge(buckets, nears, key=itemgetter(0))


class Views:
    """The engine's queries, and its views for operators in bounded steps.

    Args:
        state: the engine's shared state, all of which is read here and none changed.
    """

    def __init__(self, state: EngineState) -> None:
        self._ops = state.ops
        self._op_ids = state.op_ids
        self._tally = state.tally
        self._progress = state.progress
        self._purgatory = state.purgatory
        self._keyed = state.keyed
        self._signals = state.signals
        self._finished = state.finished

    # -- queries -------------------------------------------------------------------------------

    @property
    def clock_ms(self) -> int:
        """The latest time the engine was told."""
        return self._progress.now_ms

    def lookup(self, scope: str, op_id: str) -> tuple[OperationSpec, Outcome | None] | None:
        """The spec and (if finished) the outcome of an operation, or None if unknown."""
        op = self._ops.get((scope, op_id))
        if op is not None:
            return op.spec, None
        done = self._finished.get((scope, op_id), now_ms=self._progress.now_ms)
        return (done.spec, done.outcome) if done is not None else None

    def pending(self, scope: str | None = None) -> list[OperationSpec]:
        """Pending operations (of one scope, or all) in registration order."""
        return [op.spec for (s, _), op in self._ops.items() if scope is None or s == scope]

    def pending_page(self, scope: str, after: str | None, limit: int) -> list[OperationSpec]:
        """Up to ``limit`` pending operations of ``scope`` in ``op_id`` order, from the first
        ``op_id`` after ``after`` (None: from the start).

        A page costs O(log n + limit) for a scope of n pending operations, and listing page
        after page (each from the last ``op_id`` of the one before) visits every operation
        pending throughout exactly once, whatever is registered or finished meanwhile.
        """
        ids = self._op_ids.get(scope)
        if ids is None or limit <= 0:
            return []
        ops = self._ops
        return [ops[(scope, op_id)].spec for op_id in _ids_after(ids, after, limit)]

    def statistics(self) -> EngineStatistics:
        """A frozen record of the engine's counts."""
        p = self._purgatory.statistics()
        t = self._purgatory.timer.statistics()
        tally, progress = self._tally, self._progress
        counts = progress.counts
        return EngineStatistics(
            pending=len(self._ops),
            watched=p.watched,
            watch_keys=p.keys,
            timer_buckets=t.buckets,
            timer_levels=t.levels,
            signals=len(self._signals),
            scopes_with_watermark=len(self._keyed.watermarks()),
            completed=counts[OutcomeKind.COMPLETED],
            expired=counts[OutcomeKind.EXPIRED],
            cancelled=counts[OutcomeKind.CANCELLED],
            purged=p.purged,
            late=progress.late,
            sequence=progress.sequence,
            clock_ms=progress.now_ms,
            pending_bytes=tally.pending_bytes,
            remembered_signals=len(self._signals),
            remembered_bytes=tally.remembered_bytes,
            finished_bytes=tally.finished_bytes,
        )

    def decided_after(self, sequence: int) -> list[Outcome]:
        """The outcomes still remembered (within ``outcome_ttl_ms``) whose sequence is after
        ``sequence``, in sequence order: after a restore, those that may not have been
        delivered."""
        found = [
            e.value.outcome
            for _, e in self._finished.items(now_ms=self._progress.now_ms)
            if e.value.outcome.sequence > sequence
        ]
        return sorted(found, key=lambda o: o.sequence)

    def next_expiration_ms(self) -> int | None:
        """When the engine's ``advance_clock`` has work next (signal and outcome expiry
        included)."""
        times = [
            self._purgatory.timer.next_expiration_ms(),
            self._keyed.next_expiration_ms(self._progress.now_ms),
            self._signals.next_expiration_ms(),
            self._finished.next_expiration_ms(),
        ]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    def is_pending(self, scope: str, op_id: str) -> bool:
        """Whether the operation is pending (no side effect, unlike :meth:`lookup`)."""
        return (scope, op_id) in self._ops

    @property
    def memory_bytes(self) -> int:
        """The estimated bytes the engine holds: pending, remembered and finished state."""
        return self._tally.memory_bytes

    # -- views for operators: read-only, in bounded steps ---------------------------------------

    @property
    def pending_operations(self) -> int:
        """How many operations are pending (what ``statistics().pending`` says, in O(1))."""
        return len(self._ops)

    @property
    def pending_scopes(self) -> int:
        """How many scopes have pending operations."""
        return len(self._tally.pending_by_scope)

    def missing_keys(self, spec: OperationSpec) -> tuple[str, ...]:
        """The keys of ``spec`` that no remembered signal answers now, in the spec's order.

        Not an access: no signal's TTL is refreshed (a read under ``on_read_and_write`` would
        refresh it, and reads are not journaled), so a signal that expired but is not cleaned
        up yet still counts here until the engine's next ``advance_clock`` removes it.
        """
        peek, scope = self._signals.peek, spec.scope
        return tuple(key for key in spec.keys if peek((scope, key)) is None)

    def busiest_scopes(self, count: int, *, step: int = _VIEW_STEP) -> View[tuple[str, int]]:
        """The ``count`` scopes with the most pending operations, most first (ties by name),
        with their counts.

        A generator of bounded steps (see :data:`View`): each reads at most ``step`` scopes.
        """
        counts = self._tally.pending_by_scope
        best: list[tuple[str, int]] = []
        reading = _read_live(counts.items(), step)
        while True:
            try:
                part = next(reading)
            except StopIteration as done:
                complete: bool = done.value
                break
            best = nlargest(count, chain(best, part), key=_COUNT)
            yield
        now = {scope: counts[scope] for scope, _ in best if scope in counts}  # read again
        return sorted(now.items(), key=lambda item: (-item[1], item[0])), complete

    def next_deadlines(self, count: int, *, step: int = _VIEW_STEP) -> View[OperationSpec]:
        """The pending processing-time operations with the ``count`` earliest deadlines, in the
        order they would expire (ties in the order they were added to the wheel; ties at the
        last place may go either way).

        Read from the timing wheel, never from every operation: its queued buckets and near
        tasks are visited in order of the least deadline each may hold (a bucket's expiration,
        the start of its tick), only until ``count`` tasks are held that are all due before
        anything not visited (so usually a few 1 ms buckets); then their tasks are compared.
        Event-time operations wait in the wheel's last bucket, at ``MAX_TIME_MS``: not read.

        A generator of bounded steps (see :data:`View`): the visit is the first (it counts,
        it reads no task), and each step after it reads at most ``step`` tasks.
        """
        groups: list[Collection[TimerTask]] = []
        held, upper = 0, -1
        for lower, last, tasks in _wheel_runs(self._purgatory.timer):
            if (held >= count and lower > upper) or last >= MAX_TIME_MS:
                break
            groups.append(tasks)
            held += len(tasks)
            upper = max(upper, last)
        yield
        best: list[TimerTask] = []
        complete, read = True, 0
        for group in groups:
            reading = _read_live(group, step)
            while True:
                try:
                    part = next(reading)
                except StopIteration as done:
                    complete = complete and done.value
                    break
                best = nsmallest(count, chain(best, part), key=_BY_DEADLINE)
                read += len(part)
                if read >= step:  # so a group longer than a step is read over several
                    yield
                    read = 0
        live = {t for t in best if isinstance(t, _Op) and t.is_scheduled and not t.is_done}
        return [op.spec for op in sorted(live, key=_DUE_ORDER)], complete
