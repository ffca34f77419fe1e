"""One owner of every partition's life on this replica (service layer: dispatch).

:class:`Follower` drives the :class:`~purgatory.service.ownership.life.LifeTable` from what
happens to a partition, and is the only one that does:

* **taken**: the source holds a partition it was given (at start, or by a group rebalance),
  unread; the follower restores it
  (:func:`~purgatory.service.journal.restore.restore_partition`: the latest snapshot, then the
  journal after it), then serves it with the rebuilt engine, re-sends what was decided and
  not delivered, and resumes the inputs at the positions the journal reached. In
  transactional delivery, the partition's transactional id is taken first, fencing every
  earlier writer.
* **weather**: a restore that fails on the broker (a timeout, a refused connection, a
  transaction coordinator still loading) is tried again after a back-off, while ``/readyz``
  says why; a timeout is never a reason to exit.
* **fenced**: another writer appended to the partition's changelog (the journal's writer says
  so): the partition stops serving at once, nothing it decided since is released, and it is
  restored again from the changelog after a back-off that doubles while the fences go on.
* **revoked**: the group takes the partition away (cleanly, or lost with a session that
  expired while a link was cut). :meth:`Follower.hand_over` stops applying it, waits until
  every journal record in flight has settled (acknowledged where this writer expected it, so
  what it caused is released; or elsewhere, void, so nothing is), until every callback it
  decided is delivered, and writes its delivered mark, within ``grace_s``; then the partition
  is dropped. Its next owner restores a journal that holds everything and re-sends nothing.
  The source calls it off the consumer's heartbeats (see
  :mod:`purgatory.service.kafka.source`).

* **warm**: the group asks this replica to keep partitions warm before they move here; the
  :class:`~purgatory.service.dispatch.standby.Standbys` rebuild and tail them, and a restore
  of a partition given here takes its standby over (it replays only the journal's last
  records). A graceful stop first asks the group to move every partition away this way
  (:meth:`Follower.leave`), serving them until each has gone.

While a partition is not serving, its HTTP inputs answer 503 with Retry-After
(``NotServingError``), and ``/readyz`` reports its state, its restore's progress and, when it
waits, why.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass

import trio

from purgatory._core import BadRecordError, TransportError
from purgatory.service.dispatch.dispatcher import Dispatcher
from purgatory.service.dispatch.standby import Standbys
from purgatory.service.egress.outbox import Outbox
from purgatory.service.journal.changelog import Changelog, Gate
from purgatory.service.journal.release import Release
from purgatory.service.journal.restore import Progress, Restored, restore_partition
from purgatory.service.kafka.transport import LogReader, RecordSource
from purgatory.service.ownership.life import Life, LifeEvent, LifeTable, PartitionState
from purgatory.service.settings import Settings
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.metrics import Metrics
from reaper import Clock, Reaper

__all__ = ["Follower", "FollowerConfig"]

_log = get_logger()


@dataclass(frozen=True, slots=True)
class FollowerConfig:
    """Where a partition's journal is, and how long a hand-over may take.

    Attributes:
        changelog_topic: the journal's topic (partition p holds input partition p's).
        snapshots_topic: the snapshots' topic (None: restore from the journal alone).
        input_topics: the input topics, co-partitioned.
        grace_s: how long a hand-over waits for what the partition recorded and decided.
        poll_s: how often the assignment is looked at.
    """

    changelog_topic: str
    snapshots_topic: str | None
    input_topics: tuple[str, ...]
    grace_s: float
    poll_s: float = 0.05

    @classmethod
    def from_settings(cls, settings: Settings) -> FollowerConfig:
        """The topics of ``settings`` (no snapshots when ``PURGATORY_SNAPSHOT_INTERVAL_MS`` is
        0), and ``PURGATORY_SHUTDOWN_GRACE_MS`` for a hand-over."""
        return cls(
            changelog_topic=settings.topic_changelog,
            snapshots_topic=settings.topic_snapshots if settings.snapshot_interval_ms else None,
            input_topics=(settings.topic_requests, settings.topic_signals),
            grace_s=settings.shutdown_grace_ms / 1000,
        )


class Follower:
    """Takes, restores, serves, fences, hands over and drops this replica's partitions.

    Args:
        source: the input topics' consumer (what it holds is what this replica was given).
        dispatcher: applies inputs to the engines of the partitions served (its table is
            where a restored partition is served).
        reader: reads the changelog at restore (None: a partition starts empty).
        changelog: the journal's writer (None: no journal).
        gate: what the journal holds back (its :meth:`~Gate.durable`).
        outbox: egress (a hand-over waits for its acknowledgements).
        release: takes the positions a restored partition resumes at (the group's offsets
            follow them).
        metrics: where restores and fences are counted.
        clock: the time source (the engines' epoch ms).
        config: the topics and bounds.
        table: the partitions' lives (this follower is the only one that moves them).
        reaper: woken once a partition is served (its overdue operations are due at once).
    """

    def __init__(
        self,
        source: RecordSource,
        dispatcher: Dispatcher,
        reader: LogReader | None,
        *,
        changelog: Changelog | None,
        gate: Gate,
        outbox: Outbox,
        release: Release,
        metrics: Metrics,
        clock: Clock,
        config: FollowerConfig,
        table: LifeTable,
        reaper: Reaper | None = None,
    ) -> None:
        self._source = source
        self._dispatcher = dispatcher
        self._partitions = dispatcher.table
        self._reaper = reaper
        self._reader = reader
        self._changelog = changelog
        self._gate = gate
        self._outbox = outbox
        self._release = release
        self._metrics = metrics
        self._clock = clock
        self._config = config
        self.table = table
        self.progress: dict[int, Progress] = {}  # each held partition's latest restore
        self.standbys = Standbys(
            reader,
            dispatcher.table,
            changelog_topic=config.changelog_topic,
            snapshots_topic=config.snapshots_topic,
            on_warm=source.report_warm,
        )
        self._dropped: dict[int, trio.Event] = {}  # handing over: set once it is dropped

    # -- what the rest of the service reads ----------------------------------------------------

    def held(self) -> frozenset[int]:
        """The input partitions the source holds now."""
        topics = self._config.input_topics
        return frozenset(p for t, p in self._source.assignment() if t in topics)

    def joined(self) -> bool:
        """Whether the source was given its partitions at least once (see
        ``RecordSource.joined``)."""
        return self._source.joined()

    def caught_up(self) -> bool:
        """Every input partition held is restored and served."""
        return self.held() <= self.table.in_state(PartitionState.SERVING)

    def fences(self) -> dict[int, int]:
        """Partition -> times it was fenced since this replica started."""
        return self.table.fences()

    # -- the assignment --------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow the source's assignment until cancelled: take what it gives, restore what is
        due, hand over what it took away."""
        async with trio.open_nursery() as nursery:
            await nursery.start(self.standbys.run)
            while True:
                self._look(nursery)
                await trio.sleep(self._config.poll_s)

    async def leave(self, *, within_s: float) -> None:
        """A graceful stop: ask the group to move every partition held to the other replicas,
        each once warm there, and serve them until they have gone, nobody is left to take them,
        or ``within_s`` has passed."""
        until_s = trio.current_time() + within_s
        self._source.leave()
        while self.held() and not self._source.left_alone() and trio.current_time() < until_s:
            await trio.sleep(self._config.poll_s)
        _log.info("partitions_left", held=sorted(self.held()), alone=self._source.left_alone())

    def _look(self, nursery: trio.Nursery) -> None:
        now = trio.current_time()
        held = self.held()
        self.standbys.want(self._source.warm_wanted(), keep=held)
        topics = self._config.input_topics
        paused = {p for t, p in self._source.held() if t in topics}
        table = self.table
        known = {life.partition for life in table.held()}
        # Taken away without a revocation seen (or taken away and given back between two
        # looks: held again, unread, so its position was reset): handed over, then taken anew.
        live = known - table.in_state(PartitionState.HANDING_OVER)
        gone = (live - held) | (table.in_state(PartitionState.SERVING) & paused)
        if gone:
            nursery.start_soon(self._settle, self._revoke(gone))
        for partition in sorted(held - known):
            table.take(partition, now)
        for partition in table.due(now):
            if partition not in held or self._held_back(partition):
                continue
            life = table.on(partition, LifeEvent.BEGIN, now)
            self._metrics.partition_taken(partition)
            nursery.start_soon(functools.partial(self._restore, life, life.restores))

    def _held_back(self, partition: int) -> bool:
        """Whether ``partition`` is not to be restored now: inputs are stopped, or it is beyond
        the partitions the service started with (an input topic grew: it has no journal)."""
        return (
            self._partitions.inputs_stopped is not None or partition >= self._partitions.partitions
        )

    # -- taken -> restoring -> serving --------------------------------------------------------

    async def _restore(self, life: Life, restores: int) -> None:
        """Restore ``life``'s partition (or start it empty without a reader), then serve it;
        on the broker's weather, leave it ``taken`` to be tried again after a back-off."""
        partition = life.partition
        status = self.progress[partition] = Progress(partition)
        try:
            restored = await self._rebuild(partition, restores, status)
        except (TransportError, BadRecordError) as exc:
            if self._current(life, restores):
                life = self.table.on(
                    partition, LifeEvent.FAILED, trio.current_time(), reason=str(exc)
                )
                _log.warning(
                    "partition_restore_failed",
                    partition=partition,
                    error=str(exc),
                    failures=life.failures,
                    retry_in_s=round(max(0.0, life.until_s - trio.current_time()), 3),
                )
            return
        if not self._current(life, restores):
            _log.info("partition_taken_while_restoring", partition=partition)
            return  # revoked or fenced meanwhile: this restore is void
        await self._serve(restored)
        if self._current(life, restores):  # serving once its inputs are resumed (until then
            self.table.on(partition, LifeEvent.RESTORED, trio.current_time())  # it is held)
            self._log_serving(restored)

    async def _rebuild(self, partition: int, restores: int, status: Progress) -> Restored:
        """``partition``'s engine from its snapshot and journal (new, without a reader).

        Raises:
            TransportError: the broker did not answer (or refused) a read or the take of the
                partition's transactional id.
            BadRecordError: a journal entry is damaged.
        """
        if self._changelog is not None:  # transactional: earlier writers fenced before the read
            await self._changelog.open_partition(partition)
        warm = await self.standbys.take(partition, status)
        if warm is not None:
            return warm
        if self._reader is None:  # no journal: the partition starts empty
            status.seconds = 0.0
            engine = self._partitions.new_engine(partition, start_ms=0)
            return Restored(engine, {}, [], 0, 0, status)
        _log.info("partition_restoring", partition=partition, attempt=restores)
        return await restore_partition(
            self._reader,
            topic=self._config.changelog_topic,
            snapshots_topic=self._config.snapshots_topic,
            partition=partition,
            config=self._partitions.config,
            journal=self._partitions.journal(partition),
            progress=status,
        )

    async def _serve(self, restored: Restored) -> None:
        """Serve a restored partition's engine: its writer told where the log ends, the
        overdue flagged late, the undelivered re-sent, its inputs resumed where the journal
        reached."""
        engine, positions = restored.engine, restored.positions
        partition = engine.partition
        if self._changelog is not None:  # where its next record must land: checked first
            self._changelog.expect(partition, restored.journal_end)
        restored.progress.overdue = engine.resume(self._clock.now_ms())
        topics = self._config.input_topics
        epochs = {t: self._source.resume_epoch(t, partition) for t in topics}
        self._partitions.serve(
            partition, engine, acked=restored.acked, positions=positions, epochs=epochs
        )
        if self._reaper is not None:
            self._reaper.wake()
        if restored.resend:  # journaled already: straight to the outbox's order
            self._dispatcher.resent(restored.resend)
            self._release.resent(restored.resend)
        await self._source.resume({(t, partition): positions.get(t) for t in topics})
        if positions:  # the group's offsets follow the journal, after the re-sent outcomes
            self._release.consumed(partition, {(t, partition): o for t, o in positions.items()})

    @staticmethod
    def _log_serving(restored: Restored) -> None:
        status = restored.progress
        _log.info(
            "partition_serving",
            partition=status.partition,
            journal_records=status.records,
            void_records=status.void,
            journal_entries=status.entries,
            pending=restored.engine.statistics().pending,
            resent=len(restored.resend),
            overdue=status.overdue,
            snapshot_pending=status.snapshot_pending,
            restore_s=round(status.seconds or 0.0, 3),
            fetch_s=round(status.fetch_s, 3),
            rebuild_s=round(status.rebuild_s, 3),
            tail_s=round(status.tail_s, 3),
            positions=restored.positions,
        )

    def _current(self, life: Life, restores: int) -> bool:
        """Whether ``life`` is still the partition's and still in the restore ``restores``."""
        return (
            self.table.get(life.partition) is life
            and life.state is PartitionState.RESTORING
            and life.restores == restores
        )

    # -- fenced ----------------------------------------------------------------------------------

    def fenced(self, partition: int) -> None:
        """Another writer wrote to ``partition``'s changelog (or took its transactional id):
        stop serving it; it is restored again from the changelog after its back-off."""
        self._metrics.partition_fenced(partition)
        if self.table.get(partition) is None:
            return  # no longer held: its last record was void, nothing else to do
        life = self.table.on(partition, LifeEvent.FENCED, trio.current_time())
        if life.state is PartitionState.FENCED:
            self._partitions.drop(partition)
            _log.warning(
                "partition_restore_deferred",
                partition=partition,
                seconds=round(life.until_s - trio.current_time(), 3),
                fences_in_a_row=life.streak,
                fences=life.fences,
            )

    # -- revoked -> handing over -> dropped ----------------------------------------------------

    async def hand_over(self, taken: frozenset[tuple[str, int]]) -> None:
        """A rebalance takes partitions away (or they were lost with the session): stop
        applying them, let what they recorded settle and what they decided be delivered, write
        their delivered marks, and drop them (see the module docstring).

        Returns once every one of them is dropped, whoever began its hand-over: the source
        publishes the new assignment before its rebalance listener calls this, so
        :meth:`run`'s look may have begun it already. The rebalance goes on when this
        returns, and the next owner restores the partition from the changelog then: a record
        still in flight would be missing there, and a write this replica answers 2xx once it
        lands unknown to the partition's next owner."""
        topics = self._config.input_topics
        partitions = {p for t, p in taken if t in topics}
        await self._settle(self._revoke(partitions))
        for partition in sorted(partitions):
            dropped = self._dropped.get(partition)
            if dropped is not None:
                await dropped.wait()

    def _revoke(self, partitions: Iterable[int]) -> dict[int, bool]:
        """Move each held partition of ``partitions`` to ``handing over``, at once: it applies
        nothing more. Returns those this call moved, each with whether it was serving."""
        now = trio.current_time()
        moved: dict[int, bool] = {}
        for partition in sorted(set(partitions)):
            life = self.table.get(partition)
            if life is None or life.state is PartitionState.HANDING_OVER:
                continue  # not held, or handed over by another call already
            serving = life.state is PartitionState.SERVING
            self.table.on(partition, LifeEvent.REVOKED, now)
            self._partitions.drop(partition, keep_acked=serving)
            self._dropped[partition] = trio.Event()
            moved[partition] = serving
        return moved

    async def _settle(self, moved: dict[int, bool]) -> None:
        """Settle and drop the partitions :meth:`_revoke` moved; then whoever waits for their
        hand-over (:meth:`hand_over`) goes on, however it ended."""
        dropped = {p: self._dropped[p] for p in moved if p in self._dropped}
        try:
            await self._settle_moved(moved)
        finally:
            for partition, event in dropped.items():
                event.set()
                if self._dropped.get(partition) is event:
                    del self._dropped[partition]

    async def _settle_moved(self, moved: dict[int, bool]) -> None:
        if not moved:
            return
        serving = sorted(p for p, was in moved.items() if was)
        changelog = self._changelog
        done = False
        began = trio.current_time()
        took: dict[str, float] = {}  # each step's seconds, for the log
        _log.info("partitions_handing_over", partitions=sorted(moved), serving=serving)
        with trio.move_on_after(self._config.grace_s):
            # Every record in flight settles first: acknowledged where this writer expected
            # it (what it caused is released), or elsewhere (void: the partition is fenced,
            # nothing is released, and no delivered mark is written for it).
            await self._gate.durable()
            took["durable_s"] = trio.current_time() - began
            if changelog is not None and not self._outbox.closed:
                await self._outbox.acknowledged()
                took["acknowledged_s"] = trio.current_time() - began
                await changelog.mark_delivered(serving)
                took["marked_s"] = trio.current_time() - began
            done = True
        for partition in serving:
            self._partitions.forget_acked(partition)
        now = trio.current_time()
        for partition in sorted(moved):
            if changelog is not None:  # a record still in flight checks itself (its ``at``)
                changelog.forget(partition)
                await changelog.close_partition(partition)
            self.table.on(partition, LifeEvent.HANDED_OVER, now)
            self.progress.pop(partition, None)
            _log.info("partition_dropped", partition=partition)
        _log.info(
            "partitions_handed_over",
            partitions=serving,
            complete=done,
            **{step: round(seconds, 3) for step, seconds in took.items()},
        )
