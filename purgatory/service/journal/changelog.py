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

One writer per partition, checked at every acknowledgement: the writer knows the offset its
next record of a partition should get (the end it restored to, then each of its own records),
and writes it into the record (``at``, :mod:`purgatory.service.journal.format`). A record
acknowledged at another offset means someone else wrote to the partition meanwhile (a zombie
that kept writing after the partition moved, the new owner seen by a zombie, a replica cut
from the broker whose record in flight landed after the new owner's, or two replicas
configured onto the same partitions): the record is void for every replay, and the partition
is **fenced**, and stays fenced until the service has restored it again from the changelog and
says where it took it over (:meth:`Changelog.expect`). The check is the record's own, so it
holds for a record in flight when its partition is handed over or forgotten: a writer that
lost its partition learns where its last record landed before it releases anything that
record caused. Whatever the stale engine recorded is then void, wherever it is:

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

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from purgatory._core import JournalEntry, SizeLimitError, TransportError
from purgatory._core._backoff import Backoff
from purgatory.service.errors import JournalStalledError, NotServingError
from purgatory.service.journal.format import (
    JOURNAL_KEY,
    encode_journal_record,
    entry_text,
    marker_size,
)
from purgatory.service.kafka.transport import Delivery, OutRecord, RecordSink, SendFailure
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.stats import ChangelogStatistics

__all__ = ["Changelog", "Gate", "NoJournal"]

_log = get_logger()

_RECORD_OVERHEAD = 512  # the envelope around the entries, positions included
#: The pause before a journal record the broker refused (retriable) is sent again.
RETRY = Backoff(first_s=0.05, max_s=1.0)


@dataclass
class _Part:
    entries: list[str] = field(default_factory=list)
    size: int = 0  # bytes of the entries and of the ``inputs`` markers, as encoded
    positions: dict[str, int] = field(default_factory=dict)
    inputs: list[list[Any]] = field(default_factory=list)  # [first, end, topic, offset]
    outbound: list[OutRecord] = field(default_factory=list)  # released with it (transactional)
    sequence: int = 0  # the highest outcome sequence among them


@dataclass
class _Batch:
    parts: dict[int, _Part] = field(default_factory=dict)
    releases: list[tuple[int | None, Callable[[], None]]] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)
    error: TransportError | None = None
    since_s: float | None = None  # when it got its first entry or release (trio's clock)

    def empty(self) -> bool:
        return not self.parts and not self.releases


class Changelog:
    """Appends every partition's journal to the changelog topic, ahead of what it caused.

    Args:
        sink: where the records go.
        topic: the changelog topic (partition p holds input partition p's journal).
        max_record_bytes: the largest record the broker takes.
        delivered: the partition's highest outcome sequence acknowledged on the callbacks topic.
        on_fenced: called with a partition another writer wrote to (see the module docstring).
        wait_ms: how long :meth:`durable` waits when ``bounded``, and how long the oldest
            unacknowledged entry may wait before the journal counts as stalled.
        capacity: entries recorded and not acknowledged before :meth:`wait_for_room` waits.
    """

    def __init__(
        self,
        sink: RecordSink,
        *,
        topic: str,
        max_record_bytes: int,
        delivered: Callable[[int], int] = lambda _partition: 0,
        on_fenced: Callable[[int], None] = lambda _partition: None,
        wait_ms: int = 5_000,
        capacity: int = 100_000,
    ) -> None:
        self._sink = sink
        self.wait_ms = wait_ms
        self.capacity = capacity
        self._topic = topic
        self._max_entries_bytes = max_record_bytes - _RECORD_OVERHEAD
        self._delivered = delivered
        self._on_fenced = on_fenced
        self._expected: dict[int, int] = {}  # partition -> offset its next record should get
        self._fenced: set[int] = set()  # fenced, not yet taken over again (see expect)
        self._consuming: tuple[int, str, int] | None = None  # the consumed record being applied
        self._fences: dict[int, int] = {}  # partition -> times fenced (durable() compares)
        self.fenced = 0
        self._sealed: list[_Batch] = []
        self._open = _Batch()
        self._last: _Batch | None = None  # the latest batch that holds anything
        self._writing: _Batch | None = None  # the batch in flight
        self._stalled_since_s: float | None = None  # when a write's wait passed wait_ms
        self._wakeup = trio.Event()
        self._room = trio.Event()
        self._closed = False
        self._failure: TransportError | None = None
        self._counts = {"batches": 0, "records": 0, "entries": 0, "bytes": 0, "retries": 0}
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
            self._end_input(part)
            part = None
        if part is None:
            part = self._open.parts[partition] = _Part()
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
            part = self._open.parts[partition] = _Part()
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
            part = self._open.parts[partition] = _Part()
        self._end_input(part)
        part.positions[topic] = offset
        self._touch()

    async def mark_delivered(self, partitions: Iterable[int]) -> None:
        """Write each partition's delivered mark now (at a clean stop, once everything is
        delivered and :meth:`run` has returned), so the next owner re-sends nothing. A
        partition fenced meanwhile gets none: its marks count in a numbering the log does not
        have.

        Raises:
            TransportError: the broker refused a record for good.
        """
        batch = _Batch(parts={p: _Part() for p in partitions if p in self._expected})
        if batch.parts:
            self._fence_all(await self._write(batch))  # a mark releases nothing

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

    def expect(self, partition: int, offset: int) -> None:
        """This writer takes ``partition`` over at ``offset`` (the end it restored to): its
        next record there must land at that offset (a fence on it is lifted)."""
        self._fenced.discard(partition)
        self._expected[partition] = offset

    async def open_partition(self, partition: int) -> None:
        """Before ``partition``'s restore reads the changelog: nothing to do here (in
        transactional delivery its transactional id is taken there)."""
        await trio.lowlevel.checkpoint()

    async def close_partition(self, partition: int) -> None:
        """``partition`` left this replica: nothing to let go here."""
        await trio.lowlevel.checkpoint()

    def forget(self, partition: int) -> None:
        """This writer no longer owns ``partition`` (everything it recorded there is settled:
        acknowledged, or withdrawn by a fence). Anything of it still unwritten is withdrawn."""
        self._expected.pop(partition, None)
        self._fenced.discard(partition)
        self._withdraw(partition)

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
        return ChangelogStatistics(
            **self._counts,
            pending_entries=self._pending_entries,
            unacknowledged_s=waited_s,
            stalled=waited_s * 1000 >= self.wait_ms,
        )

    def _check(self) -> None:
        if self._failure is not None:
            raise self._failure

    @staticmethod
    def _end_input(part: _Part) -> None:
        """The consumed record being applied produced no more entries in ``part``."""
        if part.inputs and part.inputs[-1][1] is None:
            if part.inputs[-1][0] == len(part.entries):
                _first, _end, topic, offset = part.inputs.pop()  # it produced none here
                part.size -= marker_size(topic, offset)  # (refused, or a mere duplicate)
            else:
                part.inputs[-1][1] = len(part.entries)

    def _touch(self) -> None:
        if self._open.since_s is None:
            self._open.since_s = trio.current_time()
        self._last = self._open
        self._wakeup.set()

    def _seal(self) -> None:
        self._sealed.append(self._open)
        self._open = _Batch()

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
                void = await self._write(batch)
            except TransportError as exc:
                self._fail(batch, exc)
                raise
            finally:
                self._writing = None
            batch.done.set()
            self._room.set()
            self._resumed()
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

    def _withdraw(self, partition: int) -> None:
        """Drop what ``partition`` recorded and is not yet written, and what it would release."""
        for batch in [*self._sealed, self._open]:
            part = batch.parts.pop(partition, None)
            if part is not None:
                self._pending_entries -= len(part.entries)
            batch.releases = [(p, r) for p, r in batch.releases if p != partition]
        self._room.set()

    def _fail(self, batch: _Batch, error: TransportError) -> None:
        self._failure = error
        for pending in [batch, *self._sealed, self._open]:
            pending.error = error
            pending.done.set()
        self._room.set()
        _log.error("changelog_failed", error=str(error))

    async def _write(self, batch: _Batch) -> dict[int, bool]:
        """Write the batch; returns the partitions whose record is void (another writer wrote
        to them meanwhile), each with whether its current owner here wrote it."""
        order = sorted(batch.parts)
        ats = [self._expected.get(p) for p in order]  # where each must land (None: unchecked)
        records = [self._record(p, batch.parts[p], at) for p, at in zip(order, ats, strict=True)]
        written: list[int | None] = [None] * len(records)
        entries = sum(len(part.entries) for part in batch.parts.values())
        todo = list(range(len(records)))
        attempt = 0
        while todo:
            delivery = await self._sink.send_batch([records[i] for i in todo])
            results = await self._results(delivery, batch)
            for i, offset in zip(todo, await delivery.offsets(), strict=True):
                written[i] = offset
            failed = [(i, f) for i, f in zip(todo, results, strict=True) if f is not None]
            for _i, failure in failed:
                if not failure.retriable:
                    raise TransportError(
                        f"changelog topic {self._topic!r} refused a journal record:"
                        f" {failure.reason}"
                    )
            todo = [i for i, _f in failed]
            if todo:
                self._counts["retries"] += 1
                _log.warning("changelog_retry", records=len(todo), reason=failed[0][1].reason)
                await trio.sleep(RETRY.delay_s(attempt))
                attempt += 1
        self._counts["batches"] += 1
        self._counts["records"] += len(records)
        self._counts["entries"] += entries
        self._counts["bytes"] += sum(len(r.value) for r in records)
        self._pending_entries -= entries
        return self._check_offsets(order, written, ats)

    def _resumed(self) -> None:
        """Log ``journal_resumed`` once a stall is over: no entry left has waited ``wait_ms``
        (the batches recorded during the stall are written first)."""
        if self._stalled_since_s is not None and not self.stalled():
            _log.info(
                "journal_resumed",
                stalled_s=round(trio.current_time() - self._stalled_since_s, 3),
                pending_entries=self._pending_entries,
            )
            self._stalled_since_s = None

    async def _results(self, delivery: Delivery, batch: _Batch) -> list[SendFailure | None]:
        """The delivery's results; logs ``journal_stalled`` once the batch's oldest entry has
        waited ``wait_ms`` for them (once per stall)."""
        since_s = batch.since_s if batch.since_s is not None else trio.current_time()
        if self._stalled_since_s is None:
            with trio.move_on_at(since_s + self.wait_ms / 1000):
                return await delivery.results()
            self._report_stall(since_s, batch, "the broker has not acknowledged a changelog record")
        return await delivery.results()

    def _report_stall(self, since_s: float, batch: _Batch, what: str) -> None:
        """The journal is stalled since ``since_s`` (``what`` did not happen in time)."""
        self._stalled_since_s = since_s
        _log.warning(
            "journal_stalled",
            wait_ms=self.wait_ms,
            partitions=sorted(batch.parts),
            pending_entries=self._pending_entries,
            detail=f"{what} within PURGATORY_JOURNAL_WAIT_MS: HTTP writes answer 503 with"
            " Retry-After, consumed inputs wait in their topics, nothing decided is released",
        )

    def _check_offsets(
        self, order: list[int], written: list[int | None], ats: list[int | None]
    ) -> dict[int, bool]:
        """The partitions whose record did not land where it had to (void), each with whether
        the partition's current owner here wrote it; the next offset expected for the others.
        """
        void: dict[int, bool] = {}
        for partition, offset, at in zip(order, written, ats, strict=True):
            current = at is not None and self._expected.get(partition) == at
            if partition in self._fenced:
                void[partition] = True  # written before the fence was seen: void as well
                continue
            if offset is None or at is None:
                continue  # not known (a sink that does not say), or not taken over
            if offset == at:
                if current:
                    self._expected[partition] = offset + 1
                continue
            void[partition] = current
            if current:
                del self._expected[partition]
            _log.error(
                "partition_fenced",
                partition=partition,
                expected_offset=at,
                written_offset=offset,
                owned=current,
                detail="another writer appended to this partition's changelog: a replica"
                " that kept writing after the partition moved, a replica cut from the"
                " broker whose record landed after the new owner's, or two replicas"
                " configured onto the same partitions (the same ordinal or static"
                " partitions); the record is void, nothing this writer decided since is"
                " released, and it restores the partition from the changelog if it still"
                " owns it",
            )
        return void

    def _delivered_mark(self, partition: int, part: _Part) -> int:
        """The delivered mark a record of ``part`` carries."""
        return self._delivered(partition)

    def _record(self, partition: int, part: _Part, at: int | None = None) -> OutRecord:
        self._end_input(part)
        value = encode_journal_record(
            partition,
            part.entries,
            part.positions,
            self._delivered_mark(partition, part),
            part.inputs,
            at=at,
        )
        return OutRecord(self._topic, JOURNAL_KEY, value, partition=partition)


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
