"""Restoring a partition's engine from the changelog (service layer: journal).

When this replica is given an input partition (at start, or by a group rebalance), the source
holds it unread while :func:`restore_partition` rebuilds its engine:

1. load the partition's latest snapshot (:mod:`purgatory.service.snapshots.snapshots`) at its
   own clock, exactly as it was, or start from an empty engine when there is none;
2. read the changelog partition of the same number from the snapshot's journal offset (or its
   start) to its real end (the high watermark a fetch reports), replaying every journal batch
   that counts (not a stale writer's void record, see
   :mod:`purgatory.service.journal.format`) at the times it was first applied, so the engine
   decides the same outcomes with the same sequences;
3. the outcomes after the last ``delivered`` mark are re-sent (exact repeats, same identity);
4. the inputs resume at the positions the journal reached (the records after them were never
   journaled, so they are read again; a record before them is never applied twice);
5. ``Engine.resume`` (journaled) flags what is overdue against the wall clock ``late``; the
   reaper expires it at its next step.

It gives the rebuilt engine, the outcomes to re-send and the positions to resume at to its
caller (:mod:`purgatory.service.dispatch.follow`, which serves the partition with them).

A warm standby (:mod:`purgatory.service.dispatch.standby`) does steps 1 and 2 before the
partition is its own (:func:`stand_by`), then goes on replaying the journal as its owner
appends to it (:meth:`Standing.catch_up`); a restore from it (``restore_partition(...,
standby=)``) reads only what was appended since, usually the old owner's last batches.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import trio

from purgatory._core import (
    BadRecordError,
    Engine,
    EngineConfig,
    JournalEntry,
    Outcome,
    TransportError,
    replay_journal,
    restore_engine,
)
from purgatory.service.journal.format import counts, decode_journal_record, fresh_entries, reach
from purgatory.service.kafka.transport import ConsumedRecord, LogReader
from purgatory.service.snapshots.snapshots import find_latest
from purgatory.service.telemetry.logging import get_logger

__all__ = ["Progress", "Replayer", "Restored", "Standing", "restore_partition", "stand_by"]

_log = get_logger()


@dataclass
class Progress:
    """How far the restore of one partition has got (read by ``/readyz`` and the metrics)."""

    partition: int
    records: int = 0
    void: int = 0  # records that landed where their writer did not expect (skipped)
    entries: int = 0
    bytes: int = 0
    offset: int = 0
    snapshot_bytes: int = 0
    snapshot_pending: int = 0
    overdue: int = 0  # operations overdue when it resumed (flagged late)
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
    share one pause; reference counting still frees what they drop. When the last one ends,
    the C allocator gives its free pages back (:func:`_give_back_memory`)."""

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
            if self._depth == 0:
                # What the restores built lives long: frozen, later collections never scan it
                # (a million operations cost a full collection about a second). An engine
                # dropped at a hand-over is cyclic garbage: the table unfreezes then.
                gc.freeze()
                if self._reenable:
                    gc.enable()
                _give_back_memory()


_gc_paused = _GcPause()


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim: Callable[[int], int] = libc.malloc_trim
    except (OSError, AttributeError):  # not glibc: nothing to call
        return None
    return trim


def _give_back_memory() -> None:
    """Return the C allocator's free pages to the system (glibc's ``malloc_trim``; elsewhere
    nothing). A restore decodes tens of MB (the snapshot's text, its columns, the indexes'
    tables as they grow) that are freed among the long-lived objects it built, so the heap
    cannot shrink from its top: measured on a restore of 1M pending operations, the process
    kept 678 bytes of RSS per operation, 552 after the trim (what registering them costs),
    which took 7 ms."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


async def restore_partition(
    reader: LogReader,
    *,
    topic: str,
    snapshots_topic: str | None,
    partition: int,
    config: EngineConfig,
    journal: Callable[[JournalEntry], None] | None,
    progress: Progress,
    standby: Standing | None = None,
) -> Restored:
    """Rebuild partition ``partition``'s engine: its latest snapshot, then the journal after it
    (or, from a warm ``standby`` of it, the journal after what it replayed).

    ``journal`` is attached to the rebuilt engine (the replay itself is not journaled again).
    The replay runs in the reader's worker thread when it has one, so the event loop keeps
    answering (``/readyz``, other partitions) meanwhile.

    Raises:
        TransportError: a topic could not be read, or holds a record this version cannot.
        BadRecordError: a journal entry is damaged.
    """
    if standby is None:
        standby = await stand_by(
            reader,
            topic=topic,
            snapshots_topic=snapshots_topic,
            partition=partition,
            config=config,
            journal=journal,
            progress=progress,
        )
    else:
        with _gc_paused():
            standby.replayer.progress = progress
            progress.offset = standby.end
            began = trio.current_time()
            await standby.catch_up(reader, topic)
        progress.tail_s = trio.current_time() - began
    progress.seconds = trio.current_time() - progress.started_s
    replayer = standby.replayer
    return Restored(
        replayer.engine, replayer.positions, replayer.resend, replayer.acked, standby.end, progress
    )


@dataclass
class Standing:
    """A partition's engine replayed up to offset ``end`` of its journal (a warm standby)."""

    replayer: Replayer
    end: int

    async def catch_up(self, reader: LogReader, topic: str) -> int:
        """Replay what the journal gained since; how many records that was.

        Raises:
            TransportError: the journal could not be read.
            BadRecordError: a journal entry is damaged.
        """
        progress = self.replayer.progress
        before = progress.records
        partition = self.replayer.engine.partition
        self.end = await reader.read(topic, partition, self.end, self.replayer.handle)
        return progress.records - before


async def stand_by(
    reader: LogReader,
    *,
    topic: str,
    snapshots_topic: str | None,
    partition: int,
    config: EngineConfig,
    journal: Callable[[JournalEntry], None] | None,
    progress: Progress,
) -> Standing:
    """Rebuild ``partition``'s engine as a restore does, for a standby that keeps it current.

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
    return Standing(replayer, end)


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
    try:
        # In a worker thread, as the replay: the loop keeps answering (``/readyz``, the other
        # partitions) while a million operations are rebuilt.
        engine = await trio.to_thread.run_sync(
            functools.partial(restore_engine, found.data, now_ms=0, config=config, journal=journal)
        )
    except BadRecordError as exc:
        # A snapshot this build cannot decode (a later format, written by a newer replica
        # before a rollback): it only saves time, so the whole journal is replayed instead.
        _log.warning("snapshot_undecodable", partition=partition, error=str(exc))
        engine = Engine(config, partition=partition, journal=journal)
        return Replayer(engine, progress=progress), 0
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
        resend: outcomes after ``acked`` so far (kept until :meth:`forget_resend`).
        progress: counts to update.
    """

    def __init__(
        self,
        engine: Engine,
        *,
        positions: dict[str, int] | None = None,
        acked: int = 0,
        resend: list[Outcome] | None = None,
        progress: Progress,
    ) -> None:
        self.engine = engine
        self.positions = positions if positions is not None else {}
        self.acked = acked
        self.resend = resend if resend is not None else []
        self.progress = progress
        self._keep = True

    def forget_resend(self) -> None:
        """Keep no outcome after the delivered mark from now on (a restore re-sends them; a
        snapshotter does not need them)."""
        self._keep = False
        self.resend = []

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
            if not counts(doc, record.offset):  # a stale writer's: decided on another log
                progress.void += 1
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
