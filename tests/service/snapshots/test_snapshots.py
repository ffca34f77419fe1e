"""Snapshots on the in-memory broker, in virtual time: written by the snapshotter from the
journal, found again, and a restore from one decides what a restore from the journal alone does."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
import trio
import trio.testing

from purgatory._codec import encode_request, encode_signal
from purgatory._codec._records import RegisterRequest, SignalRecord
from purgatory._core import snapshot_engine
from purgatory.service.app import Service, topics_of
from purgatory.service.journal.restore import Progress, Restored, restore_partition
from purgatory.service.kafka.transport import RecordSink
from purgatory.service.settings import Settings
from purgatory.service.snapshots import snapshotter as snapshotter_module
from purgatory.service.snapshots.snapshots import (
    CHUNK_KEY,
    MANIFEST_KEY,
    find_latest,
    write_snapshot,
)
from purgatory.service.snapshots.snapshotter import Snapshotter
from reaper import Clock
from tests.service.dispatch.test_quotas_paths import _all_committed
from tests.service.fake_kafka import FakeBroker, FakeReader, FakeTransport

EPOCH_MS = 1_763_780_400_000
SETTINGS = Settings.from_env({}, shutdown_grace_ms=5_000, snapshot_interval_ms=1_000)
REQUESTS, SIGNALS = SETTINGS.topic_requests, SETTINGS.topic_signals
CALLBACKS, CHANGELOG = SETTINGS.topic_callbacks, SETTINGS.topic_changelog
SNAPSHOTS = SETTINGS.topic_snapshots


def _broker(**faults: Any) -> FakeBroker:
    return FakeBroker({t: 2 for t in topics_of(SETTINGS)}, **faults)


def _register(broker: FakeBroker, scope: str, op_id: str, keys: list[str], **kw: Any) -> None:
    request = RegisterRequest(op_id=op_id, scope=scope, keys=tuple(keys), **kw)
    broker.append(REQUESTS, scope.encode(), encode_request(request))


def _signal(broker: FakeBroker, scope: str, key: str) -> None:
    broker.append(SIGNALS, scope.encode(), encode_signal(SignalRecord(scope, key, None, None)))


def _snapshotter(reader: FakeReader, sink: RecordSink, interval_ms: int) -> Snapshotter:
    """A snapshotter of both partitions, in small chunks (a snapshot spans several)."""
    return Snapshotter(
        reader,
        sink,
        changelog_topic=CHANGELOG,
        snapshots_topic=SNAPSHOTS,
        config=SETTINGS.to_engine_config(),
        partitions=[0, 1],
        interval_ms=interval_ms,
        max_record_bytes=4_096,
        tail_every_s=0.2,
    )


async def _serve(broker: FakeBroker, stop: trio.Event, *, with_snapshotter: bool) -> None:
    fake = FakeTransport(broker, max_batch=16)
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=[REQUESTS, SIGNALS], group_id="g", assignment=None) as source,
    ):
        service = Service(SETTINGS, Clock(offset_ms=EPOCH_MS), source, sink, reader)
        async with trio.open_nursery() as nursery:
            if with_snapshotter:
                snapshotter = _snapshotter(reader, sink, SETTINGS.snapshot_interval_ms)
                nursery.start_soon(snapshotter.run)
            await service.run(stop, serve_http=False)
            nursery.cancel_scope.cancel()


async def _restore(reader: FakeReader, partition: int, *, snapshots: bool) -> Restored:
    """Partition ``partition`` restored as a service would: from its latest snapshot and the
    journal after it, or (``snapshots`` false) from the journal alone."""
    return await restore_partition(
        reader,
        topic=CHANGELOG,
        snapshots_topic=SNAPSHOTS if snapshots else None,
        partition=partition,
        config=SETTINGS.to_engine_config(),
        journal=None,
        progress=Progress(partition),
    )


def _callbacks(broker: FakeBroker) -> dict[str, bytes]:
    """Every callback by its id; copies of one id must be byte-identical."""
    seen: dict[str, bytes] = {}
    for record in broker.records(CALLBACKS):
        value = record.value or b""
        ident = json.loads(value)["id"]
        assert seen.setdefault(ident, value) == value, ident
    return seen


async def test_a_restart_from_a_snapshot_and_its_journal_tail_decides_the_same_outcomes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    for i in range(60):
        _register(broker, f"s{i % 5}", f"op{i}", [f"k{i}"], timeout_ms=3_600_000)
        _register(broker, f"s{i % 5}", f"t{i}", [], timeout_ms=2_000 + 100 * i)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _serve(broker, stop, with_snapshotter=True))
        await trio.sleep(3)  # snapshots are written; some timers have expired
        for i in range(0, 60, 2):
            _signal(broker, f"s{i % 5}", f"k{i}")
        await trio.sleep(3)
        stop.set()
    manifests = [r for r in broker.records(SNAPSHOTS) if r.key == MANIFEST_KEY]
    assert manifests, "the snapshotter wrote no snapshot"
    assert any(r.key == CHUNK_KEY for r in broker.records(SNAPSHOTS))
    before = _callbacks(broker)

    # Rebuild each partition both ways: from its latest snapshot and from the journal alone.
    reader = FakeReader(broker)
    for partition in (0, 1):
        found = await find_latest(reader, topic=SNAPSHOTS, partition=partition)
        assert found is not None and found.manifest.journal_offset > 0
        from_snapshot = await _restore(reader, partition, snapshots=True)
        from_journal = await _restore(reader, partition, snapshots=False)
        assert from_snapshot.progress.snapshot_bytes > 0
        assert from_snapshot.progress.entries < from_journal.progress.entries
        assert snapshot_engine(from_snapshot.engine) == snapshot_engine(from_journal.engine)
        assert from_snapshot.positions == from_journal.positions
        assert from_snapshot.journal_end == from_journal.journal_end

    # A restarted service restores from the snapshots and re-sends nothing that differs.
    again = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _serve(broker, again, with_snapshotter=False))
        await trio.sleep(200)  # every timer is due
        again.set()
    after = _callbacks(broker)
    assert before.items() <= after.items()
    ops = {json.loads(v)["op_id"]: json.loads(v)["outcome"] for v in after.values()}
    assert len(ops) == len(after)  # one outcome per operation, one id each
    expected = {f"t{i}": "expired" for i in range(60)} | {
        f"op{i}": "completed" for i in range(0, 60, 2)
    }
    assert ops == expected


async def test_a_damaged_snapshot_is_skipped_for_the_one_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    reader = FakeReader(broker)
    async with FakeTransport(broker).open_sink() as sink:
        for clock_ms, data in ((1, b"first snapshot"), (2, b"second snapshot")):
            await write_snapshot(
                sink,
                topic=SNAPSHOTS,
                data=data * 100,
                partition=1,
                journal_offset=clock_ms * 10,
                clock_ms=clock_ms,
                input_positions={REQUESTS: clock_ms},
                delivered=clock_ms,
                max_record_bytes=1_100,
            )
    found = await find_latest(reader, topic=SNAPSHOTS, partition=1)
    assert found is not None and found.data == b"second snapshot" * 100
    assert found.manifest.delivered == 2
    assert found.manifest.input_positions == ((REQUESTS, 1, 2),)
    # Alter one chunk of the second snapshot: its checksum fails, the first one is used.
    log = broker.topics[SNAPSHOTS][1]
    last_chunk = log[found.offset - 1]
    log[found.offset - 1] = dataclasses.replace(
        last_chunk, value=(last_chunk.value or b"")[:-1] + b"!"
    )
    fallback = await find_latest(reader, topic=SNAPSHOTS, partition=1)
    assert fallback is not None and fallback.data == b"first snapshot" * 100
    assert await find_latest(reader, topic=SNAPSHOTS, partition=0) is None


@pytest.mark.parametrize(
    ("start", "first", "settle_s"),
    [([0], [0], 1.0), ([0], [0], 60.0), ([], [1], 60.0)],
    ids=["settles", "moves-on-first", "first-answer-at-once"],
)
async def test_a_snapshotter_follows_the_partitions_the_service_beside_it_holds(
    start: list[int], first: list[int], settle_s: float, autojump_clock: trio.testing.MockClock
) -> None:
    broker = _broker()
    for i in range(20):
        _register(broker, f"s{i}", f"op{i}", ["k"], timeout_ms=3_600_000)
    stop = trio.Event()
    # What the service says, look by look (None: it cannot say).
    held: list[list[int] | None] = [first, first, None, [1]]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _serve(broker, stop, with_snapshotter=False))
        await trio.sleep(1)  # journaled
        reader = FakeReader(broker)
        async with FakeTransport(broker).open_sink() as sink:

            async def wanted() -> list[int] | None:
                return held.pop(0) if len(held) > 1 else held[0]

            snapshotter = Snapshotter(
                reader,
                sink,
                changelog_topic=CHANGELOG,
                snapshots_topic=SNAPSHOTS,
                config=SETTINGS.to_engine_config(),
                partitions=start,
                interval_ms=500,
                max_record_bytes=4_096,
                tail_every_s=0.2,
                wanted=wanted,
                settle_s=settle_s,
            )
            async with trio.open_nursery() as inner:
                inner.start_soon(snapshotter.run)
                await trio.sleep(3)
                inner.cancel_scope.cancel()
        stop.set()
    order = [s.partition for s in snapshotter.written]
    manifests = {r.partition for r in broker.records(SNAPSHOTS) if r.key == MANIFEST_KEY}
    if not start:  # the service's first answer is followed at once, whatever settle_s
        assert set(order) == manifests == {1}
    elif settle_s < 3:  # partition 0 first, then 1 once the service held it for settle_s
        assert order[0] == 0 and 1 in order
        assert 0 not in order[order.index(1) :]  # and 0 no more: its standby was dropped
        assert manifests == {0, 1}
    else:  # held for less than settle_s: not rebuilt here (a rollout moves it on soon)
        assert set(order) == manifests == {0}


async def test_a_snapshot_of_a_later_format_is_passed_over_for_the_whole_journal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A replica rolled back to an older build finds the snapshot a newer one wrote: it cannot
    decode it, so it replays the whole journal instead, and reaches the same state."""
    broker = _broker()
    for i in range(20):
        _register(broker, "s0", f"op{i}", [f"k{i}"], timeout_ms=3_600_000)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _serve(broker, stop, with_snapshotter=False))
        await trio.sleep(2)
        stop.set()
    reader = FakeReader(broker)
    partition = next(p for p in (0, 1) if broker.topics[CHANGELOG][p])
    from_journal = await _restore(reader, partition, snapshots=False)
    assert from_journal.engine.statistics().pending == 20
    later = b"PURGATORY-SNAPSHOT\n" + (99).to_bytes(2, "big") + b"a format of the future"
    async with FakeTransport(broker).open_sink() as sink:
        await write_snapshot(
            sink,
            topic=SNAPSHOTS,
            data=later,
            partition=partition,
            journal_offset=len(broker.topics[CHANGELOG][partition]),
            clock_ms=EPOCH_MS,
            input_positions={REQUESTS: 20},
            delivered=0,
            max_record_bytes=1_100,
        )
    restored = await _restore(reader, partition, snapshots=True)
    assert restored.progress.snapshot_bytes == 0  # the snapshot was not used
    assert snapshot_engine(restored.engine) == snapshot_engine(from_journal.engine)
    assert restored.positions == from_journal.positions


async def test_the_last_snapshots_at_a_stop_leave_the_next_owner_no_tail(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A graceful stop: the standby catches up with the journal and snapshots every partition
    that grew, so a restore replays nothing after the snapshot."""
    broker = _broker()
    for i in range(30):
        _register(broker, f"s{i % 3}", f"op{i}", [f"k{i}"], timeout_ms=3_600_000)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _serve(broker, stop, with_snapshotter=False))
        await trio.sleep(2)
        stop.set()
    reader = FakeReader(broker)
    async with FakeTransport(broker).open_sink() as sink:
        snapshotter = _snapshotter(reader, sink, 3_600_000)  # no periodic snapshot meanwhile
        await snapshotter.follow([0, 1])
        assert not [r for r in broker.records(SNAPSHOTS) if r.key == MANIFEST_KEY]
        for i in range(30, 40):  # journaled after the standby's restore
            _register(broker, f"s{i % 3}", f"op{i}", [f"k{i}"], timeout_ms=3_600_000)
        again = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _serve(broker, again, with_snapshotter=False))
            await trio.sleep(2)
            again.set()
        await snapshotter.last_snapshots()
    pending = 0
    for partition in (0, 1):
        if not broker.topics[CHANGELOG][partition]:
            continue
        restored = await _restore(reader, partition, snapshots=True)
        assert restored.progress.snapshot_bytes > 0
        assert restored.progress.records == 0  # no tail after the last snapshot
        assert restored.journal_end == len(broker.topics[CHANGELOG][partition])
        pending += restored.engine.statistics().pending
    assert pending == 40


async def test_a_bulk_load_is_snapshotted_before_the_interval(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    """A partition whose journal gained at least ``EARLY_SNAPSHOT_ENTRIES`` entries since its
    last snapshot, and at least a quarter as many as that snapshot held operations, is
    snapshotted at the next look; a smaller growth waits for the interval."""
    monkeypatch.setattr(snapshotter_module, "EARLY_SNAPSHOT_ENTRIES", 10)
    broker = _broker()

    async def journal(scopes: str) -> None:
        """Register an operation in each scope of ``scopes`` (``"0"``: s0, ``"1"``: s1) through
        a service, stopped once it has journaled them all."""
        for scope in scopes:
            ident = f"op{len(broker.records(REQUESTS))}"
            _register(broker, f"s{scope}", ident, [ident], timeout_ms=3_600_000)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _serve(broker, stop, with_snapshotter=False))
            for _ in range(1_000):
                await trio.sleep(0.1)
                if _all_committed(broker, SETTINGS):
                    break
            stop.set()

    async def look(snapshotter: Snapshotter) -> list[tuple[int, int]]:
        """One look of the snapshotter between two intervals; the snapshots written so far."""
        await snapshotter.tail()
        await snapshotter.snapshot_all(grown=True)
        return sorted((s.partition, s.pending) for s in snapshotter.written)

    p0, p1 = (broker.partition_for(CHANGELOG, scope.encode()) for scope in ("s0", "s1"))
    assert p0 != p1
    await journal("0" * 10 + "1" * 30)  # a bulk load into empty partitions
    reader = FakeReader(broker)
    async with FakeTransport(broker).open_sink() as sink:
        snapshotter = _snapshotter(reader, sink, 3_600_000)  # no periodic snapshot meanwhile
        async with trio.open_nursery() as nursery:  # its loop snapshots them before the interval
            nursery.start_soon(snapshotter.run)
            await trio.sleep(1)
            nursery.cancel_scope.cancel()
        first = sorted([(p0, 10), (p1, 30)])
        assert sorted((s.partition, s.pending) for s in snapshotter.written) == first
        await journal("0" + "1" * 3)  # fewer entries than EARLY_SNAPSHOT_ENTRIES
        assert await look(snapshotter) == first
        await journal("0" * 80)  # more than a quarter of the 10 it held: snapshotted
        assert await look(snapshotter) == sorted([*first, (p0, 91)])
        await journal("0" * 15)  # more than EARLY_SNAPSHOT_ENTRIES, not a quarter of 91
        assert await look(snapshotter) == sorted([*first, (p0, 91)])
        await snapshotter.snapshot_all()  # the interval's snapshot takes every one that grew
        assert sorted((s.partition, s.pending) for s in snapshotter.written[3:]) == sorted(
            [(p0, 106), (p1, 33)]
        )
