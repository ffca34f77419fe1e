"""Warm standbys (service layer: dispatch): partitions this replica is to take over, rebuilt
and kept current before they move here.

A partition that moves is served nowhere while its next owner rebuilds its engine: a restore
of a few hundred thousand operations takes seconds, and every write to its scopes meanwhile is
answered 503. So the group's assignor (:mod:`purgatory.service.kafka.assignor`) moves a
partition that its owner still serves only once its next owner keeps it *warm*: the next
owner's assignment asks it to warm the partition, and :class:`Standbys` then

1. rebuilds the partition's engine exactly as a restore does (the latest snapshot, then the
   journal to its end: :func:`~purgatory.service.journal.restore.stand_by`);
2. replays what the owner appends to the journal, every ``tail_every_s``;
3. once a replay finds at most ``warm_records`` new records, reports the partition warm (the
   group then moves it: its owner hands it over, a second round gives it here).

When the partition is given to this replica, its restore takes the standby over
(:meth:`Standbys.take`) and replays only what the old owner appended since the last replay:
its last batches and its delivered mark, a fraction of a second. A standby the group no
longer asks for (its partition went elsewhere, or stays) is dropped, and its memory with it;
one whose rebuild fails on the broker's weather is tried again after a back-off. Without a
journal there is nothing to rebuild: every partition asked for is warm at once.

A standby never applies an input and never decides: its engine only replays what the owner
decided, so it holds nothing the journal does not.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from purgatory._core import BadRecordError, TransportError
from purgatory._core._backoff import Backoff
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.journal.restore import Progress, Restored, Standing, restore_partition
from purgatory.service.journal.restore import stand_by as rebuild_standby
from purgatory.service.kafka.transport import LogReader
from purgatory.service.telemetry.logging import get_logger

__all__ = ["DROP_AFTER_S", "STANDBY_BACKOFF", "Standbys"]

_log = get_logger()

#: How long a standby the group no longer asks for is kept before it is dropped.
DROP_AFTER_S = 5.0
#: After a rebuild or replay that failed on the broker's weather, the wait before the next.
STANDBY_BACKOFF = Backoff(first_s=0.5, max_s=10.0)


@dataclass
class _Standby:
    partition: int
    scope: trio.CancelScope
    lock: trio.Lock = field(default_factory=trio.Lock)
    standing: Standing | None = None  # None while it is rebuilt
    warm: bool = False
    taken: bool = False
    unwanted_since: float | None = None  # trio time since the group stopped asking for it


class Standbys:
    """Keeps the partitions the group asks for warm (see the module docstring).

    Args:
        reader: reads the changelog and the snapshots (None: no journal, nothing to rebuild).
        partitions: the partitions' engines' configuration and journals.
        changelog_topic: the journal.
        snapshots_topic: where snapshots are (None: rebuild from the journal alone).
        on_warm: told the partitions kept warm, each time that set changes.
        tail_every_s: how often a standby replays what the journal gained.
        warm_records: a replay of at most this many records makes its partition warm.
    """

    def __init__(
        self,
        reader: LogReader | None,
        partitions: PartitionTable,
        *,
        changelog_topic: str,
        snapshots_topic: str | None,
        on_warm: Callable[[frozenset[int]], None],
        tail_every_s: float = 0.25,
        warm_records: int = 200,
    ) -> None:
        self._reader = reader
        self._partitions = partitions
        self._changelog = changelog_topic
        self._snapshots = snapshots_topic
        self._on_warm = on_warm
        self._tail_every_s = tail_every_s
        self._warm_records = warm_records
        self._standbys: dict[int, _Standby] = {}
        self._reported: frozenset[int] = frozenset()
        self._nursery: trio.Nursery | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the standbys asked for until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def warm(self) -> frozenset[int]:
        """The partitions kept warm now (and wanted)."""
        return frozenset(p for p, warm in self.states().items() if warm)

    def states(self) -> dict[int, bool]:
        """Each standby wanted now: whether it is warm (else still rebuilt or catching up)."""
        return {p: s.warm for p, s in sorted(self._standbys.items()) if s.unwanted_since is None}

    def want(self, partitions: frozenset[int], *, keep: frozenset[int] = frozenset()) -> None:
        """Keep standbys of ``partitions`` (and of those of ``keep`` there are: the partitions
        given here, whose restore may take them over): start the missing ones, drop those
        wanted by neither for :data:`DROP_AFTER_S` (the assignor's request and the assignment
        are published apart: a standby dropped between the two would be rebuilt cold)."""
        now = trio.current_time()
        for partition in sorted(set(self._standbys) - partitions - keep):
            standby = self._standbys[partition]
            if standby.unwanted_since is None:
                standby.unwanted_since = now
            if now - standby.unwanted_since < DROP_AFTER_S:
                continue
            del self._standbys[partition]
            if not standby.taken:
                standby.scope.cancel()
                gc.unfreeze()  # its engine is cyclic garbage; its rebuild froze it (restore.py)
                _log.info("standby_dropped", partition=partition)
        for partition in (partitions | keep) & set(self._standbys):
            self._standbys[partition].unwanted_since = None
        if self._nursery is None:
            return
        for partition in sorted(partitions - set(self._standbys)):
            standby = self._standbys[partition] = _Standby(partition, trio.CancelScope())
            self._nursery.start_soon(self._keep, standby)
        self._report()

    async def take(self, partition: int, progress: Progress) -> Restored | None:
        """Restore ``partition`` from its warm standby (None: it has none ready; it is dropped).

        Raises:
            TransportError: the journal could not be read.
            BadRecordError: a journal entry is damaged.
        """
        standby = self._standbys.pop(partition, None)
        if standby is None:
            return None
        async with standby.lock:  # after the replay in flight, if any
            standby.taken = True
            standby.scope.cancel()
        self._report()
        if standby.standing is None or self._reader is None:
            return None
        _log.info(
            "partition_restoring", partition=partition, standby=True, offset=standby.standing.end
        )
        return await restore_partition(
            self._reader, **self._journal_of(partition), progress=progress, standby=standby.standing
        )

    async def _keep(self, standby: _Standby) -> None:
        """Rebuild ``standby``'s partition, then replay the journal until cancelled."""
        failures = 0
        with standby.scope:
            while True:
                try:
                    async with standby.lock:
                        if standby.taken:
                            return
                        records = await self._step(standby)
                    failures = 0
                except (TransportError, BadRecordError) as exc:
                    failures += 1
                    _log.warning("standby_failed", partition=standby.partition, error=str(exc))
                    await trio.sleep(STANDBY_BACKOFF.delay_s(failures))
                    continue
                if not standby.warm and records <= self._warm_records:
                    standby.warm = True
                    self._report()
                await trio.sleep(self._tail_every_s)

    async def _step(self, standby: _Standby) -> int:
        """Rebuild the partition, or replay what its journal gained; how many records that
        replayed (a rebuild counts as more than ``warm_records``: one replay more is due)."""
        partition = standby.partition
        if self._reader is None:
            standby.standing = None
            return 0
        if standby.standing is None:
            progress = Progress(partition)
            standby.standing = await rebuild_standby(
                self._reader, **self._journal_of(partition), progress=progress
            )
            _log.info(
                "standby_restored",
                partition=partition,
                pending=standby.standing.replayer.engine.statistics().pending,
                journal_offset=standby.standing.end,
                seconds=round(progress.seconds or 0.0, 3),
            )
            return self._warm_records + 1
        return await standby.standing.catch_up(self._reader, self._changelog)

    def _journal_of(self, partition: int) -> dict[str, Any]:
        """Where ``partition``'s journal and snapshots are, and how its engine is built."""
        return {
            "topic": self._changelog,
            "snapshots_topic": self._snapshots,
            "partition": partition,
            "config": self._partitions.config,
            "journal": self._partitions.journal(partition),
        }

    def _report(self) -> None:
        warm = self.warm()
        if warm != self._reported:
            self._reported = warm
            self._on_warm(warm)
