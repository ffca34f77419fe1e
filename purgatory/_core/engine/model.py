"""Value objects of the declarative engine (core concept: operations, signals, outcomes).

An *operation* waits, within one ``scope``, for signals on a set of watch keys until a
condition holds (``all`` keys, ``any`` key, or at least ``count`` distinct keys), or until its
deadline passes, in processing time or in event time (against the scope's watermark). An
operation with no keys is a *timer*: it only has a deadline. A *signal* is a fact ("key k of
scope s happened, with this payload"); it is remembered with a TTL and satisfies every operation
that watches its key, before or after the operation registers. An *outcome* is the single
terminal result of an operation, delivered as a callback.

Every object here is frozen and validated on construction; errors name the field.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from purgatory._core._errors import UsageError
from purgatory._core.engine.validate import check_ms, check_text
from purgatory._core.flink.keyed_timers import TimeDomain

__all__ = ["Condition", "OperationSpec", "Outcome", "OutcomeKind", "SignalFact"]


class Condition(enum.StrEnum):
    """When an operation's keys satisfy it."""

    ALL = "all"
    ANY = "any"
    COUNT = "count"


class OutcomeKind(enum.StrEnum):
    """The terminal outcome of an operation: exactly one per operation."""

    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


def _optional_text(name: str, value: object) -> str | None:
    if value is not None and not isinstance(value, str):
        raise UsageError(f"{name} must be a str or None, got {type(value).__name__}")
    return value


@dataclass(frozen=True, slots=True)
class OperationSpec:
    """What a client registers.

    Attributes:
        op_id: unique within the scope; re-registering the same spec is idempotent.
        scope: the partitioning unit (a pipeline, a dataset); keys live inside it.
        keys: the watch keys (empty for a timer).
        deadline_ms: when it expires: epoch ms in processing time, or an event time.
        condition: ``all`` (default), ``any`` or ``count``.
        count: how many distinct keys ``count`` needs.
        time_domain: whether ``deadline_ms`` is processing time or event time.
        payload: opaque text (JSON) returned in the callback.
        reply_to: where the callback goes (a topic name), or None for the default.
        timeout_ms: the relative timeout the client sent, from which ``deadline_ms`` was
            computed at arrival; None when the client sent ``deadline_ms`` itself. A retry of a
            request with the same ``timeout_ms`` is the same request, whatever its arrival.
    """

    op_id: str
    scope: str
    keys: tuple[str, ...]
    deadline_ms: int
    condition: Condition = Condition.ALL
    count: int | None = None
    time_domain: TimeDomain = TimeDomain.PROCESSING_TIME
    payload: str | None = None
    reply_to: str | None = None
    timeout_ms: int | None = None

    def __post_init__(self) -> None:
        check_text("op_id", self.op_id)
        check_text("scope", self.scope)
        if not isinstance(self.keys, tuple):
            raise UsageError(f"keys must be a tuple of str, got {type(self.keys).__name__}")
        for key in self.keys:
            check_text("keys[]", key)
        if len(set(self.keys)) != len(self.keys):
            raise UsageError("keys must not repeat a key")
        check_ms("deadline_ms", self.deadline_ms)
        try:
            object.__setattr__(self, "condition", Condition(self.condition))
        except ValueError:
            raise UsageError(
                f"condition must be one of all, any, count: {self.condition!r}"
            ) from None
        try:
            object.__setattr__(self, "time_domain", TimeDomain(self.time_domain))
        except ValueError:
            raise UsageError(f"time_domain is invalid: {self.time_domain!r}") from None
        if self.condition is Condition.COUNT:
            if isinstance(self.count, bool) or not isinstance(self.count, int):
                raise UsageError(f"count must be an int with condition count, got {self.count!r}")
            if not 1 <= self.count <= len(self.keys):
                raise UsageError(f"count must be between 1 and len(keys)={len(self.keys)}")
        elif self.count is not None:
            raise UsageError("count is only allowed with condition count")
        if self.keys == () and self.condition is not Condition.ALL:
            raise UsageError("condition must be all for a timer (an operation with no keys)")
        _optional_text("payload", self.payload)
        _optional_text("reply_to", self.reply_to)
        if self.timeout_ms is not None:
            check_ms("timeout_ms", self.timeout_ms)

    @property
    def needed(self) -> int:
        """How many distinct signalled keys satisfy the condition."""
        if self.condition is Condition.ANY:
            return 1
        if self.condition is Condition.COUNT:
            assert self.count is not None
            return self.count
        return len(self.keys)

    @property
    def is_timer(self) -> bool:
        """True for an operation with no keys: it only has a deadline."""
        return not self.keys


@dataclass(frozen=True, slots=True)
class SignalFact:
    """A remembered signal: its payload, its event time and when it arrived."""

    signalled_ms: int
    event_time_ms: int | None = None
    payload: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """The single terminal result of one operation, delivered as a callback.

    Attributes:
        sequence: increases by one per outcome of the engine (survives restarts: it is
            replayed from the journal); with ``partition`` and the registration answered it
            makes the outcome's identity (``purgatory._codec.outcome_id``).
        keys: the keys whose signals satisfied it (completed), in the spec's order.
        missing: the keys that never arrived (expired or cancelled).
        signals: the payloads of the satisfying signals, by key.
        late: it expired overdue, catching up after a restore.
        partition: the input partition whose engine decided it (0 outside the service);
            with ``sequence`` and the registration it answers it makes the outcome's identity.
    """

    op_id: str
    scope: str
    outcome: OutcomeKind
    registered_ms: int
    outcome_ms: int
    deadline_ms: int
    time_domain: TimeDomain
    sequence: int
    keys: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    signals: dict[str, str | None] = field(default_factory=dict)
    payload: str | None = None
    reply_to: str | None = None
    late: bool = False
    partition: int = 0
