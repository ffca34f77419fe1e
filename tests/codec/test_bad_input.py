"""Every bad record is rejected with a RecordError that names the field (table-driven)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from purgatory._codec import (
    Limits,
    RecordError,
    decode_callback,
    decode_request,
    decode_signal,
)
from purgatory._core import BadRecordError

_DROP: Any = object()
MAX = "253402300799999"


def _json(base: dict[str, object], changes: dict[str, object]) -> bytes:
    record = {**base, **changes}
    return json.dumps({k: v for k, v in record.items() if v is not _DROP}).encode()


def register(**changes: object) -> bytes:
    base: dict[str, object] = {
        "v": 1,
        "type": "register",
        "op_id": "nightly",
        "scope": "ingest@2026-11-22",
        "keys": ["ingest/orders", "ingest/users"],
        "condition": "all",
        "deadline_ms": 1_000,
    }
    return _json(base, changes)


def signal(**changes: object) -> bytes:
    return _json({"v": 1, "type": "signal", "scope": "s", "key": "k"}, changes)


def callback(**changes: object) -> bytes:
    base: dict[str, object] = {
        "v": 1,
        "type": "callback",
        "op_id": "op",
        "scope": "s",
        "outcome": "completed",
        "registered_ms": 1,
        "outcome_ms": 2,
        "deadline_ms": 3,
        "time_domain": "processing_time",
        "sequence": 1,
        "partition": 0,
        "id": "0-1-0123456789abcdef",
        "keys": ["a"],
        "missing": ["b"],
        "signals": {"a": None},
        "payload": None,
        "late": False,
    }
    return _json(base, changes)


REQ, SIG, CB = "request", "signal", "callback"
SMALL = Limits(max_record_bytes=200, max_payload_bytes=10, max_keys_per_operation=3)

# (decoder, input, limits, field, message prefix)
CASES: list[tuple[str, object, Limits, str | None, str]] = [
    (REQ, b"\x00\x01 garbage", Limits(), None, "(record): not valid JSON"),
    (REQ, b"", Limits(), None, "(record): not valid JSON"),
    (
        REQ,
        b'{"v":1,"type":"cancel","op_id":"a","scope":"\xff"}',
        Limits(),
        None,
        "(record): not valid UTF-8 (at byte 44)",
    ),
    (REQ, "\ufeff{}".encode(), Limits(), None, "(record): not valid JSON"),
    (REQ, b"[1, 2]", Limits(), None, "(record): expected a JSON object, got array"),
    (SIG, b'"a signal"', Limits(), None, "(record): expected a JSON object, got string"),
    (REQ, 5, Limits(), None, "(record): expected bytes or a JSON object, got int"),
    (REQ, {1: "x"}, Limits(), None, "(record): field names must be strings"),
    (REQ, b'{"v":1,"v":1}', Limits(), None, '(record): repeats the name "v"'),
    (REQ, register(op_id=_DROP, v=_DROP), Limits(), "v", "v: required field is missing"),
    (REQ, register(v=2), Limits(), "v", "v: unsupported version 2 (this build reads 1)"),
    (REQ, register(v="1"), Limits(), "v", 'v: unsupported version "1" (this build reads 1)'),
    (REQ, register(v=True), Limits(), "v", "v: unsupported version true"),
    (
        REQ,
        register(type="regster"),
        Limits(),
        "type",
        'type: expected one of register, cancel, got "regster"',
    ),
    (REQ, signal(), Limits(), "type", "type: expected one of register, cancel"),
    (SIG, register(), Limits(), "type", "type: expected one of signal, watermark"),
    (REQ, register(colour="red"), Limits(), "colour", "colour: unknown field"),
    (REQ, register(op_id=_DROP), Limits(), "op_id", "op_id: required field is missing"),
    (
        REQ,
        register(op_id="x" * 257),
        Limits(),
        "op_id",
        "op_id: must be a non-empty string of at most 256 UTF-8 bytes",
    ),
    (
        REQ,
        register(scope=""),
        Limits(),
        "scope",
        "scope: must be a non-empty string of at most 512 UTF-8 bytes",
    ),
    (REQ, register(scope=7), Limits(), "scope", "scope: must be a non-empty string"),
    (REQ, register(keys="ingest/orders"), Limits(), "keys", "keys: must be an array of strings"),
    (
        REQ,
        register(keys=["a", "b", ""]),
        Limits(),
        "keys[2]",
        "keys[2]: must be a non-empty string of at most 512 UTF-8 bytes",
    ),
    (REQ, register(keys=["a", 3]), Limits(), "keys[1]", "keys[1]: must be a non-empty string"),
    (
        REQ,
        register(keys=["k" * 513]),
        Limits(),
        "keys[0]",
        "keys[0]: must be a non-empty string of at most 512 UTF-8 bytes",
    ),
    (
        REQ,
        register(keys=["€" * 171]),
        Limits(),
        "keys[0]",
        "keys[0]: must be a non-empty string of at most 512 UTF-8 bytes",
    ),
    (REQ, register(keys=["a", "b", "a"]), Limits(), "keys[2]", "keys[2]: duplicate of keys[0]"),
    (
        REQ,
        register(keys=[f"k{i}" for i in range(1001)]),
        Limits(),
        "keys",
        "keys: at most 1000 keys per operation, got 1001",
    ),
    (
        REQ,
        register(keys=["a", "b", "c", "d"]),
        SMALL,
        "keys",
        "keys: at most 3 keys per operation, got 4",
    ),
    (
        REQ,
        register(keys=["x" * 300]),
        SMALL,
        None,
        "(record): 433 bytes is over the limit of 200 bytes",
    ),
    (
        REQ,
        register(deadline_ms=True),
        Limits(),
        "deadline_ms",
        f"deadline_ms: must be an integer in [0, {MAX}]",
    ),
    (REQ, register(deadline_ms=1.5), Limits(), "deadline_ms", "deadline_ms: must be an integer in"),
    (REQ, register(deadline_ms=1.0), Limits(), "deadline_ms", "deadline_ms: must be an integer in"),
    (REQ, register(deadline_ms=-1), Limits(), "deadline_ms", "deadline_ms: must be an integer in"),
    (
        REQ,
        register(deadline_ms=10**30),
        Limits(),
        "deadline_ms",
        "deadline_ms: must be an integer in",
    ),
    (
        REQ,
        register(deadline_ms="1000"),
        Limits(),
        "deadline_ms",
        "deadline_ms: must be an integer in",
    ),
    (
        REQ,
        register(deadline_ms=float("nan")),
        Limits(),
        "deadline_ms",
        "deadline_ms: must be an integer in",
    ),
    (
        REQ,
        register(deadline_ms=float("inf")),
        Limits(),
        "deadline_ms",
        "deadline_ms: must be an integer in",
    ),
    (REQ, register().replace(b"1000", b"1" * 5000), Limits(), None, "(record): not valid JSON"),
    (
        REQ,
        register(deadline_ms=_DROP),
        Limits(),
        "deadline_ms",
        "deadline_ms: one of deadline_ms or timeout_ms is required",
    ),
    (
        REQ,
        register(timeout_ms=5),
        Limits(),
        "timeout_ms",
        "timeout_ms: not allowed together with deadline_ms",
    ),
    (
        REQ,
        register(deadline_ms=_DROP, timeout_ms=5, time_domain="event_time"),
        Limits(),
        "timeout_ms",
        "timeout_ms: only allowed with time_domain processing_time",
    ),
    (
        REQ,
        register(time_domain="wall_clock"),
        Limits(),
        "time_domain",
        "time_domain: expected one of processing_time, event_time",
    ),
    (
        REQ,
        register(condition="most"),
        Limits(),
        "condition",
        "condition: expected one of all, any, count",
    ),
    (
        REQ,
        register(condition=["all"]),
        Limits(),
        "condition",
        "condition: expected one of all, any, count",
    ),
    (REQ, register(count=1), Limits(), "count", "count: only allowed with condition count"),
    (REQ, register(condition="count"), Limits(), "count", "count: required with condition count"),
    (
        REQ,
        register(condition="count", count=3),
        Limits(),
        "count",
        "count: must be an integer in [1, 2]",
    ),
    (
        REQ,
        register(condition="count", count=0),
        Limits(),
        "count",
        "count: must be an integer in [1, 2]",
    ),
    (
        REQ,
        register(condition="count", count=True),
        Limits(),
        "count",
        "count: must be an integer in [1, 2]",
    ),
    (
        REQ,
        register(keys=[], condition="any"),
        Limits(),
        "condition",
        "condition: must be all for an operation without keys",
    ),
    (
        REQ,
        register(count=None),
        Limits(),
        "count",
        "count: must not be null (leave the field out instead)",
    ),
    (
        REQ,
        register(payload=[float("inf")]),
        Limits(),
        "payload",
        "payload: must be JSON without NaN or Infinity",
    ),
    (
        REQ,
        register(payload="x" * 20),
        SMALL,
        "payload",
        "payload: at most 10 bytes of JSON, got 22",
    ),
    (
        REQ,
        register(payload={"deep": [[[[[[]]]]]]}).replace(
            b"[[[[[[]]]]]]", b"[" * 100_000 + b"]" * 100_000
        ),
        Limits(),
        None,
        "(record): not valid JSON (nested too deeply)",
    ),
    (
        REQ,
        register(payload="\ud800"),
        Limits(),
        "payload",
        "payload: must be valid Unicode (no lone surrogates)",
    ),
    (
        REQ,
        register(reply_to="callbacks topic"),
        Limits(),
        "reply_to",
        "reply_to: must be a Kafka topic name",
    ),
    (REQ, register(reply_to=".."), Limits(), "reply_to", "reply_to: must be a Kafka topic name"),
    (
        REQ,
        b'{"v":1,"type":"cancel","op_id":"a"}',
        Limits(),
        "scope",
        "scope: required field is missing",
    ),
    (SIG, signal(key=_DROP), Limits(), "key", "key: required field is missing"),
    (SIG, signal(key="\udfff"), Limits(), "key", "key: must be valid Unicode (no lone surrogates)"),
    (
        SIG,
        signal(event_time_ms="5"),
        Limits(),
        "event_time_ms",
        "event_time_ms: must be an integer in",
    ),
    (
        SIG,
        signal(payload=float("nan")),
        Limits(),
        "payload",
        "payload: must be JSON without NaN or Infinity",
    ),
    (SIG, signal(op_id="x"), Limits(), "op_id", "op_id: unknown field"),
    (
        SIG,
        signal(type="watermark", key=_DROP),
        Limits(),
        "watermark_ms",
        "watermark_ms: required field is missing",
    ),
    (
        SIG,
        signal(type="watermark", key=_DROP, watermark_ms=False),
        Limits(),
        "watermark_ms",
        "watermark_ms: must be an integer in",
    ),
    (
        SIG,
        {"v": 1, "type": "signal", "scope": "s", "key": "k", "payload": {1, 2}},
        Limits(),
        "payload",
        "payload: must be a JSON value",
    ),
    (
        CB,
        callback(outcome="done"),
        Limits(),
        "outcome",
        "outcome: expected one of completed, expired, cancelled",
    ),
    (CB, callback(late=_DROP), Limits(), "late", "late: required field is missing"),
    (CB, callback(late="yes"), Limits(), "late", "late: must be true or false"),
    (
        CB,
        callback(sequence=0),
        Limits(),
        "sequence",
        "sequence: must be an integer in [1, 9223372036854775807]",
    ),
    (CB, callback(time_domain=None), Limits(), "time_domain", "time_domain: must not be null"),
    (CB, callback(partition=-1), Limits(), "partition", "partition: must be an integer in [0, "),
    (CB, callback(partition=True), Limits(), "partition", "partition: must be an integer in [0, "),
    (CB, callback(id=_DROP), Limits(), "id", "id: required field is missing"),
    (CB, callback(id="0-1-XYZ"), Limits(), "id", "id: must be '<partition>-<sequence>-<16 hex"),
    (CB, callback(id=7), Limits(), "id", "id: must be '<partition>-<sequence>-<16 hex"),
    (CB, callback(missing=["a"]), Limits(), "missing[0]", "missing[0]: duplicate of keys[0]"),
    (CB, callback(keys="a"), Limits(), "keys", "keys: must be an array of strings, got string"),
    (CB, callback(signals={"b": 1}), Limits(), 'signals["b"]', 'signals["b"]: is not one of keys'),
    (
        CB,
        callback(signals={"a": float("nan")}),
        Limits(),
        'signals["a"]',
        'signals["a"]: must be JSON without NaN',
    ),
    (
        CB,
        callback(registered_ms=-5),
        Limits(),
        "registered_ms",
        "registered_ms: must be an integer in",
    ),
    (CB, callback(reply_to="x"), Limits(), "reply_to", "reply_to: unknown field"),
    (CB, register(), Limits(), "type", "type: expected one of callback"),
]

_DECODERS: dict[str, Callable[[Any, Limits], object]] = {
    REQ: decode_request,
    SIG: decode_signal,
    CB: lambda data, _limits: decode_callback(data),
}


@pytest.mark.parametrize(
    ("decoder", "data", "limits", "field", "message"),
    CASES,
    ids=[f"{i:02d}-{case[4][:48]}" for i, case in enumerate(CASES)],
)
def test_bad_record_is_rejected_naming_the_field(
    decoder: str, data: object, limits: Limits, field: str | None, message: str
) -> None:
    with pytest.raises(RecordError) as info:
        _DECODERS[decoder](data, limits)
    error = info.value
    assert str(error).startswith(message), str(error)
    assert error.field == field
    assert isinstance(error, BadRecordError) and isinstance(error, ValueError)
    assert str(error) == f"{'(record)' if field is None else field}: {error.reason}"


@pytest.mark.parametrize(
    ("decoder", "data", "limits", "field", "message"),
    [case for case in CASES if isinstance(case[1], bytes)],
)
def test_parsed_json_is_rejected_like_bytes(
    decoder: str, data: bytes, limits: Limits, field: str | None, message: str
) -> None:
    """An HTTP body (already parsed) gets the same answer as the same record from Kafka."""
    try:
        parsed = json.loads(data)
    except (ValueError, RecursionError):
        return  # not JSON: only bytes can carry it
    if not isinstance(parsed, Mapping) or field is None:
        return
    with pytest.raises(RecordError) as info:
        _DECODERS[decoder](parsed, limits)
    assert (info.value.field, str(info.value)[: len(message)]) == (field, message)


def test_the_table_covers_at_least_25_cases_and_every_decoder() -> None:
    assert len(CASES) >= 25
    assert {case[0] for case in CASES} == {REQ, SIG, CB}


def test_oversized_record_is_rejected_before_parsing() -> None:
    huge = b"{" * 2_000  # not JSON either: the size check answers first
    with pytest.raises(
        RecordError, match=r"^\(record\): 2000 bytes is over the limit of 1000 bytes"
    ):
        decode_signal(huge, Limits(max_record_bytes=1_000))
    assert decode_signal(signal(), Limits(max_record_bytes=len(signal()))) is not None


def test_limits_are_inclusive_boundaries() -> None:
    exact = Limits(max_key_bytes=4, max_scope_bytes=2, max_op_id_bytes=2, max_payload_bytes=3)
    decode_request(register(keys=["€a"], scope="ab", op_id="ab", payload="a"), exact)
    cases: list[tuple[dict[str, object], str]] = [
        ({"keys": ["€ab"]}, "keys[0]"),
        ({"scope": "abc"}, "scope"),
        ({"op_id": "éa"}, "op_id"),
        ({"payload": "ab"}, "payload"),
    ]
    for changes, field in cases:
        with pytest.raises(RecordError) as info:
            decode_request(
                register(**{"scope": "ab", "op_id": "ab", "keys": ["€a"], **changes}), exact
            )
        assert info.value.field == field
