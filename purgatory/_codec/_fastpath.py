"""The inbound decoders' fast path: the usual valid record in one pass (codec concept: inbound
records; stdlib only).

Theory of operation. The full decoders in ``_inbound`` check one thing after another so that a
bad record's error names the first thing wrong with it, then build the record through its
validating constructor, which checks much of it again. Almost every record is good, and for a
good one that order is pure cost. The fast path decodes the record as producers usually write
it (UTF-8 JSON bytes, no whitespace around the object), checks every field against its type and
limit in one pass, and builds the record without its constructor's checks. It never raises and
never explains: for anything it does not accept it returns None, and the caller runs the full
decoder, which finds the error. So it may turn down more than it must, but it accepts only what
the full decoder accepts and builds the very same record; a Hypothesis test holds it to that.

Worked example: ``{"v":1,"type":"signal","scope":"a:b","key":"k","payload":{"n":1}}`` scans to
a dict of 5 members; scope, key and payload (canonical text ``{"n":1}``) hold 2 ``:`` between
them, and the text holds 7 = 5 + 2, so no name was repeated (see ``_json``); the fields fit,
and a SignalRecord comes back. With ``"key":"k","key":"k"`` the text holds one ``:`` more than
the dict accounts for: None, and the full decoder reports the repeated name.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard

from purgatory._codec._json import MISSING, payload_text, scan_record
from purgatory._codec._records import (
    _TOPIC,
    CancelRequest,
    Limits,
    RecordError,
    RegisterRequest,
    Request,
    SignalInput,
    SignalRecord,
    WatermarkRecord,
)
from purgatory._core import MAX_TIME_MS, Condition, TimeDomain
from purgatory._core.engine.validate import slot_setters

__all__ = ["fast_request", "fast_signal"]

# _inbound.FORMAT_VERSION (which imports this module); the agreement test fails if they part.
_FORMAT_VERSION = 1
_CONDITIONS = {c.value: c for c in Condition}
_DOMAINS = {d.value: d for d in TimeDomain}


_new = object.__new__
_SIGNAL_SET = slot_setters(SignalRecord, "scope", "key", "event_time_ms", "payload")
_WATERMARK_SET = slot_setters(WatermarkRecord, "scope", "watermark_ms")
_CANCEL_SET = slot_setters(CancelRequest, "op_id", "scope")
_REGISTER_SET = slot_setters(
    RegisterRequest,
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


def _fits(value: object, max_bytes: int) -> TypeGuard[str]:
    """Whether ``value`` is a non-empty str of at most ``max_bytes`` UTF-8 bytes."""
    if type(value) is not str or not value:
        return False
    if value.isascii():
        return len(value) <= max_bytes
    try:
        return len(value.encode("utf-8")) <= max_bytes
    except UnicodeEncodeError:  # a lone surrogate
        return False


def _is_ms(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_TIME_MS


def _envelope(obj: dict[str, Any], types: Mapping[str, frozenset[str]]) -> str | None:
    """The record's type if ``v`` is 1, ``type`` is one of ``types`` and no field is unknown."""
    version = obj.get("v")
    kind = obj.get("type")
    if type(version) is not int or version != _FORMAT_VERSION or type(kind) is not str:
        return None
    allowed = types.get(kind)
    return kind if allowed is not None and obj.keys() <= allowed else None


def fast_signal(
    data: object, limits: Limits, types: Mapping[str, frozenset[str]]
) -> SignalInput | None:
    """What :func:`decode_signal` returns for ``data``, or None to leave ``data`` to it.

    Args:
        data: the record's value.
        limits: the sizes to enforce.
        types: the record types of the topic (signal, watermark) and the fields of each.
    """
    scanned = scan_record(data, limits.max_record_bytes)
    if scanned is None:
        return None
    obj, colons = scanned
    kind = _envelope(obj, types)
    if kind == "watermark":
        return _watermark_record(obj, colons, limits)
    if kind is None:
        return None
    scope = obj.get("scope")
    key = obj.get("key")
    event_time_ms = obj.get("event_time_ms", MISSING)
    if event_time_ms is MISSING:
        event_time_ms = None
    elif not _is_ms(event_time_ms):
        return None
    if not (_fits(scope, limits.max_scope_bytes) and _fits(key, limits.max_key_bytes)):
        return None
    payload = obj.get("payload")
    if payload is not None:
        try:
            payload = payload_text("payload", payload, limits.max_payload_bytes)
        except RecordError:
            return None
    if colons is not None and colons != (
        len(obj) + scope.count(":") + key.count(":") + (payload.count(":") if payload else 0)
    ):
        return None
    record = _new(SignalRecord)
    set_scope, set_key, set_event_time_ms, set_payload = _SIGNAL_SET
    set_scope(record, scope)
    set_key(record, key)
    set_event_time_ms(record, event_time_ms)
    set_payload(record, payload)
    return record


def _watermark_record(
    obj: dict[str, Any], colons: int | None, limits: Limits
) -> WatermarkRecord | None:
    scope = obj.get("scope")
    watermark_ms = obj.get("watermark_ms")
    if not (_fits(scope, limits.max_scope_bytes) and _is_ms(watermark_ms)):
        return None
    if colons is not None and colons != len(obj) + scope.count(":"):
        return None
    record = _new(WatermarkRecord)
    set_scope, set_watermark_ms = _WATERMARK_SET
    set_scope(record, scope)
    set_watermark_ms(record, watermark_ms)
    return record


def fast_request(
    data: object, limits: Limits, types: Mapping[str, frozenset[str]]
) -> Request | WatermarkRecord | None:
    """What :func:`decode_request` or :func:`decode_requests_record` returns for ``data``, or
    None to leave ``data`` to it.

    Args:
        data: the record's value.
        limits: the sizes to enforce.
        types: the record types the decoder reads (register, cancel, maybe watermark) and the
            fields of each.
    """
    scanned = scan_record(data, limits.max_record_bytes)
    if scanned is None:
        return None
    obj, colons = scanned
    kind = _envelope(obj, types)
    if kind is None:
        return None
    if kind == "watermark":
        return _watermark_record(obj, colons, limits)
    op_id = obj.get("op_id")
    scope = obj.get("scope")
    if not (_fits(op_id, limits.max_op_id_bytes) and _fits(scope, limits.max_scope_bytes)):
        return None
    if kind == "cancel":
        if colons is not None and colons != len(obj) + op_id.count(":") + scope.count(":"):
            return None
        record = _new(CancelRequest)
        set_op_id, set_scope = _CANCEL_SET
        set_op_id(record, op_id)
        set_scope(record, scope)
        return record
    return _register_request(obj, colons, limits, op_id, scope)


def _register_request(
    obj: dict[str, Any], colons: int | None, limits: Limits, op_id: str, scope: str
) -> RegisterRequest | None:
    keys = obj.get("keys")
    if type(keys) is not list or not _usual_keys(keys, limits):
        return None
    shape = _condition_of(obj, keys)
    if shape is None:
        return None
    condition, domain, count = shape
    deadline_ms = obj.get("deadline_ms", MISSING)
    timeout_ms = obj.get("timeout_ms", MISSING)
    if deadline_ms is MISSING:
        if not _is_ms(timeout_ms) or domain is not TimeDomain.PROCESSING_TIME:
            return None
        deadline_ms = None
    elif _is_ms(deadline_ms) and timeout_ms is MISSING:
        timeout_ms = None
    else:
        return None
    reply_to = obj.get("reply_to", MISSING)
    if reply_to is MISSING:
        reply_to = None
    elif type(reply_to) is not str or not _TOPIC.fullmatch(reply_to) or reply_to in {".", ".."}:
        return None
    payload = obj.get("payload")
    if payload is not None:
        try:
            payload = payload_text("payload", payload, limits.max_payload_bytes)
        except RecordError:
            return None
    if colons is not None and colons != (
        len(obj)
        + op_id.count(":")
        + scope.count(":")
        + "".join(keys).count(":")
        + (payload.count(":") if payload else 0)
    ):
        return None
    fields = (op_id, scope, tuple(keys), condition, count, deadline_ms, timeout_ms, domain)
    return _new_register(*fields, payload, reply_to)


def _usual_keys(keys: list[Any], limits: Limits) -> bool:
    """Whether ``keys`` are valid watch keys, distinct and within the limits."""
    if len(keys) > limits.max_keys_per_operation:
        return False
    max_key_bytes = limits.max_key_bytes
    for key in keys:
        # The usual ASCII key inline; _fits for the rest.
        usual = type(key) is str and key.isascii() and 0 < len(key) <= max_key_bytes
        if not usual and not _fits(key, max_key_bytes):
            return False
    return len(set(keys)) == len(keys)


def _condition_of(
    obj: dict[str, Any], keys: list[Any]
) -> tuple[Condition, TimeDomain, int | None] | None:
    """The registration's condition, time domain and count, when valid together."""
    condition = obj.get("condition", "all")
    domain = obj.get("time_domain", "processing_time")
    if type(condition) is not str or type(domain) is not str:
        return None
    condition = _CONDITIONS.get(condition)
    domain = _DOMAINS.get(domain)
    if condition is None or domain is None:
        return None
    count = obj.get("count", MISSING)
    if condition is Condition.COUNT:
        if type(count) is not int or not 1 <= count <= len(keys):
            return None
    elif count is not MISSING or (not keys and condition is not Condition.ALL):
        return None
    else:
        count = None
    return condition, domain, count


def _new_register(*values: Any) -> RegisterRequest:
    """A RegisterRequest of already validated ``values``, in :data:`_REGISTER_SET`'s order
    (no ``__post_init__``: every field was checked here)."""
    record = _new(RegisterRequest)
    for setter, value in zip(_REGISTER_SET, values, strict=True):
        setter(record, value)
    return record
