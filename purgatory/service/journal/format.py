"""The journal's wire format: a changelog record, and how a replay reads it (service layer).

Each entry is one row of the core's journal (:func:`purgatory._core.encode_entry`: the input
an engine applied, as JSON-able data), written with the one compact encoder
(:func:`purgatory._core._compact.dumps`). This module puts the rows of one partition in the
record around them, reads records back, and holds the two rules a replay follows.

A record of the changelog (key ``journal``, value JSON)::

    {"v": 1, "type": "journal", "partition": 3, "entries": [<journal rows>],
     "positions": {"<input topic>": <next offset>}, "delivered": <sequence>,
     "inputs": [[<first entry>, <end entry>, "<input topic>", <offset>], ...]}

``inputs`` (absent when the record holds no entry of a consumed record) says which entries
each consumed record produced: ``entries[first:end]`` came from ``offset`` of that topic. Two
writers on one partition (see below) can both journal the same consumed record before either
is fenced; a replay applies a consumed record's entries only if it is not before the positions
reached by the records before it (and takes the greatest position reached, not the last), so
the log decides every input once, whoever wrote it twice.

``delivered`` is the partition's highest outcome sequence whose callback (and every one before
it) the broker had acknowledged when the record was written; a restore re-sends the outcomes
after it.

``at`` (acknowledged delivery) is the offset the record's writer expected it to land at: the
end of the log it restored, then one past each of its own records. A record that landed
anywhere else was written by a writer that no longer had the whole log (a replica cut from the
broker while its partition moved, whose record in flight landed after the new owner's): it was
decided on a state the log does not have, so it is **void**. Its writer releases nothing it
caused (it sees the offset at the acknowledgement), and every replay skips it, entries,
positions and delivered mark alike (:func:`counts`). The records that count therefore form one
history in which each was written on exactly the records before it: an append made
conditional on the log's end, checked by every reader. Records without ``at`` (transactional
delivery, where the broker fences by producer epoch and markers take offsets; older journals)
always count.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from typing import Any

from purgatory._core import JournalEntry, TransportError, encode_entry
from purgatory._core._compact import dumps

__all__ = [
    "JOURNAL_KEY",
    "counts",
    "decode_journal_record",
    "encode_journal_record",
    "entry_text",
    "fresh_entries",
    "marker_size",
    "reach",
]

#: The key of every journal record (snapshot records have others).
JOURNAL_KEY = b"journal"
_INDEX_DIGITS = 10  # an entry index in an ``inputs`` marker has at most this many digits


def entry_text(entry: JournalEntry) -> str:
    """One entry as the text it takes in a record's ``entries``."""
    return dumps(encode_entry(entry))


def encode_journal_record(
    partition: int,
    entries: Sequence[str],
    positions: dict[str, int],
    delivered: int,
    inputs: Sequence[Sequence[Any]],
    *,
    at: int | None = None,
) -> bytes:
    """The value of one journal record (``entries``: texts of :func:`entry_text`; ``at``: the
    offset its writer expects it to land at, None: unchecked)."""
    extra = f',"inputs":{dumps(inputs)}' if inputs else ""
    if at is not None:
        extra += f',"at":{at:d}'
    value = (
        f'{{"v":1,"type":"journal","partition":{partition:d},'
        f'"entries":[{",".join(entries)}],"positions":{dumps(positions)},'
        f'"delivered":{delivered:d}{extra}}}'
    )
    return value.encode("utf-8", "surrogatepass")


def fresh_entries(doc: dict[str, Any], positions: dict[str, int]) -> list[Any]:
    """The entries of a journal batch to replay after ``positions`` (reached by the records
    before it): those of a consumed record already applied before are left out (a second
    writer journaled it again; see the module docstring)."""
    entries: list[Any] = doc["entries"]
    inputs = doc.get("inputs")
    if not inputs:
        return entries
    stale = [
        (first, end) for first, end, topic, offset in inputs if offset < positions.get(topic, 0)
    ]
    if not stale:
        return entries
    keep = [True] * len(entries)
    for first, end in stale:
        keep[first:end] = [False] * (end - first)
    return [entry for entry, kept in zip(entries, keep, strict=True) if kept]


def counts(doc: dict[str, Any], offset: int) -> bool:
    """Whether the journal record ``doc``, read at ``offset``, counts: it landed where its
    writer expected it, or it does not say where (see the module docstring)."""
    at = doc.get("at")
    return at is None or at == offset


def reach(positions: dict[str, int], reached: dict[str, int]) -> None:
    """Fold a journal batch's positions into ``positions``: the greatest wins (two writers'
    records interleave; every input before the greatest is in the log)."""
    for topic, offset in reached.items():
        if offset > positions.get(topic, 0):
            positions[topic] = offset


def decode_journal_record(value: bytes) -> dict[str, Any] | None:
    """The journal batch of a changelog record; None for another kind of changelog record.

    Raises:
        TransportError: the record is not a changelog record this version can read.
    """
    try:
        doc = json.loads(value)
    except ValueError as exc:
        raise TransportError(f"changelog record is not JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise TransportError(f"changelog record of an unknown format: {value[:80]!r}")
    if doc.get("type") != "journal":
        return None
    return doc


def marker_size(topic: str, offset: int) -> int:
    """At most the bytes one ``inputs`` marker ``[first,end,"topic",offset],`` takes (a record
    counts them against its limit with its entries)."""
    return _quoted_bytes(topic) + len(str(offset)) + 2 * _INDEX_DIGITS + 6


@functools.cache
def _quoted_bytes(topic: str) -> int:
    # Asked for every entry of every consumed record; the service reads two input topics.
    return len(dumps(topic).encode("utf-8", "surrogatepass"))
