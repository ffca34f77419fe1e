"""The records that travel on the wire, as values (codec concept: records; stdlib only).

Every record is a frozen, slotted dataclass validated on construction, so a record built by a
client in Python obeys the same rules as one decoded from Kafka. What is checked here does not
depend on configuration: types, enums, time ranges and the rules between fields. What does
depend on it (how many keys, how many bytes) is a :class:`Limits`, which the decoders enforce.

Every failure is a :class:`RecordError` whose ``field`` names the offending field (a JSON path
such as ``keys[2]``), or is None when the record as a whole is bad.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TypeAlias, TypeVar, cast

from purgatory._core import (
    MAX_TIME_MS,
    BadRecordError,
    Condition,
    OperationSpec,
    TimeDomain,
    UsageError,
)
from purgatory._core.engine.validate import check_positive_int

__all__ = [
    "CancelRequest",
    "Limits",
    "RecordError",
    "RegisterRequest",
    "Request",
    "SignalInput",
    "SignalRecord",
    "WatermarkRecord",
]

_E = TypeVar("_E", Condition, TimeDomain)
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")
_CONDITIONS = ", ".join(c.value for c in Condition)
_DOMAINS = ", ".join(d.value for d in TimeDomain)


class RecordError(BadRecordError):
    """A record failed to decode or validate.

    The message is ``"<field>: <reason>"``, or ``"(record): <reason>"`` when no single field is
    to blame (bytes that are not JSON, a record over the size limit, ...).

    Attributes:
        field: the JSON path of the offending field (``"keys[2]"``, ``"payload"``), or None.
        reason: the message without the field.
    """

    def __init__(self, field: str | None, reason: str) -> None:
        super().__init__(f"{'(record)' if field is None else field}: {reason}")
        self.field = field
        self.reason = reason

    def __reduce__(self) -> tuple[type[RecordError], tuple[str | None, str]]:
        # Spark ships exceptions between processes: keep both attributes through pickling.
        return (type(self), (self.field, self.reason))


@dataclass(frozen=True, slots=True)
class Limits:
    """The sizes a decoder accepts; larger records are rejected naming the field.

    Attributes:
        max_keys_per_operation: the most watch keys one registration may list.
        max_key_bytes: the longest key, in UTF-8 bytes.
        max_scope_bytes: the longest scope, in UTF-8 bytes.
        max_op_id_bytes: the longest operation id, in UTF-8 bytes.
        max_payload_bytes: the largest payload, in UTF-8 bytes of its canonical JSON text.
        max_record_bytes: the largest record, checked before parsing.

    Raises:
        UsageError: naming the field that is not a positive int.
    """

    max_keys_per_operation: int = 1000
    max_key_bytes: int = 512
    max_scope_bytes: int = 512
    max_op_id_bytes: int = 256
    max_payload_bytes: int = 65_536
    max_record_bytes: int = 1_048_576

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            check_positive_int(name, getattr(self, name))


def check_text(field: str, value: object) -> str:
    """``value`` if it is a non-empty str, else a RecordError naming ``field``."""
    if not isinstance(value, str) or not value:
        raise RecordError(field, "must be a non-empty string")
    return value


def check_ms(field: str, value: object) -> int:
    """``value`` if it is an int (not a bool) in ``[0, MAX_TIME_MS]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIME_MS:
        raise RecordError(field, f"must be an integer in [0, {MAX_TIME_MS}]")
    return value


def check_optional_ms(field: str, value: object) -> int | None:
    """``value`` if it is None or a valid time in milliseconds."""
    return None if value is None else check_ms(field, value)


def check_enum(field: str, kind: type[_E], value: object) -> _E:
    """``value`` as a member of ``kind``; the error lists the accepted values."""
    try:
        return kind(cast(str, value))
    except (ValueError, TypeError):
        accepted = _CONDITIONS if kind is Condition else _DOMAINS
        raise RecordError(field, f"expected one of {accepted}") from None


def check_payload_type(value: object) -> str | None:
    """A payload is JSON text or None; the JSON text ``null`` is the same as None."""
    if value is None or value == "null":
        return None
    if not isinstance(value, str):
        raise RecordError("payload", "must be JSON text (a str) or None")
    return value


@dataclass(frozen=True, slots=True)
class RegisterRequest:
    """Register an operation: wait for signals on ``keys`` until ``condition`` or a deadline.

    Attributes:
        op_id: unique within the scope; registering the same request again is idempotent.
        scope: the partitioning unit (also the Kafka message key); keys live inside it.
        keys: the watch keys; empty for a timer, which only has a deadline.
        condition: ``all`` keys, ``any`` key, or at least ``count`` distinct keys.
        count: how many keys ``count`` needs (1 to ``len(keys)``); None otherwise.
        deadline_ms: an absolute deadline (epoch ms, or an event time); or None with a timeout.
        timeout_ms: a deadline relative to arrival (processing time only); or None.
        time_domain: whether the deadline is processing time or event time.
        payload: canonical JSON text returned in the callback, or None.
        reply_to: the topic the callback goes to, or None for the service's default.

    Raises:
        RecordError: naming the field that breaks a rule.
    """

    op_id: str
    scope: str
    keys: tuple[str, ...]
    condition: Condition = Condition.ALL
    count: int | None = None
    deadline_ms: int | None = None
    timeout_ms: int | None = None
    time_domain: TimeDomain = TimeDomain.PROCESSING_TIME
    payload: str | None = None
    reply_to: str | None = None

    def __post_init__(self) -> None:
        check_text("op_id", self.op_id)
        check_text("scope", self.scope)
        keys = self.keys
        if not isinstance(keys, tuple):
            raise RecordError("keys", "must be a tuple of strings")
        seen: dict[str, int] = {}
        for i, key in enumerate(keys):
            if type(key) is not str or not key:
                check_text(f"keys[{i}]", key)
            first = seen.setdefault(key, i)
            if first != i:
                raise RecordError(f"keys[{i}]", f"duplicate of keys[{first}]")
        condition = check_enum("condition", Condition, self.condition)
        object.__setattr__(self, "condition", condition)
        domain = check_enum("time_domain", TimeDomain, self.time_domain)
        object.__setattr__(self, "time_domain", domain)
        if condition is Condition.COUNT:
            count = self.count
            if count is None:
                raise RecordError("count", "required with condition count")
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= len(keys):
                raise RecordError("count", f"must be an integer in [1, {len(keys)}] (the keys)")
        elif self.count is not None:
            raise RecordError("count", "only allowed with condition count")
        if not keys and condition is not Condition.ALL:
            raise RecordError("condition", "must be all for an operation without keys (a timer)")
        if self.deadline_ms is None:
            if self.timeout_ms is None:
                raise RecordError("deadline_ms", "one of deadline_ms or timeout_ms is required")
            check_ms("timeout_ms", self.timeout_ms)
            if domain is not TimeDomain.PROCESSING_TIME:
                raise RecordError("timeout_ms", "only allowed with time_domain processing_time")
        else:
            check_ms("deadline_ms", self.deadline_ms)
            if self.timeout_ms is not None:
                raise RecordError("timeout_ms", "not allowed together with deadline_ms")
        object.__setattr__(self, "payload", check_payload_type(self.payload))
        reply_to = self.reply_to
        if reply_to is not None and (
            not isinstance(reply_to, str)
            or not _TOPIC.fullmatch(reply_to)
            or reply_to in {".", ".."}
        ):
            raise RecordError("reply_to", "must be a Kafka topic name (1 to 249 of A-Za-z0-9._-)")

    def to_spec(self, now_ms: int) -> OperationSpec:
        """The engine's spec, with a timeout turned into a deadline at ``now_ms``.

        Args:
            now_ms: the arrival time; the deadline is ``now_ms + timeout_ms``, saturating at
                ``MAX_TIME_MS``. Ignored when ``deadline_ms`` is set.

        Raises:
            UsageError: if ``now_ms`` is not a valid time.
        """
        deadline = self.deadline_ms
        if deadline is None:
            if isinstance(now_ms, bool) or not isinstance(now_ms, int) or now_ms < 0:
                raise UsageError(f"now_ms must be an int >= 0, got {now_ms!r}")
            assert self.timeout_ms is not None
            deadline = min(now_ms + self.timeout_ms, MAX_TIME_MS)
        return OperationSpec(
            op_id=self.op_id,
            scope=self.scope,
            keys=self.keys,
            deadline_ms=deadline,
            condition=self.condition,
            count=self.count,
            time_domain=self.time_domain,
            payload=self.payload,
            reply_to=self.reply_to,
            timeout_ms=None if self.deadline_ms is not None else self.timeout_ms,
        )


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """Cancel a pending operation; its callback says ``cancelled``.

    Raises:
        RecordError: naming the field that is not a non-empty string.
    """

    op_id: str
    scope: str

    def __post_init__(self) -> None:
        check_text("op_id", self.op_id)
        check_text("scope", self.scope)


@dataclass(frozen=True, slots=True)
class SignalRecord:
    """A fact: ``key`` of ``scope`` happened, with an optional event time and payload.

    Raises:
        RecordError: naming the invalid field.
    """

    scope: str
    key: str
    event_time_ms: int | None = None
    payload: str | None = None

    def __post_init__(self) -> None:
        check_text("scope", self.scope)
        check_text("key", self.key)
        check_optional_ms("event_time_ms", self.event_time_ms)
        object.__setattr__(self, "payload", check_payload_type(self.payload))


@dataclass(frozen=True, slots=True)
class WatermarkRecord:
    """The event-time watermark of ``scope``: no event older than it will come.

    Raises:
        RecordError: naming the invalid field.
    """

    scope: str
    watermark_ms: int

    def __post_init__(self) -> None:
        check_text("scope", self.scope)
        check_ms("watermark_ms", self.watermark_ms)


#: A record of the requests topic.
Request: TypeAlias = RegisterRequest | CancelRequest
#: A record of the signals topic.
SignalInput: TypeAlias = SignalRecord | WatermarkRecord
