"""The declarative engine (core concept: operations over signals; sans-IO, stdlib only).

The engine is what the service drives: it turns :class:`OperationSpec` registrations, signals,
watermarks and cancels into exactly one :class:`Outcome` per operation. It composes the parts of
the core and adds nothing that needs I/O:

* a :class:`DelayedOperationPurgatory` watches each operation under ``(scope, key)`` for each of
  its keys and holds processing-time deadlines in its timing wheel;
* a :class:`TtlState` remembers signals, so a signal that arrives before its waiter counts;
* :class:`KeyedTimers` hold event-time deadlines against each scope's monotonic watermark;
* a second :class:`TtlState` remembers finished operations for idempotent re-registration.

Time rules, so that outcomes are right to the millisecond whatever the delivery lag: a
processing-time operation is expired, not completed, once ``now_ms >= deadline_ms`` even if its
expiry has not run yet; an event-time one once the scope's watermark reaches its deadline. An
operation whose deadline already passed when it registers expires at the next step, never inside
the register call.

Outcomes are events, h11-style: each call that decides outcomes returns them, in the order they
happened (:meth:`Engine.register` in its :class:`Registration`, :meth:`Engine.signal` and
:meth:`Engine.advance_clock` as lists, :meth:`Engine.cancel` as one). An expiry is decided inside
:meth:`Engine.advance_clock`, so the shell gets an outcome, never a callable that reaches back into
the engine. Each outcome carries a sequence number that increases across the engine's life,
restarts included.

A callback carries the payloads of the signals that satisfied its operation, so what an operation
accumulates is bounded: ``max_signal_bytes_per_operation`` caps the UTF-8 bytes of signal
payloads one operation's outcome can report. The input that would cross it is refused with a
:class:`LimitError` naming ``payload`` (a signal) or ``keys`` (a registration whose keys were
already signalled with too much), and changes nothing; a callback therefore never outgrows the
record size it was configured for.

Memory is limited in bytes as well as in counts. The engine keeps an estimate of the bytes each
pending operation, remembered signal and finished operation holds (a formula of its texts, see
:mod:`purgatory._core._footprint`), with totals per scope and per engine updated by every input,
expiry and restore (:meth:`Engine.statistics`, :attr:`Engine.memory_bytes`).
``max_pending_bytes_per_scope`` refuses a registration whose estimate would take its scope's
pending operations over it; ``max_remembered_signals_per_scope`` and
``max_remembered_bytes_per_scope`` refuse a signal that would grow its scope's remembered
signals over them, unless a pending operation awaits its key (it is needed now, not only kept
for later; what such signals hold is bounded by the keys of the operations admitted). Each
refusal is a :class:`LimitError` whose ``field`` names the limit.

Limits are decided on the engine's state alone, so a journal replayed on an engine of the same
configuration refuses exactly the inputs refused the first time (the journal records every
input, refused or not; :func:`~purgatory._core._journal.replay_journal` skips the refusals).
Remembered signals that expired but are not cleaned up yet are stored here but absent from a
snapshot, so before refusing a signal the engine removes them and decides again: a restored
engine decides the same.
"""

from __future__ import annotations

import enum
from bisect import bisect_left, bisect_right, insort
from collections.abc import Callable, Collection, Generator, Iterable, Iterator
from dataclasses import dataclass, replace
from heapq import heappop, heappush, merge, nlargest, nsmallest
from itertools import chain, islice
from operator import attrgetter, itemgetter
from typing import TypeVar

from purgatory._core._entries import (
    AdvanceEntry,
    CancelEntry,
    JournalEntry,
    RegisterEntry,
    ResumeEntry,
    SignalEntry,
    WatermarkEntry,
)
from purgatory._core._errors import ConflictError, LimitError, SizeLimitError, UsageError
from purgatory._core._footprint import finished_bytes, operation_bytes, signal_bytes
from purgatory._core._keyed_timers import KeyedTimers, TimeDomain
from purgatory._core._model import OperationSpec, Outcome, OutcomeKind, SignalFact
from purgatory._core._operation import DelayedOperation
from purgatory._core._purgatory import DelayedOperationPurgatory
from purgatory._core._timer import Timer, TimerTask, _Bucket
from purgatory._core._ttl_state import TtlConfig, TtlState
from purgatory._core._validate import MAX_TIME_MS, check_ms, check_positive_int, check_text

__all__ = [
    "ConflictError",
    "Engine",
    "EngineConfig",
    "EngineStatistics",
    "LimitError",
    "Registration",
    "RegistrationStatus",
    "SizeLimitError",
]

_DEADLINE = "deadline"  # the keyed-timer namespace of event-time deadlines
_DAY_MS = 86_400_000
_DEFAULT_SIGNAL_TTL = TtlConfig(ttl_ms=7 * _DAY_MS)
_NO_LIMIT = 1 << 40  # default and largest value of the byte and remembered-signal limits
_VIEW_STEP = 10_000  # items one step of an operator's view reads (1 to 3 ms in CPython)


class RegistrationStatus(enum.StrEnum):
    """What :meth:`Engine.register` did."""

    PENDING = "pending"  # new, waiting
    COMPLETED = "completed"  # new, satisfied at once by remembered signals
    DUPLICATE = "duplicate"  # the same spec was registered before: nothing changed
    REARMED = "rearmed"  # a timer moved to its new deadline


@dataclass(frozen=True, slots=True)
class Registration:
    """The answer to a registration: its status and, once finished, the outcome."""

    status: RegistrationStatus
    outcome: Outcome | None = None


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Tuning and limits of the engine; every field is validated and named in errors."""

    tick_ms: int = 1
    wheel_size: int = 512
    purge_interval: int = 1000
    signal_ttl: TtlConfig = _DEFAULT_SIGNAL_TTL
    outcome_ttl_ms: int = _DAY_MS
    max_fire_per_step: int = 10_000
    max_pending: int = 10_000_000
    max_pending_per_scope: int = 1_000_000
    max_signal_bytes_per_operation: int = 524_288
    # Estimated bytes (purgatory._core._footprint); the defaults mean "no limit".
    max_pending_bytes_per_scope: int = _NO_LIMIT
    max_remembered_signals_per_scope: int = _NO_LIMIT
    max_remembered_bytes_per_scope: int = _NO_LIMIT

    def __post_init__(self) -> None:
        check_positive_int("tick_ms", self.tick_ms, maximum=MAX_TIME_MS)
        check_positive_int("wheel_size", self.wheel_size, minimum=2, maximum=1 << 20)
        check_positive_int("purge_interval", self.purge_interval, minimum=0)
        if not isinstance(self.signal_ttl, TtlConfig):
            raise UsageError("signal_ttl must be a TtlConfig")
        check_positive_int("outcome_ttl_ms", self.outcome_ttl_ms, maximum=MAX_TIME_MS)
        check_positive_int("max_fire_per_step", self.max_fire_per_step)
        check_positive_int("max_pending", self.max_pending, maximum=1 << 40)
        check_positive_int("max_pending_per_scope", self.max_pending_per_scope, maximum=1 << 40)
        check_positive_int(
            "max_signal_bytes_per_operation", self.max_signal_bytes_per_operation, maximum=1 << 40
        )
        for name in (
            "max_pending_bytes_per_scope",
            "max_remembered_signals_per_scope",
            "max_remembered_bytes_per_scope",
        ):
            check_positive_int(name, getattr(self, name), maximum=_NO_LIMIT)


@dataclass(frozen=True, slots=True)
class EngineStatistics:
    """Counts describing the engine at one instant."""

    pending: int
    watched: int
    watch_keys: int
    timer_buckets: int
    timer_levels: int
    signals: int
    scopes_with_watermark: int
    completed: int
    expired: int
    cancelled: int
    purged: int
    late: int
    sequence: int
    clock_ms: int
    # Estimated bytes (purgatory._core._footprint) and the count of remembered signals.
    pending_bytes: int = 0
    remembered_signals: int = 0
    remembered_bytes: int = 0
    finished_bytes: int = 0


@dataclass(frozen=True, slots=True)
class _Finished:
    spec: OperationSpec
    outcome: Outcome


class _Op(DelayedOperation):
    """One registered operation; its outcome is decided by the engine's clock."""

    __slots__ = ("engine", "expiring", "facts", "late", "outcome", "registered_ms", "spec")

    def __init__(self, engine: Engine, spec: OperationSpec, registered_ms: int, late: bool) -> None:
        in_wheel = spec.time_domain is TimeDomain.PROCESSING_TIME
        super().__init__(deadline_ms=spec.deadline_ms if in_wheel else MAX_TIME_MS)
        self.engine = engine
        self.spec = spec
        self.registered_ms = registered_ms
        self.late = late
        self.expiring = False
        self.outcome: Outcome | None = None
        self.facts: dict[str, SignalFact | None] | None = None

    def try_complete(self) -> bool:
        if self.engine._deadline_passed(self.spec):
            return False  # too late: it expires at the next step instead
        facts = self.engine._facts(self.spec)
        if sum(fact is not None for fact in facts.values()) >= self.spec.needed:
            self.facts = facts  # the outcome reports these: no second read of the store
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        kind = OutcomeKind.EXPIRED if self.expiring else OutcomeKind.COMPLETED
        self.engine._finish(self, kind)

    def run(self) -> None:
        self.expiring = True
        super().run()


class Engine:
    """Declarative delayed operations over signals, told the time in integer milliseconds.

    Args:
        config: tuning and limits.
        start_ms: the clock's initial time (epoch ms in the service).
        journal: called with each input before it is applied, as a typed entry
            (``purgatory._core._journal`` records and replays them); None records nothing.
        partition: the input partition this engine serves; stamped on every outcome.
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        start_ms: int = 0,
        journal: Callable[[JournalEntry], None] | None = None,
        partition: int = 0,
    ) -> None:
        self.config = config if config is not None else EngineConfig()
        self.partition = partition
        self._journal = journal
        self._now = check_ms("start_ms", start_ms)
        wheel = Timer(
            tick_ms=self.config.tick_ms, wheel_size=self.config.wheel_size, start_ms=self._now
        )
        self.purgatory = DelayedOperationPurgatory(
            "operations", timer=wheel, purge_interval=self.config.purge_interval
        )
        self.keyed = KeyedTimers(max_fire_per_poll=self.config.max_fire_per_step)
        # Estimated bytes held (purgatory._core._footprint), kept up to date by every change:
        # pending operations in _add/_finish, signals and finished ones by their TtlState.
        self._pending_bytes = 0
        self._pending_bytes_by_scope: dict[str, int] = {}
        self._remembered_bytes = 0
        self._remembered_by_scope: dict[str, list[int]] = {}  # scope -> [count, bytes]
        self._finished_bytes = 0
        self.signals: TtlState[tuple[str, str], SignalFact] = TtlState(
            self.config.signal_ttl, on_change=self._remembered_changed
        )
        self.finished: TtlState[tuple[str, str], _Finished] = TtlState(
            TtlConfig(ttl_ms=self.config.outcome_ttl_ms), on_change=self._finished_changed
        )
        self._ops: dict[tuple[str, str], _Op] = {}
        self._op_ids: dict[str, list[str] | _SortedIds] = {}  # scope -> pending op_ids, sorted
        self._pending_by_scope: dict[str, int] = {}
        self._decided: list[Outcome] = []  # outcomes of the call under way, returned by it
        self._sequence = 0
        self._counts = dict.fromkeys(OutcomeKind, 0)
        self._late = 0

    # -- inputs ------------------------------------------------------------------------------

    def register(self, spec: OperationSpec, *, now_ms: int, retry: bool = False) -> Registration:
        """Register an operation (idempotent for the same spec; timers re-arm).

        ``retry`` says the request may have been applied already (its sender tries again after
        an answer it could not trust: a 503, a lost connection). A timer sent again with a
        relative timeout then has a later deadline than the first try; as a retry it is a
        ``duplicate`` of what it finds (pending, or finished and remembered) instead of moving
        the timer or, once fired, starting a second round.

        Raises:
            ConflictError: the id is pending or finished with a different spec.
            LimitError: a pending limit would be exceeded (in operations, or in estimated
                bytes: ``max_pending_bytes_per_scope``); its ``field`` names the limit.
            UsageError: ``spec`` or ``now_ms`` is invalid.
        """
        if not isinstance(spec, OperationSpec):
            raise UsageError(f"spec must be an OperationSpec, got {type(spec).__name__}")
        if self._journal is not None:
            self._journal(RegisterEntry(check_ms("now_ms", now_ms), spec, retry=retry))
        now = self._tick(now_ms)
        ident = (spec.scope, spec.op_id)
        current = self._ops.get(ident)
        if current is not None:
            if _same_request(current.spec, spec):
                return Registration(RegistrationStatus.DUPLICATE)
            if spec.is_timer and current.spec.is_timer and _same_but_deadline(current.spec, spec):
                if retry and _same_retried_timer(current.spec, spec):
                    return Registration(RegistrationStatus.DUPLICATE)
                self._rearm(current, spec)
                return Registration(RegistrationStatus.REARMED)
            raise ConflictError(
                f"op_id {spec.op_id!r} is pending in scope {spec.scope!r} with another body"
            )
        done = self.finished.get(ident, now_ms=now)
        if done is not None and retry and _same_retried_timer(done.spec, spec):
            return Registration(RegistrationStatus.DUPLICATE, done.outcome)
        if done is not None and not (spec.is_timer and done.spec.deadline_ms != spec.deadline_ms):
            if _same_request(done.spec, spec):
                return Registration(RegistrationStatus.DUPLICATE, done.outcome)
            raise ConflictError(
                f"op_id {spec.op_id!r} finished in scope {spec.scope!r} with another body"
            )
        self._check_limits(spec.scope)
        self._check_pending_bytes(spec)
        self._check_signal_bytes(spec)
        op = self._add(spec, registered_ms=now, late=False)
        self._decided.clear()
        if op.outcome is not None:
            return Registration(RegistrationStatus.COMPLETED, op.outcome)
        return Registration(RegistrationStatus.PENDING)

    def signal(
        self,
        scope: str,
        key: str,
        *,
        now_ms: int,
        event_time_ms: int | None = None,
        payload: str | None = None,
    ) -> list[Outcome]:
        """Remember that ``key`` happened in ``scope`` and complete what it satisfies.

        Returns:
            The outcomes of the operations this signal completed, in sequence order.

        Raises:
            LimitError: the payload would make an operation watching ``key`` report more than
                ``max_signal_bytes_per_operation`` bytes of signal payloads; or no pending
                operation awaits ``key`` and remembering it would take the scope over
                ``max_remembered_signals_per_scope`` or ``max_remembered_bytes_per_scope``
                (the error's ``field``); nothing changed.
        """
        if self._journal is not None:
            self._journal(
                SignalEntry(check_ms("now_ms", now_ms), scope, key, event_time_ms, payload)
            )
        fact = SignalFact(self._tick(now_ms), _opt_ms("event_time_ms", event_time_ms), payload)
        ident = (check_text("scope", scope), check_text("key", key))
        if payload is not None:
            if not isinstance(payload, str):
                raise UsageError("payload must be a str or None")
            self._check_watchers_signal_bytes(ident, _utf8_len(payload))
        self._check_remembered(ident, fact)
        self.signals.put(ident, fact, now_ms=self._now)
        self.purgatory.check_and_complete(ident)
        return self._take()

    def advance_watermark(self, scope: str, watermark_ms: int) -> bool:
        """Move ``scope``'s event-time watermark forward (a backward one is a no-op).

        Event-time deadlines it passes expire at the next :meth:`advance_clock`.
        """
        if self._journal is not None:
            self._journal(WatermarkEntry(scope, watermark_ms))
        return self.keyed.advance_watermark(scope, watermark_ms)

    def cancel(self, scope: str, op_id: str, *, now_ms: int) -> Outcome | None:
        """Cancel a pending operation. Returns its ``cancelled`` outcome, or None if not pending."""
        if self._journal is not None:
            self._journal(CancelEntry(check_ms("now_ms", now_ms), scope, op_id))
        self._tick(now_ms)
        op = self._ops.get((scope, op_id))
        if op is None or not op.cancel_operation():
            return None
        outcome = self._finish(op, OutcomeKind.CANCELLED)
        self._decided.clear()
        return outcome

    # -- the clock -----------------------------------------------------------------------------

    def advance_clock(self, now_ms: int) -> list[Outcome]:
        """Move the clock and expire what is due; return the ``expired`` outcomes, in order.

        Work is bounded by ``max_fire_per_step`` (plus one bucket): overdue operations after a
        restore come back over several steps, earliest first. Call again while
        :meth:`next_expiration_ms` is at or before ``now_ms`` to catch up.
        """
        if self._journal is not None:
            self._journal(AdvanceEntry(check_ms("now_ms", now_ms)))
        now = self._tick(now_ms)
        self.signals.advance_clock(now)
        self.finished.advance_clock(now)
        budget = self.config.max_fire_per_step
        due: list[TimerTask] = []
        timer = self.purgatory.timer
        while len(due) < budget:
            nxt = timer.next_expiration_ms()
            if nxt is None or nxt > now:
                due.extend(self.purgatory.advance_clock(now))  # nothing is due: moves the wheel
                break
            due.extend(self.purgatory.advance_clock(nxt))
        for fired in self.keyed.poll(now):
            op = self._ops.get((fired.scope, fired.key))
            if op is not None and op.spec.deadline_ms == fired.timestamp_ms:
                due.append(op)
        for task in due:
            task.run()  # expires it, unless a signal or a cancel finished it first
        return self._take()

    def resume(self, now_ms: int) -> int:
        """After a restore: flag every pending operation overdue at ``now_ms`` late.

        They expire at the next :meth:`advance_clock` to ``now_ms``, each outcome flagged
        ``late``. The clock moves to ``now_ms`` (and an empty engine's wheel with it). Journaled,
        so a second restore flags the same operations.

        Returns:
            How many were flagged.
        """
        if self._journal is not None:
            self._journal(ResumeEntry(check_ms("now_ms", now_ms)))
        now = self._tick(now_ms)
        if not self._ops:
            # Nothing is pending, so nothing can be due: the wheel starts here rather than at
            # the engine's start (an engine created for a restore starts at 0, and a wheel far
            # behind its deadlines cascades every operation through extra levels).
            self.purgatory.advance_clock(now)
        flagged = 0
        for op in self._ops.values():
            spec = op.spec
            if (
                not op.late
                and spec.time_domain is TimeDomain.PROCESSING_TIME
                and spec.deadline_ms <= now_ms
            ):
                op.late = True
                flagged += 1
        return flagged

    def decided_after(self, sequence: int) -> list[Outcome]:
        """The outcomes still remembered (within ``outcome_ttl_ms``) whose sequence is after
        ``sequence``, in sequence order: after a restore, those that may not have been
        delivered."""
        found = [
            e.value.outcome
            for _, e in self.finished.items(now_ms=self._now)
            if e.value.outcome.sequence > sequence
        ]
        return sorted(found, key=lambda o: o.sequence)

    def next_expiration_ms(self) -> int | None:
        """When :meth:`advance_clock` has work next (signal and outcome expiry included)."""
        times = [
            self.purgatory.timer.next_expiration_ms(),
            self.keyed.next_expiration_ms(self._now),
            self.signals.next_expiration_ms(),
            self.finished.next_expiration_ms(),
        ]
        known = [t for t in times if t is not None]
        return min(known) if known else None

    # -- queries -------------------------------------------------------------------------------

    @property
    def clock_ms(self) -> int:
        """The latest time the engine was told."""
        return self._now

    def lookup(self, scope: str, op_id: str) -> tuple[OperationSpec, Outcome | None] | None:
        """The spec and (if finished) the outcome of an operation, or None if unknown."""
        op = self._ops.get((scope, op_id))
        if op is not None:
            return op.spec, None
        done = self.finished.get((scope, op_id), now_ms=self._now)
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
        p = self.purgatory.statistics()
        t = self.purgatory.timer.statistics()
        return EngineStatistics(
            pending=len(self._ops),
            watched=p.watched,
            watch_keys=p.keys,
            timer_buckets=t.buckets,
            timer_levels=t.levels,
            signals=len(self.signals),
            scopes_with_watermark=len(self.keyed.watermarks()),
            completed=self._counts[OutcomeKind.COMPLETED],
            expired=self._counts[OutcomeKind.EXPIRED],
            cancelled=self._counts[OutcomeKind.CANCELLED],
            purged=p.purged,
            late=self._late,
            sequence=self._sequence,
            clock_ms=self._now,
            pending_bytes=self._pending_bytes,
            remembered_signals=len(self.signals),
            remembered_bytes=self._remembered_bytes,
            finished_bytes=self._finished_bytes,
        )

    @property
    def memory_bytes(self) -> int:
        """The estimated bytes the engine holds: pending, remembered and finished state."""
        return self._pending_bytes + self._remembered_bytes + self._finished_bytes

    def is_pending(self, scope: str, op_id: str) -> bool:
        """Whether the operation is pending (no side effect, unlike :meth:`lookup`)."""
        return (scope, op_id) in self._ops

    def awaits(self, scope: str, key: str) -> bool:
        """Whether a pending operation watches ``key`` in ``scope`` (a signal of it is needed)."""
        watchers = self.purgatory._watchers.get((scope, key), ())
        return any(not op.is_done for op in watchers)  # finished ones linger until a purge

    # -- views for operators: read-only, in bounded steps ---------------------------------------

    @property
    def pending_operations(self) -> int:
        """How many operations are pending (what ``statistics().pending`` says, in O(1))."""
        return len(self._ops)

    @property
    def pending_scopes(self) -> int:
        """How many scopes have pending operations."""
        return len(self._pending_by_scope)

    def missing_keys(self, spec: OperationSpec) -> tuple[str, ...]:
        """The keys of ``spec`` that no remembered signal answers now, in the spec's order.

        Not an access: no signal's TTL is refreshed (a read under ``on_read_and_write`` would
        refresh it, and reads are not journaled), so a signal that expired but is not cleaned
        up yet still counts here until the next :meth:`advance_clock` removes it.
        """
        peek, scope = self.signals.peek, spec.scope
        return tuple(key for key in spec.keys if peek((scope, key)) is None)

    def busiest_scopes(self, count: int, *, step: int = _VIEW_STEP) -> View[tuple[str, int]]:
        """The ``count`` scopes with the most pending operations, most first (ties by name),
        with their counts.

        A generator of bounded steps (see :data:`View`): each reads at most ``step`` scopes.
        """
        counts = self._pending_by_scope
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
        for lower, last, tasks in _wheel_runs(self.purgatory.timer):
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

    def operation_bytes(self, spec: OperationSpec) -> int:
        """The estimated bytes ``spec`` would hold while pending."""
        return operation_bytes(spec)

    def signal_growth_bytes(self, scope: str, key: str, payload: str | None) -> int:
        """The estimated bytes remembering this signal would add (negative: it would free
        some, replacing a larger payload); no side effect."""
        return self._remembered_growth((scope, key), SignalFact(self._now, None, payload))[1]

    # -- internals (also used by the snapshot module) ------------------------------------------

    def _tick(self, now_ms: int) -> int:
        now = check_ms("now_ms", now_ms)
        self._now = max(self._now, now)
        return self._now

    def _check_limits(self, scope: str) -> None:
        if len(self._ops) >= self.config.max_pending:
            raise LimitError(
                f"max_pending ({self.config.max_pending}) operations are pending",
                field="max_pending",
            )
        if self._pending_by_scope.get(scope, 0) >= self.config.max_pending_per_scope:
            limit = self.config.max_pending_per_scope
            raise LimitError(
                f"max_pending_per_scope ({limit}) reached in scope {scope!r}",
                field="max_pending_per_scope",
            )

    # -- estimated bytes (purgatory._core._footprint) -------------------------------------------

    def _hold_pending_bytes(self, scope: str, size: int) -> None:
        self._pending_bytes += size
        held = self._pending_bytes_by_scope.get(scope, 0) + size
        if held:
            self._pending_bytes_by_scope[scope] = held
        else:
            del self._pending_bytes_by_scope[scope]

    def _remembered_changed(
        self, ident: tuple[str, str], old: SignalFact | None, new: SignalFact | None
    ) -> None:
        scope, key = ident
        count = (new is not None) - (old is not None)
        size = (0 if new is None else signal_bytes(scope, key, new)) - (
            0 if old is None else signal_bytes(scope, key, old)
        )
        self._remembered_bytes += size
        held = self._remembered_by_scope.get(scope)
        if held is None:
            self._remembered_by_scope[scope] = [count, size]
            return
        held[0] += count
        held[1] += size
        if not held[0]:
            del self._remembered_by_scope[scope]

    def _finished_changed(
        self, _ident: tuple[str, str], old: _Finished | None, new: _Finished | None
    ) -> None:
        if new is not None:
            self._finished_bytes += finished_bytes(new.spec)
        if old is not None:
            self._finished_bytes -= finished_bytes(old.spec)

    def _check_pending_bytes(self, spec: OperationSpec) -> None:
        limit = self.config.max_pending_bytes_per_scope
        if limit >= _NO_LIMIT:
            return  # nothing held in memory comes near it: spare the hot path the estimate
        size = operation_bytes(spec)
        held = self._pending_bytes_by_scope.get(spec.scope, 0)
        if held + size > limit:
            raise LimitError(
                f"max_pending_bytes_per_scope ({limit}) would be exceeded in scope "
                f"{spec.scope!r}: its pending operations hold about {held} bytes, this one "
                f"{size}",
                field="max_pending_bytes_per_scope",
            )

    def _remembered_growth(self, ident: tuple[str, str], fact: SignalFact) -> tuple[int, int]:
        """What remembering ``fact`` under ``ident`` adds: (signals, bytes) to its scope."""
        scope, key = ident
        old = self.signals.peek(ident)
        if old is None:
            return 1, signal_bytes(scope, key, fact)
        return 0, signal_bytes(scope, key, fact) - signal_bytes(scope, key, old)

    def _remembered_over(self, ident: tuple[str, str], fact: SignalFact) -> str | None:
        """The remembered-signal limit that remembering ``fact`` would cross, if any."""
        config = self.config
        count, size = self._remembered_growth(ident, fact)
        held_count, held_bytes = self._remembered_by_scope.get(ident[0], (0, 0))
        if count > 0 and held_count + count > config.max_remembered_signals_per_scope:
            return "max_remembered_signals_per_scope"
        if size > 0 and held_bytes + size > config.max_remembered_bytes_per_scope:
            return "max_remembered_bytes_per_scope"
        return None

    def _check_remembered(self, ident: tuple[str, str], fact: SignalFact) -> None:
        config = self.config
        if (
            config.max_remembered_signals_per_scope >= _NO_LIMIT
            and config.max_remembered_bytes_per_scope >= _NO_LIMIT
        ):
            return  # no limit set: spare the hot path the estimate
        if self._remembered_over(ident, fact) is None or self.awaits(*ident):
            return
        # What is stored may include signals expired but not yet cleaned up, which a snapshot
        # does not hold: count only the live ones, so a restored engine decides the same.
        self.signals.remove_expired(self._now)
        over = self._remembered_over(ident, fact)
        if over is None:
            return
        scope = ident[0]
        count, size = self._remembered_by_scope.get(scope, (0, 0))
        limit = getattr(self.config, over)
        raise LimitError(
            f"{over} ({limit}) would be exceeded in scope {scope!r}: it remembers {count} "
            f"signals of about {size} bytes, and no pending operation awaits key {ident[1]!r}",
            field=over,
        )

    def _add(
        self, spec: OperationSpec, *, registered_ms: int, late: bool, checked: bool = True
    ) -> _Op:
        """Hold a new operation: index it, watch its keys, schedule its deadline.

        With ``checked`` (a registration) its condition is checked before and after the watch,
        and it may complete at once. Without (``_restore_pending``) it is watched as it is.
        """
        op = _Op(self, spec, registered_ms, late)
        self._ops[(spec.scope, spec.op_id)] = op
        _add_id(self._op_ids, spec.scope, spec.op_id)
        self._pending_by_scope[spec.scope] = self._pending_by_scope.get(spec.scope, 0) + 1
        self._hold_pending_bytes(spec.scope, operation_bytes(spec))
        if spec.time_domain is TimeDomain.EVENT_TIME:
            self.keyed.register_event_time_timer(
                spec.scope, spec.op_id, _DEADLINE, spec.deadline_ms
            )
        if spec.keys:
            keys = [(spec.scope, k) for k in spec.keys]
            if checked:
                self.purgatory.try_complete_else_watch(op, keys)
            else:
                self.purgatory._watch_restored(op, keys)
        elif spec.time_domain is TimeDomain.PROCESSING_TIME:
            self.purgatory.timer.add(op)
        return op

    def _restore_pending(
        self, spec: OperationSpec, *, registered_ms: int, late: bool | None = None
    ) -> None:
        """Rebuild one operation a snapshot held as pending, without checking its condition.

        It was pending when the snapshot was taken, so the signals then remembered did not
        satisfy it; a restore only ever drops remembered signals (their TTL), never adds one.
        So the check-watch-check of a registration (the bulk of its cost) can be skipped; an
        operation whose deadline passed meanwhile is flagged late and expires at the next step.
        """
        if late is None:
            late = self._deadline_passed(spec)
        self._add(spec, registered_ms=registered_ms, late=late, checked=False)

    def _rearm(self, op: _Op, spec: OperationSpec) -> None:
        old = op.spec
        op.spec = spec
        if spec.time_domain is TimeDomain.EVENT_TIME:
            self.keyed.delete_event_time_timer(old.scope, old.op_id, _DEADLINE, old.deadline_ms)
            self.keyed.register_event_time_timer(
                spec.scope, spec.op_id, _DEADLINE, spec.deadline_ms
            )
        else:
            op.deadline_ms = spec.deadline_ms  # moves it in the wheel, after its tick's others
            # Pending operations are kept in the order they were (re)added to the wheel, which
            # is the order a tick's operations expire in: a snapshot lists them so, and a
            # restore re-adds them so, to expire ties exactly as the original would.
            ident = (spec.scope, spec.op_id)
            self._ops[ident] = self._ops.pop(ident)
        op.late = False  # a re-arm is a new request, not a catch-up after a restore

    def _deadline_passed(self, spec: OperationSpec) -> bool:
        if spec.time_domain is TimeDomain.PROCESSING_TIME:
            return self._now >= spec.deadline_ms
        watermark = self.keyed.current_watermark(spec.scope)
        return watermark is not None and watermark >= spec.deadline_ms

    def _outcome_ms(self, spec: OperationSpec, kind: OutcomeKind) -> int:
        # A processing-time operation expires at its deadline, whenever the expiry is run:
        # from that millisecond on no signal could complete it. Delivery lateness is the
        # reaper's and the executor's to report.
        if kind is OutcomeKind.EXPIRED and spec.time_domain is TimeDomain.PROCESSING_TIME:
            return spec.deadline_ms
        return self._now

    def _facts(self, spec: OperationSpec) -> dict[str, SignalFact | None]:
        """The remembered signal of each of the operation's keys (None: not signalled)."""
        get, scope, now = self.signals.get, spec.scope, self._now
        return {key: get((scope, key), now_ms=now) for key in spec.keys}

    def _finish(self, op: _Op, kind: OutcomeKind) -> Outcome:
        spec = op.spec
        ident = (spec.scope, spec.op_id)
        del self._ops[ident]
        _remove_id(self._op_ids, spec.scope, spec.op_id)
        left = self._pending_by_scope[spec.scope] - 1
        if left:
            self._pending_by_scope[spec.scope] = left
        else:
            del self._pending_by_scope[spec.scope]
        self._hold_pending_bytes(spec.scope, -operation_bytes(spec))
        if spec.time_domain is TimeDomain.EVENT_TIME:
            self.keyed.delete_event_time_timer(spec.scope, spec.op_id, _DEADLINE, spec.deadline_ms)
        facts = op.facts if op.facts is not None else self._facts(spec)
        self._sequence += 1
        self._counts[kind] += 1
        late = op.late and kind is OutcomeKind.EXPIRED
        self._late += late
        outcome = Outcome(
            op_id=spec.op_id,
            scope=spec.scope,
            outcome=kind,
            registered_ms=op.registered_ms,
            outcome_ms=self._outcome_ms(spec, kind),
            deadline_ms=spec.deadline_ms,
            time_domain=spec.time_domain,
            sequence=self._sequence,
            keys=tuple(k for k, f in facts.items() if f is not None),
            missing=tuple(k for k, f in facts.items() if f is None),
            signals={k: f.payload for k, f in facts.items() if f is not None},
            payload=spec.payload,
            reply_to=spec.reply_to,
            late=late,
            partition=self.partition,
        )
        op.outcome = outcome
        self.finished.put(ident, _Finished(spec, outcome), now_ms=self._now)
        self._decided.append(outcome)
        return outcome

    def _take(self) -> list[Outcome]:
        decided = self._decided
        if not decided:
            return []
        self._decided = []
        return decided

    def _signal_bytes(self, scope: str, keys: tuple[str, ...], skip: str | None) -> int:
        total = 0
        get, now = self.signals.get, self._now
        for key in keys:
            if key != skip:
                fact = get((scope, key), now_ms=now)
                if fact is not None and fact.payload is not None:
                    total += _utf8_len(fact.payload)
        return total

    def _check_signal_bytes(self, spec: OperationSpec) -> None:
        limit = self.config.max_signal_bytes_per_operation
        if spec.keys and self._signal_bytes(spec.scope, spec.keys, None) > limit:
            raise SizeLimitError(
                "keys",
                f"the signals already received for these keys carry more than "
                f"max_signal_bytes_per_operation ({limit}) bytes of payload, more than one "
                f"callback may report",
            )

    def _check_watchers_signal_bytes(self, ident: tuple[str, str], size: int) -> None:
        limit = self.config.max_signal_bytes_per_operation
        if size > limit:
            raise SizeLimitError(
                "payload", f"{size} bytes, over max_signal_bytes_per_operation ({limit})"
            )
        watchers = self.purgatory._watchers.get(ident)
        if not watchers:
            return
        scope, key = ident
        for op in watchers:
            if op.is_done or not isinstance(op, _Op):  # a cancelled one lingers too
                continue
            spec = op.spec
            if len(spec.keys) > 1 and self._signal_bytes(scope, spec.keys, key) + size > limit:
                raise SizeLimitError(
                    "payload",
                    f"with this signal, op_id {spec.op_id!r} in scope {scope!r} would report "
                    f"more than max_signal_bytes_per_operation ({limit}) bytes of signal "
                    f"payloads, more than one callback may carry",
                )


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _same_request(current: OperationSpec, sent: OperationSpec) -> bool:
    """Whether ``sent`` repeats the registration of ``current`` as its client sent it.

    A relative ``timeout_ms`` becomes a deadline at arrival, so a retry of the same request
    arrives with another deadline: it is still the same request. Not for a timer (no keys): a
    timer re-sent with its ``timeout_ms`` is pushed back to the new arrival plus the timeout,
    which is how an inactivity timer re-arms.
    """
    if current == sent:
        return True
    return (
        not sent.is_timer
        and sent.timeout_ms is not None
        and current.timeout_ms == sent.timeout_ms
        and replace(current, deadline_ms=sent.deadline_ms) == sent
    )


def _same_retried_timer(current: OperationSpec, sent: OperationSpec) -> bool:
    """Whether ``sent``, a retry, is the timer ``current`` sent again with its relative timeout
    (whose deadline moved only because the retry arrived later)."""
    return (
        current.is_timer
        and sent.is_timer
        and sent.timeout_ms is not None
        and current.timeout_ms == sent.timeout_ms
        and _same_but_deadline(current, sent)
    )


def _same_but_deadline(a: OperationSpec, b: OperationSpec) -> bool:
    return a.time_domain == b.time_domain and a.payload == b.payload and a.reply_to == b.reply_to


def _opt_ms(name: str, value: int | None) -> int | None:
    return None if value is None else check_ms(name, value)


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


# The pending op_ids of each scope, sorted, for pages of pending operations. A scope of at most
# 2 * _BLOCK operations (most scopes) holds them in one sorted list; a larger one in a
# _SortedIds, whose cost per insert or removal grows with the log of the scope's size only.
_BLOCK = 512


def _add_id(index: dict[str, list[str] | _SortedIds], scope: str, op_id: str) -> None:
    ids = index.get(scope)
    if ids is None:
        index[scope] = [op_id]
    elif isinstance(ids, list):
        insort(ids, op_id)
        if len(ids) > 2 * _BLOCK:
            index[scope] = _SortedIds(ids)
    else:
        ids.add(op_id)


def _remove_id(index: dict[str, list[str] | _SortedIds], scope: str, op_id: str) -> None:
    ids = index[scope]
    if isinstance(ids, list):
        at = bisect_left(ids, op_id)
        assert ids[at] == op_id, "removing an op_id that is not pending"
        del ids[at]
    else:
        ids.remove(op_id)
    if not ids:
        del index[scope]


def _ids_after(ids: list[str] | _SortedIds, after: str | None, limit: int) -> list[str]:
    if isinstance(ids, list):
        start = 0 if after is None else bisect_right(ids, after)
        return ids[start : start + limit]
    return ids.after(after, limit)


class _SortedIds:
    """A set of strings kept sorted, as a list of sorted blocks (a flat sorted list would move
    every later item on each insert: O(n) per registration in a scope of n operations).

    The blocks are in order and each is sorted, so ``_lasts`` (each block's greatest item)
    finds an item's block by bisection: add and remove cost O(log n + _BLOCK), and a page of
    ``limit`` items after a given one costs O(log n + limit). An emptied block is dropped and
    a small one is merged into its neighbour, so no block is empty and pages never walk
    empty blocks.
    """

    __slots__ = ("_blocks", "_lasts")

    def __init__(self, items: list[str]) -> None:
        self._blocks = [items[i : i + _BLOCK] for i in range(0, len(items), _BLOCK)]
        self._lasts = [block[-1] for block in self._blocks]

    def __bool__(self) -> bool:
        return bool(self._blocks)

    def add(self, item: str) -> None:
        """Add ``item`` (not already held)."""
        blocks, lasts = self._blocks, self._lasts
        if not blocks:
            blocks.append([item])
            lasts.append(item)
            return
        i = bisect_left(lasts, item)
        if i == len(lasts):  # after every item held: the end of the last block
            i -= 1
            block = blocks[i]
            block.append(item)
            lasts[i] = item
        else:
            block = blocks[i]
            insort(block, item)
        if len(block) > 2 * _BLOCK:
            self._split(i)

    def remove(self, item: str) -> None:
        """Remove ``item`` (held)."""
        blocks, lasts = self._blocks, self._lasts
        i = bisect_left(lasts, item)
        block = blocks[i]
        j = bisect_left(block, item)
        assert block[j] == item, "removing an op_id that is not pending"
        del block[j]
        if not block:
            del blocks[i]
            del lasts[i]
            return
        lasts[i] = block[-1]
        if len(block) < _BLOCK // 4 and i + 1 < len(blocks):
            block.extend(blocks[i + 1])  # the next block's items all sort after this one's
            del blocks[i + 1]
            del lasts[i]
            if len(block) > 2 * _BLOCK:
                self._split(i)

    def after(self, item: str | None, limit: int) -> list[str]:
        """Up to ``limit`` items greater than ``item`` (None: the least ones), in order."""
        blocks = self._blocks
        if item is None:
            i, j = 0, 0
        else:
            i = bisect_right(self._lasts, item)
            j = bisect_right(blocks[i], item) if i < len(blocks) else 0
        found: list[str] = []
        while i < len(blocks) and len(found) < limit:
            found.extend(blocks[i][j : j + limit - len(found)])
            i, j = i + 1, 0
        return found

    def _split(self, i: int) -> None:
        block = self._blocks[i]
        self._blocks[i : i + 1] = [block[:_BLOCK], block[_BLOCK:]]
        self._lasts[i : i + 1] = [block[_BLOCK - 1], block[-1]]
