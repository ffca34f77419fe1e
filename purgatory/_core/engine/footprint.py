"""Memory estimates of the engine's state (core concept: footprint; sans-IO, stdlib only).

The engine limits what it holds in bytes as well as in counts, so it needs the bytes that each
held object takes. Walking the interpreter's objects (``sys.getsizeof`` over a graph) on every
input would cost more than the input; worse, it would differ from one build to another, and a
journal replayed elsewhere must re-decide every limit exactly as it was decided the first time.
So an estimate is a formula of an input's texts only: a fixed overhead per held object, plus the
UTF-8 lengths of its texts, plus the header of each optional text present::

    pending operation  OPERATION_BYTES + KEY_BYTES * len(keys)
                       [+ EVENT_TIME_BYTES] + texts(scope, op_id, keys, payload, reply_to)
    remembered signal  SIGNAL_BYTES + texts(scope, key, payload)
    finished operation OUTCOME_BYTES + OUTCOME_KEY_BYTES * len(keys)
                       [+ EVENT_TIME_OUTCOME_BYTES] + texts(scope, op_id, keys, payload, reply_to)

where ``texts`` is the sum of UTF-8 lengths plus ``TEXT_BYTES`` for each optional text (payload,
``reply_to``) that is set: an object of its own. The overheads cover everything an object keeps
alive inside the engine: a pending operation's spec, its index entries, its watch-list entries
(one per key) and its timer entry; a signal's fact, its TTL slot and wheel entry; a finished
operation's spec and outcome, kept for idempotent retries (``outcome_ttl_ms``). The payloads of
the signals an outcome reports are not counted again: they are the remembered signals' own
strings, which outlive the outcome under the default TTLs.

How the constants were measured (CPython 3.11, 64-bit): with ``tracemalloc``, 20,000 objects
built from freshly decoded strings (as a JSON decode gives them, so nothing is interned) were
registered, signalled, or registered and cancelled into an empty engine; the traced growth was
divided by the count and the texts' lengths subtracted; the fixed and per-key parts were fitted
over 0, 1, 3 and 10 keys with payloads of 0 and 1,000 bytes, in both time domains (each shape
within 1 % of the formula in processing time; in event time 6 % under it with three keys and 9 %
over without). The pending constants were measured again, at 3,000 objects, when pending
operations took their compact form (536 + 234 per key before, 432 + 160 now). An estimate is
part of what a replay re-decides, so a journal written under a configured
``max_pending_bytes_per_scope`` by an earlier build is replayed against the smaller estimate: a
registration that limit refused then may be held now. No limit in bytes is set by default.
Fewer objects cost more each, up to 20 % at 3,000 (hash tables grow by doubling).
``tests/core/test_footprint.py`` repeats the measurement and fails when the formula drifts from
it by more than 30 %.
A non-ASCII text takes up to four bytes per character in CPython whatever its UTF-8 length, so
the estimate can be low for it; it is never an input's size on the wire.

Worked example: the nightly barrier of three keys ``ingest/orders``, ``ingest/users``,
``ingest/stock`` (13 + 12 + 12 bytes) in scope ``ingest@2026-11-22`` (17) with op_id ``nightly``
(7) and a 17-byte payload, in processing time::

    432 + 3 * 160 + (17 + 7 + 37 + 49 + 17) = 1,039 bytes while pending
    880 + 3 * 125 + (17 + 7 + 37 + 49 + 17) = 1,382 bytes once finished

and the signal ``ingest/orders`` with the payload ``o``: ``480 + 17 + 13 + 49 + 1 = 560`` bytes.
"""

from __future__ import annotations

from purgatory._core.engine.model import OperationSpec, SignalFact
from purgatory._core.flink.keyed_timers import TimeDomain

__all__ = [
    "EVENT_TIME_BYTES",
    "EVENT_TIME_OUTCOME_BYTES",
    "KEY_BYTES",
    "OPERATION_BYTES",
    "OUTCOME_BYTES",
    "OUTCOME_KEY_BYTES",
    "SIGNAL_BYTES",
    "TEXT_BYTES",
    "finished_bytes",
    "operation_bytes",
    "plain_operation_bytes",
    "signal_bytes",
    "utf8_len",
]

#: A pending operation without keys: its ``_Op`` (a timer task holding its spec's fields), its
#: ``(scope, op_id)`` tuple and index entries, its wheel entry, its deadline's int and the
#: headers of its scope and op_id strings (the scope's is shared by a scope's operations, but
#: the estimate of an input cannot know what else is held).
OPERATION_BYTES = 432
#: Each watch key: its string's header, its slot in the keys tuple and its watch-list entry
#: (the ``(scope, key)`` tuple and the dict slot; a key watched by several operations adds a
#: list).
KEY_BYTES = 160
#: An event-time deadline: its keyed timer and heap entry, instead of a wheel entry, and the
#: spec the operation keeps (an event-time operation is not plain).
EVENT_TIME_BYTES = 680
#: A remembered signal: its ``(scope, key)`` tuple, its fact, its TTL slot (a timer task in the
#: TTL wheel) and dict entry, and the headers of its scope and key strings.
SIGNAL_BYTES = 480
#: A finished operation kept for idempotency: its spec, its outcome and its TTL slot.
OUTCOME_BYTES = 880
#: Each key of a finished operation: its string's header and its slots in the spec's and the
#: outcome's tuples (and the outcome's signals dict, once completed).
OUTCOME_KEY_BYTES = 125
#: An event-time operation's heap entry is deleted lazily: it outlives the operation.
EVENT_TIME_OUTCOME_BYTES = 270
#: An optional text that is set (a payload, a ``reply_to``): the header of a string object.
TEXT_BYTES = 49


def utf8_len(text: str) -> int:
    """The UTF-8 length of ``text`` (lone surrogates counted as three bytes each)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _texts(scope: str, op_id: str, keys: tuple[str, ...], payload: str | None) -> int:
    total = utf8_len(scope) + utf8_len(op_id)
    for key in keys:
        total += utf8_len(key)
    if payload is not None:
        total += TEXT_BYTES + utf8_len(payload)
    return total


def _spec_texts(spec: OperationSpec) -> int:
    total = _texts(spec.scope, spec.op_id, spec.keys, spec.payload)
    if spec.reply_to is not None:
        total += TEXT_BYTES + utf8_len(spec.reply_to)
    return total


def operation_bytes(spec: OperationSpec) -> int:
    """The estimated bytes ``spec`` holds while it is pending."""
    extra = EVENT_TIME_BYTES if spec.time_domain is TimeDomain.EVENT_TIME else 0
    return OPERATION_BYTES + KEY_BYTES * len(spec.keys) + extra + _spec_texts(spec)


def plain_operation_bytes(
    scope: str, op_id: str, keys: tuple[str, ...], payload: str | None
) -> int:
    """:func:`operation_bytes` of a processing-time operation without ``reply_to``."""
    return OPERATION_BYTES + KEY_BYTES * len(keys) + _texts(scope, op_id, keys, payload)


def finished_bytes(spec: OperationSpec) -> int:
    """The estimated bytes a finished ``spec`` and its outcome hold while remembered."""
    extra = EVENT_TIME_OUTCOME_BYTES if spec.time_domain is TimeDomain.EVENT_TIME else 0
    return OUTCOME_BYTES + OUTCOME_KEY_BYTES * len(spec.keys) + extra + _spec_texts(spec)


def signal_bytes(scope: str, key: str, fact: SignalFact) -> int:
    """The estimated bytes a remembered signal holds."""
    total = SIGNAL_BYTES + utf8_len(scope) + utf8_len(key)
    if fact.payload is not None:
        total += TEXT_BYTES + utf8_len(fact.payload)
    return total
