"""Every record survives encode -> decode unchanged; callbacks and dead letters read back."""

from __future__ import annotations

import base64
import json
import pickle

import pytest
from hypothesis import given

from purgatory._codec import (
    CancelRequest,
    Limits,
    RecordError,
    RegisterRequest,
    Request,
    SignalInput,
    SignalRecord,
    WatermarkRecord,
    canonical_json,
    decode_callback,
    decode_request,
    decode_requests_record,
    decode_signal,
    encode_callback,
    encode_dead_letter,
    encode_request,
    encode_signal,
    message_key,
    outcome_id,
)
from purgatory._core import MAX_TIME_MS, Condition, OperationSpec, Outcome, TimeDomain, UsageError
from tests.codec._strategies import (
    dead_letter_args,
    json_values,
    outcomes,
    requests,
    signal_inputs,
    watermarks,
)


@given(requests)
def test_request_round_trips_through_bytes_and_through_parsed_json(record: Request) -> None:
    data = encode_request(record)
    assert decode_request(data, Limits()) == record
    assert decode_request(json.loads(data), Limits()) == record
    assert message_key(record) == record.scope.encode()


@given(requests | watermarks)
def test_the_requests_topic_reads_requests_and_in_band_watermarks(
    record: Request | WatermarkRecord,
) -> None:
    data = encode_signal(record) if isinstance(record, WatermarkRecord) else encode_request(record)
    assert decode_requests_record(data, Limits()) == record
    assert decode_requests_record(json.loads(data), Limits()) == record


def test_a_request_body_is_never_a_watermark_and_a_signal_never_goes_to_requests() -> None:
    watermark = encode_signal(WatermarkRecord("s", 5))
    with pytest.raises(RecordError, match=r"^type: expected one of register, cancel, got"):
        decode_request(watermark)
    signal = encode_signal(SignalRecord("s", "k"))
    with pytest.raises(RecordError, match=r"^type: expected one of register, cancel, watermark"):
        decode_requests_record(signal)


@given(signal_inputs)
def test_signal_round_trips_through_bytes_and_through_parsed_json(record: SignalInput) -> None:
    data = encode_signal(record)
    assert decode_signal(data, Limits()) == record
    assert decode_signal(json.loads(data), Limits()) == record


@given(outcomes())
def test_callback_round_trips_with_payloads_embedded_as_json(outcome: Outcome) -> None:
    data = encode_callback(outcome)
    plain = json.loads(data)  # valid JSON, whatever the payload texts held
    assert plain["payload"] == (None if outcome.payload is None else json.loads(outcome.payload))
    assert decode_callback(data) == {
        "v": 1,
        "type": "callback",
        "op_id": outcome.op_id,
        "scope": outcome.scope,
        "outcome": outcome.outcome.value,
        "registered_ms": outcome.registered_ms,
        "outcome_ms": outcome.outcome_ms,
        "deadline_ms": outcome.deadline_ms,
        "time_domain": outcome.time_domain.value,
        "sequence": outcome.sequence,
        "partition": outcome.partition,
        "id": outcome_id(outcome),
        "keys": list(outcome.keys),
        "missing": list(outcome.missing),
        "signals": outcome.signals,
        "payload": outcome.payload,
        "late": outcome.late,
    }


@given(json_values)
def test_payload_is_kept_as_canonical_text_whatever_its_spacing(value: object) -> None:
    spaced = json.dumps(
        {"v": 1, "type": "signal", "scope": "s", "key": "k", "payload": value}, indent=3
    )
    record = decode_signal(spaced.encode(), Limits())
    assert isinstance(record, SignalRecord)
    expected = (
        None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    )
    assert record.payload == expected


@given(dead_letter_args)
def test_dead_letter_keeps_the_original_bytes(args: dict[str, object]) -> None:
    letter = json.loads(encode_dead_letter(**args))  # type: ignore[arg-type]
    value = args["value"]
    assert isinstance(value, bytes | None)
    if value is None:
        assert (letter["value"], letter["value_bytes"], letter["truncated"]) == (None, None, False)
    else:
        kept = (
            letter["value"].encode()
            if letter["value_encoding"] == "utf-8"
            else base64.b64decode(letter["value"])
        )
        assert value.startswith(kept)
        assert letter["value_bytes"] == len(value)
        limit = args["max_value_bytes"]
        assert isinstance(limit, int)
        assert letter["truncated"] == (len(value) > limit)
        assert len(kept) >= min(len(value), limit) - 3  # a cut inside a character drops it
    key = args["key"]
    assert isinstance(key, bytes | None)
    if key is None:
        assert letter["key"] is None
    elif letter.get("key_encoding") == "base64":
        assert base64.b64decode(letter["key"]) == key
    else:
        assert letter["key"].encode() == key
    timestamp = args["timestamp_ms"]
    assert letter["timestamp_ms"] == (None if timestamp is None or timestamp == -1 else timestamp)


def test_dead_letter_of_binary_value_is_base64_and_cut_at_a_character_boundary() -> None:
    letter = json.loads(
        encode_dead_letter(
            reason="(record): not valid UTF-8 (at byte 0)",
            field=None,
            topic="signals",
            partition=3,
            offset=42,
            timestamp_ms=1,
            key=b"\xff\xfe",
            value=b"\xff\x00",
        )
    )
    assert letter["key"] == "//4=" and letter["key_encoding"] == "base64"
    assert letter["value"] == "/wA=" and letter["value_encoding"] == "base64"
    cut = json.loads(
        encode_dead_letter(
            reason="r",
            field="f",
            topic="t",
            partition=0,
            offset=0,
            timestamp_ms=None,
            key=None,
            value="€€".encode(),
            max_value_bytes=4,
        )
    )
    assert (cut["value"], cut["value_encoding"], cut["value_bytes"], cut["truncated"]) == (
        "€",
        "utf-8",
        6,
        True,
    )


def test_dead_letter_reason_quoting_a_lone_surrogate_is_still_utf8() -> None:
    data = encode_dead_letter(
        reason="key: bad \ud800",
        field="\udfff",
        topic="t",
        partition=0,
        offset=0,
        timestamp_ms=None,
        key=None,
        value=None,
    )
    assert json.loads(data.decode("utf-8"))["reason"] == "key: bad ?"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("reason", None),
        ("field", 3),
        ("topic", ""),
        ("partition", -2),
        ("offset", True),
        ("timestamp_ms", 1.5),
        ("max_value_bytes", -1),
    ],
)
def test_dead_letter_arguments_are_checked(name: str, value: object) -> None:
    args: dict[str, object] = {
        "reason": "r",
        "field": None,
        "topic": "t",
        "partition": 0,
        "offset": 0,
        "timestamp_ms": None,
        "key": None,
        "value": b"",
    }
    args[name] = value
    with pytest.raises(UsageError, match=f"^{name} "):
        encode_dead_letter(**args)  # type: ignore[arg-type]


def test_to_spec_keeps_a_deadline_and_turns_a_timeout_into_one_saturating() -> None:
    absolute = RegisterRequest("op", "s", ("a", "b"), Condition.ANY, deadline_ms=7)
    assert absolute.to_spec(now_ms=1_000) == OperationSpec(
        "op", "s", ("a", "b"), 7, condition=Condition.ANY
    )
    relative = RegisterRequest("op", "s", (), timeout_ms=500, payload='{"a":1}', reply_to="cb")
    spec = relative.to_spec(now_ms=1_000)
    assert (spec.deadline_ms, spec.payload, spec.reply_to, spec.is_timer) == (
        1_500,
        '{"a":1}',
        "cb",
        True,
    )
    assert relative.to_spec(now_ms=MAX_TIME_MS - 1).deadline_ms == MAX_TIME_MS
    with pytest.raises(UsageError, match=r"^now_ms "):
        relative.to_spec(now_ms=-1)


def test_records_validate_on_construction_naming_the_field() -> None:
    with pytest.raises(RecordError, match=r"^keys: must be a tuple") as info:
        RegisterRequest("op", "s", ["a"], deadline_ms=1)  # type: ignore[arg-type]
    assert info.value.field == "keys"
    with pytest.raises(RecordError, match=r"^count: must be an integer in \[1, 1\]"):
        RegisterRequest("op", "s", ("a",), Condition.COUNT, count=2, deadline_ms=1)
    with pytest.raises(RecordError, match=r"^scope: must be a non-empty string"):
        CancelRequest("op", "")
    with pytest.raises(RecordError, match=r"^payload: must be JSON text"):
        SignalRecord("s", "k", payload={"a": 1})  # type: ignore[arg-type]
    assert RegisterRequest("op", "s", (), deadline_ms=1, payload="null").payload is None
    assert RegisterRequest("op", "s", (), "all", deadline_ms=1).condition is Condition.ALL  # type: ignore[arg-type]
    timer = RegisterRequest("op", "s", (), deadline_ms=1, time_domain="event_time")  # type: ignore[arg-type]
    assert timer.time_domain is TimeDomain.EVENT_TIME


def test_encoders_name_what_cannot_be_written() -> None:
    with pytest.raises(RecordError, match=r"^payload: must be JSON text") as info:
        encode_signal(SignalRecord("s", "k", payload="{"))
    assert info.value.field == "payload"
    with pytest.raises(RecordError, match=r"^payload: must be JSON text without NaN"):
        encode_request(RegisterRequest("op", "s", (), deadline_ms=1, payload="[NaN]"))
    with pytest.raises(RecordError, match=r"^keys: must be valid Unicode"):
        encode_request(RegisterRequest("op", "s", ("\ud800",), deadline_ms=1))
    with pytest.raises(UsageError, match=r"^record must be"):
        encode_request(SignalRecord("s", "k"))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"^record must be"):
        encode_signal(CancelRequest("op", "s"))  # type: ignore[arg-type]


def test_encoding_writes_the_canonical_payload() -> None:
    record = SignalRecord("s", "k", 5, '{ "b" : [1, 2.50] }')
    assert encode_signal(record) == (
        b'{"v":1,"type":"signal","scope":"s","key":"k","event_time_ms":5,"payload":{"b":[1,2.5]}}'
    )
    assert canonical_json({"ü": [1, None]}) == '{"ü":[1,null]}'
    with pytest.raises(UsageError, match=r"^value must be plain JSON"):
        canonical_json(float("nan"))


def test_record_error_carries_field_and_reason_through_pickle() -> None:
    error = RecordError("keys[2]", "must be a non-empty string of at most 512 UTF-8 bytes")
    again = pickle.loads(pickle.dumps(error))
    assert (again.field, again.reason, str(again)) == (error.field, error.reason, str(error))
    assert str(RecordError(None, "not valid JSON")) == "(record): not valid JSON"


def test_limits_are_validated_naming_the_field() -> None:
    for name in (
        "max_keys_per_operation",
        "max_key_bytes",
        "max_scope_bytes",
        "max_op_id_bytes",
        "max_payload_bytes",
        "max_record_bytes",
    ):
        for bad in (0, True, "5"):
            with pytest.raises(UsageError, match=f"^{name} "):
                Limits(**{name: bad})  # type: ignore[arg-type]
