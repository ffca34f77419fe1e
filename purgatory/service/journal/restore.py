"""Restoring a partition's engine from the changelog, and following the assignment (service layer).

When this replica is given an input partition (at start, or by a group rebalance), the source
holds it unread while :func:`restore_partition` rebuilds its engine:

1. load the partition's latest snapshot (:mod:`purgatory.service.journal.snapshots`) at its own
clock,
   exactly as it was, or start from an empty engine when there is none;
2. read the changelog partition of the same number from the snapshot's journal offset (or its
   start) to its real end (the high watermark a fetch reports), replaying every journal batch
   at the times it was first applied, so the engine decides the same outcomes with the same
   sequences;
3. the outcomes after the last ``delivered`` mark are re-sent (exact repeats, same identity);
4. the inputs resume at the positions the journal reached (the records after them were never
   journaled, so they are read again; a record before them is never applied twice);
5. ``Engine.resume`` (journaled) flags what is overdue against the wall clock ``late``; the
   reaper expires it at its next step.

While a partition restores, its HTTP inputs answer 503 with Retry-After (``NotServingError``) and
``/readyz`` reports the restore's progress. A partition taken away is dropped: everything it
decided is journaled already, so its next owner re-sends what was not delivered.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field

import trio

from purgatory._core import (
    Engine,
    EngineConfig,
    JournalEntry,
    Outcome,
    TransportError,
    replay_journal,
    restore_engine,
)
from purgatory.service.dispatch.partitions import ServiceState
from purgatory.service.journal.format import decode_journal_record, fresh_entries, reach
from purgatory.service.journal.snapshots import find_latest
from purgatory.service.kafka.config import ConsumedRecord
from purgatory.service.kafka.transport import LogReader, RecordSource
from purgatory.service.telemetry.logging import get_logger
from reaper import Clock

__all__ = ["Progress", "Replayer", "Restored", "follow_assignment", "restore_partition"]

_log = get_logger()


@dataclass
class Progress:
    """How far the restore of one partition has got (read by ``/readyz`` and the metrics)."""

    partition: int
    records: int = 0
    entries: int = 0
    bytes: int = 0
    offset: int = 0
    snapshot_bytes: int = 0
    snapshot_pending: int = 0
    fetch_s: float = 0.0  # finding and reading the snapshot
    rebuild_s: float = 0.0  # rebuilding the engine from it
    tail_s: float = 0.0  # reading and replaying the journal after it
    started_s: float = field(default_factory=trio.current_time)
    seconds: float | None = None  # set when done


@dataclass
class Restored:
    """A partition's engine rebuilt from its journal."""

    engine: Engine
    positions: dict[str, int]
    resend: list[Outcome]
    acked: int
    journal_end: int  # the changelog offset after the last record replayed
    progress: Progress


class _GcPause:
    """No cyclic garbage collection while a restore allocates a partition's state (it only
    builds live objects: every collection would scan them all for nothing). Parallel restores
    share one pause; reference counting still frees what they drop."""

    def __init__(self) -> None:
        self._depth = 0
        self._reenable = False

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        if self._depth == 0:
            self._reenable = gc.isenabled()
            gc.disable()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self._reenable:
                gc.enable()


_gc_paused = _GcPause()


async def restore_partition(
    reader: LogReader,
    *,
    topic: str,
    snapshots_topic: str | None,
    partition: int,
    config: EngineConfig,
    journal: Callable[[JournalEntry], None] | None,
    progress: Progress,
) -> Restored:
    """Rebuild partition ``partition``'s engine: its latest snapshot, then the journal after it.

    ``journal`` is attached to the rebuilt engine (the replay itself is not journaled again).
    The replay runs in the reader's worker thread when it has one, so the event loop keeps
    answering (``/readyz``, other partitions) meanwhile.

    Raises:
        TransportError: a topic could not be read, or holds a record this version cannot.
        BadRecordError: a journal entry is damaged.
    """
    with _gc_paused():
        replayer, start = await _from_snapshot(
            reader,
            snapshots_topic=snapshots_topic,
            partition=partition,
            config=config,
            journal=journal,
            progress=progress,
        )
        began = trio.current_time()
        end = await reader.read(topic, partition, start, replayer.handle)
    progress.tail_s = trio.current_time() - began
    progress.seconds = trio.current_time() - progress.started_s
    return Restored(
        replayer.engine, replayer.positions, replayer.resend, replayer.acked, end, progress
    )


async def _from_snapshot(
    reader: LogReader,
    *,
    snapshots_topic: str | None,
    partition: int,
    config: EngineConfig,
    journal: Callable[[JournalEntry], None] | None,
    progress: Progress,
) -> tuple[Replayer, int]:
    """The engine of the latest usable snapshot (a new one without), ready to replay the
    journal from the offset it returns."""
    began = trio.current_time()
    found = None
    if snapshots_topic is not None:
        try:
            found = await find_latest(reader, topic=snapshots_topic, partition=partition)
        except TransportError as exc:  # snapshots only save time: replay the whole journal
            _log.warning("snapshot_unreadable", partition=partition, error=str(exc))
    progress.fetch_s = trio.current_time() - began
    if found is None:
        engine = Engine(config, partition=partition, journal=journal)
        return Replayer(engine, progress=progress), 0
    began = trio.current_time()
    manifest = found.manifest
    engine = restore_engine(found.data, now_ms=0, config=config, journal=journal)
    progress.snapshot_bytes = manifest.size_bytes
    progress.snapshot_pending = engine.statistics().pending
    progress.rebuild_s = trio.current_time() - began
    progress.offset = manifest.journal_offset
    replayer = Replayer(
        engine,
        positions={t: o for t, _p, o in manifest.input_positions},
        acked=manifest.delivered,
        resend=engine.decided_after(manifest.delivered),
        progress=progress,
    )
    return replayer, manifest.journal_offset


class Replayer:
    """Applies changelog records to an engine, following the positions and the delivered mark.

    Args:
        engine: the engine (its journal, if any, does not record the replay).
        positions: the input positions reached so far (updated).
        acked: the delivered mark so far.
        resend: outcomes after ``acked`` so far (kept only with ``keep_resend``).
        progress: counts to update.
        keep_resend: keep the outcomes after the delivered mark (a restore re-sends them; a
            snapshotter does not need them).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        positions: dict[str, int] | None = None,
        acked: int = 0,
        resend: list[Outcome] | None = None,
        progress: Progress,
        keep_resend: bool = True,
    ) -> None:
        self.engine = engine
        self.positions = positions if positions is not None else {}
        self.acked = acked
        self.resend = resend if resend is not None else []
        self.progress = progress
        self._keep = keep_resend

    def handle(self, batch: list[ConsumedRecord]) -> None:
        """Apply one batch of changelog records (may run in the reader's worker thread)."""
        progress = self.progress
        for record in batch:
            value = record.value or b""
            progress.records += 1
            progress.bytes += len(value)
            progress.offset = record.offset + 1
            doc = decode_journal_record(value)
            if doc is None:
                continue
            entries = fresh_entries(doc, self.positions)
            progress.entries += len(entries)
            decided = replay_journal(self.engine, entries)
            reach(self.positions, doc["positions"])
            if doc["delivered"] > self.acked:
                self.acked = doc["delivered"]
                if self._keep:
                    self.resend = [o for o in self.resend if o.sequence > self.acked]
            if self._keep:
                self.resend.extend(o for o in decided if o.sequence > self.acked)


async def follow_assignment(
    source: RecordSource,
    state: ServiceState,
    reader: LogReader | None,
    *,
    changelog_topic: str,
    snapshots_topic: str | None = None,
    input_topics: Collection[str],
    clock: Clock,
    progress: dict[int, Progress],
    commit: Callable[[dict[tuple[str, int], int]], None] = lambda _offsets: None,
    took: Callable[[int, int], None] | None = None,
    taken: Callable[[int], None] = lambda _partition: None,
    hold_off: Callable[[int], bool] = lambda _partition: False,
    poll_s: float = 0.05,
) -> None:
    """Serve exactly the input partitions the source holds: restore each one it is given
    (without a ``reader``, start it empty), drop each one taken away. Runs until cancelled.

    ``commit`` takes the journaled positions of a restored partition (the outbox's
    ``put_commit``: the group's offsets then follow the journal, after the re-sent outcomes).
    ``took`` is told each partition restored and the changelog offset it was restored to (the
    journal's writer then checks that its next record lands there); ``taken`` is told each
    partition as its restore begins. A partition still held but
    no longer served (fenced: another writer wrote to it) is restored again, once ``hold_off``
    says its back-off is over."""
    known: set[int] = set()
    while True:
        # Fenced partitions (dropped while still held) are taken again, from the changelog.
        known &= state.serving() | state.restoring_now()
        held = {p for t, p in source.assignment() if t in input_topics}
        paused = {p for t, p in source.held() if t in input_topics}
        # Taken away; or taken away and given back between two looks (held again: the
        # consumer's position was reset, so the partition is restored again from its journal).
        for partition in sorted((known - held) | (known & paused)):
            state.drop(partition)
            progress.pop(partition, None)
            known.discard(partition)
            _log.info("partition_dropped", partition=partition)
        new = sorted(p for p in held - known if not hold_off(p))
        for partition in new:
            state.restoring(partition)
            taken(partition)
        async with trio.open_nursery() as restores:  # in parallel: each mostly waits on I/O
            for partition in new:
                restores.start_soon(
                    functools.partial(
                        _take,
                        source,
                        state,
                        reader,
                        partition=partition,
                        changelog_topic=changelog_topic,
                        snapshots_topic=snapshots_topic,
                        input_topics=input_topics,
                        clock=clock,
                        progress=progress,
                        commit=commit,
                        took=took,
                    )
                )
        known.update(new)
        await trio.sleep(poll_s)


async def _take(
    source: RecordSource,
    state: ServiceState,
    reader: LogReader | None,
    *,
    partition: int,
    changelog_topic: str,
    snapshots_topic: str | None,
    input_topics: Collection[str],
    clock: Clock,
    progress: dict[int, Progress],
    commit: Callable[[dict[tuple[str, int], int]], None],
    took: Callable[[int, int], None] | None,
) -> None:
    status = progress[partition] = Progress(partition)
    positions: dict[str, int] = {}
    resend: list[Outcome] = []
    acked = 0
    journal_end: int | None = None
    if reader is not None:
        _log.info("partition_restoring", partition=partition)
        restored = await restore_partition(
            reader,
            topic=changelog_topic,
            snapshots_topic=snapshots_topic,
            partition=partition,
            config=state.config,
            journal=state.journal(partition),
            progress=status,
        )
        engine = restored.engine
        positions, resend, acked = restored.positions, restored.resend, restored.acked
        journal_end = restored.journal_end
    else:  # no journal: the partition starts empty
        engine = state.new_engine(partition, start_ms=0)
        status.seconds = 0.0
    if not any((t, partition) in source.assignment() for t in input_topics):
        _log.info("partition_taken_while_restoring", partition=partition)
        return  # taken away meanwhile: its next owner restores it
    if took is not None and journal_end is not None:
        took(partition, journal_end)  # before the resume entry: the first record checked
    now = clock.now_ms()
    late = engine.resume(now)
    epochs = {t: source.resume_epoch(t, partition) for t in input_topics}
    state.serve(partition, engine, acked=acked, positions=positions, epochs=epochs)
    state.redeliver(resend)
    await source.resume({(t, partition): positions.get(t) for t in input_topics})
    if positions:
        commit({(t, partition): offset for t, offset in positions.items()})
    _log.info(
        "partition_serving",
        partition=partition,
        journal_records=status.records,
        journal_entries=status.entries,
        pending=engine.statistics().pending,
        resent=len(resend),
        overdue=late,
        snapshot_pending=status.snapshot_pending,
        restore_s=round(status.seconds or 0.0, 3),
        positions=positions,
    )
