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

The engine is composed, not mixed in, as Kafka's ``SystemTimer`` owns its wheel and its
executor rather than inheriting them. :class:`Engine` builds its parts in its constructor and
hands each the state they share, so what reads and what changes each collection is written in
one place, and each part can be read (and tested) alone:

* the core's structures: a :class:`DelayedOperationPurgatory` and its timing wheel, the
  :class:`KeyedTimers`, and two :class:`TtlState` stores (signals, finished operations);
* :class:`~purgatory._core.engine.state.EngineState`, one record of references to everything
  shared: those structures, the pending operations and their page index, the engine's clock
  and outcome counters, and the :class:`~purgatory._core.engine.state.Tally` of what is held
  (in number and in estimated bytes), which the lifecycle and the two stores keep up to date;
* :class:`~purgatory._core.engine.lifecycle.Lifecycle` changes the pending operations once an
  input is accepted: holds, re-arms, cancels and finishes them into outcomes; each operation
  asks it, not the engine, whether its deadline passed and which of its keys are signalled;
* :class:`~purgatory._core.engine.budget.Budget` refuses the input that would cross a limit;
* :class:`~purgatory._core.engine.views.Views` is the read side: the queries and the operators'
  views, deciding nothing.

No part holds another or the engine. The engine binds once the parts' methods it calls on every
input, and the read side's queries as its own (``engine.pending_page`` is
``engine.views.pending_page``), so delegating costs no call on the hot paths.

This module holds :class:`Engine` itself: its inputs (checked, journaled, refused or applied),
its clock and its construction. :mod:`purgatory._core.engine.engine_types` holds its
configuration, its answers and the records it keeps per operation (and when a registration
repeats another); of the engine's modules it imports only the model and the checks, so no
module of the engine imports one that imports it back. :mod:`purgatory._core.engine.sorted_ids`
holds the sorted op_ids of each scope that the pages read.
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
from purgatory._core.engine.budget import Budget
from purgatory._core.engine.engine_types import (
    EngineConfig,
    Registration,
    RegistrationStatus,
    _against_pending,
    _Finished,
    _Op,
    _repeats_finished,
)
from purgatory._core.engine.lifecycle import Lifecycle
from purgatory._core.engine.model import OperationSpec, Outcome, SignalFact
from purgatory._core.engine.state import EngineState, Tally, _Progress
from purgatory._core.engine.validate import check_ms, check_text
from purgatory._core.engine.views import Views
from purgatory._core.flink.keyed_timers import KeyedTimers
from purgatory._core.flink.ttl_state import TtlConfig, TtlState
from purgatory._core.wheel.purgatory import DelayedOperationPurgatory
from purgatory._core.wheel.timer import Timer, TimerTask

__all__ = ["ConflictError", "Engine", "LimitError", "SizeLimitError"]


class Engine:
    """Declarative delayed operations over signals, told the time in integer milliseconds.

    Its queries are those of its read side, :attr:`views` (``lookup``, ``pending``,
    ``pending_page``, ``is_pending``, ``statistics``, ``decided_after``, ``next_expiration_ms``,
    ``missing_keys``, ``busiest_scopes``, ``next_deadlines``), and of its :attr:`budget`
    (``operation_bytes``, ``signal_growth_bytes``, ``awaits``), bound here once; the module's
    docstring tells its parts.

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
        self.config = config = config if config is not None else EngineConfig()
        self.partition = partition
        self._journal = journal
        self._progress = progress = _Progress(check_ms("start_ms", start_ms))
        wheel = Timer(
            tick_ms=config.tick_ms, wheel_size=config.wheel_size, start_ms=progress.now_ms
        )
        self.purgatory = DelayedOperationPurgatory(
            "operations", timer=wheel, purge_interval=config.purge_interval
        )
        self.keyed = KeyedTimers(max_fire_per_poll=config.max_fire_per_step)
        self.tally = tally = Tally()  # told of every change by the lifecycle and the stores
        self.signals: TtlState[tuple[str, str], SignalFact] = TtlState(
            config.signal_ttl, on_change=tally.remembered_changed
        )
        self.finished: TtlState[tuple[str, str], _Finished] = TtlState(
            TtlConfig(ttl_ms=config.outcome_ttl_ms), on_change=tally.finished_changed
        )
        self._ops: dict[tuple[str, str], _Op] = {}
        state = EngineState(
            ops=self._ops,
            op_ids={},  # scope -> pending op_ids, sorted
            progress=progress,
            tally=tally,
            purgatory=self.purgatory,
            keyed=self.keyed,
            signals=self.signals,
            finished=self.finished,
        )
        self.lifecycle = life = Lifecycle(state, partition=partition)
        self.budget = budget = Budget(config, state)
        self.views = views = Views(state)
        # Bound once, so that neither an input nor a query pays a call to reach a part.
        self._add, self._rearm, self._take = life.add, life.rearm, life.take
        self._check_registration = budget.check_registration
        self._check_signal = budget.check_signal
        self.operation_bytes = budget.operation_bytes
        self.signal_growth_bytes = budget.signal_growth_bytes
        self.awaits = budget.awaits
        self.lookup = views.lookup
        self.pending = views.pending
        self.pending_page = views.pending_page
        self.is_pending = views.is_pending
        self.statistics = views.statistics
        self.decided_after = views.decided_after
        self.next_expiration_ms = views.next_expiration_ms
        self.missing_keys = views.missing_keys
        self.busiest_scopes = views.busiest_scopes
        self.next_deadlines = views.next_deadlines

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
            status = _against_pending(current.spec, spec, retry)
            if status is RegistrationStatus.REARMED:
                self._rearm(current, spec)
            return Registration(status)
        done = self.finished.get(ident, now_ms=now)
        if done is not None and _repeats_finished(done.spec, spec, retry):
            return Registration(RegistrationStatus.DUPLICATE, done.outcome)
        self._check_registration(spec, now)
        outcome = self._add(spec, registered_ms=now, late=False)
        if outcome is not None:
            return Registration(RegistrationStatus.COMPLETED, outcome)
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
        now = self._tick(now_ms)
        fact = SignalFact(now, _opt_ms("event_time_ms", event_time_ms), payload)
        ident = (check_text("scope", scope), check_text("key", key))
        if payload is not None and not isinstance(payload, str):
            raise UsageError("payload must be a str or None")
        self._check_signal(ident, fact, now)
        self.signals.put(ident, fact, now_ms=now)
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
        return None if op is None else self.lifecycle.cancel(op)

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
            if op is not None and op.spec_deadline_ms == fired.timestamp_ms:
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
        return self.lifecycle.flag_late(now_ms)

    # -- the read side's properties (its methods are bound in __init__) -------------------------

    @property
    def clock_ms(self) -> int:
        """The latest time the engine was told."""
        return self.views.clock_ms

    @property
    def memory_bytes(self) -> int:
        """The estimated bytes the engine holds: pending, remembered and finished state."""
        return self.views.memory_bytes

    @property
    def pending_operations(self) -> int:
        """How many operations are pending (what ``statistics().pending`` says, in O(1))."""
        return self.views.pending_operations

    @property
    def pending_scopes(self) -> int:
        """How many scopes have pending operations."""
        return self.views.pending_scopes

    # -- internals ------------------------------------------------------------------------------

    def _tick(self, now_ms: int) -> int:
        now = check_ms("now_ms", now_ms)
        progress = self._progress
        progress.now_ms = max(progress.now_ms, now)
        return progress.now_ms


def _opt_ms(name: str, value: int | None) -> int | None:
    return None if value is None else check_ms(name, value)
