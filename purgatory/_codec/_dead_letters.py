"""The dead-letter topic (codec concept: one record kind; stdlib only).

A dead letter wraps a record the service refused (an input it could not read or apply, or a
callback the broker would not take) with the reason and where it came from. It must reach the
topic whatever the refused record holds: a letter the broker refuses as too large is a record
lost without a trace. So every letter, its own Kafka key included, is *bounded by construction*:

* **The letter's Kafka key** (:func:`dead_letter_key`) is the record's scope when it is known
  (it decoded), else the original key; either is kept as is up to :data:`DEAD_LETTER_KEY_BYTES`
  (512) bytes (less under a small limit: an eighth of the letter, at least 64), and a longer
  one is replaced by the 64 hex digits of its SHA-256. A null key without a known scope stays
  null. Letters of a scope thus share its partition, and a letter keyed by the hash of the
  original key carries the same hash as its ``key_sha256``.
* **The letter's value** (:func:`encode_dead_letter`) holds the original key and value only as
  *prefixes*: at most ``max_key_bytes`` (1 KiB) of the key and ``max_value_bytes`` (64 KiB) of
  the value by default, less when the record limit demands it. Beside each prefix it carries the
  original size and the SHA-256 of the whole original bytes, so an operator can match a letter
  with the record a producer sent (``sha256sum``) even when little of it is kept.
* **The whole letter** (Kafka key + value) is at most ``max_record_bytes`` less a margin of a
  quarter of it, at most 4 KiB (:func:`dead_letter_budget`): 1 MiB - 4 KiB by default, well
  under the producer's and the broker's limits with the record's own framing. Room for the
  longest Kafka key is set aside and the fixed fields are placed first; what remains goes, in
  this order and each up to its own cap, to the ``topic`` (256 bytes), the ``field`` (256), the
  ``reason`` (4 KiB), the key's prefix and the value's prefix, each cut to what its JSON text
  can hold (escapes and base64 counted). With the smallest limit (1 KiB) a letter still holds
  its sizes, hashes and the start of its reason.

The letter (``"v": 1``, ``"type": "dead_letter"``), in this order:

``reason``, ``field``, ``topic``, ``partition``, ``offset``, ``timestamp_ms``
    why, which field (or null), and where the record was read (-1 for the partition and offset
    of a callback, which was never read); the timestamp is null when the record had none.
``key``, ``key_encoding`` (only when ``base64``), ``key_bytes``, ``key_sha256``, ``key_truncated``
    the original key's prefix as UTF-8 text (or base64 when it is not UTF-8), its size in
    bytes, the hex SHA-256 of all of it, and whether the prefix is shorter than the key; all
    null (``key_truncated`` false) for a null key.
``value``, ``value_encoding``, ``value_bytes``, ``value_sha256``, ``truncated``
    the same for the original value (``value_encoding`` is always present: ``utf-8`` or
    ``base64``; ``truncated`` says the value was cut).

A prefix is cut at a character boundary when it is text, so a cut never turns UTF-8 into base64.
The ``reason``, ``field`` and ``topic`` are cut the same way when they outgrow their room (a
lone surrogate in them is written as ``?``).
The letter is the ``dead_letter`` schema of :func:`purgatory._codec.schema`.
"""

from __future__ import annotations

import base64
from hashlib import sha256
from json.encoder import encode_basestring as _str

from purgatory._codec._inbound import FORMAT_VERSION
from purgatory._codec._json import dumps
from purgatory._core import UsageError

__all__ = [
    "DEAD_LETTER_KEY_BYTES",
    "DEFAULT_MAX_DEAD_LETTER_KEY_BYTES",
    "DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES",
    "DEFAULT_MAX_RECORD_BYTES",
    "dead_letter_budget",
    "dead_letter_key",
    "encode_dead_letter",
]

#: How much of a refused record's value a dead letter keeps by default (the rest is cut off).
DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES = 65_536
#: How much of a refused record's key a dead letter keeps by default.
DEFAULT_MAX_DEAD_LETTER_KEY_BYTES = 1_024
#: The longest scope or key a letter takes as its own Kafka key; a longer one is hashed.
DEAD_LETTER_KEY_BYTES = 512
#: The record limit letters are bounded by unless told (the service's default).
DEFAULT_MAX_RECORD_BYTES = 1_048_576
_MIN_RECORD_BYTES = 1_024  # the smallest limit the service accepts
_MAX_MARGIN_BYTES = 4_096
_HASH_KEY_BYTES = 64  # a SHA-256 in hex
_TOPIC_JSON_BYTES = 256
_FIELD_JSON_BYTES = 256
_REASON_JSON_BYTES = 4_096
_MAX_OFFSET = (1 << 63) - 1
_MAX_PARTITION = (1 << 31) - 1


def dead_letter_budget(max_record_bytes: int) -> tuple[int, int]:
    """The most bytes a dead letter may take under ``max_record_bytes``.

    Returns:
        The most for the whole letter (its Kafka key and its value), ``max_record_bytes`` less
        a quarter of it, at most 4 KiB; and the most for its Kafka key.

    Raises:
        UsageError: ``max_record_bytes`` is not an int of at least 1024.
    """
    if isinstance(max_record_bytes, bool) or not isinstance(max_record_bytes, int):
        raise UsageError(f"max_record_bytes must be an int, got {max_record_bytes!r}")
    if max_record_bytes < _MIN_RECORD_BYTES:
        raise UsageError(f"max_record_bytes must be >= {_MIN_RECORD_BYTES}, got {max_record_bytes}")
    whole = max_record_bytes - min(_MAX_MARGIN_BYTES, max_record_bytes // 4)
    return whole, min(DEAD_LETTER_KEY_BYTES, max(_HASH_KEY_BYTES, whole // 8))


def dead_letter_key(
    scope: str | None, key: bytes | None, *, max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES
) -> bytes | None:
    """The Kafka key of a dead letter: the scope if known, else the original key, bounded.

    Args:
        scope: the refused record's scope when it is known (it decoded), else None.
        key: the refused record's key (None: a null key).
        max_record_bytes: the record limit (sets the bound, see :func:`dead_letter_budget`).

    Returns:
        The scope's UTF-8 bytes or the key, when at most the bound; otherwise the hex SHA-256
        of them (as the letter's ``key_sha256`` says for a key); None for a null key of a
        record whose scope is unknown.

    Raises:
        UsageError: naming the argument of the wrong type or range.
    """
    _, bound = dead_letter_budget(max_record_bytes)
    if scope is not None and not isinstance(scope, str):
        raise UsageError(f"scope must be a str or None, got {type(scope).__name__}")
    if key is not None and not isinstance(key, bytes | bytearray | memoryview):
        raise UsageError(f"key must be bytes or None, got {type(key).__name__}")
    chosen = key if scope is None else scope.encode("utf-8", "surrogatepass")
    if chosen is None:
        return None
    chosen = bytes(chosen)
    return chosen if len(chosen) <= bound else sha256(chosen).hexdigest().encode("ascii")


def _check_letter(  # noqa: PLR0917 - encode_dead_letter's arguments, checked together
    reason: str,
    field: str | None,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    max_value_bytes: int,
    max_key_bytes: int,
) -> int | None:
    """Refuse an argument of :func:`encode_dead_letter` of the wrong type or range
    (``UsageError`` naming it); the timestamp to write (None when out of range)."""
    if not isinstance(reason, str):
        raise UsageError(f"reason must be a str, got {type(reason).__name__}")
    if field is not None and not isinstance(field, str):
        raise UsageError(f"field must be a str or None, got {type(field).__name__}")
    if not isinstance(topic, str) or not topic:
        raise UsageError(f"topic must be a non-empty str, got {topic!r}")
    for name, number, most in (
        ("partition", partition, _MAX_PARTITION),
        ("offset", offset, _MAX_OFFSET),
    ):
        if isinstance(number, bool) or not isinstance(number, int) or not -1 <= number <= most:
            raise UsageError(f"{name} must be an int in [-1, {most}], got {number!r}")
    if timestamp_ms is not None:
        if isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int):
            raise UsageError(f"timestamp_ms must be an int or None, got {timestamp_ms!r}")
        if not 0 <= timestamp_ms <= _MAX_OFFSET:
            timestamp_ms = None
    for name, number in (("max_value_bytes", max_value_bytes), ("max_key_bytes", max_key_bytes)):
        if isinstance(number, bool) or not isinstance(number, int):
            raise UsageError(f"{name} must be an int, got {number!r}")
        if number < 0:
            raise UsageError(f"{name} must be >= 0, got {number}")
    return timestamp_ms


def _fill(  # noqa: PLR0917 - the pieces of one letter, in the order they take their room
    obj: dict[str, object],
    budget: int,
    topic: str,
    field: str | None,
    reason: str,
    key_prefix: _Prefix,
    value_prefix: _Prefix,
) -> None:
    """Put the texts and the prefixes of the key and value in ``obj``, within ``budget``."""
    # Room left once the fixed fields (and the empty strings' quotes) are placed; each piece
    # in turn takes what it needs of it, up to its cap.
    room = budget - len(_encode(obj))
    assert room >= 0, (budget, obj)  # 1 KiB limits leave hundreds of bytes
    for name, text, cap in (
        ("topic", topic, _TOPIC_JSON_BYTES),
        ("field", field, _FIELD_JSON_BYTES),
        ("reason", reason, _REASON_JSON_BYTES),
    ):
        if text is not None:
            obj[name] = cut = _cut_text(text, min(cap, room + 2))
            room -= _json_bytes(cut) - 2
    for name, prefix in (("key", key_prefix), ("value", value_prefix)):
        if prefix.raw is None:
            continue
        text, kept = prefix.fit(room + 2)
        obj[name] = text
        room -= _json_bytes(text) - 2
        obj["key_truncated" if name == "key" else "truncated"] = kept < len(prefix.raw)


def encode_dead_letter(
    *,
    reason: str,
    field: str | None,
    topic: str,
    partition: int,
    offset: int,
    timestamp_ms: int | None,
    key: bytes | None,
    value: bytes | None,
    max_value_bytes: int = DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES,
    max_key_bytes: int = DEFAULT_MAX_DEAD_LETTER_KEY_BYTES,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
) -> bytes:
    """Encode a dead letter: a refused record, with why and where it came from.

    The result and :func:`dead_letter_key` together fit :func:`dead_letter_budget`, whatever
    the arguments' sizes (see the module docstring).

    Args:
        reason: what was wrong (for a RecordError, its message).
        field: the offending field, or None.
        topic, partition, offset: where the record was read; for an outbound record the broker
            refused (a callback), the topic it was for and -1 for partition and offset.
        timestamp_ms: the record's timestamp; None (or Kafka's -1) when it has none.
        key, value: the original bytes; None for a null key or value (a tombstone).
        max_value_bytes: the value is cut to at most this many bytes (``value_bytes``,
            ``value_sha256`` and ``truncated`` tell of the whole).
        max_key_bytes: the key is cut to at most this many bytes (``key_bytes``, ``key_sha256``
            and ``key_truncated`` tell of the whole).
        max_record_bytes: the record limit the letter stays under, with margin.

    Raises:
        UsageError: naming the argument of the wrong type or range.
    """
    timestamp_ms = _check_letter(
        reason, field, topic, partition, offset, timestamp_ms, max_value_bytes, max_key_bytes
    )
    for name, data in (("key", key), ("value", value)):
        if data is not None and not isinstance(data, bytes | bytearray | memoryview):
            raise UsageError(f"{name} must be bytes or None, got {type(data).__name__}")
    whole, key_bound = dead_letter_budget(max_record_bytes)
    raw_key = None if key is None else bytes(key)
    raw_value = None if value is None else bytes(value)
    key_prefix = _Prefix(raw_key, max_key_bytes)
    value_prefix = _Prefix(raw_value, max_value_bytes)
    obj: dict[str, object] = {
        "v": FORMAT_VERSION,
        "type": "dead_letter",
        "reason": "",
        "field": None if field is None else "",
        "topic": "",
        "partition": partition,
        "offset": offset,
        "timestamp_ms": timestamp_ms,
        "key": None if raw_key is None else "",
    }
    if key_prefix.encoding == "base64":
        obj["key_encoding"] = "base64"
    obj.update(
        key_bytes=None if raw_key is None else len(raw_key),
        key_sha256=None if raw_key is None else sha256(raw_key).hexdigest(),
        key_truncated=False,
        value=None if raw_value is None else "",
        value_encoding=value_prefix.encoding,
        value_bytes=None if raw_value is None else len(raw_value),
        value_sha256=None if raw_value is None else sha256(raw_value).hexdigest(),
        truncated=False,
    )
    _fill(obj, whole - key_bound, topic, field, reason, key_prefix, value_prefix)
    # A reason may quote a rejected string: never let a lone surrogate make the letter unsendable.
    return _encode(obj)


def _encode(obj: dict[str, object]) -> bytes:
    return dumps(obj).encode("utf-8", errors="replace")


def _json_bytes(text: str) -> int:
    """The size of ``text`` as a JSON string in a letter, quotes included."""
    return len(_str(text).encode("utf-8", errors="replace"))


def _cut_text(text: str, room: int) -> str:
    """The longest prefix of ``text`` whose JSON string takes at most ``room`` bytes."""
    size = _json_bytes(text)
    if size <= room:
        return text
    n = min(len(text), max(0, room - 2))  # every character takes at least one byte
    while n > 0 and (size := _json_bytes(text[:n])) > room:
        n = min(n - 1, n * room // size)  # an escape takes at most six bytes: few rounds
    return text[:n]


class _Prefix:
    """The start of an original key or value, as UTF-8 text or base64, cut to fit."""

    def __init__(self, raw: bytes | None, most: int) -> None:
        self.raw = raw
        self.encoding = "utf-8"
        self._text = ""
        self._cut = b"" if raw is None else raw[:most]
        if raw is None:
            return
        try:
            self._text = self._cut.decode("utf-8")
        except UnicodeDecodeError as e:
            # A cut through a multi-byte character is not a reason to fall back to base64.
            cut_short = len(self._cut) < len(raw)
            if cut_short and e.start >= len(self._cut) - 3 and e.reason == "unexpected end of data":
                self._text = self._cut[: e.start].decode("utf-8")
            else:
                self.encoding = "base64"

    def fit(self, room: int) -> tuple[str, int]:
        """The prefix as JSON string content taking at most ``room`` bytes, and how many of
        the original bytes it holds."""
        if self.encoding == "base64":
            kept = self._cut[: max(0, room - 2) // 4 * 3]
            return base64.b64encode(kept).decode("ascii"), len(kept)
        text = _cut_text(self._text, room)
        return text, len(text.encode("utf-8"))
