"""The snapshotter (service layer): a warm standby that tails the journal and writes snapshots.

It runs beside the service, in its own process (``purgatory snapshotter``; ``purgatory serve``
starts one as its child), so building a snapshot never holds up the serving loop. For each of
its partitions it restores the engine exactly as a service would (latest snapshot, then the
journal after it), then keeps it current by replaying the changelog as it grows. Every
``snapshot_interval_ms``, a partition whose journal grew is snapshotted at the journal offset
reached and written to the snapshots topic (:mod:`purgatory.service.snapshots.snapshots`).

A partition whose journal gained many entries since its last snapshot is snapshotted at the
next look, without waiting for the interval: at least :data:`EARLY_SNAPSHOT_ENTRIES`, and at
least a quarter (:data:`EARLY_SNAPSHOT_SHARE`) as many as the last snapshot held operations.
A bulk load (a backfill registering a day of operations in seconds) is then in a snapshot
within a second or two, and a restore or a standby rebuilt meanwhile decodes it and replays a
short tail instead of every entry (measured in a rollout on a busy machine, 70k operations: a
replica rebuilt a partition from its journal alone in 7.6 s, from a snapshot of three quarters
of it and the journal after in 3.4 s, from a snapshot of it all in 1.4 s). The second bound
keeps the cost in proportion: an early snapshot holds at most the last one's operations plus
the entries since, five times the entries that call for it, and writing an operation costs a
fraction of replaying its entry.

At a graceful stop (SIGTERM, sent by ``serve`` once the service has stopped and its journal is
settled) the standby catches up with the journal and writes a last snapshot of each partition
that grew (:meth:`Snapshotter.last_snapshots`), within :data:`LAST_SNAPSHOTS_S`: the next owner
then restores that snapshot and replays nothing after it, where it would otherwise replay up
to an interval of journal.

The snapshot is of a replayed engine, never of the live one: it holds exactly the journal's
prefix up to ``journal_offset``, and a restore from it followed by the journal after it decides
the same outcomes as the serving engine did. A snapshotter that dies or lags costs nothing but
replay time at the next restore; two snapshotters of one partition only write redundant
snapshots (each complete and checked on its own).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

import trio

from purgatory._core import EngineConfig, TransportError, snapshot_engine
from purgatory.service.journal.restore import Progress, Standing, stand_by
from purgatory.service.kafka.transport import LogReader, RecordSink
from purgatory.service.snapshots.snapshots import write_snapshot
from purgatory.service.telemetry.logging import get_logger

__all__ = [
    "EARLY_SNAPSHOT_ENTRIES",
    "EARLY_SNAPSHOT_SHARE",
    "LAST_SNAPSHOTS_S",
    "SnapshotStatistics",
    "Snapshotter",
]

_log = get_logger()

#: How long the last snapshots at a graceful stop may take: under the serving process's 10 s
#: between its SIGTERM and a SIGKILL (``supervisors.supervisor.STOP_TIMEOUT_S``).
LAST_SNAPSHOTS_S = 8.0
#: The fewest journal entries since a partition's last snapshot that snapshot it early.
EARLY_SNAPSHOT_ENTRIES = 10_000
#: The share of the operations the last snapshot held that, gained in entries, snapshot early.
EARLY_SNAPSHOT_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class SnapshotStatistics:
    """What one snapshot cost."""

    partition: int
    pending: int
    bytes: int
    chunks: int
    journal_offset: int
    cpu_s: float


class _Standby:
    def __init__(self, partition: int, standing: Standing) -> None:
        self.partition = partition
        self.standing = standing
        self.snapshot_at = -1  # the journal offset of the last snapshot written
        self.entries_at = 0  # the entries replayed when it was written
        self.pending_at = standing.replayer.progress.snapshot_pending  # what it held then

    def dirty(self) -> bool:
        return self.standing.end != self.snapshot_at

    def grown(self) -> bool:
        """Whether the journal gained enough entries since the last snapshot to write one
        now, before the interval (see the module docstring)."""
        replayer = self.standing.replayer
        gained = replayer.progress.entries - self.entries_at
        return gained >= max(EARLY_SNAPSHOT_ENTRIES, EARLY_SNAPSHOT_SHARE * self.pending_at)


class Snapshotter:
    """Keeps partitions' engines current from the journal and snapshots them.

    Args:
        reader: reads the changelog and the snapshots topic.
        sink: where the snapshots go.
        changelog_topic: the journal.
        snapshots_topic: where snapshots go.
        config: the engines' configuration (the service's).
        partitions: which partitions to keep.
        interval_ms: how often a partition whose journal grew is snapshotted.
        max_record_bytes: the largest record the broker takes (chunks stay under it).
        tail_every_s: how often the journal is read for what is new.
        wanted: asked before each look: the partitions to keep now (None: no change); the
            standby then follows the serving replica's partitions as they move: those of its
            first answer at once (a new group's, while the service restores them too), each
            later one once it has been wanted for ``settle_s`` (a rollout moves partitions
            every few seconds: each one rebuilt here would take the CPU from the serving
            replicas, and the replica that held it wrote its last snapshot as it left).
        settle_s: see ``wanted``.
    """

    def __init__(
        self,
        reader: LogReader,
        sink: RecordSink,
        *,
        changelog_topic: str,
        snapshots_topic: str,
        config: EngineConfig,
        partitions: Sequence[int],
        interval_ms: int,
        max_record_bytes: int,
        tail_every_s: float = 1.0,
        wanted: Callable[[], Awaitable[Iterable[int] | None]] | None = None,
        settle_s: float = 30.0,
    ) -> None:
        self._reader = reader
        self._sink = sink
        self._changelog = changelog_topic
        self._snapshots = snapshots_topic
        self._config = config
        self._partitions = list(partitions)
        self._interval_s = interval_ms / 1000
        self._max_record_bytes = max_record_bytes
        self._tail_every_s = tail_every_s
        self._wanted = wanted
        self._settle_s = settle_s
        self._since: dict[int, float] = {}  # partition -> since when it is wanted (trio time)
        self._standby: dict[int, _Standby] = {}
        self.written: list[SnapshotStatistics] = []

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Restore every partition, then tail and snapshot until cancelled."""
        await self.follow(self._partitions)
        task_status.started()
        next_snapshot = trio.current_time() + self._interval_s
        settle_s = 0.0  # what the service holds when first asked is followed at once
        while True:
            await trio.sleep(self._tail_every_s)
            if self._wanted is not None:
                wanted = await self._wanted()
                if wanted is not None:
                    await self.follow(wanted, settle_s=settle_s)
                    settle_s = self._settle_s
            await self.tail()
            if trio.current_time() >= next_snapshot:
                await self.snapshot_all()
                next_snapshot = trio.current_time() + self._interval_s
            else:
                await self.snapshot_all(grown=True)

    async def last_snapshots(self) -> None:
        """At a graceful stop: replay the journal to its end and snapshot every partition that
        grew since its last snapshot, so the next owner restores from the latest state and
        replays no tail. The serving process has stopped when it asks (its journal is
        settled); a partition whose write fails keeps its earlier snapshot, as at any time."""
        await self.tail()
        await self.snapshot_all()

    async def follow(self, partitions: Iterable[int], *, settle_s: float = 0.0) -> None:
        """Keep a standby of exactly ``partitions``: drop the others, restore each new one
        once it has been wanted for ``settle_s``."""
        wanted = set(partitions)
        now = trio.current_time()
        self._since = {p: self._since.get(p, now) for p in wanted}
        for partition in sorted(set(self._standby) - wanted):
            del self._standby[partition]
            gc.unfreeze()  # its engine is cyclic garbage; a restore froze it (see restore.py)
            _log.info("standby_dropped", partition=partition)
        for partition in sorted(wanted - set(self._standby)):
            if now - self._since[partition] >= settle_s:
                await self._restore(partition)

    async def _restore(self, partition: int) -> None:
        progress = Progress(partition)
        standing = await stand_by(
            self._reader,
            topic=self._changelog,
            snapshots_topic=self._snapshots,
            partition=partition,
            config=self._config,
            journal=None,
            progress=progress,
        )
        standing.replayer.forget_resend()
        standby = _Standby(partition, standing)
        if not progress.records:  # nothing journaled since the last snapshot (or at all)
            standby.snapshot_at = standing.end
        self._standby[partition] = standby
        _log.info(
            "standby_restored",
            partition=partition,
            journal_end=standing.end,
            pending=standing.replayer.engine.statistics().pending,
        )

    async def tail(self) -> None:
        """Replay what the journal gained since the last look."""
        for standby in self._standby.values():
            await standby.standing.catch_up(self._reader, self._changelog)

    async def snapshot_all(self, *, grown: bool = False) -> None:
        """Snapshot every partition whose journal grew since its last snapshot (``grown``:
        only those it grew by many entries, see the module docstring)."""
        for standby in self._standby.values():
            if standby.grown() if grown else standby.dirty():
                try:
                    self.written.append(await self._snapshot(standby))
                except TransportError as exc:
                    _log.warning("snapshot_failed", partition=standby.partition, error=str(exc))

    async def _snapshot(self, standby: _Standby) -> SnapshotStatistics:
        replayer, journal_end = standby.standing.replayer, standby.standing.end
        engine = replayer.engine
        cpu = time.process_time()
        data = snapshot_engine(engine)
        cpu_s = time.process_time() - cpu
        manifest = await write_snapshot(
            self._sink,
            topic=self._snapshots,
            data=data,
            partition=standby.partition,
            journal_offset=journal_end,
            clock_ms=engine.clock_ms,
            input_positions=replayer.positions,
            delivered=replayer.acked,
            max_record_bytes=self._max_record_bytes,
        )
        standby.snapshot_at = journal_end
        standby.entries_at = replayer.progress.entries
        standby.pending_at = engine.pending_operations
        stats = SnapshotStatistics(
            partition=standby.partition,
            pending=standby.pending_at,
            bytes=len(data),
            chunks=manifest.chunks,
            journal_offset=manifest.journal_offset,
            cpu_s=cpu_s,
        )
        _log.info(
            "snapshot_written",
            partition=stats.partition,
            pending=stats.pending,
            bytes=stats.bytes,
            chunks=stats.chunks,
            journal_offset=stats.journal_offset,
            cpu_s=round(cpu_s, 3),
        )
        return stats
