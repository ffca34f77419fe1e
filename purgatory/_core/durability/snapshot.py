"""Versioned snapshots of the whole engine (core concept: snapshot/restore; sans-IO, stdlib only).

A snapshot holds everything needed to rebuild an :class:`Engine`: pending operations in
registration order (so ties keep their order), remembered signals with their last access time,
watermarks, finished operations kept for idempotency, the outcome sequence and counters. Watch
lists and wheel entries are derived from the operations, so they are rebuilt, not stored.
Expired TTL state is never written.

Format, version 2::

    b"PURGATORY-SNAPSHOT\\n"  magic
    2 bytes                  format version, big-endian
    rest                     zlib-compressed UTF-8 JSON document

Version 2 holds the pending operations by column (``pending``), as a restore of a million
wants them: a table of scopes and each operation's index in it; its op_ids, then its keys, each
column one string of them all with their lengths; the deadlines, registration times, timeouts
(-1: none) and payload lengths (-1: none), like every column of ints, as base64 of an array of
little-endian 64-bit ints; the positions of the ones flagged ``late``; and,
for the few that are not plain (a condition other than ``all``, event time, a ``reply_to``),
their position with those fields. Decoding is then a handful of C calls (the JSON parser reads
a column as one string, base64 and ``array`` turn it into ints) and a slice per text, where
version 1, one JSON row per operation, cost a list and a dozen objects per operation before the
rebuild began: a restore of 1M pending operations went from 14 s of CPU to about 4. Version 1
is still read, so a snapshot written before an upgrade restores after it.

Restoring at ``now_ms`` rebuilds the pending operations in bulk, from their fields: no spec
for a plain one, no re-validation, and watch entries without the condition checks of a
registration, all vouched for by the snapshot (see
:meth:`~purgatory._core.engine.lifecycle.Lifecycle.restore_bulk`). Each keeps its
``late`` flag, so a restore at the snapshot's own clock rebuilds exactly the state that was saved
(a journal tail replayed on it then decides the same outcomes); restored at a later ``now_ms``,
one whose deadline has passed meanwhile is flagged ``late`` and expires at the next steps, at
most ``max_fire_per_step`` at a time.
A snapshot of an unknown version or a damaged one raises :class:`BadRecordError`.
"""

from __future__ import annotations

import json
import sys
import zlib
from array import array
from base64 import b64decode, b64encode
from collections.abc import Callable, Iterable, Iterator
from itertools import accumulate, pairwise, repeat
from sys import intern
from typing import Any

from purgatory._core._compact import dumps
from purgatory._core._errors import BadRecordError
from purgatory._core.durability.entries import JournalEntry
from purgatory._core.engine.engine import Engine
from purgatory._core.engine.engine_types import (
    EngineConfig,
    _checked_spec,
    _Finished,
    _is_plain,
)
from purgatory._core.engine.lifecycle import RestoredRow
from purgatory._core.engine.model import Condition, OperationSpec, Outcome, OutcomeKind, SignalFact
from purgatory._core.flink.keyed_timers import TimeDomain

__all__ = ["SNAPSHOT_VERSION", "restore_engine", "snapshot_engine"]

SNAPSHOT_VERSION = 2
_READS = (1, 2)
_MAGIC = b"PURGATORY-SNAPSHOT\n"


def snapshot_engine(engine: Engine) -> bytes:
    """Serialize ``engine`` to bytes (see the module docstring for the format)."""
    now = engine.clock_ms
    progress = engine._progress
    doc = {
        "clock_ms": now,
        "partition": engine.partition,
        "sequence": progress.sequence,
        "counts": {kind.value: n for kind, n in progress.counts.items()},
        "late": progress.late,
        "pending": _pending_columns(engine),
        "signals": [
            [
                scope,
                key,
                e.last_access_ms,
                e.value.signalled_ms,
                e.value.event_time_ms,
                e.value.payload,
            ]
            for (scope, key), e in engine.signals.items(now_ms=now)
        ],
        "watermarks": engine.keyed.watermarks(),
        "finished": [
            [e.last_access_ms, _spec_row(e.value.spec), _outcome_row(e.value.outcome)]
            for _, e in engine.finished.items(now_ms=now)
        ],
    }
    body = dumps(doc).encode()
    return _MAGIC + SNAPSHOT_VERSION.to_bytes(2, "big") + zlib.compress(body, 1)


def restore_engine(
    data: bytes,
    *,
    now_ms: int,
    config: EngineConfig | None = None,
    journal: Callable[[JournalEntry], None] | None = None,
) -> Engine:
    """Rebuild an engine from :func:`snapshot_engine` bytes at time ``now_ms``.

    ``journal`` is attached to the rebuilt engine (the restore itself is not journaled).

    Raises:
        BadRecordError: the bytes are not a snapshot, of an unsupported version, or damaged.
    """
    version, doc = _decode(data)
    try:
        engine = Engine(
            config, start_ms=max(now_ms, doc["clock_ms"]), partition=doc.get("partition", 0)
        )
        now = engine.clock_ms
        progress = engine._progress
        progress.sequence = doc["sequence"]
        for kind in OutcomeKind:
            progress.counts[kind] = doc["counts"][kind.value]
        progress.late = doc["late"]
        for scope, watermark in doc["watermarks"].items():
            engine.keyed.advance_watermark(scope, watermark)
        for scope, key, last_access, signalled, event_time, payload in doc["signals"]:
            fact = SignalFact(signalled, event_time, payload)
            engine.signals.restore((scope, key), fact, last_access_ms=last_access, now_ms=now)
        for last_access, spec_row, outcome_row in doc["finished"]:
            spec = _spec(spec_row)
            done = _Finished(spec, _outcome(outcome_row, engine.partition))
            engine.finished.restore(
                (spec.scope, spec.op_id), done, last_access_ms=last_access, now_ms=now
            )
        # Each flag as it was (a restore at the snapshot's own clock rebuilds the same state),
        # or, restored at a later time, overdue since then too.
        rows = _v1_rows(doc["operations"]) if version == 1 else _pending_rows(doc["pending"])
        engine.lifecycle.restore_bulk(rows, overdue_late=now_ms > doc["clock_ms"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise BadRecordError(f"snapshot: malformed document ({exc})") from exc
    engine._journal = journal
    return engine


def _decode(data: bytes) -> tuple[int, dict[str, Any]]:
    if not isinstance(data, bytes | bytearray) or not data.startswith(_MAGIC):
        raise BadRecordError("snapshot: not a purgatory snapshot (bad magic)")
    header = len(_MAGIC)
    version = int.from_bytes(data[header : header + 2], "big")
    if version not in _READS:
        raise BadRecordError(
            f"snapshot: version {version} is not supported (this build reads 1 and 2)"
        )
    try:
        doc = json.loads(zlib.decompress(data[header + 2 :]))
    except (zlib.error, ValueError) as exc:
        raise BadRecordError(f"snapshot: damaged body ({exc})") from exc
    if not isinstance(doc, dict):
        raise BadRecordError("snapshot: the document is not an object")
    return version, doc


def _pending_columns(engine: Engine) -> dict[str, Any]:
    """The pending operations by column, in the engine's order (see the module docstring)."""
    scopes: dict[str, int] = {}
    scope_at: list[int] = []
    op_ids: list[str] = []
    keys: list[str] = []
    key_counts: list[int] = []
    deadlines: list[int] = []
    registered: list[int] = []
    timeouts: list[int] = []
    payloads: list[str] = []
    payload_lens: list[int] = []
    late_at: list[int] = []
    rest: list[list[Any]] = []
    for at, op in enumerate(engine._ops.values()):
        scope, op_id = op.ident
        index = scopes.get(scope)
        if index is None:
            index = scopes[scope] = len(scopes)
        scope_at.append(index)
        op_ids.append(op_id)
        held = op._keys
        if type(held) is str:
            keys.append(held)
            key_counts.append(1)
        else:
            keys.extend(held)
            key_counts.append(len(held))
        deadlines.append(op.spec_deadline_ms)
        registered.append(op.registered_ms)
        timeout = op.timeout_ms
        timeouts.append(-1 if timeout is None else timeout)
        payload = op.payload
        if payload is None:
            payload_lens.append(-1)
        else:
            payloads.append(payload)
            payload_lens.append(len(payload))
        if op.late:
            late_at.append(at)
        spec = op.rest
        if spec is not None:
            rest.append(
                [at, spec.condition.value, spec.count, spec.time_domain.value, spec.reply_to]
            )
    return {
        "scopes": list(scopes),
        "scope": _ints(scope_at),
        "op_ids": "".join(op_ids),
        "op_id_lens": _ints([len(op_id) for op_id in op_ids]),
        "keys": "".join(keys),
        "key_lens": _ints([len(key) for key in keys]),
        "key_counts": _ints(key_counts),
        "deadlines": _ints(deadlines),
        "registered": _ints(registered),
        "timeouts": _ints(timeouts),
        "payloads": "".join(payloads),
        "payload_lens": _ints(payload_lens),
        "late_at": late_at,
        "rest": rest,
    }


def _ints(values: list[int]) -> str:
    """A column of ints as base64 of little-endian 64-bit ints: decoded by C calls into an
    array, whose ints are made one at a time as the rebuild reads them, where a JSON list
    would make them all at once (a million short-lived objects each, interleaved in memory
    with the long-lived ones the rebuild makes, so their space is not given back)."""
    column = array("q", values)
    if sys.byteorder != "little":  # pragma: no cover - every platform this runs on is
        column.byteswap()
    return b64encode(column.tobytes()).decode("ascii")


def _column(text: str) -> array[int]:
    """:func:`_ints`, decoded."""
    column = array("q")
    column.frombytes(b64decode(text, validate=True))
    if sys.byteorder != "little":  # pragma: no cover
        column.byteswap()
    return column


def _pending_rows(columns: dict[str, Any]) -> Iterator[RestoredRow]:
    """The rows of :meth:`Lifecycle.restore_bulk` from a version 2 ``pending`` document.

    Each column is turned into its values by C loops (slices of the texts, the arrays' ints)
    and zipped; what a row alone needs (a tuple of one key, a None for no timeout) is made as
    the rebuild takes the row, and the few operations that are not plain get their spec at
    their position (:func:`_with_rest`)."""
    column = columns.__getitem__
    op_ids = _slices(column("op_ids"), _column(column("op_id_lens")))
    keys = _slices(column("keys"), _column(column("key_lens")))
    counts = _column(column("key_counts"))
    size = len(op_ids)
    if len(counts) != size:
        raise ValueError(f"{len(counts)} key counts for {size} operations")
    if counts.count(1) == size:
        if len(keys) != size:
            raise ValueError(f"{len(keys)} keys for {size} operations of one key")
        grouped: Iterator[tuple[str, ...]] = ((key,) for key in keys)
    else:
        grouped = _grouped(keys, counts)
    payload_lens = _column(column("payload_lens"))
    payloads: Iterator[str | None]
    if payload_lens.count(-1) == len(payload_lens):
        payloads = repeat(None, len(payload_lens))
    else:
        payloads = _optional_slices(column("payloads"), payload_lens)
    late_at = set(column("late_at"))
    scopes = [intern(scope) for scope in column("scopes")]
    rows: Iterator[RestoredRow] = zip(
        map(scopes.__getitem__, _column(column("scope"))),
        op_ids,
        grouped,
        _runs(_column(column("deadlines"))),
        _runs(_column(column("registered"))),
        _runs(None if timeout < 0 else timeout for timeout in _column(column("timeouts"))),
        payloads,
        (at in late_at for at in range(size)) if late_at else repeat(False, size),
        repeat(None, size),
        strict=True,
    )
    rest_at = {row[0]: row for row in column("rest")}
    return _with_rest(rows, rest_at) if rest_at else rows


def _with_rest(rows: Iterator[RestoredRow], rest_at: dict[int, list[Any]]) -> Iterator[RestoredRow]:
    """``rows``, each operation that is not plain given its spec from its ``rest`` entry."""
    for at, row in enumerate(rows):
        found = rest_at.get(at)
        if found is None:
            yield row
            continue
        scope, op_id, keys, deadline, registered, timeout, payload, late, _ = row
        _, condition, count, domain, reply_to = found
        spec = _trusted_spec([
            op_id, scope, keys, deadline, condition, count, domain, payload, reply_to, timeout
        ])  # fmt: skip
        yield (scope, op_id, keys, deadline, registered, timeout, payload, late, spec)


def _runs(values: Iterable[int | None]) -> Iterator[Any]:
    """``values``, each equal to the one before given as that one's int object: the operations
    of a batch share their deadline, registration time and timeout, and a restore keeps them
    as registering them did (32 bytes per operation and value, where each is its own int)."""
    last: int | None = None
    for value in values:
        if value != last:
            last = value
        yield last


def _slices(text: str, lengths: array[int]) -> list[str]:
    """``text`` cut into consecutive pieces of ``lengths``."""
    if sum(lengths) != len(text):
        raise ValueError("the lengths do not add up to the text")
    return [text[start:end] for start, end in pairwise(accumulate(lengths, initial=0))]


def _grouped(keys: list[str], counts: array[int]) -> Iterator[tuple[str, ...]]:
    taken = 0
    for count in counts:
        yield tuple(keys[taken : taken + count])
        taken += count
    if taken != len(keys):
        raise ValueError("the key counts do not add up to the keys")


def _optional_slices(text: str, lengths: array[int]) -> Iterator[str | None]:
    at = 0
    for length in lengths:
        if length < 0:
            yield None
        else:
            yield text[at : at + length]
            at += length


def _v1_rows(rows: list[list[Any]]) -> Iterator[RestoredRow]:
    """The rows of :meth:`Lifecycle.restore_bulk` from a version 1 ``operations`` list."""
    for row in rows:
        spec = _trusted_spec(row)
        rest = None if _is_plain(spec) else spec
        late = len(row) == 12 and row[11] is True
        scope = intern(spec.scope)
        yield (scope, spec.op_id, spec.keys, spec.deadline_ms, row[10], spec.timeout_ms,
               spec.payload, late, rest)  # fmt: skip


def _spec_row(spec: OperationSpec) -> list[Any]:
    return [
        spec.op_id,
        spec.scope,
        list(spec.keys),
        spec.deadline_ms,
        spec.condition.value,
        spec.count,
        spec.time_domain.value,
        spec.payload,
        spec.reply_to,
        spec.timeout_ms,
    ]


def _spec(row: list[Any]) -> OperationSpec:
    op_id, scope, keys, deadline, condition, count, domain, payload, reply_to, timeout = row
    return OperationSpec(
        op_id=op_id,
        scope=scope,
        keys=tuple(keys),
        deadline_ms=deadline,
        condition=Condition(condition),
        count=count,
        time_domain=TimeDomain(domain),
        payload=payload,
        reply_to=reply_to,
        timeout_ms=timeout,
    )


_CONDITIONS = {c.value: c for c in Condition}
_DOMAINS = {d.value: d for d in TimeDomain}


def _trusted_spec(row: list[Any]) -> OperationSpec:
    """An operation row of a pending operation, without the constructor's checks.

    The spec was validated when it was registered, and the snapshot's body is checked whole
    (zlib's checksum) before any row is read, so re-validating a million specs on restore
    would only cost time. A row of the wrong shape still fails (unpacking, enum lookups).
    """
    op_id, scope, keys, deadline, condition, count, domain, payload, reply_to, timeout = row[:10]
    return _checked_spec((
        op_id, scope, tuple(keys), deadline, _CONDITIONS[condition], count, _DOMAINS[domain],
        payload, reply_to, timeout,
    ))  # fmt: skip


def _outcome_row(o: Outcome) -> list[Any]:
    return [
        o.op_id,
        o.scope,
        o.outcome.value,
        o.registered_ms,
        o.outcome_ms,
        o.deadline_ms,
        o.time_domain.value,
        o.sequence,
        list(o.keys),
        list(o.missing),
        o.signals,
        o.payload,
        o.reply_to,
        o.late,
    ]


def _outcome(row: list[Any], partition: int = 0) -> Outcome:
    (
        op_id,
        scope,
        kind,
        reg,
        at,
        deadline,
        domain,
        seq,
        keys,
        missing,
        signals,
        payload,
        reply,
        late,
    ) = row
    return Outcome(
        op_id=op_id,
        scope=scope,
        outcome=OutcomeKind(kind),
        registered_ms=reg,
        outcome_ms=at,
        deadline_ms=deadline,
        time_domain=TimeDomain(domain),
        sequence=seq,
        keys=tuple(keys),
        missing=tuple(missing),
        signals=dict(signals),
        payload=payload,
        reply_to=reply,
        late=late,
        partition=partition,
    )
