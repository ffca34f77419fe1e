"""Snapshot chunks and their manifest: a round trip for any snapshot and chunk size, and every
damage (a chunk missing, repeated, reordered, cut or altered) refused, naming what is wrong."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory._core import BadRecordError, Engine, OperationSpec, UsageError, snapshot_engine
from purgatory._core.durability.manifest import (
    SnapshotManifest,
    decode_manifest,
    encode_manifest,
    join_snapshot,
    split_snapshot,
)

_POSITIONS = st.lists(
    st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 99), st.integers(0, 10**12)),
    max_size=4,
)


def _split(data: bytes, size: int) -> tuple[SnapshotManifest, list[bytes]]:
    return split_snapshot(
        data,
        max_chunk_bytes=size,
        partition=3,
        journal_offset=41,
        clock_ms=1_000,
        input_positions=[("req", 3, 17)],
    )


@settings(max_examples=300)
@given(data=st.binary(max_size=2_000), size=st.integers(1, 700), positions=_POSITIONS)
def test_chunks_round_trip_and_stay_under_the_bound(
    data: bytes, size: int, positions: list[tuple[str, int, int]]
) -> None:
    manifest, chunks = split_snapshot(
        data,
        max_chunk_bytes=size,
        partition=0,
        journal_offset=7,
        clock_ms=5,
        input_positions=positions,
    )
    assert all(len(c) <= size for c in chunks)
    assert manifest.chunks == len(chunks) == max(1, -(-len(data) // size))
    assert join_snapshot(manifest, chunks) == data
    assert decode_manifest(encode_manifest(manifest)) == manifest


@settings(max_examples=300)
@given(data=st.binary(min_size=2, max_size=2_000), size=st.integers(1, 300), pick=st.data())
def test_any_damage_is_refused(data: bytes, size: int, pick: st.DataObject) -> None:
    manifest, chunks = _split(data, size)
    damage = pick.draw(st.sampled_from(["drop", "repeat", "swap", "cut", "flip"]))
    bad = list(chunks)
    index = pick.draw(st.integers(0, len(bad) - 1))
    if damage == "drop":
        del bad[index]
    elif damage == "repeat":
        bad.insert(index, bad[index])
    elif damage == "swap":
        if len(bad) < 2 or bad[0] == bad[-1]:
            bad[index] = bytes([bad[index][0] ^ 1]) + bad[index][1:]  # a flip instead
        else:
            bad[0], bad[-1] = bad[-1], bad[0]
    elif damage == "cut":
        bad[index] = bad[index][:-1]
    else:
        at = pick.draw(st.integers(0, len(bad[index]) - 1))
        bit = 1 << pick.draw(st.integers(0, 7))
        chunk = bad[index]
        bad[index] = chunk[:at] + bytes([chunk[at] ^ bit]) + chunk[at + 1 :]
    with pytest.raises(BadRecordError, match=r"^snapshot of partition 3: "):
        join_snapshot(manifest, bad)


def test_the_worked_example() -> None:
    manifest, chunks = _split(b"0123456789", 4)
    assert chunks == [b"0123", b"4567", b"89"]
    assert (manifest.chunks, manifest.size_bytes) == (3, 10)
    with pytest.raises(BadRecordError, match="2 chunks, the manifest lists 3"):
        join_snapshot(manifest, chunks[:2])


def test_a_real_engine_snapshot_travels_in_chunks() -> None:
    engine = Engine(start_ms=0)
    for i in range(500):
        engine.register(OperationSpec(f"o{i}", "s", (f"k{i}",), deadline_ms=10_000), now_ms=0)
    data = snapshot_engine(engine)
    manifest, chunks = _split(data, 1_024)
    assert len(chunks) > 1
    assert snapshot_engine(engine) == join_snapshot(manifest, chunks)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"v":2}', "v: version 2 is not supported"),
        (
            b'{"v":1,"partition":-1,"journal_offset":0,"clock_ms":0,"chunks":1,'
            b'"size_bytes":0,"crc32":0,"input_positions":[]}',
            "partition: must be an int >= 0",
        ),
        (
            b'{"v":1,"partition":0,"journal_offset":0,"clock_ms":0,"chunks":1,'
            b'"size_bytes":0,"crc32":0,"input_positions":[["t",0]]}',
            "input_positions: must be a list",
        ),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_field(record: bytes, message: str) -> None:
    with pytest.raises(BadRecordError, match=message):
        decode_manifest(record)


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"max_chunk_bytes": 0}, "max_chunk_bytes"), ({"partition": -1}, "partition")],
)
def test_bad_arguments_are_named(kwargs: dict[str, int], named: str) -> None:
    args = {"max_chunk_bytes": 10, "partition": 0} | kwargs
    with pytest.raises(UsageError, match=f"^{named} "):
        split_snapshot(
            b"x",
            max_chunk_bytes=args["max_chunk_bytes"],
            partition=args["partition"],
            journal_offset=0,
            clock_ms=0,
        )
