"""The JSON Schema files agree with the codec and document every field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

import jsonschema  # type: ignore[import-untyped, unused-ignore]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from purgatory._codec import (
    SCHEMA_NAMES,
    Limits,
    RecordError,
    Request,
    SignalInput,
    WatermarkRecord,
    decode_callback,
    decode_request,
    decode_signal,
    encode_callback,
    encode_dead_letter,
    encode_request,
    encode_signal,
    schema,
)
from purgatory._codec._inbound import _FIELDS
from purgatory._core import MAX_TIME_MS, Condition, Outcome, OutcomeKind, TimeDomain, UsageError
from tests.codec._strategies import dead_letter_args, outcomes, requests, signal_inputs, watermarks

DRAFT_2020_12 = "https://json-schema.org/draft/2020-12/schema"
_CONDITIONAL = {"if", "then", "else", "not"}  # constraints, not field definitions


def validator(name: str) -> Any:
    return jsonschema.Draft202012Validator(schema(name))


def walk_properties(node: object, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every field definition: each entry of a ``properties`` and each ``items`` of an array."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _CONDITIONAL or key == "allOf":
                continue
            if key == "properties":
                for name, definition in value.items():
                    yield f"{path}.{name}", definition
                    yield from walk_properties(definition, f"{path}.{name}")
            elif key in {"items", "additionalProperties"} and isinstance(value, dict):
                yield f"{path}[]", value
                yield from walk_properties(value, f"{path}[]")
            else:
                yield from walk_properties(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from walk_properties(item, f"{path}/{i}")


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_schema_file_is_a_valid_draft_2020_12_schema(name: str) -> None:
    document = schema(name)
    jsonschema.Draft202012Validator.check_schema(document)
    assert document["$schema"] == DRAFT_2020_12
    assert document["$id"] == f"urn:purgatory:schemas:{name}.v1"
    assert document["title"] and document["description"]
    assert "oneOf" in document


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_every_field_has_a_title_and_a_description(name: str) -> None:
    fields = list(walk_properties(schema(name)))
    assert len(fields) > 5
    for path, definition in fields:
        assert definition.get("title"), f"{name}{path} has no title"
        assert len(definition.get("description", "")) > 10, f"{name}{path} has no description"


@pytest.mark.parametrize("name", SCHEMA_NAMES)
def test_every_record_type_is_closed_and_documented(name: str) -> None:
    definitions = schema(name)["$defs"]
    assert isinstance(definitions, dict)
    for kind, definition in definitions.items():
        assert definition["additionalProperties"] is False, kind
        assert definition["title"] and definition["description"], kind
        assert definition["properties"]["type"]["const"] == kind
        assert definition["properties"]["v"]["const"] == 1
        assert set(definition["required"]) <= set(definition["properties"])


def test_schemas_name_the_fields_and_values_the_codec_knows() -> None:
    defs: dict[str, Any] = {}
    for name in ("request", "signal"):
        section: Any = schema(name)["$defs"]
        defs.update(section)
    for kind, fields in _FIELDS.items():
        assert set(defs[kind]["properties"]) == fields, kind
    register = defs["register"]["properties"]
    assert register["condition"]["enum"] == [c.value for c in Condition]
    assert register["time_domain"]["enum"] == [d.value for d in TimeDomain]
    assert register["deadline_ms"]["maximum"] == MAX_TIME_MS
    limits = Limits()
    assert register["keys"]["maxItems"] == limits.max_keys_per_operation
    assert register["keys"]["items"]["maxLength"] == limits.max_key_bytes
    assert register["scope"]["maxLength"] == limits.max_scope_bytes
    assert register["op_id"]["maxLength"] == limits.max_op_id_bytes
    callback: Any = schema("callback")["$defs"]
    assert callback["callback"]["properties"]["outcome"]["enum"] == [k.value for k in OutcomeKind]


def test_schema_files_ship_inside_the_package_and_load_fresh_copies() -> None:
    shipped = {p.name for p in files("purgatory").joinpath("schemas").iterdir()}
    assert shipped == {f"{name}.v1.schema.json" for name in SCHEMA_NAMES}
    first = schema("request")
    first.clear()
    assert schema("request")
    with pytest.raises(UsageError, match=r"^name must be one of callback, dead_letter"):
        schema("requests")


@given(requests)
def test_every_encoded_request_validates(record: Request) -> None:
    validator("request").validate(json.loads(encode_request(record)))


@given(watermarks)
def test_an_in_band_watermark_validates_as_a_requests_topic_record(record: WatermarkRecord) -> None:
    validator("request").validate(json.loads(encode_signal(record)))


@given(signal_inputs)
def test_every_encoded_signal_validates(record: SignalInput) -> None:
    validator("signal").validate(json.loads(encode_signal(record)))


@given(outcomes())
def test_every_encoded_callback_validates(outcome: Outcome) -> None:
    validator("callback").validate(json.loads(encode_callback(outcome)))


@given(dead_letter_args, st.sampled_from(["\ud800", "ok"]))
def test_every_encoded_dead_letter_validates(args: dict[str, Any], reason_tail: str) -> None:
    args["reason"] += reason_tail
    validator("dead_letter").validate(json.loads(encode_dead_letter(**args)))


_REGISTER: dict[str, object] = {
    "v": 1,
    "type": "register",
    "op_id": "nightly",
    "scope": "ingest@2026-11-22",
    "keys": ["ingest/orders", "ingest/users"],
    "deadline_ms": 1_000,
}
_SIGNAL: dict[str, object] = {"v": 1, "type": "signal", "scope": "s", "key": "k"}
_CALLBACK: dict[str, object] = json.loads(
    encode_callback(
        Outcome("op", "s", OutcomeKind.EXPIRED, 1, 2, 3, TimeDomain.PROCESSING_TIME, 1, (), ("a",))
    )
)
_GONE: Any = object()


def _with(base: dict[str, object], **changes: object) -> dict[str, object]:
    record = {**base, **changes}
    return {k: v for k, v in record.items() if v is not _GONE}


INVALID: list[tuple[str, dict[str, object]]] = [
    ("request", _with(_REGISTER, v=_GONE)),
    ("request", _with(_REGISTER, v=2)),
    ("request", _with(_REGISTER, type="unregister")),
    ("request", _with(_REGISTER, colour="red")),
    ("request", _with(_REGISTER, op_id="")),
    ("request", _with(_REGISTER, op_id="x" * 257)),
    ("request", _with(_REGISTER, scope=_GONE)),
    ("request", _with(_REGISTER, keys="a")),
    ("request", _with(_REGISTER, keys=["a", "a"])),
    ("request", _with(_REGISTER, keys=["a", ""])),
    ("request", _with(_REGISTER, keys=["k" * 513])),
    ("request", _with(_REGISTER, keys=[f"k{i}" for i in range(1001)])),
    ("request", _with(_REGISTER, deadline_ms=True)),
    ("request", _with(_REGISTER, deadline_ms=-1)),
    ("request", _with(_REGISTER, deadline_ms=MAX_TIME_MS + 1)),
    ("request", _with(_REGISTER, deadline_ms="5")),
    ("request", _with(_REGISTER, deadline_ms=1.5)),
    ("request", _with(_REGISTER, deadline_ms=_GONE)),
    ("request", _with(_REGISTER, timeout_ms=5)),
    ("request", _with(_REGISTER, deadline_ms=_GONE, timeout_ms=5, time_domain="event_time")),
    ("request", _with(_REGISTER, condition="most")),
    ("request", _with(_REGISTER, count=1)),
    ("request", _with(_REGISTER, condition="count")),
    ("request", _with(_REGISTER, condition="count", count=0)),
    ("request", _with(_REGISTER, keys=[], condition="any")),
    ("request", _with(_REGISTER, time_domain="wall")),
    ("request", _with(_REGISTER, reply_to="no spaces")),
    ("request", _with(_REGISTER, reply_to="..")),
    ("request", _with(_REGISTER, count=None)),
    ("request", {"v": 1, "type": "cancel", "op_id": "a", "scope": "s", "keys": []}),
    ("request", _SIGNAL),
    ("signal", _with(_SIGNAL, key=_GONE)),
    ("signal", _with(_SIGNAL, event_time_ms=False)),
    ("signal", _with(_SIGNAL, op_id="a")),
    ("signal", {"v": 1, "type": "watermark", "scope": "s"}),
    ("signal", {"v": 1, "type": "watermark", "scope": "s", "watermark_ms": -3}),
    ("signal", _REGISTER),
    ("callback", _with(_CALLBACK, late=_GONE)),
    ("callback", _with(_CALLBACK, late=0)),
    ("callback", _with(_CALLBACK, outcome="done")),
    ("callback", _with(_CALLBACK, sequence=0)),
    ("callback", _with(_CALLBACK, signals=[])),
    ("callback", _with(_CALLBACK, reply_to="t")),
    ("callback", _with(_CALLBACK, time_domain="wall")),
]

_DECODERS: dict[str, Any] = {
    "request": decode_request,
    "signal": decode_signal,
    "callback": decode_callback,
}


@pytest.mark.parametrize(
    ("name", "record"), INVALID, ids=[f"{n}-{i}" for i, (n, _) in enumerate(INVALID)]
)
def test_invalid_record_is_rejected_by_both_the_codec_and_the_schema(
    name: str, record: dict[str, object]
) -> None:
    assert not validator(name).is_valid(record)
    with pytest.raises(RecordError):
        _DECODERS[name](record)
    with pytest.raises(RecordError):
        _DECODERS[name](json.dumps(record).encode())


def test_the_valid_baselines_of_the_invalid_set_pass_both() -> None:
    for name, record in (("request", _REGISTER), ("signal", _SIGNAL), ("callback", _CALLBACK)):
        assert validator(name).is_valid(record)
        _DECODERS[name](record)


@pytest.mark.parametrize(
    "letter",
    [
        {"v": 1, "type": "dead_letter", "reason": "r"},
        json.loads(
            encode_dead_letter(
                reason="r",
                field=None,
                topic="t",
                partition=0,
                offset=0,
                timestamp_ms=None,
                key=b"k",
                value=b"v",
            )
        )
        | {"key_encoding": "utf-8"},
        json.loads(
            encode_dead_letter(
                reason="r",
                field=None,
                topic="t",
                partition=0,
                offset=0,
                timestamp_ms=None,
                key=None,
                value=None,
            )
        )
        | {"value_encoding": "hex"},
    ],
)
def test_schema_rejects_malformed_dead_letters(letter: dict[str, object]) -> None:
    assert not validator("dead_letter").is_valid(letter)
