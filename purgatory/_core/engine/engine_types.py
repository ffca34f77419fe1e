"""The engine's records (core concept: config, answers, held operations; sans-IO, stdlib only).

What an :class:`~purgatory._core.engine.engine.Engine` is built with and answers, and what it holds
per operation: :class:`EngineConfig` (its tuning and limits, validated), :class:`Registration`
and :class:`RegistrationStatus` (what a registration did), :class:`EngineStatistics` (its counts
at one instant), ``_Op`` (a pending operation, whose outcome the engine's clock decides) and
``_Finished`` (a finished one, remembered for idempotent re-registration), with the rules of
that idempotence: when a registration repeats a pending or a finished operation
(``_against_pending``, ``_repeats_finished``).

An ``_Op`` is a :class:`DelayedOperation` that the purgatory and the wheel call
(``try_complete``, ``run``); to decide, it asks its owner (the engine's ``Lifecycle``) through
the small :class:`_Owner` protocol rather than knowing the engine: of the engine's modules this
one imports only the model and the checks, so the others all import it and it imports none back.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol

from purgatory._core._errors import ConflictError, UsageError
from purgatory._core.engine.model import (
    Condition,
    OperationSpec,
    Outcome,
    OutcomeKind,
    SignalFact,
)
from purgatory._core.engine.validate import MAX_TIME_MS, check_positive_int, slot_setters
from purgatory._core.flink.keyed_timers import TimeDomain
from purgatory._core.flink.ttl_state import TtlConfig
from purgatory._core.wheel.operation import _COMPLETED, _PENDING, DelayedOperation

__all__ = ["EngineConfig", "EngineStatistics", "Registration", "RegistrationStatus"]

_DAY_MS = 86_400_000
_DEFAULT_SIGNAL_TTL = TtlConfig(ttl_ms=7 * _DAY_MS)
_NO_LIMIT = 1 << 40  # default and largest value of the byte and remembered-signal limits


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
    # Estimated bytes (purgatory._core.engine.footprint); the defaults mean "no limit".
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
    # Estimated bytes (purgatory._core.engine.footprint) and the count of remembered signals.
    pending_bytes: int = 0
    remembered_signals: int = 0
    remembered_bytes: int = 0
    finished_bytes: int = 0


@dataclass(frozen=True, slots=True)
class _Finished:
    spec: OperationSpec
    outcome: Outcome


class _Owner(Protocol):
    """What an :class:`_Op` asks of the part that holds it (the engine's ``Lifecycle``)."""

    def deadline_passed(self, op: _Op) -> bool: ...

    def facts(self, op: _Op, *, by_deadline: bool = False) -> dict[str, SignalFact | None]: ...

    def finish(
        self, op: _Op, kind: OutcomeKind, facts: dict[str, SignalFact | None] | None = None
    ) -> Outcome: ...


def _is_plain(spec: OperationSpec) -> bool:
    """Whether ``spec`` is what nearly every operation is: condition ``all``, processing
    time, no ``reply_to``; such an operation keeps no spec of its own while pending."""
    return (
        spec.condition is Condition.ALL
        and spec.time_domain is TimeDomain.PROCESSING_TIME
        and spec.reply_to is None
    )


_SPEC_SETTERS = slot_setters(
    OperationSpec, "op_id", "scope", "keys", "deadline_ms", "condition", "count",
    "time_domain", "payload", "reply_to", "timeout_ms",
)  # fmt: skip
_new = object.__new__


def _checked_spec(fields: Sequence[Any]) -> OperationSpec:
    """A spec from its ten fields, in the dataclass's order and already as its constructor
    would leave them (a restore, a rebuild of what was registered): no checks run."""
    op_id, scope, keys, deadline, condition, count, domain, payload, reply_to, timeout = fields
    spec: OperationSpec = _new(OperationSpec)
    (s_op_id, s_scope, s_keys, s_deadline, s_condition, s_count, s_domain, s_payload, s_reply_to,
     s_timeout) = _SPEC_SETTERS  # fmt: skip
    s_op_id(spec, op_id)
    s_scope(spec, scope)
    s_keys(spec, keys)
    s_deadline(spec, deadline)
    s_condition(spec, condition)
    s_count(spec, count)
    s_domain(spec, domain)
    s_payload(spec, payload)
    s_reply_to(spec, reply_to)
    s_timeout(spec, timeout)
    return spec


class _Op(DelayedOperation):
    """One registered operation; its outcome is decided by the engine's clock, through its
    owner.

    Held by the million, so it is compact (120 bytes, and a tuple it shares with the engine's
    index): it keeps its spec's fields rather than the spec, its ``ident`` (scope, op_id) is
    the very tuple that keys the engine's index, its scope string is interned (one per scope,
    not one per operation), a single key is kept as a string, not a tuple of one, and the rare
    fields (a condition other than ``all``, event time, ``reply_to``) are kept as the spec
    itself in ``rest``, None for every plain operation. Its owner is a class attribute: each
    engine's ``Lifecycle`` makes its own subclass (:func:`_op_type`). :attr:`spec` rebuilds the
    spec when asked (a lookup, a finish), which is rare beside holding it.
    """

    __slots__ = ("_keys", "ident", "late", "payload", "registered_ms", "rest", "timeout_ms")

    owner: ClassVar[_Owner]

    def __init__(
        self,
        ident: tuple[str, str],
        spec: OperationSpec,
        *,
        registered_ms: int,
        late: bool,
        deadline_ms: int,
        timeout_ms: int | None,
    ) -> None:
        """``deadline_ms`` and ``timeout_ms``: the spec's, or an int of the same value that
        the owner already holds (one int object shared by a batch's operations)."""
        in_wheel = spec.time_domain is TimeDomain.PROCESSING_TIME
        super().__init__(deadline_ms=deadline_ms if in_wheel else MAX_TIME_MS)
        keys = spec.keys
        self.ident = ident
        self._keys: str | tuple[str, ...] = keys[0] if len(keys) == 1 else keys
        self.registered_ms = registered_ms
        self.late = late
        self.payload = spec.payload
        self.timeout_ms = timeout_ms
        self.rest = None if _is_plain(spec) else spec

    @property
    def scope(self) -> str:
        return self.ident[0]

    @property
    def op_id(self) -> str:
        return self.ident[1]

    @property
    def keys(self) -> tuple[str, ...]:
        keys = self._keys
        return (keys,) if type(keys) is str else keys  # type: ignore[return-value]

    @property
    def spec_deadline_ms(self) -> int:
        """The spec's deadline: processing time or, in event time, a watermark to reach."""
        rest = self.rest
        return self._deadline_ms if rest is None else rest.deadline_ms

    @property
    def time_domain(self) -> TimeDomain:
        rest = self.rest
        return TimeDomain.PROCESSING_TIME if rest is None else rest.time_domain

    @property
    def needed(self) -> int:
        """How many of its keys must be signalled (see :attr:`OperationSpec.needed`)."""
        rest = self.rest
        if rest is None:
            keys = self._keys
            return 1 if type(keys) is str else len(keys)
        return rest.needed

    @property
    def spec(self) -> OperationSpec:
        """Its spec, as registered (rebuilt for a plain operation)."""
        rest = self.rest
        if rest is not None:
            return rest
        scope, op_id = self.ident
        return _checked_spec((
            op_id, scope, self.keys, self._deadline_ms, Condition.ALL, None,
            TimeDomain.PROCESSING_TIME, self.payload, None, self.timeout_ms,
        ))  # fmt: skip

    def try_complete(self) -> bool:
        # Past its deadline only the signals that came before it count: a signal at or after
        # the deadline loses to the expiry, while a registration applied after its deadline
        # (a client late, a journal replayed behind another writer's records, a clock behind
        # the partition's) is completed by the signals the partition already held for it.
        owner = self.owner
        facts = owner.facts(self, by_deadline=owner.deadline_passed(self))
        if sum(fact is not None for fact in facts.values()) < self.needed:
            return False
        if self._state != _PENDING:
            return False
        # force_complete, with the facts handed on: the outcome reports these, no second read
        self._state = _COMPLETED
        self.cancel()
        owner.finish(self, OutcomeKind.COMPLETED, facts)
        return True

    def on_complete(self) -> None:
        self.owner.finish(self, OutcomeKind.COMPLETED)

    def run(self) -> None:
        # The timer's action: expire it, unless a signal or a cancel finished it first.
        if self._state != _PENDING:
            return
        self._state = _COMPLETED
        self.cancel()
        self.owner.finish(self, OutcomeKind.EXPIRED)

    def decide(
        self,
        kind: OutcomeKind,
        facts: dict[str, SignalFact | None],
        sequence: int,
        now_ms: int,
        partition: int,
    ) -> Outcome:
        """Its outcome: ``kind`` decided at ``now_ms``, reporting ``facts`` (its keys' signals,
        None where missing)."""
        scope, op_id = self.ident
        rest = self.rest
        deadline = self._deadline_ms if rest is None else rest.deadline_ms
        domain = TimeDomain.PROCESSING_TIME if rest is None else rest.time_domain
        expired = kind is OutcomeKind.EXPIRED
        # A processing-time operation expires at its deadline, whenever the expiry is run:
        # from that millisecond on no signal could complete it. Delivery lateness is the
        # reaper's and the executor's to report. One registered after its deadline expires
        # when it registered: an outcome is never before the registration it answers.
        if expired and domain is TimeDomain.PROCESSING_TIME:
            now_ms = max(deadline, self.registered_ms)
        return Outcome(
            op_id=op_id,
            scope=scope,
            outcome=kind,
            registered_ms=self.registered_ms,
            outcome_ms=now_ms,
            deadline_ms=deadline,
            time_domain=domain,
            sequence=sequence,
            keys=tuple(k for k, f in facts.items() if f is not None),
            missing=tuple(k for k, f in facts.items() if f is None),
            signals={k: f.payload for k, f in facts.items() if f is not None},
            payload=self.payload,
            reply_to=None if rest is None else rest.reply_to,
            late=self.late and expired,
            partition=partition,
        )


def _op_type(owner: _Owner) -> type[_Op]:
    """The class of the operations ``owner`` holds: :class:`_Op` with ``owner`` set on it,
    which each operation would otherwise carry in a slot of its own."""
    return type("_Op", (_Op,), {"__slots__": (), "owner": owner})


def _against_pending(
    current: OperationSpec, spec: OperationSpec, retry: bool
) -> RegistrationStatus:
    """What registering ``spec`` does while ``current``, of the same id, is pending: nothing
    (``duplicate``), or move the timer to its new deadline (``rearmed``).

    Raises:
        ConflictError: ``spec`` is another operation under the same id.
    """
    if _same_request(current, spec):
        return RegistrationStatus.DUPLICATE
    if spec.is_timer and current.is_timer and _same_but_deadline(current, spec):
        if retry and _same_retried_timer(current, spec):
            return RegistrationStatus.DUPLICATE
        return RegistrationStatus.REARMED
    raise ConflictError(
        f"op_id {spec.op_id!r} is pending in scope {spec.scope!r} with another body"
    )


def _repeats_finished(done: OperationSpec, spec: OperationSpec, retry: bool) -> bool:
    """Whether registering ``spec`` repeats ``done``, finished under the same id and still
    remembered (a ``duplicate``: its outcome is the answer); False for a timer sent again
    with another deadline, which starts a new round.

    Raises:
        ConflictError: ``spec`` is another operation under the same id.
    """
    if retry and _same_retried_timer(done, spec):
        return True
    if spec.is_timer and done.deadline_ms != spec.deadline_ms:
        return False
    if _same_request(done, spec):
        return True
    raise ConflictError(f"op_id {spec.op_id!r} finished in scope {spec.scope!r} with another body")


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
