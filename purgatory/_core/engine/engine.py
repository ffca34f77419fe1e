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
expiry has not run yet; an event-time one once the scope's watermark reaches its deadline. Past
its deadline only the signals that came before it count: an expiry reports them (``keys``) and
the keys without one (``missing``, never empty), and an operation registered after its deadline
(a late client, a clock behind the partition's, a journal replayed behind another writer's
records) completes at once if the signals held before its deadline satisfy it, or else expires
at the next step, never inside the register call, at the time it registered. So an outcome
never contradicts its inputs: no ``expired`` with nothing missing, no ``outcome_ms`` before
``registered_ms``.

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
:mod:`purgatory._core.engine.footprint`), with totals per scope and per engine updated by every
input,
expiry and restore (:meth:`Engine.statistics`, :attr:`Engine.memory_bytes`).
``max_pending_bytes_per_scope`` refuses a registration whose estimate would take its scope's
pending operations over it; ``max_remembered_signals_per_scope`` and
``max_remembered_bytes_per_scope`` refuse a signal that would grow its scope's remembered
signals over them, unless a pending operation awaits its key (it is needed now, not only kept
for later; what such signals hold is bounded by the keys of the operations admitted). Each
refusal is a :class:`LimitError` whose ``field`` names the limit.

Limits are decided on the engine's state alone, so a journal replayed on an engine of the same
configuration refuses exactly the inputs refused the first time (the journal records every
input, refused or not; :func:`~purgatory._core.durability.journal.replay_journal` skips the
refusals).
Remembered signals that expired but are not cleaned up yet are stored here but absent from a
snapshot, so before refusing a signal the engine removes them and decides again: a restored
engine decides the same.

The engine spans five modules. This one holds :class:`Engine`: its inputs, its clock and the
life of a pending operation. :mod:`purgatory._core.engine.engine_types` holds its configuration, its
answers and the records it keeps per operation (and when a registration repeats another);
:mod:`purgatory._core.engine.budget` its estimated bytes and their limits, and
:mod:`purgatory._core.engine.views` its queries and operators' views, two mixins :class:`Engine`
inherits; :mod:`purgatory._core.engine.sorted_ids` the sorted op_ids of each scope that its pages
read.
"""

from __future__ import annotations

from collections.abc import Callable

from purgatory._core._errors import ConflictError, LimitError, SizeLimitError, UsageError
from purgatory._core.durability.entries import (
    AdvanceEntry,
    CancelEntry,
    JournalEntry,
    RegisterEntry,
    ResumeEntry,
    SignalEntry,
    WatermarkEntry,
)
from purgatory._core.engine.budget import _Budget, _utf8_len
from purgatory._core.engine.engine_types import (
    EngineConfig,
    Registration,
    RegistrationStatus,
    _Finished,
    _Op,
    _same_but_deadline,
    _same_request,
    _same_retried_timer,
)
from purgatory._core.engine.footprint import operation_bytes
from purgatory._core.engine.model import OperationSpec, Outcome, OutcomeKind, SignalFact
from purgatory._core.engine.sorted_ids import _add_id, _remove_id, _SortedIds
from purgatory._core.engine.validate import check_ms, check_text
from purgatory._core.engine.views import _Views
from purgatory._core.flink.keyed_timers import KeyedTimers, TimeDomain
from purgatory._core.flink.ttl_state import TtlConfig, TtlState
from purgatory._core.wheel.purgatory import DelayedOperationPurgatory
from purgatory._core.wheel.timer import Timer, TimerTask

__all__ = ["ConflictError", "Engine", "LimitError", "SizeLimitError"]

_DEADLINE = "deadline"  # the keyed-timer namespace of event-time deadlines


class Engine(_Views, _Budget):
    """Declarative delayed operations over signals, told the time in integer milliseconds.

    Args:
        config: tuning and limits.
        start_ms: the clock's initial time (epoch ms in the service).
        journal: called with each input before it is applied, as a typed entry
            (``purgatory._core.durability.journal`` records and replays them); None records nothing.
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
        # Estimated bytes held (purgatory._core.engine.footprint), kept up to date by every change:
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

    def _outcome_ms(self, op: _Op, kind: OutcomeKind) -> int:
        # A processing-time operation expires at its deadline, whenever the expiry is run:
        # from that millisecond on no signal could complete it. Delivery lateness is the
        # reaper's and the executor's to report. One registered after its deadline expires
        # when it registered: an outcome is never before the registration it answers.
        spec = op.spec
        if kind is OutcomeKind.EXPIRED and spec.time_domain is TimeDomain.PROCESSING_TIME:
            return max(spec.deadline_ms, op.registered_ms)
        return self._now

    def _facts(
        self, spec: OperationSpec, *, by_deadline: bool = False
    ) -> dict[str, SignalFact | None]:
        """The remembered signal of each of the operation's keys (None: not signalled).

        With ``by_deadline`` only a signal that came before the deadline counts: one that
        arrived before it (processing time), or whose event time, if it has one, is before it
        (event time). An expiry reports its keys and ``missing`` so, and a registration
        whose deadline has already passed is decided by them (see :class:`_Op`).
        """
        get, scope, now = self.signals.get, spec.scope, self._now
        facts = {key: get((scope, key), now_ms=now) for key in spec.keys}
        if not by_deadline:
            return facts
        deadline, in_time = spec.deadline_ms, spec.time_domain is TimeDomain.PROCESSING_TIME
        return {key: fact if fact is not None and _before(fact, deadline, in_time) else None
                for key, fact in facts.items()}  # fmt: skip

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
        expired = kind is OutcomeKind.EXPIRED
        facts = op.facts if op.facts is not None else self._facts(spec, by_deadline=expired)
        self._sequence += 1
        self._counts[kind] += 1
        late = op.late and kind is OutcomeKind.EXPIRED
        self._late += late
        outcome = Outcome(
            op_id=spec.op_id,
            scope=spec.scope,
            outcome=kind,
            registered_ms=op.registered_ms,
            outcome_ms=self._outcome_ms(op, kind),
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


def _before(fact: SignalFact, deadline_ms: int, processing_time: bool) -> bool:
    """Whether a signal came before a deadline: it arrived before it (processing time), or
    its event time, when it has one, is before it (event time)."""
    if processing_time:
        return fact.signalled_ms < deadline_ms
    return fact.event_time_ms is None or fact.event_time_ms < deadline_ms


def _opt_ms(name: str, value: int | None) -> int | None:
    return None if value is None else check_ms(name, value)
