"""How fresh each partition's latest snapshot is, as the serving process sees it (service layer).

The snapshotter runs in another process (or pod) and tells the service nothing; the snapshots
topic is where its work lands, so that is what this reads. A :class:`SnapshotWatch` looks every
``every_s`` at the last record of each partition of the snapshots topic: a manifest (key
``manifest``, :mod:`purgatory.service.snapshots.snapshots`) is the latest snapshot, and its record
timestamp is when it was
written (the producer's clock, or the broker's with ``LogAppendTime``). It also reads the
changelog partition's end offset; the records from the manifest's ``journal_offset`` to that end
are what a restore would replay on top of the snapshot. :meth:`SnapshotWatch.statistics` turns
both into the gauges ``purgatory_snapshot_age_seconds`` and ``purgatory_snapshot_lag_records`` at
scrape time.

Why the topic and not the child: it holds only snapshots that are complete (a manifest is sent
once all its chunks are acknowledged), it survives restarts of either process, and it also shows
snapshots another replica's snapshotter wrote. It costs two or three small reads per partition
and look: the chunks are never read back (they can be MiBs), so a damaged snapshot that a
restore would skip still counts here. While a snapshot is being written its chunks follow the
last manifest; the watch keeps the manifest it knew until the new one lands, and, knowing none
yet, looks back up to ``LOOK_BACK_RECORDS`` records for one.

A partition without any snapshot shows the time since the watch began and every changelog
record as its lag. The watch follows the static partitions when the service has them, else every
partition of the changelog (any replica can tell how fresh any partition's snapshot is).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import trio

from purgatory._core import BadRecordError, TransportError
from purgatory._core.durability.manifest import decode_manifest
from purgatory.service.kafka.transport import ConsumedRecord, LogReader
from purgatory.service.snapshots.snapshots import MANIFEST_KEY
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.stats import SnapshotStatus

__all__ = ["LOOK_BACK_RECORDS", "SnapshotWatch"]

_log = get_logger()

#: How far back from a partition's end a manifest is looked for when none is known yet.
LOOK_BACK_RECORDS = 80


@dataclass(slots=True)
class _Seen:
    since_ms: int  # when the watch began to look at this partition
    snapshots_end: int = -1  # the snapshots partition's end at the last look
    written_ms: int | None = None  # the latest manifest record's timestamp
    journal_offset: int = 0
    journal_end: int = 0

    def status(self, partition: int, now_ms: int) -> SnapshotStatus:
        since_ms = self.since_ms if self.written_ms is None else self.written_ms
        return SnapshotStatus(
            partition=partition,
            age_s=max(0, now_ms - since_ms) / 1000,
            lag_records=max(0, self.journal_end - self.journal_offset),
            journal_offset=self.journal_offset,
            found=self.written_ms is not None,
        )


class SnapshotWatch:
    """Looks at the latest snapshot of each partition now and then (see the module docstring).

    Args:
        reader: reads the snapshots topic and the changelog.
        snapshots_topic: where the snapshotter writes.
        changelog_topic: the journal.
        partitions: the partitions to watch (None: every partition of the changelog).
        now_ms: the wall clock in epoch ms (record timestamps are epoch ms).
        every_s: how often to look.
    """

    def __init__(
        self,
        reader: LogReader,
        *,
        snapshots_topic: str,
        changelog_topic: str,
        partitions: Sequence[int] | None,
        now_ms: Callable[[], int],
        every_s: float,
    ) -> None:
        self._reader = reader
        self._snapshots = snapshots_topic
        self._changelog = changelog_topic
        self._partitions = None if partitions is None else sorted(partitions)
        self._now_ms = now_ms
        self._every_s = every_s
        self._seen: dict[int, _Seen] = {}
        self._failing = False

    def statistics(self) -> list[SnapshotStatus]:
        """Every watched partition's status, its age computed now."""
        now_ms = self._now_ms()
        return [seen.status(partition, now_ms) for partition, seen in sorted(self._seen.items())]

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Look now, then every ``every_s``, until cancelled; started after the first look.

        A broker that cannot be read is logged (``snapshot_watch_failed``, once until it can be
        read again) and tried again at the next look: the gauges keep what was known.
        """
        while True:
            await self.look()
            task_status.started()
            task_status = trio.TASK_STATUS_IGNORED
            await trio.sleep(self._every_s)

    async def look(self) -> None:
        """Read every watched partition's latest manifest and changelog end once."""
        try:
            if self._partitions is None:
                self._partitions = list(range(await self._reader.partition_count(self._changelog)))
            for partition in self._partitions:
                await self._look(partition)
        except TransportError as exc:
            if not self._failing:
                _log.warning("snapshot_watch_failed", error=str(exc))
            self._failing = True
            return
        if self._failing:
            _log.info("snapshot_watch_recovered")
        self._failing = False

    async def _look(self, partition: int) -> None:
        seen = self._seen.get(partition)
        if seen is None:
            seen = self._seen[partition] = _Seen(since_ms=self._now_ms())
        end = await self._reader.end_offset(self._snapshots, partition)
        if end != seen.snapshots_end:
            found = await self._last_manifest(partition, end, end - 1)
            if found is None and seen.written_ms is None:
                found = await self._last_manifest(partition, end, end - LOOK_BACK_RECORDS)
            if found is not None:
                seen.written_ms, seen.journal_offset = found
            seen.snapshots_end = end
        seen.journal_end = await self._reader.end_offset(self._changelog, partition)

    async def _last_manifest(self, partition: int, end: int, start: int) -> tuple[int, int] | None:
        """``(written_ms, journal_offset)`` of the last manifest from ``start`` on, or None."""
        if end <= 0:
            return None
        manifests: list[ConsumedRecord] = []

        def handle(batch: list[ConsumedRecord]) -> None:
            manifests.extend(r for r in batch if r.key == MANIFEST_KEY)

        await self._reader.read(self._snapshots, partition, max(0, start), handle)
        for record in reversed(manifests):
            try:
                manifest = decode_manifest(record.value or b"")
            except BadRecordError:
                continue  # a restore skips it too
            if manifest.partition != partition:
                continue
            written_ms = record.timestamp_ms if record.timestamp_ms >= 0 else self._now_ms()
            return written_ms, manifest.journal_offset
        return None
