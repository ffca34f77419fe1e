"""Following the assignment: serve exactly the input partitions the source holds (service
layer: dispatch).

When this replica is given an input partition (at start, or by a group rebalance), the source
holds it unread while :func:`~purgatory.service.journal.restore.restore_partition` rebuilds
its engine; this module then serves the partition with it, re-sends what was decided and not
delivered, and resumes the inputs at the positions the journal reached. While a partition
restores, its HTTP inputs answer 503 with Retry-After (``NotServingError``) and ``/readyz``
reports the restore's progress. A partition taken away is dropped: everything it decided is
journaled already, so its next owner re-sends what was not delivered.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable, Collection

import trio

from purgatory._core import Outcome
from purgatory.service.dispatch.partitions import ServiceState
from purgatory.service.journal.restore import Progress, restore_partition
from purgatory.service.kafka.transport import LogReader, RecordSource
from purgatory.service.telemetry.logging import get_logger
from reaper import Clock

__all__ = ["follow_assignment"]

_log = get_logger()


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
    opening: Callable[[int], Awaitable[None]] | None = None,
    taken: Callable[[int], None] = lambda _partition: None,
    hold_off: Callable[[int], bool] = lambda _partition: False,
    poll_s: float = 0.05,
) -> None:
    """Serve exactly the input partitions the source holds: restore each one it is given
    (without a ``reader``, start it empty), drop each one taken away. Runs until cancelled.

    ``commit`` takes the journaled positions of a restored partition (the outbox's
    ``put_commit``: the group's offsets then follow the journal, after the re-sent outcomes).
    ``took`` is told each partition restored and the changelog offset it was restored to (the
    journal's writer then checks that its next record lands there); ``opening`` is awaited
    before each restore reads the changelog (transactional delivery takes the partition's
    transactional id there, fencing its earlier owners); ``taken`` is told each
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
        _drop(state, progress, known, (known - held) | (known & paused))
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
                        opening=opening,
                    )
                )
        known.update(new)
        await trio.sleep(poll_s)


def _drop(
    state: ServiceState, progress: dict[int, Progress], known: set[int], gone: set[int]
) -> None:
    for partition in sorted(gone):
        state.drop(partition)
        progress.pop(partition, None)
        known.discard(partition)
        _log.info("partition_dropped", partition=partition)


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
    opening: Callable[[int], Awaitable[None]] | None = None,
) -> None:
    """Restore ``partition`` (or start it empty without a ``reader``), then serve it."""
    status = progress[partition] = Progress(partition)
    positions: dict[str, int] = {}
    resend: list[Outcome] = []
    acked, journal_end = 0, None
    if opening is not None:  # before the changelog is read: earlier writers fenced
        await opening(partition)
    if reader is not None:
        _log.info("partition_restoring", partition=partition)
        restored = await restore_partition(
            reader, topic=changelog_topic, snapshots_topic=snapshots_topic, partition=partition,
            config=state.config, journal=state.journal(partition), progress=status,
        )  # fmt: skip
        engine, positions, resend = restored.engine, restored.positions, restored.resend
        acked, journal_end = restored.acked, restored.journal_end
    else:  # no journal: the partition starts empty
        engine = state.new_engine(partition, start_ms=0)
        status.seconds = 0.0
    if not any((t, partition) in source.assignment() for t in input_topics):
        _log.info("partition_taken_while_restoring", partition=partition)
        return  # taken away meanwhile: its next owner restores it
    if took is not None and journal_end is not None:
        took(partition, journal_end)  # before the resume entry: the first record checked
    late = engine.resume(clock.now_ms())
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
