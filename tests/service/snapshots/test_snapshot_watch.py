"""The serving process's view of its partitions' snapshots, read from the snapshots topic, in
virtual time: the age of each latest snapshot and the changelog records after it."""

from __future__ import annotations

from collections.abc import Callable

import structlog
import trio
import trio.testing

from purgatory._core import TransportError
from purgatory._core.durability.manifest import encode_manifest, split_snapshot
from purgatory.service.kafka.transport import ConsumedRecord
from purgatory.service.snapshots.snapshot_watch import LOOK_BACK_RECORDS, SnapshotWatch
from purgatory.service.snapshots.snapshots import CHUNK_KEY, MANIFEST_KEY
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeReader

EPOCH_MS = 1_763_780_400_000
SNAPSHOTS, CHANGELOG = "purgatory.snapshots", "purgatory.changelog"


def _broker() -> FakeBroker:
    return FakeBroker({SNAPSHOTS: 2, CHANGELOG: 2})


def _put(broker: FakeBroker, topic: str, partition: int, record: tuple[bytes, bytes, int]) -> None:
    """Append ``(key, value, timestamp_ms)`` as the broker would."""
    log = broker.topics[topic][partition]
    log.append(ConsumedRecord(topic, partition, len(log), *record))


def _journal(broker: FakeBroker, partition: int, records: int) -> None:
    for _ in range(records):
        _put(broker, CHANGELOG, partition, (b"journal", b"{}", EPOCH_MS))


def _chunks(broker: FakeBroker, partition: int, count: int, written_ms: int) -> None:
    for _ in range(count):
        _put(broker, SNAPSHOTS, partition, (CHUNK_KEY, b"abcd", written_ms))


def _snapshot(broker: FakeBroker, partition: int, *, journal_offset: int, written_ms: int) -> None:
    """A whole snapshot as the snapshotter writes it: chunks, then their manifest."""
    manifest, chunks = split_snapshot(
        b"0123456789",
        max_chunk_bytes=4,
        partition=partition,
        journal_offset=journal_offset,
        clock_ms=written_ms,
    )
    for chunk in chunks:
        _put(broker, SNAPSHOTS, partition, (CHUNK_KEY, chunk, written_ms))
    _put(broker, SNAPSHOTS, partition, (MANIFEST_KEY, encode_manifest(manifest), written_ms))


def _watch(
    broker: FakeBroker, *, partitions: list[int] | None = None, reader: FakeReader | None = None
) -> tuple[SnapshotWatch, Callable[[], int]]:
    clock = Clock(offset_ms=EPOCH_MS - int(trio.current_time() * 1000))
    watch = SnapshotWatch(
        reader or FakeReader(broker),
        snapshots_topic=SNAPSHOTS,
        changelog_topic=CHANGELOG,
        partitions=partitions,
        now_ms=clock.now_ms,
        every_s=30,
    )
    return watch, clock.now_ms


def _by_partition(watch: SnapshotWatch) -> dict[int, tuple[float, int, bool]]:
    return {s.partition: (s.age_s, s.lag_records, s.found) for s in watch.statistics()}


async def test_the_age_grows_at_scrape_time_and_the_lag_counts_the_journal_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    _journal(broker, 0, 8)
    _snapshot(broker, 0, journal_offset=5, written_ms=EPOCH_MS - 40_000)
    _journal(broker, 1, 2)  # partition 1 has no snapshot yet
    watch, _ = _watch(broker, partitions=[0, 1])
    await watch.look()
    assert _by_partition(watch) == {0: (40.0, 3, True), 1: (0.0, 2, False)}
    await trio.sleep(25)  # no look: the ages still follow the clock
    assert _by_partition(watch) == {0: (65.0, 3, True), 1: (25.0, 2, False)}
    _snapshot(broker, 0, journal_offset=8, written_ms=EPOCH_MS + 20_000)
    _snapshot(broker, 1, journal_offset=2, written_ms=EPOCH_MS + 21_000)
    _journal(broker, 1, 1)
    await watch.look()
    assert _by_partition(watch) == {0: (5.0, 0, True), 1: (4.0, 1, True)}
    (status, _) = watch.statistics()
    assert status.journal_offset == 8


async def test_a_snapshot_being_written_leaves_the_last_one_until_its_manifest_lands(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    _journal(broker, 0, 10)
    _snapshot(broker, 0, journal_offset=4, written_ms=EPOCH_MS - 60_000)
    watch, _ = _watch(broker, partitions=[0])
    await watch.look()
    _chunks(broker, 0, 3, EPOCH_MS)  # the next snapshot's chunks, its manifest not yet
    await watch.look()
    assert _by_partition(watch) == {0: (60.0, 6, True)}
    manifest, _ = split_snapshot(
        b"x", max_chunk_bytes=4, partition=0, journal_offset=10, clock_ms=0
    )
    _put(broker, SNAPSHOTS, 0, (MANIFEST_KEY, encode_manifest(manifest), EPOCH_MS))
    await watch.look()
    assert _by_partition(watch) == {0: (0.0, 0, True)}


async def test_knowing_no_snapshot_yet_the_watch_looks_back_for_the_last_manifest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    _journal(broker, 0, 7)
    _journal(broker, 1, 7)
    _snapshot(broker, 0, journal_offset=7, written_ms=EPOCH_MS - 90_000)
    _chunks(broker, 0, 40, EPOCH_MS)  # a snapshot under way
    _put(broker, SNAPSHOTS, 0, (MANIFEST_KEY, b"{damaged", EPOCH_MS))  # skipped, as a restore does
    _snapshot(broker, 1, journal_offset=7, written_ms=EPOCH_MS - 90_000)
    _chunks(broker, 1, LOOK_BACK_RECORDS, EPOCH_MS)  # too far back to be looked for
    watch, _ = _watch(broker, partitions=[0, 1])
    await watch.look()
    assert _by_partition(watch) == {0: (90.0, 0, True), 1: (0.0, 7, False)}


async def test_without_static_partitions_every_changelog_partition_is_watched(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    watch, _ = _watch(broker, partitions=None)
    async with trio.open_nursery() as nursery:
        await nursery.start(watch.run)
        assert _by_partition(watch) == {0: (0.0, 0, False), 1: (0.0, 0, False)}
        _journal(broker, 1, 4)
        _snapshot(broker, 1, journal_offset=3, written_ms=EPOCH_MS + 1_000)
        await trio.sleep(29)
        assert _by_partition(watch)[1] == (29.0, 0, False)  # not looked again yet
        await trio.sleep(2)  # the look at 30 s
        assert _by_partition(watch)[1] == (30.0, 1, True)
        nursery.cancel_scope.cancel()


class _FlakyReader(FakeReader):
    """Fails every read while ``down``."""

    down = False

    async def end_offset(self, topic: str, partition: int) -> int:
        if self.down:
            raise TransportError("broker away")
        return await super().end_offset(topic, partition)


async def test_an_unreadable_broker_keeps_what_was_known_and_is_logged_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    _journal(broker, 0, 2)
    _snapshot(broker, 0, journal_offset=2, written_ms=EPOCH_MS)
    reader = _FlakyReader(broker)
    watch, _ = _watch(broker, partitions=[0], reader=reader)
    with structlog.testing.capture_logs() as logs:
        await watch.look()
        reader.down = True
        for _ in range(3):
            await trio.sleep(30)
            await watch.look()
        assert _by_partition(watch) == {0: (90.0, 0, True)}
        reader.down = False
        await watch.look()
    events = [e["event"] for e in logs]
    assert events == ["snapshot_watch_failed", "snapshot_watch_recovered"]
    assert "broker away" in logs[0]["error"]
