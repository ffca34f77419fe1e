"""JSON in and out, strictly (codec concept: the wire syntax; stdlib only).

Parsing is stricter than :func:`json.loads`: the bytes must be UTF-8 (not UTF-16 or 32), an
object may not repeat a name (the last one would silently win), and the size and the nesting
depth are checked before anything is parsed. ``NaN`` and ``Infinity`` parse, so that the field
holding them can be named, and are then rejected by the field's check: no field accepts a float.
Every path in (Kafka records and HTTP bodies alike) parses with :func:`parse_json`, so they
accept and refuse the same texts.

Depth. Arrays and objects nest at most :data:`MAX_DEPTH` (64) levels in any text parsed, and a
payload at most :data:`MAX_PAYLOAD_DEPTH` (60) levels of its own, so that every text that
carries a payload stays within :data:`MAX_DEPTH`: a Kafka record adds one level around it, a
callback two (its ``signals`` object), an HTTP batch body three (body, list, item). The depth is
measured on the text, in linear time and without recursion (strings removed, then the brackets
still open counted), before the recursive parser ever sees it: a text nested a thousand deep is
an error that names it, never a ``RecursionError``.

A payload is kept as its *canonical* text, the core's compact :func:`dumps` (no spaces, UTF-8
text): the same JSON value always gives the same text, whatever spacing it
arrived with, so it can be stored, compared and spliced back into an outgoing record as is.

:func:`scan_record` is the decoders' cheap first try (see ``_fastpath``): the C scanner alone,
without a hook per object, on the record as Kafka usually carries it. Repeated names are then
found by counting: in JSON text without a backslash every string is its own literal text, so
each ``:`` is either inside a string or separates one object member; the text's ``:`` count
equals the decoded value's members plus the ``:`` in its strings exactly when no member was
dropped by a repeated name. The caller, who knows the record's strings, makes that comparison.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import accumulate
from json.scanner import make_scanner
from typing import Any

from purgatory._codec._records import RecordError
from purgatory._core import UsageError
from purgatory._core._compact import dumps

__all__ = [
    "MAX_DEPTH",
    "MAX_PAYLOAD_DEPTH",
    "MISSING",
    "canonical_json",
    "dumps",
    "encode_text",
    "json_type",
    "nesting",
    "parse_json",
    "parse_object",
    "payload_text",
    "payload_value",
    "scan_record",
    "show",
]

MISSING: Any = object()
#: How deep arrays and objects may nest in a text the codec parses (a record, an HTTP body).
MAX_DEPTH = 64
#: How deep a payload's own arrays and objects may nest (see the module docstring).
MAX_PAYLOAD_DEPTH = MAX_DEPTH - 4
_TOO_DEEP = (
    f"not valid JSON (nested too deeply): more than {MAX_DEPTH} levels of arrays and objects"
)
_JSON_TYPES = {dict: "object", list: "array", str: "string", int: "number", float: "number"}


class _DuplicateNameError(ValueError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


def _unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _DuplicateNameError(name)
            seen.add(name)
    return obj


_DECODER = json.JSONDecoder(object_pairs_hook=_unique_object)
_SCAN_UNIQUE = make_scanner(_DECODER)  # type: ignore[arg-type]  # the stub wants a scanner
_SCAN = make_scanner(json.JSONDecoder())  # type: ignore[arg-type]


# Every byte but the five that shape nesting (the quote and the four brackets) is dropped, and
# objects' braces are read as brackets: only how deep they nest matters here.
_NOT_SHAPE = bytes(b for b in range(256) if b not in b'"[]{}')
_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_STEP = [0] * 256
_STEP[ord("[")], _STEP[ord("]")] = 1, -1


def _shape(text: str | bytes) -> bytes:
    """The brackets of ``text`` outside strings, braces read as brackets."""
    data = text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text
    # An escaped backslash, then an escaped quote, are the only escapes that could hide where
    # a string ends (UTF-8 never puts an ASCII byte inside a multi-byte character). Without
    # them, every quote left opens or closes a string, so the pieces between quotes alternate
    # outside and inside strings.
    kept = data.replace(b"\\\\", b"").replace(b'\\"', b"").translate(_AS_BRACKETS, _NOT_SHAPE)
    return b"".join(kept.split(b'"')[::2])


def nesting(text: str | bytes) -> int:
    """How deep the arrays and objects of JSON ``text`` nest: 0 for a scalar, 1 for ``[]``.

    The most brackets open at once outside strings, in linear time and without recursion. On
    text that is not JSON it still counts what opens, so ``[[[[`` (never closed) is 4 deep.
    """
    return max(accumulate(map(_STEP.__getitem__, _shape(text))), default=0)


def _deeper_than(text: str | bytes, limit: int) -> bool:
    """Whether ``text`` nests more than ``limit`` deep; :func:`nesting`, but quicker."""
    if isinstance(text, str):
        brackets = text.count("[") + text.count("{")
    else:
        brackets = text.count(b"[") + text.count(b"{")
    if brackets <= limit:  # a cheap bound: most texts have too few brackets to be deep at all
        return False
    shape = _shape(text)
    for _ in range(limit):
        # Each pass removes the innermost pairs, one level (replace does not look again at
        # the pairs its removals make), so balanced text of depth d is gone after d passes.
        if not shape:
            return False
        shorter = shape.replace(b"[]", b"")
        if len(shorter) == len(shape):
            break  # unbalanced: not JSON, measured exactly below
        shape = shorter
    return bool(shape) and nesting(text) > limit


def json_type(value: object) -> str:
    """The JSON name of ``value``'s type, for error messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def show(value: object, limit: int = 40) -> str:
    """``value`` as short JSON text, for error messages."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_json(data: bytes | bytearray | memoryview, max_bytes: int) -> object:
    """Parse JSON text strictly: UTF-8 only, no repeated name in an object, at most
    ``max_bytes`` bytes and :data:`MAX_DEPTH` levels deep.

    Raises:
        RecordError: with ``field`` None, saying what is wrong with the text.
    """
    size = len(data) if not isinstance(data, memoryview) else data.nbytes
    if size > max_bytes:
        raise RecordError(None, f"{size} bytes is over the limit of {max_bytes} bytes")
    raw = bytes(data)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise RecordError(None, f"not valid UTF-8 (at byte {e.start})") from None
    if _deeper_than(raw, MAX_DEPTH):
        raise RecordError(None, _TOO_DEEP)
    try:
        return _DECODER.decode(text)
    except _DuplicateNameError as e:
        raise RecordError(None, f"repeats the name {show(e.name)} in one JSON object") from None
    except json.JSONDecodeError as e:
        raise RecordError(None, f"not valid JSON ({e})") from None
    except ValueError as e:  # an integer of more than 4300 digits
        raise RecordError(None, f"not valid JSON ({e})") from None
    except RecursionError:  # pragma: no cover - the depth was checked: a backstop only
        raise RecordError(None, _TOO_DEEP) from None


def parse_object(data: object, max_record_bytes: int) -> Mapping[str, object]:
    """Parse one record: bytes (UTF-8 JSON, see :func:`parse_json`) or an already-parsed JSON
    object.

    Raises:
        RecordError: with ``field`` None when the bytes are too long, not UTF-8, not JSON,
            nested too deeply, or not an object.
    """
    if isinstance(data, bytes | bytearray | memoryview):
        obj = parse_json(data, max_record_bytes)
    elif isinstance(data, Mapping):
        obj = data
        for name in obj:
            if not isinstance(name, str):
                raise RecordError(None, f"field names must be strings, got {name!r}")
    else:
        raise RecordError(None, f"expected bytes or a JSON object, got {type(data).__name__}")
    if not isinstance(obj, Mapping):
        raise RecordError(None, f"expected a JSON object, got {json_type(obj)}")
    return obj


def scan_record(data: object, max_record_bytes: int) -> tuple[dict[str, Any], int | None] | None:
    """The JSON object of a usual record, cheaply; or None to leave it to :func:`parse_object`.

    Takes only bytes of UTF-8 JSON text that is one object with no whitespace around it. Never
    raises: a record it cannot vouch for is None, and :func:`parse_object` says what is wrong.

    Returns:
        The object, and the number of ``:`` in the text: the caller must check that it is
        ``len(obj)`` plus the ``:`` in the canonical text of every value (the names, known
        fields, hold none; see the module docstring), else a member was dropped by a repeated
        name. None instead of a number when the text holds a backslash: then repeated names
        were checked while parsing.
    """
    if type(data) is not bytes or len(data) > max_record_bytes:
        return None
    try:
        text = data.decode("utf-8")
        if _deeper_than(data, MAX_DEPTH):
            return None
        if "\\" in text:
            obj, end = _SCAN_UNIQUE(text, 0)
            colons = None
        else:
            obj, end = _SCAN(text, 0)
            colons = text.count(":")
    except (ValueError, StopIteration, RecursionError):  # UnicodeDecodeError is a ValueError
        return None
    if end != len(text) or type(obj) is not dict:
        return None
    return obj, colons


def canonical_json(value: object) -> str:
    """The canonical compact JSON text of a JSON value: what payloads are stored as.

    Raises:
        UsageError: if ``value`` is not plain JSON (NaN, Infinity, a set, ...).
    """
    try:
        return dumps(value)
    except (ValueError, TypeError, RecursionError) as e:
        raise UsageError(f"value must be plain JSON: {e}") from None


def payload_text(field: str, value: object, max_bytes: int | None) -> str | None:
    """The canonical text of a payload value, None for JSON null.

    Raises:
        RecordError: naming ``field`` if the value is not plain JSON (NaN, Infinity, lone
            surrogates, non-JSON objects) or its text is over ``max_bytes`` UTF-8 bytes.
    """
    if value is None:
        return None
    try:
        text = dumps(value)
    except ValueError:
        raise RecordError(field, "must be JSON without NaN or Infinity") from None
    except TypeError:
        raise RecordError(field, "must be a JSON value") from None
    except RecursionError:
        raise RecordError(field, "is nested too deeply") from None
    if _deeper_than(text, MAX_PAYLOAD_DEPTH):
        raise RecordError(
            field,
            f"is nested too deeply: more than {MAX_PAYLOAD_DEPTH} levels of arrays and objects",
        )
    if max_bytes is not None:
        if text.isascii():
            size = len(text)
        else:
            try:
                size = len(text.encode("utf-8"))
            except UnicodeEncodeError:
                raise RecordError(field, "must be valid Unicode (no lone surrogates)") from None
        if size > max_bytes:
            raise RecordError(field, f"at most {max_bytes} bytes of JSON, got {size}")
    return text


def _no_constant(name: str) -> object:
    raise ValueError(name)


def payload_value(field: str, text: str) -> object:
    """Parse stored payload text back to a value (for encoders of client records).

    Raises:
        RecordError: naming ``field`` if ``text`` is not JSON.
    """
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError:
        raise RecordError(field, "must be JSON text without NaN or Infinity") from None
    except RecursionError:
        raise RecordError(field, "is nested too deeply") from None


def encode_text(text: str, record: Mapping[str, object]) -> bytes:
    """``text`` as UTF-8, naming the field of ``record`` that holds a lone surrogate if any."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        for name, value in record.items():
            try:
                dumps(value).encode("utf-8")
            except UnicodeEncodeError:
                field = name
                break
        else:  # pragma: no cover - the text came from these values
            field = None
        raise RecordError(field, "must be valid Unicode (no lone surrogates)") from None
