"""Restoring a partition's engine from the changelog, and following the assignment (service layer).

When this replica is given an input partition (at start, or by a group rebalance), the source
holds it unread while :func:`restore_partition` rebuilds its engine:

1. read the changelog partition of the same number from its start to its real end (the high
   watermark a fetch reports), replaying every journal batch into a new engine at the times they
   were first applied, so it decides the same outcomes with the same sequences;
2. the outcomes after the last ``delivered`` mark are re-sent (exact repeats, same identity);
3. the inputs resume at the positions the journal reached (the records after them were never
   journaled, so they are read again; a record before them is never applied twice);
4. ``Engine.resume`` (journaled) flags what is overdue against the wall clock ``late``; the
   reaper expires it at its next step.

While a partition restores, its HTTP inputs answer 503 with Retry-After (``NotServingError``) and
``/readyz`` reports the restore's progress. A partition taken away is dropped: everything it
decided is journaled already, so its next owner re-sends what was not delivered.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass, field

import trio

from purgatory._core import Engine, Outcome, replay_journal
from purgatory.service._changelog import decode_journal_record
from purgatory.service._kafka_config import ConsumedRecord
from purgatory.service._logging import get_logger
from purgatory.service._state import ServiceState
from purgatory.service._transport import LogReader, RecordSource
from reaper import Clock

__all__ = ["Progress", "Restored", "follow_assignment", "restore_partition"]

_log = get_logger()


@dataclass
class Progress:
    """How far the restore of one partition has got (read by ``/readyz`` and the metrics)."""

    partition: int
    records: int = 0
    entries: int = 0
    bytes: int = 0
    offset: int = 0
    started_s: float = field(default_factory=trio.current_time)
    seconds: float | None = None  # set when done


@dataclass
class Restored:
    """A partition's engine rebuilt from its journal."""

    engine: Engine
    positions: dict[str, int]
    resend: list[Outcome]
    acked: int
    progress: Progress


async def restore_partition(
    reader: LogReader, *, topic: str, partition: int, engine: Engine, progress: Progress
) -> Restored:
    """Replay changelog partition ``partition`` into ``engine`` (new, journal attached).

    The replay runs in the reader's worker thread when it has one, so the event loop keeps
    answering (``/readyz``, other partitions) meanwhile.

    Raises:
        TransportError: the changelog could not be read, or holds a record this version cannot.
        BadRecordError: a journal entry is damaged.
    """
    positions: dict[str, int] = {}
    resend: list[Outcome] = []
    acked = 0

    def handle(batch: list[ConsumedRecord]) -> None:
        nonlocal acked, resend
        for record in batch:
            value = record.value or b""
            progress.records += 1
            progress.bytes += len(value)
            progress.offset = record.offset + 1
            doc = decode_journal_record(value)
            if doc is None:
                continue
            entries = doc["entries"]
            progress.entries += len(entries)
            decided = replay_journal(engine, entries)
            positions.update(doc["positions"])
            if doc["delivered"] > acked:
                acked = doc["delivered"]
                resend = [o for o in resend if o.sequence > acked]
            resend.extend(o for o in decided if o.sequence > acked)

    await reader.read(topic, partition, 0, handle)
    progress.seconds = trio.current_time() - progress.started_s
    return Restored(engine, positions, resend, acked, progress)


async def follow_assignment(
    source: RecordSource,
    state: ServiceState,
    reader: LogReader | None,
    *,
    changelog_topic: str,
    input_topics: Collection[str],
    clock: Clock,
    progress: dict[int, Progress],
    commit: Callable[[dict[tuple[str, int], int]], None] = lambda _offsets: None,
    poll_s: float = 0.05,
) -> None:
    """Serve exactly the input partitions the source holds: restore each one it is given
    (without a ``reader``, start it empty), drop each one taken away. Runs until cancelled.

    ``commit`` takes the journaled positions of a restored partition (the outbox's
    ``put_commit``: the group's offsets then follow the journal, after the re-sent outcomes)."""
    known: set[int] = set()
    while True:
        held = {p for t, p in source.assignment() if t in input_topics}
        paused = {p for t, p in source.held() if t in input_topics}
        # Taken away; or taken away and given back between two looks (held again: the
        # consumer's position was reset, so the partition is restored again from its journal).
        for partition in sorted((known - held) | (known & paused)):
            state.drop(partition)
            progress.pop(partition, None)
            known.discard(partition)
            _log.info("partition_dropped", partition=partition)
        new = sorted(held - known)
        for partition in new:
            state.restoring(partition)
        for partition in new:
            await _take(
                source,
                state,
                reader,
                partition=partition,
                changelog_topic=changelog_topic,
                input_topics=input_topics,
                clock=clock,
                progress=progress,
                commit=commit,
            )
            known.add(partition)
        await trio.sleep(poll_s)


async def _take(
    source: RecordSource,
    state: ServiceState,
    reader: LogReader | None,
    *,
    partition: int,
    changelog_topic: str,
    input_topics: Collection[str],
    clock: Clock,
    progress: dict[int, Progress],
    commit: Callable[[dict[tuple[str, int], int]], None],
) -> None:
    engine = state.new_engine(partition, start_ms=0)
    status = progress[partition] = Progress(partition)
    positions: dict[str, int] = {}
    resend: list[Outcome] = []
    acked = 0
    if reader is not None:
        _log.info("partition_restoring", partition=partition)
        restored = await restore_partition(
            reader, topic=changelog_topic, partition=partition, engine=engine, progress=status
        )
        positions, resend, acked = restored.positions, restored.resend, restored.acked
    else:
        status.seconds = 0.0
    now = clock.now_ms()
    late = engine.resume(now)
    state.serve(partition, engine, acked=acked, positions=positions)
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
        restore_s=round(status.seconds or 0.0, 3),
        positions=positions,
    )
