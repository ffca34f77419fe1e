"""Dead letters fit the record limit whatever they wrap, and say how to match what they cut.

A letter that outgrows its record is refused by the broker and the refused input vanishes with
it, so the bound is checked for keys, values, reasons and fields several times the limit, in the
forms that grow the most when written: bytes that are not UTF-8 (base64), and control
characters, quotes and backslashes (JSON escapes, up to six bytes each).
"""

from __future__ import annotations

import base64
import json
from hashlib import sha256
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from purgatory._codec import (
    DEAD_LETTER_KEY_BYTES,
    dead_letter_budget,
    dead_letter_key,
    encode_dead_letter,
)
from purgatory._core import UsageError

# Pieces that grow the most when written, repeated up to several times the largest limit drawn.
_BYTES_PIECES = st.sampled_from([b"\xff", b"\x00", b'"', b"\\", b"\xe2\x82\xac", b"a", b"\x1f\xc3"])
_TEXT_PIECES = st.sampled_from(["\x00", '"', "\\", "\ud800", "€", "𝄞", "a", "\n"])
_LIMITS = st.integers(1_024, 16_384)


@st.composite
def _big_bytes(draw: st.DrawFn) -> bytes | None:
    if draw(st.integers(0, 9)) == 0:
        return None
    pieces = draw(st.lists(_BYTES_PIECES, min_size=1, max_size=4))
    times = draw(st.integers(0, 70_000))
    return (b"".join(pieces) * times)[: draw(st.integers(0, 70_000))] + draw(st.binary(max_size=8))


@st.composite
def _big_text(draw: st.DrawFn) -> str:
    pieces = draw(st.lists(_TEXT_PIECES, min_size=1, max_size=4))
    return ("".join(pieces) * draw(st.integers(0, 20_000))) + draw(st.text(max_size=8))


_letters = st.fixed_dictionaries(
    {
        "reason": _big_text(),
        "field": st.none() | _big_text(),
        "topic": st.just("t") | _big_text().map(lambda t: t or "t"),
        "partition": st.integers(-1, 2**31 - 1),
        "offset": st.integers(-1, 2**63 - 1),
        "timestamp_ms": st.none() | st.integers(-1, 2**63 - 1),
        "key": _big_bytes(),
        "value": _big_bytes(),
    }
)


def _kept(letter: dict[str, Any], name: str) -> bytes:
    text = letter[name]
    encoding = letter.get(f"{name}_encoding", "utf-8")
    return base64.b64decode(text) if encoding == "base64" else text.encode()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_letters, _LIMITS, st.none() | st.text(max_size=8) | _big_text())
def test_a_letter_fits_the_record_limit_and_carries_the_sizes_and_hashes(
    args: dict[str, Any], limit: int, scope: str | None
) -> None:
    key_bytes = dead_letter_key(scope, args["key"], max_record_bytes=limit)
    value = encode_dead_letter(**args, max_record_bytes=limit)
    whole, bound = dead_letter_budget(limit)
    assert len(key_bytes or b"") <= bound <= DEAD_LETTER_KEY_BYTES
    assert len(key_bytes or b"") + len(value) <= whole < limit  # with margin

    letter = json.loads(value.decode("utf-8"))
    assert (letter["v"], letter["type"]) == (1, "dead_letter")
    for name, flag in (("key", "key_truncated"), ("value", "truncated")):
        original = args[name]
        if original is None:
            assert letter[name] is None and letter[f"{name}_bytes"] is None
            assert letter[f"{name}_sha256"] is None and letter[flag] is False
            continue
        assert letter[f"{name}_bytes"] == len(original)
        assert letter[f"{name}_sha256"] == sha256(original).hexdigest()
        kept = _kept(letter, name)
        assert original.startswith(kept)
        assert letter[flag] == (len(kept) < len(original))
    assert (
        args["reason"]
        .encode("utf-8", "replace")
        .startswith(letter["reason"].encode("utf-8", "replace"))
    )
    assert (letter["partition"], letter["offset"]) == (args["partition"], args["offset"])


@given(st.none() | st.text(max_size=40), st.none() | st.binary(max_size=2_000), _LIMITS)
def test_the_letter_key_is_the_scope_else_the_key_and_a_hash_when_long(
    scope: str | None, key: bytes | None, limit: int
) -> None:
    chosen = key if scope is None else scope.encode("utf-8", "surrogatepass")
    letter_key = dead_letter_key(scope, key, max_record_bytes=limit)
    _, bound = dead_letter_budget(limit)
    if chosen is None:
        assert letter_key is None
    elif len(chosen) <= bound:
        assert letter_key == chosen
    else:
        assert letter_key == sha256(chosen).hexdigest().encode()


def test_a_700_kb_key_that_is_not_utf8_keeps_its_size_and_hash_and_a_bounded_prefix() -> None:
    key = b"\xff\xfe" * 350_000
    value = b'{"v":1,"type":"register","scope":"s","op_id":"o","keys":[],"timeout_ms":1}'
    letter_value = encode_dead_letter(
        reason="key: the message key must be the record's scope",
        field="key",
        topic="purgatory.requests",
        partition=0,
        offset=7,
        timestamp_ms=1,
        key=key,
        value=value,
    )
    letter_key = dead_letter_key("s", key)
    assert letter_key == b"s"
    assert dead_letter_key(None, key) == sha256(key).hexdigest().encode()
    assert len(letter_value) < 8_192  # 1 KiB of the key, as base64, and the rest
    letter = json.loads(letter_value)
    assert letter["key_encoding"] == "base64" and letter["key_truncated"] is True
    assert base64.b64decode(letter["key"]) == key[:1_024]
    assert (letter["key_bytes"], letter["key_sha256"]) == (700_000, sha256(key).hexdigest())
    assert letter["value"] == value.decode() and letter["truncated"] is False
    assert letter["value_sha256"] == sha256(value).hexdigest()


def test_the_smallest_limit_still_keeps_the_start_of_the_reason() -> None:
    letter = json.loads(
        encode_dead_letter(
            reason="key: " + "x" * 5_000,
            field="key",
            topic="purgatory.requests",
            partition=0,
            offset=0,
            timestamp_ms=None,
            key=b"k" * 5_000,
            value=b"v" * 5_000,
            max_record_bytes=1_024,
        )
    )
    assert letter["reason"].startswith("key: xxx")
    assert letter["key_bytes"] == letter["value_bytes"] == 5_000


@pytest.mark.parametrize("limit", [1_023, 0, True, 1.5])
def test_a_record_limit_below_1_kib_is_refused(limit: object) -> None:
    with pytest.raises(UsageError, match=r"^max_record_bytes "):
        dead_letter_budget(limit)  # type: ignore[arg-type]
