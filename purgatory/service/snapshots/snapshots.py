"""Partition snapshots on the snapshots topic (service layer): writing one, finding the latest.

A snapshot of partition p's engine (:func:`~purgatory._core.snapshot_engine`) goes to partition
p of the snapshots topic as chunks (key ``chunk``) under the broker's record size, followed by
their manifest (key ``manifest``: journal offset, clock, input positions, delivered sequence,
size and CRC-32; :mod:`purgatory._core.durability.manifest`). The manifest is sent only once every
chunk
is acknowledged, so a manifest always follows its own chunks, contiguously (one writer per
partition).

:func:`find_latest` reads backwards from the partition's end: the last manifest, then the
``chunks`` records just before it, checked against it. A damaged or incomplete snapshot is
skipped for the one before it; when none is usable the restore replays the whole journal.
Snapshots only bound the replay: the journal stays the truth, and nothing here depends on the
broker compacting or deleting anything.
"""

from __future__ import annotations

from dataclasses import dataclass

from purgatory._core import BadRecordError, TransportError
from purgatory._core.durability.manifest import (
    SnapshotManifest,
    decode_manifest,
    encode_manifest,
    join_snapshot,
    split_snapshot,
)
from purgatory.service.kafka.transport import ConsumedRecord, LogReader, OutRecord, RecordSink
from purgatory.service.telemetry.logging import get_logger

__all__ = ["CHUNK_KEY", "MANIFEST_KEY", "FoundSnapshot", "find_latest", "write_snapshot"]

_log = get_logger()

CHUNK_KEY = b"chunk"
MANIFEST_KEY = b"manifest"
_CHUNK_HEADROOM = 1024  # the record's own overhead under max_record_bytes
_WINDOWS = (1, 16, 64)  # records read per step backwards while looking for a manifest
_MAX_STEPS = 16


@dataclass(frozen=True, slots=True)
class FoundSnapshot:
    """A snapshot read back and checked."""

    manifest: SnapshotManifest
    data: bytes
    offset: int  # of its manifest record


async def write_snapshot(
    sink: RecordSink,
    *,
    topic: str,
    data: bytes,
    partition: int,
    journal_offset: int,
    clock_ms: int,
    input_positions: dict[str, int],
    delivered: int,
    max_record_bytes: int,
) -> SnapshotManifest:
    """Write one snapshot: its chunks, then (once all are acknowledged) its manifest.

    Raises:
        TransportError: a chunk or the manifest was refused (the snapshot is not usable; the
            previous one still is).
    """
    manifest, chunks = split_snapshot(
        data,
        max_chunk_bytes=max_record_bytes - _CHUNK_HEADROOM,
        partition=partition,
        journal_offset=journal_offset,
        clock_ms=clock_ms,
        input_positions=sorted((t, partition, o) for t, o in input_positions.items()),
        delivered=delivered,
    )
    records = [OutRecord(topic, CHUNK_KEY, chunk, partition=partition) for chunk in chunks]
    await _send_all(sink, records, what=f"snapshot chunks of {topic}[{partition}]")
    manifest_record = OutRecord(topic, MANIFEST_KEY, encode_manifest(manifest), partition=partition)
    await _send_all(sink, [manifest_record], what=f"snapshot manifest of {topic}[{partition}]")
    return manifest


async def _send_all(sink: RecordSink, records: list[OutRecord], *, what: str) -> None:
    delivery = await sink.send_batch(records)
    failures = [f for f in await delivery.results() if f is not None]
    if failures:
        raise TransportError(f"{what}: {len(failures)} refused ({failures[0].reason})")


async def find_latest(reader: LogReader, *, topic: str, partition: int) -> FoundSnapshot | None:
    """The latest usable snapshot of ``partition``, or None when there is none.

    Raises:
        TransportError: the topic could not be read.
    """
    end = await reader.end_offset(topic, partition)
    before = end  # look for manifests at offsets before this
    steps = 0
    while before > 0 and steps < _MAX_STEPS:
        start = max(0, before - _WINDOWS[min(steps, len(_WINDOWS) - 1)])
        steps += 1
        window = await _read_range(reader, topic, partition, start, before)
        manifests = [r for r in window if r.key == MANIFEST_KEY]
        for record in reversed(manifests):
            found = await _check(reader, topic, partition, record)
            if found is not None:
                return found
        before = start
    return None


async def _check(
    reader: LogReader, topic: str, partition: int, record: ConsumedRecord
) -> FoundSnapshot | None:
    try:
        manifest = decode_manifest(record.value or b"")
        if manifest.partition != partition:
            raise BadRecordError(f"manifest of partition {manifest.partition}")
        first = record.offset - manifest.chunks
        if first < 0:
            raise BadRecordError(f"{manifest.chunks} chunks before offset {record.offset}")
        chunks = await _read_range(reader, topic, partition, first, record.offset)
        if any(c.key != CHUNK_KEY for c in chunks):
            raise BadRecordError("the records before the manifest are not all its chunks")
        data = join_snapshot(manifest, [c.value or b"" for c in chunks])
    except BadRecordError as exc:
        _log.warning(
            "snapshot_skipped", topic=topic, partition=partition, offset=record.offset, why=str(exc)
        )
        return None
    return FoundSnapshot(manifest, data, record.offset)


async def _read_range(
    reader: LogReader, topic: str, partition: int, start: int, end: int
) -> list[ConsumedRecord]:
    """The records at offsets [start, end) (the reader reads on to the partition's end; the
    snapshots topic is short past any offset this looks at)."""
    taken: list[ConsumedRecord] = []

    def handle(batch: list[ConsumedRecord]) -> None:
        taken.extend(r for r in batch if start <= r.offset < end)

    await reader.read(topic, partition, start, handle)
    return taken
