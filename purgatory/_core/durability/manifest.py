"""Snapshot chunks and their manifest (core concept: snapshot transport; sans-IO, stdlib only).

A snapshot of a partition's engine can be larger than one broker record, so it travels as chunks
of at most ``max_chunk_bytes`` each, described by a :class:`SnapshotManifest`: which partition,
the journal offset and the clock it was taken at, the input positions it covers, how many chunks
and bytes, and a CRC-32 of the whole. :func:`join_snapshot` gives the snapshot back only when the
chunks are exactly those the manifest describes; anything else (a chunk missing, repeated, out of
order, cut, or altered) raises :class:`BadRecordError` naming what is wrong, so a restore never
starts from a damaged snapshot: it falls back to an older one, or to the journal alone.

Worked example: a 10-byte snapshot split with ``max_chunk_bytes=4`` is three chunks of 4, 4 and
2 bytes; the manifest says ``chunks=3, size_bytes=10`` and the CRC-32 of the 10 bytes. Joining
the first two chunks alone fails with "2 chunks, the manifest lists 3".
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from purgatory._core._compact import dumps
from purgatory._core._errors import BadRecordError, UsageError

__all__ = [
    "MANIFEST_VERSION",
    "SnapshotManifest",
    "decode_manifest",
    "encode_manifest",
    "join_snapshot",
    "split_snapshot",
]

MANIFEST_VERSION = 1


@dataclass(frozen=True, slots=True)
class SnapshotManifest:
    """What a chunked snapshot holds and how to check it.

    Attributes:
        partition: the input partition whose engine was snapshotted.
        journal_offset: the changelog offset of the first journal entry *not* in the snapshot
            (a restore replays the journal from there).
        clock_ms: the engine's clock when the snapshot was taken.
        input_positions: ``(topic, partition, next offset)`` of every input the snapshot covers.
        chunks: how many chunks follow.
        size_bytes: the snapshot's length.
        crc32: CRC-32 of the whole snapshot.
        delivered: the highest outcome sequence known delivered when the journal reached
            ``journal_offset`` (a restore re-sends the outcomes after it).
    """

    partition: int
    journal_offset: int
    clock_ms: int
    input_positions: tuple[tuple[str, int, int], ...]
    chunks: int
    size_bytes: int
    crc32: int
    delivered: int = 0


def split_snapshot(
    data: bytes,
    *,
    max_chunk_bytes: int,
    partition: int,
    journal_offset: int,
    clock_ms: int,
    input_positions: Sequence[tuple[str, int, int]] = (),
    delivered: int = 0,
) -> tuple[SnapshotManifest, list[bytes]]:
    """Cut ``data`` into chunks of at most ``max_chunk_bytes`` and describe them.

    Returns:
        The manifest and the chunks, in order (an empty snapshot is one empty chunk).

    Raises:
        UsageError: ``max_chunk_bytes`` is not a positive int, or a number is negative.
    """
    if isinstance(max_chunk_bytes, bool) or not isinstance(max_chunk_bytes, int):
        raise UsageError(f"max_chunk_bytes must be an int, got {max_chunk_bytes!r}")
    if max_chunk_bytes < 1:
        raise UsageError(f"max_chunk_bytes must be >= 1, got {max_chunk_bytes}")
    for name, value in (
        ("partition", partition),
        ("journal_offset", journal_offset),
        ("clock_ms", clock_ms),
        ("delivered", delivered),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise UsageError(f"{name} must be an int >= 0, got {value!r}")
    data = bytes(data)
    chunks = [data[i : i + max_chunk_bytes] for i in range(0, len(data), max_chunk_bytes)]
    chunks = chunks or [b""]
    manifest = SnapshotManifest(
        partition=partition,
        journal_offset=journal_offset,
        clock_ms=clock_ms,
        input_positions=tuple((str(t), int(p), int(o)) for t, p, o in input_positions),
        chunks=len(chunks),
        size_bytes=len(data),
        crc32=zlib.crc32(data),
        delivered=delivered,
    )
    return manifest, chunks


def join_snapshot(manifest: SnapshotManifest, chunks: Sequence[bytes]) -> bytes:
    """The snapshot the chunks make up, checked against ``manifest``.

    Raises:
        BadRecordError: the chunks are not the ones the manifest describes (the message says
            how: their count, their total size, or their checksum).
    """
    if len(chunks) != manifest.chunks:
        raise BadRecordError(
            f"snapshot of partition {manifest.partition}: {len(chunks)} chunks, "
            f"the manifest lists {manifest.chunks}"
        )
    data = b"".join(chunks)
    if len(data) != manifest.size_bytes:
        raise BadRecordError(
            f"snapshot of partition {manifest.partition}: {len(data)} bytes, "
            f"the manifest says {manifest.size_bytes}"
        )
    crc = zlib.crc32(data)
    if crc != manifest.crc32:
        raise BadRecordError(
            f"snapshot of partition {manifest.partition}: checksum {crc:#010x}, "
            f"the manifest says {manifest.crc32:#010x}"
        )
    return data


def encode_manifest(manifest: SnapshotManifest) -> bytes:
    """The manifest as one JSON record (``"v"`` is :data:`MANIFEST_VERSION`)."""
    doc = {
        "v": MANIFEST_VERSION,
        "partition": manifest.partition,
        "journal_offset": manifest.journal_offset,
        "clock_ms": manifest.clock_ms,
        "input_positions": [list(p) for p in manifest.input_positions],
        "chunks": manifest.chunks,
        "size_bytes": manifest.size_bytes,
        "crc32": manifest.crc32,
        "delivered": manifest.delivered,
    }
    return dumps(doc).encode()


def decode_manifest(data: bytes) -> SnapshotManifest:
    """The manifest :func:`encode_manifest` wrote.

    Raises:
        BadRecordError: not a manifest, of another version, or a field of the wrong kind (named).
    """
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRecordError(f"snapshot manifest: not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise BadRecordError("snapshot manifest: not a JSON object")
    if doc.get("v") != MANIFEST_VERSION:
        raise BadRecordError(
            f"snapshot manifest: v: version {doc.get('v')!r} is not supported "
            f"(this build reads {MANIFEST_VERSION})"
        )
    numbers = {}
    doc.setdefault("delivered", 0)  # written before it was kept
    names = (
        "partition",
        "journal_offset",
        "clock_ms",
        "chunks",
        "size_bytes",
        "crc32",
        "delivered",
    )
    for name in names:
        value = doc.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise BadRecordError(f"snapshot manifest: {name}: must be an int >= 0, got {value!r}")
        numbers[name] = value
    positions = doc.get("input_positions")
    if not isinstance(positions, list) or not all(_is_position(p) for p in positions):
        raise BadRecordError(
            "snapshot manifest: input_positions: must be a list of [topic, partition, offset]"
        )
    return SnapshotManifest(
        partition=numbers["partition"],
        journal_offset=numbers["journal_offset"],
        clock_ms=numbers["clock_ms"],
        input_positions=tuple((t, p, o) for t, p, o in positions),
        chunks=numbers["chunks"],
        size_bytes=numbers["size_bytes"],
        crc32=numbers["crc32"],
        delivered=numbers["delivered"],
    )


def _is_position(item: object) -> bool:
    if not isinstance(item, list) or len(item) != 3:
        return False
    topic, partition, offset = item
    return (
        isinstance(topic, str)
        and bool(topic)
        and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (partition, offset)
        )
    )
