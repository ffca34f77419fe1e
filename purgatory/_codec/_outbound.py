"""The callbacks topic (codec concept: outbound records; stdlib only).

Callbacks are on the hot path: one per finished operation. :func:`encode_callback` formats the
record in one f-string, escaping strings with the json module's C escaper, and splices the stored
payload texts in as they are (they are canonical JSON already: they were made so when the request
or signal was decoded), so no payload is parsed or re-serialised on the way out.

Dead letters have a module of their own, :mod:`purgatory._codec._dead_letters`.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from hashlib import blake2b
from json.encoder import encode_basestring as _str

from purgatory._codec._inbound import FORMAT_VERSION, envelope
from purgatory._codec._json import json_type, parse_object, payload_text, show
from purgatory._codec._records import RecordError, check_ms, check_text
from purgatory._core import Outcome, OutcomeKind, TimeDomain

__all__ = ["decode_callback", "encode_callback", "outcome_id"]

_MAX_SEQUENCE = (1 << 63) - 1  # a Kafka/Spark long
_CALLBACK_FIELDS = (
    "v",
    "type",
    "op_id",
    "scope",
    "outcome",
    "registered_ms",
    "outcome_ms",
    "deadline_ms",
    "time_domain",
    "sequence",
    "partition",
    "id",
    "keys",
    "missing",
    "signals",
    "payload",
    "late",
)
_ID = re.compile(r"[0-9]+-[0-9]+-[0-9a-f]{16}")
_CALLBACK_TYPES = {"callback": frozenset(_CALLBACK_FIELDS)}
_OUTCOMES = {k.value for k in OutcomeKind}
_DOMAINS = {d.value for d in TimeDomain}


def outcome_id(outcome: Outcome) -> str:
    """The identity of an outcome: ``<partition>-<sequence>-<digest>``.

    The digest (64 bits of BLAKE2b) is of the registration the outcome answers: its scope, op_id
    and ``registered_ms``. The partition and its sequence make it unique while the partition's
    journal lives; the digest keeps it unique even across a journal that was lost (a broker
    that kept nothing). Replay decides the same outcome with the same fields, so a re-sent
    callback carries the same id.
    """
    o = outcome
    seed = f"{o.scope}\0{o.op_id}\0{o.registered_ms}".encode("utf-8", "surrogatepass")
    return f"{o.partition}-{o.sequence}-{blake2b(seed, digest_size=8).hexdigest()}"


def encode_callback(outcome: Outcome) -> bytes:
    """Encode an outcome as the value of a callbacks-topic record (key: its scope in UTF-8).

    The stored payload texts (the operation's and each signal's) are embedded as JSON values,
    not as strings: they must be JSON text, as every decoded payload is.

    Raises:
        RecordError: if a string holds a lone surrogate (never for decoded input).
    """
    o = outcome
    signals = o.signals
    body = (
        ",".join([_str(k) + ":" + ("null" if p is None else p) for k, p in signals.items()])
        if signals
        else ""
    )
    payload = o.payload
    # One f-string, strings escaped by the C escaper of the json module: about twice as fast
    # as one json.dumps call, and nothing is parsed.
    text = (
        f'{{"v":{FORMAT_VERSION},"type":"callback","op_id":{_str(o.op_id)},'
        f'"scope":{_str(o.scope)},"outcome":"{o.outcome.value}",'
        f'"registered_ms":{o.registered_ms:d},"outcome_ms":{o.outcome_ms:d},'
        f'"deadline_ms":{o.deadline_ms:d},"time_domain":"{o.time_domain.value}",'
        f'"sequence":{o.sequence:d},"partition":{o.partition:d},"id":"{outcome_id(o)}",'
        f'"keys":[{",".join(map(_str, o.keys))}],'
        f'"missing":[{",".join(map(_str, o.missing))}],"signals":{{{body}}},'
        f'"payload":{"null" if payload is None else payload},'
        f'"late":{"true" if o.late else "false"}}}'
    )
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise RecordError(None, "must be valid Unicode (no lone surrogates)") from None


def _strings(field: str, value: object) -> list[str]:
    if not isinstance(value, list):
        raise RecordError(field, f"must be an array of strings, got {json_type(value)}")
    for i, item in enumerate(value):
        check_text(f"{field}[{i}]", item)
    return value


def decode_callback(data: bytes | Mapping[str, object]) -> dict[str, object]:
    """Decode and validate one callbacks-topic record (for consumers and the Spark source).

    Returns:
        The record's fields, in the format's order, with plain JSON values, except that
        ``payload`` and every value of ``signals`` is canonical JSON text (or None), as the
        engine stores them.

    Raises:
        RecordError: (a BadRecordError) whose message starts with the field's path.
    """
    obj = parse_object(data, sys.maxsize)
    envelope(obj, _CALLBACK_TYPES)
    for name in _CALLBACK_FIELDS:
        if name not in obj:
            raise RecordError(name, "required field is missing")
    check_text("op_id", obj["op_id"])
    check_text("scope", obj["scope"])
    if not isinstance(obj["outcome"], str) or obj["outcome"] not in _OUTCOMES:
        raise RecordError("outcome", "expected one of completed, expired, cancelled")
    for name in ("registered_ms", "outcome_ms", "deadline_ms"):
        check_ms(name, obj[name])
    if not isinstance(obj["time_domain"], str) or obj["time_domain"] not in _DOMAINS:
        raise RecordError("time_domain", "expected one of processing_time, event_time")
    sequence = obj["sequence"]
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise RecordError("sequence", f"must be an integer in [1, {_MAX_SEQUENCE}]")
    if not 1 <= sequence <= _MAX_SEQUENCE:
        raise RecordError("sequence", f"must be an integer in [1, {_MAX_SEQUENCE}]")
    partition = obj["partition"]
    if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < 2**31:
        raise RecordError("partition", "must be an integer in [0, 2147483647]")
    ident = obj["id"]
    if not isinstance(ident, str) or _ID.fullmatch(ident) is None:
        raise RecordError("id", "must be '<partition>-<sequence>-<16 hex digits>'")
    keys = _strings("keys", obj["keys"])
    missing = _strings("missing", obj["missing"])
    where: dict[str, str] = {}
    for field, names in (("keys", keys), ("missing", missing)):
        for i, key in enumerate(names):
            first = where.setdefault(key, f"{field}[{i}]")
            if first != f"{field}[{i}]":
                raise RecordError(f"{field}[{i}]", f"duplicate of {first}")
    raw_signals = obj["signals"]
    if not isinstance(raw_signals, Mapping):
        raise RecordError("signals", f"must be an object, got {json_type(raw_signals)}")
    signals: dict[str, str | None] = {}
    for key, value in raw_signals.items():
        field = f"signals[{show(key, 64)}]"
        if not where.get(key, "").startswith("keys["):
            raise RecordError(field, "is not one of keys")
        signals[key] = payload_text(field, value, None)
    if type(obj["late"]) is not bool:
        raise RecordError("late", "must be true or false")
    out = {name: obj[name] for name in _CALLBACK_FIELDS}
    out["signals"] = signals
    out["payload"] = payload_text("payload", obj["payload"], None)
    return out
