"""The life of a pending operation (core concept: held, watched, finished; sans-IO, stdlib only).

:class:`Lifecycle` is the part of the :class:`~purgatory._core.engine.engine.Engine` that changes
its pending operations once the engine has accepted an input: it holds a new operation (indexes
it, counts it in the tally, watches its keys in the purgatory and schedules its deadline in the
wheel or, in event time, in the keyed timers), re-arms a timer, rebuilds one from a snapshot,
and finishes one into its :class:`Outcome` (numbered, counted, remembered for idempotent
re-registration, and kept until the call that decided it takes it, h11-style).

It is also what each ``_Op`` asks when the purgatory or the wheel calls it: whether its deadline
has passed, which of its keys are signalled (:meth:`Lifecycle.facts`), and to finish it. So an
operation knows this part through the small protocol ``engine_types._Owner``, not the engine.

A part of its own, given the engine's shared state at construction
(:class:`~purgatory._core.engine.state.EngineState`: the pending operations and their page
index, which the budget and the views read too, and the engine's clock and outcome counters),
because the engine's own concern is the inputs: validating, journaling, refusing and telling
the time. Everything here is called with an input already accepted, so nothing here raises on
bad input.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from sys import intern as _intern

from purgatory._core.engine.engine_types import _Finished, _Op, _op_type
from purgatory._core.engine.footprint import (
    KEY_BYTES,
    OPERATION_BYTES,
    operation_bytes,
    plain_operation_bytes,
    utf8_len,
)
from purgatory._core.engine.model import OperationSpec, Outcome, OutcomeKind, SignalFact
from purgatory._core.engine.sorted_ids import _add_id, _add_ids, _remove_id
from purgatory._core.engine.state import EngineState
from purgatory._core.engine.validate import MAX_TIME_MS
from purgatory._core.flink.keyed_timers import TimeDomain
from purgatory._core.wheel.operation import _PENDING, DelayedOperation

#: A pending operation as a snapshot holds it (see :meth:`Lifecycle.restore_bulk`).
RestoredRow = tuple[
    str, str, tuple[str, ...], int, int, int | None, str | None, bool, OperationSpec | None
]
_new = object.__new__

__all__ = ["Lifecycle"]

_DEADLINE = "deadline"  # the keyed-timer namespace of event-time deadlines


class Lifecycle:
    """Holds, re-arms and finishes the engine's pending operations.

    Args:
        state: the engine's shared state; changed here: the pending operations and their
            index, the outcome counters (the clock is read), the tally (told of each operation
            held and finished), the watches and deadlines, and the finished store.
        partition: stamped on every outcome.
    """

    def __init__(self, state: EngineState, *, partition: int) -> None:
        self._ops = state.ops
        self._op_ids = state.op_ids
        self._progress = state.progress
        self._hold = state.tally.hold_pending
        self._purgatory = state.purgatory
        self._keyed = state.keyed
        self._signals = state.signals
        self._finished = state.finished
        self._partition = partition
        self._decided: list[Outcome] = []  # outcomes of the call under way, returned by it
        self._new_op = _op_type(self)
        self._last_deadline = -1  # the ints the last operation held
        self._last_timeout = -1

    # -- what the engine's inputs change -------------------------------------------------------

    def add(self, spec: OperationSpec, *, registered_ms: int, late: bool) -> Outcome | None:
        """Hold a new operation: index it, watch its keys, schedule its deadline.

        Its condition is checked before and after the watch, and it may complete at once: its
        outcome is then returned, and not taken by :meth:`take`.
        """
        scope = spec.scope
        if type(scope) is str:  # one string per scope, not one per operation
            scope = _intern(scope)
        ident = (scope, spec.op_id)
        # The operations of one batch mostly share their deadline and timeout: each new one
        # takes the int object of the one before when equal (32 bytes per operation less).
        deadline, timeout = spec.deadline_ms, spec.timeout_ms
        if deadline == self._last_deadline:
            deadline = self._last_deadline
        else:
            self._last_deadline = deadline
        if timeout is not None:
            if timeout == self._last_timeout:
                timeout = self._last_timeout
            else:
                self._last_timeout = timeout
        op = self._new_op(
            ident,
            spec,
            registered_ms=registered_ms,
            late=late,
            deadline_ms=deadline,
            timeout_ms=timeout,
        )
        self._ops[ident] = op
        _add_id(self._op_ids, scope, spec.op_id)
        self._hold(scope, 1, operation_bytes(spec))
        if spec.time_domain is TimeDomain.EVENT_TIME:
            self._keyed.register_event_time_timer(scope, spec.op_id, _DEADLINE, spec.deadline_ms)
        if spec.keys:
            self._purgatory.try_complete_else_watch(op, [(scope, k) for k in spec.keys])
        elif spec.time_domain is TimeDomain.PROCESSING_TIME:
            self._purgatory.timer.add(op)
        decided = self._decided
        self._decided = []  # the registration answers with its outcome, if any
        return decided[-1] if decided and op.is_completed else None

    def restore_bulk(self, rows: Iterable[RestoredRow], *, overdue_late: bool) -> None:
        """Rebuild a snapshot's pending operations at once, in order, from their fields: no
        spec for a plain one (processing time, condition ``all``, no ``reply_to``: nearly all),
        no condition checked (each was pending when the snapshot was taken, and a restore only
        drops remembered signals, never adds one), watches and wheel filled in bulk, the page
        index sorted once per scope.

        Each row is ``(scope, op_id, keys, deadline_ms, registered_ms, timeout_ms, payload,
        late, rest)``: ``rest`` is the spec of an operation that is not plain (else None); the
        caller interns the scopes and shares equal ints. With ``overdue_late`` (a restore at a
        later time than the snapshot's) one whose deadline has passed is flagged late too.
        """
        ops, new, now, cls = self._ops, _new, self._progress.now_ms, self._new_op
        # Parallel lists, not a list of pairs: a pair per operation, dropped at the end, would
        # leave holes in the memory among the long-lived objects made meanwhile.
        watch_keys: list[Hashable] = []
        watch_ops: list[DelayedOperation] = []
        scheduled: list[DelayedOperation] = []
        held, watched = _Held(), 0
        size_of = held.plain_size
        for scope, op_id, keys, deadline, registered, timeout, payload, late, rest in rows:
            ident = (scope, op_id)
            op = new(cls)
            op._bucket = None
            op._seq = 0
            op._state = _PENDING
            op.ident = ident
            op._keys = keys[0] if len(keys) == 1 else keys
            op.registered_ms = registered
            op.payload = payload
            op.timeout_ms = timeout
            op.rest = rest
            if rest is None:
                op._deadline_ms = deadline
                op.late = late or (overdue_late and now >= deadline)
                held.add(scope, op_id, size_of(scope, op_id, keys, payload))
            else:
                self._restore_rest(op, rest, late=late, overdue_late=overdue_late)
                held.add(scope, op_id, operation_bytes(rest))
            ops[ident] = op
            if keys:
                for key in keys:
                    watch_keys.append((scope, key))
                    watch_ops.append(op)
                scheduled.append(op)
                watched += 1
            elif rest is None or rest.time_domain is not TimeDomain.EVENT_TIME:
                scheduled.append(op)
        self._purgatory._restore_all(watch_keys, watch_ops, scheduled, watched_ops=watched)
        for scope, op_ids in held.ids.items():
            _add_ids(self._op_ids, scope, op_ids)
            self._hold(scope, len(op_ids), held.sizes[scope])

    def _restore_rest(
        self, op: _Op, rest: OperationSpec, *, late: bool, overdue_late: bool
    ) -> None:
        """The part of :meth:`restore_bulk` for an operation that is not plain."""
        domain, deadline = rest.time_domain, rest.deadline_ms
        event_time = domain is TimeDomain.EVENT_TIME
        op._deadline_ms = MAX_TIME_MS if event_time else deadline
        op.late = late or (overdue_late and self._passed(domain, rest.scope, deadline))
        if event_time:
            self._keyed.register_event_time_timer(op.scope, op.op_id, _DEADLINE, deadline)

    def rearm(self, op: _Op, spec: OperationSpec) -> None:
        """Move the pending timer ``op`` to the deadline of ``spec``, its new request (the same
        timer but for its deadline and timeout: same time domain, payload and reply_to)."""
        old_deadline = op.spec_deadline_ms
        op.timeout_ms = spec.timeout_ms
        if op.rest is not None:
            op.rest = spec
        scope, op_id = op.ident
        if spec.time_domain is TimeDomain.EVENT_TIME:
            self._keyed.delete_event_time_timer(scope, op_id, _DEADLINE, old_deadline)
            self._keyed.register_event_time_timer(scope, op_id, _DEADLINE, spec.deadline_ms)
        else:
            op.deadline_ms = spec.deadline_ms  # moves it in the wheel, after its tick's others
            # Pending operations are kept in the order they were (re)added to the wheel, which
            # is the order a tick's operations expire in: a snapshot lists them so, and a
            # restore re-adds them so, to expire ties exactly as the original would.
            self._ops[op.ident] = self._ops.pop(op.ident)
        op.late = False  # a re-arm is a new request, not a catch-up after a restore

    def cancel(self, op: _Op) -> Outcome | None:
        """Cancel the pending ``op``: its ``cancelled`` outcome, or None if it was done."""
        if not op.cancel_operation():
            return None
        outcome = self.finish(op, OutcomeKind.CANCELLED)
        self._decided.clear()  # the cancel answers with it
        return outcome

    def flag_late(self, now_ms: int) -> int:
        """Flag late every pending processing-time operation due at ``now_ms``; how many."""
        flagged = 0
        processing = TimeDomain.PROCESSING_TIME
        for op in self._ops.values():
            if not op.late and op._deadline_ms <= now_ms and op.time_domain is processing:
                op.late = True
                flagged += 1
        return flagged

    def take(self) -> list[Outcome]:
        """The outcomes decided since the last take, in sequence order."""
        decided = self._decided
        if not decided:
            return []
        self._decided = []
        return decided

    # -- what an operation asks (engine_types._Owner) -------------------------------------------

    def deadline_passed(self, op: _Op) -> bool:
        """Whether ``op``'s deadline has passed: the clock (processing time) or its scope's
        watermark (event time) has reached it."""
        rest = op.rest
        if rest is None:
            return self._progress.now_ms >= op._deadline_ms
        return self._passed(rest.time_domain, rest.scope, rest.deadline_ms)

    def _passed(self, domain: TimeDomain, scope: str, deadline_ms: int) -> bool:
        if domain is TimeDomain.PROCESSING_TIME:
            return self._progress.now_ms >= deadline_ms
        watermark = self._keyed.current_watermark(scope)
        return watermark is not None and watermark >= deadline_ms

    def facts(self, op: _Op, *, by_deadline: bool = False) -> dict[str, SignalFact | None]:
        """The remembered signal of each of the operation's keys (None: not signalled).

        With ``by_deadline`` only a signal that came before the deadline counts: one that
        arrived before it (processing time), or whose event time, if it has one, is before it
        (event time). An expiry reports its keys and ``missing`` so, and a registration
        whose deadline has already passed is decided by them (see ``_Op``).
        """
        get, scope, now = self._signals.get, op.ident[0], self._progress.now_ms
        keys = op._keys
        if type(keys) is str:
            facts = {keys: get((scope, keys), now_ms=now)}
        else:
            facts = {key: get((scope, key), now_ms=now) for key in keys}
        if not by_deadline:
            return facts
        deadline = op.spec_deadline_ms
        in_time = op.time_domain is TimeDomain.PROCESSING_TIME
        return {key: fact if fact is not None and _before(fact, deadline, in_time) else None
                for key, fact in facts.items()}  # fmt: skip

    def finish(
        self, op: _Op, kind: OutcomeKind, facts: dict[str, SignalFact | None] | None = None
    ) -> Outcome:
        """End ``op`` with an outcome of ``kind``: unindex it, number and count the outcome,
        remember it, and keep it for :meth:`take`. ``facts``: its keys' signals, when the
        caller has just read them."""
        spec = op.spec
        ident = op.ident
        scope, op_id = ident
        del self._ops[ident]
        _remove_id(self._op_ids, scope, op_id)
        self._hold(scope, -1, -operation_bytes(spec))
        if op.rest is not None and op.rest.time_domain is TimeDomain.EVENT_TIME:
            self._keyed.delete_event_time_timer(scope, op_id, _DEADLINE, spec.deadline_ms)
        expired = kind is OutcomeKind.EXPIRED
        if facts is None:
            facts = self.facts(op, by_deadline=expired)
        progress = self._progress
        progress.sequence += 1
        progress.counts[kind] += 1
        now = progress.now_ms
        outcome = op.decide(kind, facts, progress.sequence, now, self._partition)
        progress.late += outcome.late
        self._finished.put(ident, _Finished(spec, outcome), now_ms=now)
        self._decided.append(outcome)
        return outcome


class _Held:
    """What :meth:`Lifecycle.restore_bulk` tells the page index and the tally at its end: each
    scope's op_ids and estimated bytes."""

    __slots__ = ("_base", "ids", "sizes")

    def __init__(self) -> None:
        self.ids: dict[str, list[str]] = {}
        self.sizes: dict[str, int] = {}
        self._base: dict[str, int] = {}  # a scope's fixed part of a one-key operation's bytes

    def add(self, scope: str, op_id: str, size: int) -> None:
        ids = self.ids.get(scope)
        if ids is None:
            self.ids[scope] = [op_id]
            self.sizes[scope] = size
        else:
            ids.append(op_id)
            self.sizes[scope] += size

    def plain_size(self, scope: str, op_id: str, keys: tuple[str, ...], payload: str | None) -> int:
        """:func:`plain_operation_bytes`, at less cost for the usual operation (one ASCII key,
        no payload): a restore's costliest call after the wheel's."""
        if len(keys) != 1 or payload is not None or not (op_id.isascii() and keys[0].isascii()):
            return plain_operation_bytes(scope, op_id, keys, payload)
        base = self._base.get(scope)
        if base is None:
            base = self._base[scope] = OPERATION_BYTES + KEY_BYTES + utf8_len(scope)
        return base + len(op_id) + len(keys[0])


def _before(fact: SignalFact, deadline_ms: int, processing_time: bool) -> bool:
    """Whether a signal came before a deadline: it arrived before it (processing time), or
    its event time, when it has one, is before it (event time)."""
    if processing_time:
        return fact.signalled_ms < deadline_ms
    return fact.event_time_ms is None or fact.event_time_ms < deadline_ms
