"""The decoders' fast path builds exactly what the full decoders build, or declines."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from purgatory._codec import (
    FORMAT_VERSION,
    CancelRequest,
    Limits,
    RecordError,
    RegisterRequest,
    Request,
    SignalInput,
    _fastpath,
    decode_request,
    decode_requests_record,
    decode_signal,
    encode_request,
    encode_signal,
)
from purgatory._codec._fastpath import fast_request, fast_signal
from purgatory._codec._inbound import (
    _REQUEST_TYPES,
    _REQUESTS_TOPIC_TYPES,
    _SIGNAL_TYPES,
    full_request,
    full_requests_record,
    full_signal,
)
from purgatory._core import MAX_TIME_MS
from tests.codec._strategies import requests, signal_inputs, watermarks
from tests.codec.test_bad_input import CASES, REQ, SIG

Decoder = Callable[[Any, Limits], object]

# name: (the public decoder, its fast path, its full path)
PATHS: dict[str, tuple[Decoder, Decoder, Decoder]] = {
    "signal": (decode_signal, partial(fast_signal, types=_SIGNAL_TYPES), full_signal),
    "request": (decode_request, partial(fast_request, types=_REQUEST_TYPES), full_request),
    "requests_record": (
        decode_requests_record,
        partial(fast_request, types=_REQUESTS_TOPIC_TYPES),
        full_requests_record,
    ),
}
TINY = Limits(
    max_keys_per_operation=2,
    max_key_bytes=3,
    max_scope_bytes=3,
    max_op_id_bytes=3,
    max_payload_bytes=6,
    max_record_bytes=120,
)
SHAPES = {
    "signal": ("scope", "key", "event_time_ms", "payload"),
    "watermark": ("scope", "watermark_ms"),
    "cancel": ("op_id", "scope"),
    "register": (
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
    ),
}
REQUIRED = frozenset(("v", "type", "op_id", "scope", "key", "keys", "watermark_ms"))
FIELDS = sorted({"v", "type", "colour", *(name for shape in SHAPES.values() for name in shape)})


def outcome(decode: Decoder, data: object, limits: Limits) -> tuple[object, ...]:
    """A decoder's answer, comparable: the record's type and repr, or the error."""
    try:
        record = decode(data, limits)
    except RecordError as e:
        return ("error", e.field, str(e))
    return ("record", type(record), repr(record))  # repr tells an enum from its str value


def _array(items: list[str], spaced: bool) -> str:
    return "[" + (", " if spaced else ",").join(items) + "]"


def _object(pairs: list[tuple[str, str]], spaced: bool) -> str:
    colon, comma = (": ", ", ") if spaced else (":", ",")
    return "{" + comma.join(f"{name}{colon}{value}" for name, value in pairs) + "}"


def _quote(text: str, ascii_only: bool) -> str:
    return json.dumps(text, ensure_ascii=ascii_only)


# JSON text, built by hand so that it can repeat names, hold ":" in strings, escape, space.
chars = st.sampled_from('ak:é"\\\t') | st.characters(codec="utf-8")
strings = st.builds(_quote, st.text(chars, max_size=6), st.booleans()) | st.just('"\\ud800"')
scalars = strings | st.integers().map(str) | st.floats().map(json.dumps)
scalars |= st.sampled_from(["null", "true", "false", "-0", "1.0", "1e2", str(MAX_TIME_MS + 1)])
names = st.sampled_from(['"a"', '"a:b"', '":"', '"\\u0061"']) | strings
json_texts = st.recursive(
    scalars,
    lambda inner: (
        st.builds(_array, st.lists(inner, max_size=3), st.booleans())
        | st.builds(_object, st.lists(st.tuples(names, inner), max_size=3), st.booleans())
    ),
    max_leaves=8,
)
# For each field: values that are right (for some record), and values that are nearly right.
texts = st.builds(_quote, st.text(st.sampled_from("ak:é/"), min_size=1, max_size=4), st.booleans())
texts |= st.sampled_from(['"\\u003a"', '"k\\u003a"'])  # a ":" that is not one in the text
times = st.sampled_from([0, 1, 5, MAX_TIME_MS]).map(str)
bad_times = st.sampled_from([-1, MAX_TIME_MS + 1, 1.0, "1", True]).map(json.dumps)
GOOD: dict[str, st.SearchStrategy[str]] = {
    "v": st.just("1"),
    "op_id": texts,
    "scope": texts,
    "key": texts,
    "keys": st.builds(_array, st.lists(texts, max_size=3, unique=True), st.booleans()),
    "condition": st.sampled_from(['"all"', '"any"', '"count"']),
    "count": st.sampled_from(["1", "2"]),
    "deadline_ms": times,
    "timeout_ms": times,
    "event_time_ms": times,
    "watermark_ms": times,
    "time_domain": st.sampled_from(['"processing_time"', '"event_time"']),
    "payload": json_texts,
    "reply_to": st.sampled_from(['"callbacks"', '"a.b-c_1"', '"..."']),
    "colour": json_texts,
}
BAD: dict[str, st.SearchStrategy[str]] = {
    "v": st.sampled_from(["2", "1.0", "true", '"1"', "null"]),
    "op_id": st.sampled_from(['""', "null", "7", '"\\ud800"', '"abcdefgh"']),
    "keys": st.sampled_from(['["a","a"]', '["a",""]', '["a",1]', '"a"', "{}", '["a","b","c"]']),
    "condition": st.sampled_from(['"most"', '["all"]', '"ALL"', "null"]),
    "count": st.sampled_from(["0", "3", "true", "1.0", "null"]),
    "time_domain": st.sampled_from(['"wall_clock"', "null", "1"]),
    "reply_to": st.sampled_from(['".."', '"a b"', '""', "null", '"€"', json.dumps("a" * 250)]),
}
BAD["scope"] = BAD["key"] = BAD["op_id"]
BAD["payload"] = BAD["colour"] = json_texts
for _name in ("deadline_ms", "timeout_ms", "event_time_ms", "watermark_ms"):
    BAD[_name] = bad_times


@st.composite
def record_bytes(draw: st.DrawFn) -> bytes:
    """Bytes that are mostly a record of some type, often valid, often wrong in one way."""
    kind = draw(st.sampled_from(sorted(SHAPES)))
    shape = ("v", "type", *SHAPES[kind])
    fields = [n for n in shape if draw(st.integers(0, 15)) > (0 if n in REQUIRED else 7)]
    if draw(st.integers(0, 7)) == 0:
        fields.append(draw(st.sampled_from(FIELDS)))  # repeated, unknown or of another type
    pairs = []
    for name in draw(st.permutations(fields)):
        choice = draw(st.integers(0, 31))
        if choice == 0:
            value = draw(json_texts)
        elif name == "type":
            value = json.dumps(kind if choice > 2 else draw(st.sampled_from(["signal", "x"])))
        else:
            value = draw(BAD[name] if choice < 3 else GOOD[name])
        pairs.append((json.dumps(name, ensure_ascii=False), value))
    text = _object(pairs, spaced=draw(st.booleans()))
    data = text.encode()
    mutation = draw(st.integers(0, 15))
    if mutation == 1:
        data = b" " + data
    elif mutation == 2:
        data += b"\n"
    elif mutation == 3:
        data = data[: draw(st.integers(0, len(data)))]
    elif mutation == 4:
        at = draw(st.integers(0, len(data)))
        data = data[:at] + b"\xff" + data[at:]
    elif mutation == 5:
        data += draw(st.sampled_from([b"x", b"{}", b" 1", b"]"]))
    return data


def _value(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


@st.composite
def mutated_records(draw: st.DrawFn) -> bytes:
    """A valid record's bytes, as written by the encoder, changed in at most one way."""
    record = draw(requests | signal_inputs)
    if isinstance(record, RegisterRequest | CancelRequest):
        obj = json.loads(encode_request(record))
    else:
        obj = json.loads(encode_signal(record))
    pairs = [(_value(name), _value(value)) for name, value in obj.items()]
    name = draw(st.sampled_from([*obj, *obj, *FIELDS]))
    mutation = draw(st.sampled_from(["none", "set", "set", "set", "drop", "repeat", "space"]))
    value = draw(BAD[name] | BAD[name] | GOOD[name] | json_texts) if name != "type" else "1"
    if name == "type":
        value = draw(st.sampled_from(['"signal"', '"watermark"', '"register"', '"cancel"']))
    if mutation == "set":
        pairs = [(n, v) for n, v in pairs if n != _value(name)] + [(_value(name), value)]
        pairs = draw(st.permutations(pairs))
    elif mutation == "drop":
        pairs = [(n, v) for n, v in pairs if n != _value(name)]
    elif mutation == "repeat":
        at = draw(st.integers(0, len(pairs)))
        pairs.insert(at, (draw(st.sampled_from([_value(name), json.dumps(name)])), value))
    return _object(pairs, spaced=mutation == "space").encode()


@settings(max_examples=1000)
@given(
    data=record_bytes() | mutated_records(),
    limits=st.sampled_from([Limits(), Limits(max_key_bytes=8, max_payload_bytes=20), TINY]),
)
@example(data=b'{"v":1,"type":"signal","scope":"s","key":"k","key":"k"}', limits=Limits())
@example(
    data=b'{"v":1,"type":"signal","scope":"a:","key":"k","payload":{"x":1,"x":2}}', limits=Limits()
)
@example(data=b'{"v":1,"type":"cancel","op_id":":","scope":"s","op\\u005fid":"a"}', limits=Limits())
@example(data=b'{"v":1,"type":"signal","scope":"\\u003a","key":"k","key":"k"}', limits=Limits())
@example(data=b'{"v":1,"type":"signal","scope":"s","key":"k"}{}', limits=Limits())
def test_the_fast_path_builds_the_full_paths_record_or_declines(
    data: bytes, limits: Limits
) -> None:
    for public, fast, full in PATHS.values():
        expected = outcome(full, data, limits)
        record = fast(data, limits)
        if record is not None:
            assert ("record", type(record), repr(record)) == expected
        elif data == data.strip():  # the fast path declines only whitespace around a record
            assert expected[0] == "error"
        assert outcome(public, data, limits) == expected


_REGISTER = {"v": 1, "type": "register", "op_id": "op", "scope": "s", "keys": ["a", "b"]}
REGISTER = {**_REGISTER, "deadline_ms": 5}
SIGNAL = {"v": 1, "type": "signal", "scope": "s", "key": "k"}
WATERMARK = {"v": 1, "type": "watermark", "scope": "s", "watermark_ms": 5}
CANCEL = {"v": 1, "type": "cancel", "op_id": "op", "scope": "s"}
PAYLOADS: tuple[object, ...] = (None, "null", 0, [], {"a": None}, {"a:": ":"})
# Records on either side of each rule and limit the fast path checks.
EDGES: list[dict[str, object]] = [
    *({**REGISTER, "keys": keys} for keys in (["a", "a"], ["a", ""], ["a", 1], "a", ["a"] * 1001)),
    *({**REGISTER, "keys": [f"k{i}" for i in range(n)]} for n in (0, 1000)),
    {**REGISTER, "keys": ["a:b", ":", "::"], "op_id": "o:p", "scope": ":"},
    *({**REGISTER, "condition": "count", "count": n} for n in (0, 1, 2, 3, True, None)),
    {**REGISTER, "condition": "count"},
    {**REGISTER, "count": 1},
    {**REGISTER, "condition": None},
    *({**REGISTER, "keys": [], "condition": c} for c in ("all", "any", "count")),
    *({**REGISTER, "deadline_ms": t} for t in (0, MAX_TIME_MS, MAX_TIME_MS + 1, -1, True, 1.0)),
    _REGISTER,
    {**_REGISTER, "timeout_ms": 5},
    {**_REGISTER, "timeout_ms": 5, "time_domain": "event_time"},
    {**_REGISTER, "timeout_ms": None},
    {**REGISTER, "timeout_ms": 5},
    {**REGISTER, "time_domain": "event_time"},
    {**REGISTER, "time_domain": None},
    *({**REGISTER, "reply_to": t} for t in (".", "..", "...", "a" * 249, "a" * 250, "a b", "é")),
    {**REGISTER, "reply_to": None},
    *({**REGISTER, "payload": p} for p in PAYLOADS),
    *({**SIGNAL, "event_time_ms": t} for t in (None, 0, MAX_TIME_MS, MAX_TIME_MS + 1, -1, True)),
    *({**SIGNAL, "v": v} for v in (True, 1.0, 2, None)),
    {**SIGNAL, "type": "watermark"},
    {**SIGNAL, "key": None},
    *({**SIGNAL, "key": k} for k in ("k" * 512, "k" * 513, "é" * 256, "é" * 257, "\ud800")),
    *({**WATERMARK, "watermark_ms": t} for t in (-1, 0, MAX_TIME_MS, MAX_TIME_MS + 1, None)),
    {**WATERMARK, "key": "k"},
    *({**CANCEL, "op_id": o} for o in ("o" * 256, "o" * 257, "é" * 128, "é" * 129)),
    {**CANCEL, "scope": None},
    {**CANCEL, "keys": []},
]


@pytest.mark.parametrize("record", EDGES, ids=[str(i) for i in range(len(EDGES))])
@pytest.mark.parametrize("ascii_only", [False, True])
def test_the_fast_path_keeps_to_each_rule_and_limit(
    record: dict[str, object], ascii_only: bool
) -> None:
    text = json.dumps(record, ensure_ascii=ascii_only, separators=(",", ":"))
    data = text.encode("utf-8", "surrogatepass")
    for public, fast, full in PATHS.values():
        expected = outcome(full, data, Limits())
        fast_record = fast(data, Limits())
        assert expected[0] == "error" or fast_record is not None
        if fast_record is not None:
            assert ("record", type(fast_record), repr(fast_record)) == expected
        assert outcome(public, data, Limits()) == expected


@pytest.mark.parametrize(
    ("decoder", "data", "limits"),
    [case[:3] for case in CASES if isinstance(case[1], bytes) and case[0] in (REQ, SIG)],
)
def test_every_bad_record_in_the_table_is_left_to_the_full_path(
    decoder: str, data: bytes, limits: Limits
) -> None:
    if decoder == SIG:
        assert fast_signal(data, limits, _SIGNAL_TYPES) is None
    else:
        assert fast_request(data, limits, _REQUEST_TYPES) is None
        assert fast_request(data, limits, _REQUESTS_TOPIC_TYPES) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b'{"v":1,"type":"signal","scope":"s","key":"k","key":"k"}', '"key"'),
        (b'{"v":1,"type":"signal","scope":"a:b","key":"k","payload":{"x":":","x":1}}', '"x"'),
        (b'{"v":1,"type":"signal","scope":"s","key":"k","payload":[{"":0,"":0}]}', '""'),
        (b'{"v":1,"type":"signal","scope":"s","key":"k","k\\u0065y":"k"}', '"key"'),
    ],
)
def test_a_repeated_name_is_never_taken_by_the_fast_path(data: bytes, message: str) -> None:
    assert fast_signal(data, Limits(), _SIGNAL_TYPES) is None
    with pytest.raises(RecordError, match=f"^\\(record\\): repeats the name {message} in one"):
        decode_signal(data)


def _producers(obj: object) -> list[bytes]:
    """The bytes of our encoder, and of ``json.dumps`` as other producers call it."""
    return [
        json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode(),
        json.dumps(obj).encode(),
    ]


@given(record=requests)
def test_the_fast_path_takes_every_valid_request(record: Request) -> None:
    for data in _producers(json.loads(encode_request(record))):
        assert repr(fast_request(data, Limits(), _REQUEST_TYPES)) == repr(record)
        assert repr(fast_request(data, Limits(), _REQUESTS_TOPIC_TYPES)) == repr(record)


@given(record=signal_inputs)
def test_the_fast_path_takes_every_valid_signal_and_watermark(record: SignalInput) -> None:
    for data in _producers(json.loads(encode_signal(record))):
        assert repr(fast_signal(data, Limits(), _SIGNAL_TYPES)) == repr(record)


@given(record=watermarks)
def test_the_fast_path_leaves_a_watermark_request_to_the_full_path(record: SignalInput) -> None:
    assert fast_request(encode_signal(record), Limits(), _REQUEST_TYPES) is None


def test_the_fast_path_reads_the_same_format_version() -> None:
    assert _fastpath._FORMAT_VERSION == FORMAT_VERSION
