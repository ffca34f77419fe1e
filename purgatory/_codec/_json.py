"""JSON in and out, strictly (codec concept: the wire syntax; stdlib only).

Parsing is stricter than :func:`json.loads`: the bytes must be UTF-8 (not UTF-16 or 32), an
object may not repeat a name (the last one would silently win), and the size is checked before
anything is parsed. ``NaN`` and ``Infinity`` parse, so that the field holding them can be named,
and are then rejected by the field's check: no field accepts a float.

A payload is kept as its *canonical* text, ``json.dumps(value, separators=(",", ":"),
ensure_ascii=False)``: the same JSON value always gives the same text, whatever spacing it
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
from collections.abc import Callable, Mapping
from json.scanner import make_scanner
from typing import Any

from purgatory._codec._records import RecordError
from purgatory._core import UsageError

__all__ = [
    "MISSING",
    "canonical_json",
    "dumps",
    "encode_text",
    "json_type",
    "parse_object",
    "payload_text",
    "payload_value",
    "scan_record",
    "show",
]

MISSING: Any = object()
_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False
)


def _make_dumps() -> Callable[[object], str]:
    # JSONEncoder.encode builds a new C encoder on every call, which costs more than the
    # encoding of a small payload; this one is built once, with the same arguments.
    try:
        from _json import encode_basestring, make_encoder  # noqa: PLC0415
    except ImportError:  # pragma: no cover - a Python without the C accelerator
        return _ENCODER.encode
    encode = make_encoder(
        None, _ENCODER.default, encode_basestring, None, ":", ",", False, False, False
    )

    def dumps(value: object) -> str:
        return "".join(encode(value, 0))

    return dumps


#: ``dumps(value) -> str``: canonical, compact JSON; one call of the C encoder.
dumps = _make_dumps()
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


def parse_object(data: object, max_record_bytes: int) -> Mapping[str, object]:
    """Parse one record: bytes (UTF-8 JSON) or an already-parsed JSON object.

    Raises:
        RecordError: with ``field`` None when the bytes are too long, not UTF-8, not JSON, or
            not an object.
    """
    if isinstance(data, bytes | bytearray | memoryview):
        size = len(data) if not isinstance(data, memoryview) else data.nbytes
        if size > max_record_bytes:
            raise RecordError(None, f"{size} bytes is over the limit of {max_record_bytes} bytes")
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as e:
            raise RecordError(None, f"not valid UTF-8 (at byte {e.start})") from None
        try:
            obj = _DECODER.decode(text)
        except _DuplicateNameError as e:
            raise RecordError(None, f"repeats the name {show(e.name)} in one JSON object") from None
        except json.JSONDecodeError as e:
            raise RecordError(None, f"not valid JSON ({e})") from None
        except ValueError as e:  # an integer of more than 4300 digits
            raise RecordError(None, f"not valid JSON ({e})") from None
        except RecursionError:
            raise RecordError(None, "not valid JSON (nested too deeply)") from None
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
