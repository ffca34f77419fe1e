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
from dataclasses import dataclass, replace
from typing import Protocol

from purgatory._core._errors import ConflictError, UsageError
from purgatory._core.engine.model import OperationSpec, Outcome, OutcomeKind, SignalFact
from purgatory._core.engine.validate import MAX_TIME_MS, check_positive_int
from purgatory._core.flink.keyed_timers import TimeDomain
from purgatory._core.flink.ttl_state import TtlConfig
from purgatory._core.wheel.operation import DelayedOperation

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

    def deadline_passed(self, spec: OperationSpec) -> bool: ...

    def facts(
        self, spec: OperationSpec, *, by_deadline: bool = False
    ) -> dict[str, SignalFact | None]: ...

    def finish(self, op: _Op, kind: OutcomeKind) -> Outcome: ...


class _Op(DelayedOperation):
    """One registered operation; its outcome is decided by the engine's clock, through its
    owner."""

    __slots__ = ("expiring", "facts", "late", "outcome", "owner", "registered_ms", "spec")

    def __init__(self, owner: _Owner, spec: OperationSpec, registered_ms: int, late: bool) -> None:
        in_wheel = spec.time_domain is TimeDomain.PROCESSING_TIME
        super().__init__(deadline_ms=spec.deadline_ms if in_wheel else MAX_TIME_MS)
        self.owner = owner
        self.spec = spec
        self.registered_ms = registered_ms
        self.late = late
        self.expiring = False
        self.outcome: Outcome | None = None
        self.facts: dict[str, SignalFact | None] | None = None

    def try_complete(self) -> bool:
        # Past its deadline only the signals that came before it count: a signal at or after
        # the deadline loses to the expiry, while a registration applied after its deadline
        # (a client late, a journal replayed behind another writer's records, a clock behind
        # the partition's) is completed by the signals the partition already held for it.
        by_deadline = self.owner.deadline_passed(self.spec)
        facts = self.owner.facts(self.spec, by_deadline=by_deadline)
        if sum(fact is not None for fact in facts.values()) >= self.spec.needed:
            self.facts = facts  # the outcome reports these: no second read of the store
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        kind = OutcomeKind.EXPIRED if self.expiring else OutcomeKind.COMPLETED
        self.owner.finish(self, kind)

    def run(self) -> None:
        self.expiring = True
        super().run()

    def decide(
        self,
        kind: OutcomeKind,
        facts: dict[str, SignalFact | None],
        sequence: int,
        now_ms: int,
        partition: int,
    ) -> Outcome:
        """Its outcome: ``kind`` decided at ``now_ms``, reporting ``facts`` (its keys' signals,
        None where missing). Kept as :attr:`outcome` and returned."""
        spec = self.spec
        expired = kind is OutcomeKind.EXPIRED
        # A processing-time operation expires at its deadline, whenever the expiry is run:
        # from that millisecond on no signal could complete it. Delivery lateness is the
        # reaper's and the executor's to report. One registered after its deadline expires
        # when it registered: an outcome is never before the registration it answers.
        if expired and spec.time_domain is TimeDomain.PROCESSING_TIME:
            now_ms = max(spec.deadline_ms, self.registered_ms)
        outcome = self.outcome = Outcome(
            op_id=spec.op_id,
            scope=spec.scope,
            outcome=kind,
            registered_ms=self.registered_ms,
            outcome_ms=now_ms,
            deadline_ms=spec.deadline_ms,
            time_domain=spec.time_domain,
            sequence=sequence,
            keys=tuple(k for k, f in facts.items() if f is not None),
            missing=tuple(k for k, f in facts.items() if f is None),
            signals={k: f.payload for k, f in facts.items() if f is not None},
            payload=spec.payload,
            reply_to=spec.reply_to,
            late=self.late and expired,
            partition=partition,
        )
        return outcome


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
