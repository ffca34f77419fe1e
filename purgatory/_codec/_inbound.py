"""The requests and signals topics, both ways (codec concept: inbound records; stdlib only).

Decoding runs in a fixed order, so that the error a client sees is the first thing wrong with
its record: size, UTF-8, JSON syntax, object; then ``v``, ``type``, unknown fields; then each
field in the order of the format, with the limits; then the rules between fields (checked by the
record's constructor). Encoding is the exact inverse: ``decode(encode(x)) == x`` for every
record whose payload is canonical JSON text (as every decoded record's is).

Each decoder first tries the fast path (``_fastpath``), which builds the usual good record in
one pass or declines; the ``full_*`` functions here are the reference it must agree with, and
the only source of errors.
"""

from __future__ import annotations

from collections.abc import Mapping

from purgatory._codec._fastpath import fast_request, fast_signal
from purgatory._codec._json import (
    MISSING,
    dumps,
    encode_text,
    parse_object,
    payload_text,
    payload_value,
    show,
)
from purgatory._codec._records import (
    CancelRequest,
    Limits,
    RecordError,
    RegisterRequest,
    Request,
    SignalInput,
    SignalRecord,
    WatermarkRecord,
)
from purgatory._core import UsageError

__all__ = [
    "DEFAULT_LIMITS",
    "FORMAT_VERSION",
    "decode_request",
    "decode_requests_record",
    "decode_signal",
    "encode_request",
    "encode_signal",
    "envelope",
    "full_request",
    "full_requests_record",
    "full_signal",
    "message_key",
]

#: The version of the record formats this build reads and writes (the ``v`` field).
FORMAT_VERSION = 1
#: The limits used when a decoder is given none.
DEFAULT_LIMITS = Limits()

_FIELDS = {
    "register": frozenset(
        (
            "v",
            "type",
            "op_id",
            "scope",
            "keys",
            "condition",
            "count",
            "deadline_ms",
            "timeout_ms",
            "time_domain",
            "payload",
            "reply_to",
        )
    ),
    "cancel": frozenset(("v", "type", "op_id", "scope")),
    "signal": frozenset(("v", "type", "scope", "key", "event_time_ms", "payload")),
    "watermark": frozenset(("v", "type", "scope", "watermark_ms")),
}
_REQUEST_TYPES = {"register": _FIELDS["register"], "cancel": _FIELDS["cancel"]}
_REQUESTS_TOPIC_TYPES = {**_REQUEST_TYPES, "watermark": _FIELDS["watermark"]}
_SIGNAL_TYPES = {"signal": _FIELDS["signal"], "watermark": _FIELDS["watermark"]}


def envelope(
    obj: Mapping[str, object],
    types: Mapping[str, frozenset[str]],
    nullable: frozenset[str] = frozenset(("payload",)),
) -> str:
    """Check ``v``, ``type`` and the field names of ``obj``; return its type.

    An optional field is left out rather than set to null, except the fields in ``nullable``
    (a null payload is a payload).

    Raises:
        RecordError: naming ``v``, ``type``, the first unknown field or a null field.
    """
    version = obj.get("v", MISSING)
    if version is MISSING:
        raise RecordError("v", "required field is missing")
    if type(version) is not int or version != FORMAT_VERSION:
        raise RecordError(
            "v", f"unsupported version {show(version)} (this build reads {FORMAT_VERSION})"
        )
    kind = obj.get("type", MISSING)
    if kind is MISSING:
        raise RecordError("type", "required field is missing")
    allowed = types.get(kind) if isinstance(kind, str) else None
    if allowed is None:
        raise RecordError("type", f"expected one of {', '.join(types)}, got {show(kind)}")
    for name, value in obj.items():
        if name not in allowed:
            raise RecordError(name if len(name) <= 64 else name[:61] + "...", "unknown field")
        if value is None and name not in nullable:
            raise RecordError(name, "must not be null (leave the field out instead)")
    assert isinstance(kind, str)
    return kind


def _required(obj: Mapping[str, object], name: str) -> object:
    value = obj.get(name, MISSING)
    if value is MISSING:
        raise RecordError(name, "required field is missing")
    return value


def _bounded(field: str, value: object, max_bytes: int) -> str:
    """``value`` if it is a non-empty str of at most ``max_bytes`` UTF-8 bytes."""
    if isinstance(value, str) and value:
        if value.isascii():
            size = len(value)
        else:
            try:
                size = len(value.encode("utf-8"))
            except UnicodeEncodeError:
                raise RecordError(field, "must be valid Unicode (no lone surrogates)") from None
        if size <= max_bytes:
            return value
    raise RecordError(field, f"must be a non-empty string of at most {max_bytes} UTF-8 bytes")


def _keys(value: object, limits: Limits) -> tuple[str, ...]:
    if not isinstance(value, list | tuple):
        raise RecordError("keys", "must be an array of strings")
    if len(value) > limits.max_keys_per_operation:
        raise RecordError(
            "keys", f"at most {limits.max_keys_per_operation} keys per operation, got {len(value)}"
        )
    max_bytes = limits.max_key_bytes
    for i, key in enumerate(value):
        # Fast path for the usual ASCII key; anything else gets the full check and message.
        if type(key) is not str or not key or not key.isascii() or len(key) > max_bytes:
            _bounded(f"keys[{i}]", key, max_bytes)
    return tuple(value)


def decode_request(data: bytes | Mapping[str, object], limits: Limits = DEFAULT_LIMITS) -> Request:
    """Decode one record of the requests topic (or one HTTP body).

    Args:
        data: the record's value as bytes, or an already-parsed JSON object.
        limits: the sizes to enforce.

    Returns:
        A :class:`RegisterRequest` or a :class:`CancelRequest`.

    Raises:
        RecordError: (a BadRecordError) whose message starts with the field's path.
    """
    record = fast_request(data, limits, _REQUEST_TYPES)
    if record is None:
        return full_request(data, limits)
    assert not isinstance(record, WatermarkRecord)
    return record


def full_request(data: bytes | Mapping[str, object], limits: Limits = DEFAULT_LIMITS) -> Request:
    """:func:`decode_request` without the fast path: every check, in the documented order."""
    obj = parse_object(data, limits.max_record_bytes)
    return _request(obj, envelope(obj, _REQUEST_TYPES), limits)


def _request(obj: Mapping[str, object], kind: str, limits: Limits) -> Request:
    op_id = _bounded("op_id", _required(obj, "op_id"), limits.max_op_id_bytes)
    scope = _bounded("scope", _required(obj, "scope"), limits.max_scope_bytes)
    if kind == "cancel":
        return CancelRequest(op_id, scope)
    keys = _keys(_required(obj, "keys"), limits)
    return RegisterRequest(
        op_id=op_id,
        scope=scope,
        keys=keys,
        condition=obj.get("condition", "all"),  # type: ignore[arg-type]
        count=obj.get("count"),  # type: ignore[arg-type]
        deadline_ms=obj.get("deadline_ms"),  # type: ignore[arg-type]
        timeout_ms=obj.get("timeout_ms"),  # type: ignore[arg-type]
        time_domain=obj.get("time_domain", "processing_time"),  # type: ignore[arg-type]
        payload=payload_text("payload", obj.get("payload"), limits.max_payload_bytes),
        reply_to=obj.get("reply_to"),  # type: ignore[arg-type]
    )


def decode_requests_record(
    data: bytes | Mapping[str, object], limits: Limits = DEFAULT_LIMITS
) -> Request | WatermarkRecord:
    """Decode one record of the requests topic: a register, a cancel, or an in-band watermark.

    A writer that registers event-time operations and also advances the scope's watermark (the
    Spark registration sink re-arming inactivity timers) publishes both on the requests topic:
    a scope's records share a partition, so the service applies the watermark after the
    registrations written before it, as Flink's in-band watermarks. On the signals topic the
    same watermark could overtake them and fire a timer that was just re-armed.

    Raises:
        RecordError: (a BadRecordError) whose message starts with the field's path.
    """
    record = fast_request(data, limits, _REQUESTS_TOPIC_TYPES)
    return full_requests_record(data, limits) if record is None else record


def full_requests_record(
    data: bytes | Mapping[str, object], limits: Limits = DEFAULT_LIMITS
) -> Request | WatermarkRecord:
    """:func:`decode_requests_record` without the fast path."""
    obj = parse_object(data, limits.max_record_bytes)
    kind = envelope(obj, _REQUESTS_TOPIC_TYPES)
    if kind == "watermark":
        return _watermark(obj, limits)
    return _request(obj, kind, limits)


def decode_signal(
    data: bytes | Mapping[str, object], limits: Limits = DEFAULT_LIMITS
) -> SignalInput:
    """Decode one record of the signals topic (or one HTTP body).

    Args:
        data: the record's value as bytes, or an already-parsed JSON object.
        limits: the sizes to enforce.

    Returns:
        A :class:`SignalRecord` or a :class:`WatermarkRecord`.

    Raises:
        RecordError: (a BadRecordError) whose message starts with the field's path.
    """
    record = fast_signal(data, limits, _SIGNAL_TYPES)
    return full_signal(data, limits) if record is None else record


def full_signal(data: bytes | Mapping[str, object], limits: Limits = DEFAULT_LIMITS) -> SignalInput:
    """:func:`decode_signal` without the fast path."""
    obj = parse_object(data, limits.max_record_bytes)
    if envelope(obj, _SIGNAL_TYPES) == "watermark":
        return _watermark(obj, limits)
    return SignalRecord(
        scope=_bounded("scope", _required(obj, "scope"), limits.max_scope_bytes),
        key=_bounded("key", _required(obj, "key"), limits.max_key_bytes),
        event_time_ms=obj.get("event_time_ms"),  # type: ignore[arg-type]
        payload=payload_text("payload", obj.get("payload"), limits.max_payload_bytes),
    )


def _watermark(obj: Mapping[str, object], limits: Limits) -> WatermarkRecord:
    scope = _bounded("scope", _required(obj, "scope"), limits.max_scope_bytes)
    return WatermarkRecord(scope, _required(obj, "watermark_ms"))  # type: ignore[arg-type]


def encode_request(record: Request) -> bytes:
    """Encode a request as the value of a requests-topic record (key: :func:`message_key`).

    Optional fields are left out when None; the payload is written as canonical JSON.

    Raises:
        RecordError: if the payload is not JSON text, or a string holds a lone surrogate.
        UsageError: if ``record`` is not a request.
    """
    if isinstance(record, RegisterRequest):
        obj: dict[str, object] = {
            "v": FORMAT_VERSION,
            "type": "register",
            "op_id": record.op_id,
            "scope": record.scope,
            "keys": record.keys,
            "condition": record.condition.value,
        }
        if record.count is not None:
            obj["count"] = record.count
        if record.deadline_ms is not None:
            obj["deadline_ms"] = record.deadline_ms
        else:
            obj["timeout_ms"] = record.timeout_ms
        obj["time_domain"] = record.time_domain.value
        if record.payload is not None:
            obj["payload"] = payload_value("payload", record.payload)
        if record.reply_to is not None:
            obj["reply_to"] = record.reply_to
    elif isinstance(record, CancelRequest):
        obj = {"v": FORMAT_VERSION, "type": "cancel", "op_id": record.op_id, "scope": record.scope}
    else:
        raise UsageError(f"record must be a RegisterRequest or a CancelRequest, got {record!r}")
    return encode_text(dumps(obj), obj)


def encode_signal(record: SignalInput) -> bytes:
    """Encode a signal or a watermark as the value of a signals-topic record.

    Raises:
        RecordError: if the payload is not JSON text, or a string holds a lone surrogate.
        UsageError: if ``record`` is not a signal or a watermark.
    """
    if isinstance(record, SignalRecord):
        obj: dict[str, object] = {
            "v": FORMAT_VERSION,
            "type": "signal",
            "scope": record.scope,
            "key": record.key,
        }
        if record.event_time_ms is not None:
            obj["event_time_ms"] = record.event_time_ms
        if record.payload is not None:
            obj["payload"] = payload_value("payload", record.payload)
    elif isinstance(record, WatermarkRecord):
        obj = {
            "v": FORMAT_VERSION,
            "type": "watermark",
            "scope": record.scope,
            "watermark_ms": record.watermark_ms,
        }
    else:
        raise UsageError(f"record must be a SignalRecord or a WatermarkRecord, got {record!r}")
    return encode_text(dumps(obj), obj)


def message_key(record: Request | SignalInput) -> bytes:
    """The Kafka message key of a record: its scope in UTF-8 (co-partitions a scope's records).

    Raises:
        RecordError: if the scope holds a lone surrogate.
    """
    return encode_text(record.scope, {"scope": record.scope})
