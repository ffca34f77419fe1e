"""The write-ahead journal on the changelog topic (service layer).

Every input an engine applies is reported to its partition's journal before it is applied
(``Engine(journal=...)``). This module appends those entries, in batches, to the changelog
partition of the same number, with the input positions reached, and holds back everything the
entries caused until the broker has acknowledged them:

* the outcomes they decided (the outbox gets them only then, so no callback and no waiter is
  ever ahead of the journal);
* the HTTP answer to a write (:meth:`Changelog.durable`);
* the input offset commits (:meth:`Changelog.after`).

A broker that does not acknowledge (unreachable, stopped, electing a leader) holds all of that
back, and nothing is lost; but nobody may wait for it without a bound:

* an HTTP write waits at most ``wait_ms`` (``PURGATORY_JOURNAL_WAIT_MS``) for its entry, then
  fails with :class:`~purgatory.service.errors.JournalStalledError` (503 with Retry-After): the
  write stays applied and recorded, and becomes durable once the broker acknowledges it, so a
  retry finds it (a retried registration is a duplicate);
* the Kafka intake waits for room (:meth:`Changelog.wait_for_room`) once ``capacity`` entries
  are recorded and not acknowledged: consumed inputs simply wait in the topics, uncommitted;
* the journal is *stalled* while its oldest unacknowledged entry has waited ``wait_ms`` or
  longer (:meth:`Changelog.unacknowledged_s`): ``/readyz`` and the metrics say so, and the
  log has ``journal_stalled`` and ``journal_resumed``.

Group commit: the entries recorded while one batch is in flight form the next one, so the
journal costs one produce round trip per batch, not per input. A batch holds at most one record
per partition (records of one partition are never in flight together, so they cannot land out
of order); a record is cut before ``max_record_bytes``, the rest goes to the next batch.

A record's format, and the rules a replay follows, are :mod:`purgatory.service.journal.format`'s.

How a batch reaches the broker is the delivery mode's (:mod:`purgatory.service.journal.modes`
chooses): one record per partition whose offset is checked where it landed
(:class:`~purgatory.service.journal.acknowledged.AcknowledgedWriter`), or one Kafka transaction
per partition (:class:`~purgatory.service.journal.transactional.TransactionalWriter`). Either
writer says which partitions' records are void: another writer wrote to the partition
meanwhile. The partition is then **fenced**, and stays fenced until the service has restored it
again from the changelog and says where it took it over (:meth:`Changelog.expect`). Whatever
the stale engine recorded is then void, wherever it is:

* nothing its fenced batch decided is released (no callback, no waiter woken, no offset
  committed);
* its entries still waiting in later batches are withdrawn, never written, and their releases
  dropped (they were decided on the stale state too);
* an HTTP write that waits for them (:meth:`Changelog.durable`) fails with
  :class:`~purgatory.service.errors.NotServingError` (503, retry: a registration is idempotent);
* anything it tries to record while fenced is refused the same way.

``on_fenced`` has the service drop the partition and restore it again from the changelog, whose
order is the truth for every writer: every outcome released was decided on exactly a prefix of
it, so two writers can waste work, never release conflicting outcomes.

An entry too large for a record is refused before the engine applies it
(:class:`~purgatory._core.SizeLimitError`). A record the broker refuses for good (the topic is
missing, access is denied) stops the service: nothing it decided is released, and a restart
replays what was acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import trio

from purgatory._core import JournalEntry, SizeLimitError, TransportError
from purgatory.service.errors import JournalStalledError, NotServingError
from purgatory.service.journal.batch import Batch, JournalWriter, Part, Stall
from purgatory.service.journal.format import entry_text, marker_size
from purgatory.service.kafka.transport import OutRecord
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.stats import ChangelogStatistics

__all__ = ["Changelog", "Gate", "NoJournal"]

_log = get_logger()

_RECORD_OVERHEAD = 512  # the envelope around the entries, positions included


class Changelog:
    """Appends every partition's journal to the changelog topic, ahead of what it caused.

    Args:
        writer: how a batch reaches the broker (the delivery mode's).
        max_record_bytes: the largest record the broker takes.
        on_fenced: called with a partition another writer wrote to (see the module docstring).
        wait_ms: how long :meth:`durable` waits when ``bounded``, and how long the oldest
            unacknowledged entry may wait before the journal counts as stalled.
        capacity: entries recorded and not acknowledged before :meth:`wait_for_room` waits.
    """

    def __init__(
        self,
        writer: JournalWriter,
        *,
        max_record_bytes: int,
        on_fenced: Callable[[int], None] = lambda _partition: None,
        wait_ms: int = 5_000,
        capacity: int = 100_000,
    ) -> None:
        self.writer = writer
        self.wait_ms = wait_ms
        self.capacity = capacity
        self._max_entries_bytes = max_record_bytes - _RECORD_OVERHEAD
        self._on_fenced = on_fenced
        self._fenced: set[int] = set()  # fenced, not yet taken over again (see expect)
        self._consuming: tuple[int, str, int] | None = None  # the consumed record being applied
        self._fences: dict[int, int] = {}  # partition -> times fenced (durable() compares)
        self.fenced = 0
        self._sealed: list[Batch] = []
        self._open = Batch()
        self._last: Batch | None = None  # the latest batch that holds anything
        self._writing: Batch | None = None  # the batch in flight
        self._stall = Stall(wait_ms, lambda: self._pending_entries)
        self._wakeup = trio.Event()
        self._room = trio.Event()
        self._closed = False
        self._failure: TransportError | None = None
        self._entries = 0
        self._pending_entries = 0

    # -- recording (synchronous: called by the engines and the intake) ------------------------

    def journal_for(self, partition: int) -> Callable[[JournalEntry], None]:
        """The ``journal`` callable of partition ``partition``'s engine."""

        def journal(entry: JournalEntry) -> None:
            self.append(partition, entry)

        return journal

    def append(self, partition: int, entry: JournalEntry) -> None:
        """Record one entry of ``partition``'s journal.

        Raises:
            SizeLimitError: the entry alone is too large for a changelog record (the engine
                then refuses the input; nothing was recorded).
            TransportError: the journal has failed for good.
        """
        self._check()
        if partition in self._fenced:
            raise NotServingError(partition, restoring=True)
        text = entry_text(entry)
        size = len(text.encode("utf-8", "surrogatepass")) + 1
        consuming = self._consuming
        going_on = consuming is not None and consuming[0] == partition
        marker = marker_size(consuming[1], consuming[2]) if going_on and consuming else 0
        if size + marker > self._max_entries_bytes:
            raise SizeLimitError(
                "(record)",
                f"the input's journal entry ({size} bytes) is larger than a changelog record"
                f" may be (max_record_bytes)",
            )
        part = self._open.parts.get(partition)
        if part is not None and part.size + size > self._max_entries_bytes:
            self._seal()
            part.end_input()
            part = None
        if part is None:
            part = self._open.parts[partition] = Part()
            if going_on and consuming is not None:  # the consumed record goes on in this one
                part.inputs.append([0, None, consuming[1], consuming[2]])
                part.size += marker
        part.entries.append(text)
        part.size += size
        self._pending_entries += 1
        self._touch()

    def consuming(self, partition: int, topic: str, offset: int) -> None:
        """The entries recorded next for ``partition``, until :meth:`position`, come from the
        consumed record at ``offset`` of ``topic``."""
        self._check()
        if partition in self._fenced:
            return
        self._consuming = (partition, topic, offset)
        marker = marker_size(topic, offset)
        part = self._open.parts.get(partition)
        if part is not None and part.size + marker > self._max_entries_bytes:
            self._seal()  # its marker would not fit: the record's entries start the next one
            part = None
        if part is None:
            part = self._open.parts[partition] = Part()
        part.inputs.append([len(part.entries), None, topic, offset])
        part.size += marker

    def position(self, partition: int, topic: str, offset: int) -> None:
        """Record the position ``partition`` reached in ``topic`` with the entries recorded so
        far (the next offset to apply)."""
        self._check()
        self._consuming = None
        if partition in self._fenced:
            return  # its entries are void: the restore says where the inputs resume
        part = self._open.parts.get(partition)
        if part is None:
            part = self._open.parts[partition] = Part()
        part.end_input()
        part.positions[topic] = offset
        self._touch()

    def attach(
        self,
        partition: int,
        records: Sequence[OutRecord],
        *,
        sequence: int = 0,
        release: Callable[[], None] | None = None,
    ) -> None:
        """Write ``records`` with ``partition``'s entries recorded so far (or later ones): in
        transactional delivery, in the same transaction; ``release`` follows its commit.
        ``sequence``: the highest outcome sequence among them (the delivered mark moves with
        the commit)."""
        self._check()
        if partition in self._fenced:
            return
        part = self._open.parts.get(partition)
        if part is None:
            part = self._open.parts[partition] = Part()
        part.outbound.extend(records)
        part.sequence = max(part.sequence, sequence)
        if release is not None:
            self._open.releases.append((partition, release))
        self._touch()

    def after(self, release: Callable[[], None], *, partition: int | None = None) -> None:
        """Call ``release`` once everything recorded so far is acknowledged (in order); not at
        all if ``partition`` is fenced before it (what a fenced engine decided is void)."""
        self._check()
        if partition is not None and partition in self._fenced:
            return
        if self._open.empty() and (self._last is None or self._last.done.is_set()):
            release()  # nothing recorded yet, nothing in flight
            return
        self._open.releases.append((partition, release))
        self._touch()

    # -- a partition's life --------------------------------------------------------------------

    async def open_partition(self, partition: int) -> None:
        """Before ``partition``'s restore reads the changelog (in transactional delivery its
        transactional id is taken there, fencing every earlier writer)."""
        await self.writer.open_partition(partition)

    def expect(self, partition: int, offset: int) -> None:
        """This writer takes ``partition`` over at ``offset`` (the end it restored to): its
        next record there must land at that offset (a fence on it is lifted)."""
        self._fenced.discard(partition)
        self.writer.expect(partition, offset)

    def forget(self, partition: int) -> None:
        """This writer no longer owns ``partition`` (everything it recorded there is settled:
        acknowledged, or withdrawn by a fence). Anything of it still unwritten (a hand-over
        that ran out of its grace) is withdrawn, and a write that waits for it fails as a
        fenced one does (:meth:`durable`): it is in no log, and its next owner must not find
        a record of a writer that let the partition go."""
        self.writer.forget(partition)
        self._fenced.discard(partition)
        if self._withdraw(partition):
            self._fences[partition] = self._fences.get(partition, 0) + 1

    async def close_partition(self, partition: int) -> None:
        """``partition`` left this replica (its transactional producer, if any, is let go)."""
        await self.writer.close_partition(partition)

    async def mark_delivered(self, partitions: Iterable[int]) -> None:
        """Write each partition's delivered mark now (at a clean stop, once everything is
        delivered and :meth:`run` has returned), so the next owner re-sends nothing.

        Raises:
            TransportError: the broker refused a record for good.
        """
        self._fence_all(await self.writer.mark_delivered(partitions, self._fenced))

    # -- waiting -------------------------------------------------------------------------------

    async def durable(self, partitions: Iterable[int] = (), *, bounded: bool = False) -> None:
        """Return once everything recorded so far is acknowledged by the broker.

        Args:
            partitions: the partitions whose entries the caller waits for; if one of them is
                fenced meanwhile, those entries may have been withdrawn.
            bounded: give up after ``wait_ms`` (an HTTP answer does; a hand-over, which has
                its own deadline, does not).

        Raises:
            TransportError: the journal failed; what was recorded is not known to be durable.
            NotServingError: a partition of ``partitions`` was fenced meanwhile (retry later).
            JournalStalledError: ``bounded``, and the broker did not acknowledge within
                ``wait_ms``; what was recorded stays recorded (retry later).
        """
        fences = {p: self._fences.get(p, 0) for p in partitions}
        batch = self._last
        if batch is not None:
            if bounded:
                with trio.move_on_after(self.wait_ms / 1000):
                    await batch.done.wait()
                if not batch.done.is_set():
                    raise JournalStalledError(self.wait_ms)
            else:
                await batch.done.wait()
            if batch.error is not None:
                raise batch.error
        for partition, count in fences.items():
            if self._fences.get(partition, 0) != count:
                raise NotServingError(partition, restoring=True, maybe_applied=True)

    async def wait_for_room(self) -> None:
        """Wait while more than ``capacity`` entries are recorded and not acknowledged
        (back-pressure for the intake: while the broker does not acknowledge, consumed inputs
        wait in their topics instead of in memory)."""
        while self._pending_entries > self.capacity and self._failure is None and not self._closed:
            self._room = trio.Event()
            await self._room.wait()

    def unacknowledged_s(self) -> float:
        """How long the oldest entry (or release) not yet acknowledged has waited, in seconds
        (0.0: nothing waits)."""
        for batch in (self._writing, *self._sealed, self._open):
            if batch is None or batch.done.is_set() or batch.since_s is None:
                continue
            if batch is self._writing or not batch.empty():
                return max(0.0, trio.current_time() - batch.since_s)
        return 0.0

    def stalled(self) -> bool:
        """Whether the oldest unacknowledged entry has waited ``wait_ms`` or longer (a write
        recorded with it has been answered 503)."""
        return self.unacknowledged_s() * 1000 >= self.wait_ms

    def close(self) -> None:
        """No more entries: :meth:`run` returns once everything recorded is acknowledged."""
        self._closed = True
        self._wakeup.set()
        self._room.set()

    def statistics(self) -> ChangelogStatistics:
        """The writer's counts, and how long its oldest unacknowledged entry has waited."""
        waited_s = self.unacknowledged_s()
        writer = self.writer
        return ChangelogStatistics(
            batches=writer.batches,
            records=writer.records,
            entries=self._entries,
            bytes=writer.bytes,
            retries=writer.retries,
            pending_entries=self._pending_entries,
            unacknowledged_s=waited_s,
            stalled=waited_s * 1000 >= self.wait_ms,
        )

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure

    def _touch(self) -> None:
        if self._open.since_s is None:
            self._open.since_s = trio.current_time()
        self._last = self._open
        self._wakeup.set()

    def _seal(self) -> None:
        self._sealed.append(self._open)
        self._open = Batch()

    # -- the writer task ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write batches, one in flight at a time, until closed and drained.

        Raises:
            TransportError: the broker refused a journal record for good.
        """
        task_status.started()
        while True:
            if not self._sealed:
                if self._open.empty():
                    if self._closed:
                        return
                    self._wakeup = trio.Event()
                    await self._wakeup.wait()
                    continue
                self._seal()
            batch = self._sealed.pop(0)
            if batch.empty():  # everything it held was withdrawn by a fence
                batch.done.set()
                continue
            self._writing = batch
            try:
                void = await self.writer.write(batch, self._fenced, self._stall)
            except TransportError as exc:
                self._fail(batch, exc)
                raise
            finally:
                self._writing = None
            entries = sum(len(part.entries) for part in batch.parts.values())
            self._entries += entries
            self._pending_entries -= entries
            batch.done.set()
            self._room.set()
            self._stall.resumed(self.stalled())
            for partition, release in batch.releases:
                if partition is None or partition not in void:
                    release()
            self._fence_all(void)

    def _fence_all(self, void: dict[int, bool]) -> None:
        """Settle the void records of a batch: ``void`` maps each partition whose record is
        void to whether the partition's current owner here wrote it (then it is fenced) or an
        earlier one (a record of a partition handed over, still in flight then: only the
        writes that waited for it learn it is void)."""
        for partition, current in sorted(void.items()):
            if not current:
                self._fences[partition] = self._fences.get(partition, 0) + 1
            elif partition not in self._fenced:
                self._fence(partition)
                self._on_fenced(partition)

    def _fence(self, partition: int) -> None:
        """Void what the stale engine of ``partition`` recorded and is not yet written."""
        self._fenced.add(partition)
        self._fences[partition] = self._fences.get(partition, 0) + 1
        self.fenced += 1
        self._withdraw(partition)

    def _withdraw(self, partition: int) -> int:
        """Drop what ``partition`` recorded and is not yet written, and what it would release;
        returns how many entries were dropped."""
        withdrawn = 0
        for batch in [*self._sealed, self._open]:
            part = batch.parts.pop(partition, None)
            if part is not None:
                withdrawn += len(part.entries)
                self._pending_entries -= len(part.entries)
            batch.releases = [(p, r) for p, r in batch.releases if p != partition]
        if self._last is self._open and self._open.empty():  # waited for: done once written
            self._seal()
            self._wakeup.set()
        self._room.set()
        return withdrawn

    def _fail(self, batch: Batch, error: TransportError) -> None:
        self._failure = error
        for pending in [batch, *self._sealed, self._open]:
            pending.error = error
            pending.done.set()
        self._room.set()
        _log.error("changelog_failed", error=str(error))


class Gate(Protocol):
    """What the intake and the HTTP layer need from the journal (or from its absence)."""

    def consuming(self, partition: int, topic: str, offset: int) -> None: ...

    def position(self, partition: int, topic: str, offset: int) -> None: ...

    def after(self, release: Callable[[], None], *, partition: int | None = None) -> None: ...

    async def durable(self, partitions: Iterable[int] = (), *, bounded: bool = False) -> None: ...

    async def wait_for_room(self) -> None: ...


class NoJournal:
    """The gate without a journal (``PURGATORY_JOURNAL=false``): nothing is held back, and
    nothing survives a restart."""

    def consuming(self, partition: int, topic: str, offset: int) -> None:
        """Nothing to record."""

    def position(self, partition: int, topic: str, offset: int) -> None:
        """Nothing to record."""

    def after(self, release: Callable[[], None], *, partition: int | None = None) -> None:
        """Release at once."""
        release()

    async def durable(self, partitions: Iterable[int] = (), *, bounded: bool = False) -> None:
        """Nothing to wait for."""

    async def wait_for_room(self) -> None:
        """Nothing held: always room."""
