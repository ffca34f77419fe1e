"""The journal as Kafka transactions: exactly once for ``read_committed`` readers (service layer).

In transactional delivery (``PURGATORY_DELIVERY=transactional``) each input partition has its
own transactional producer (:class:`~purgatory.service.kafka.transport.Transactions`), and a
group commit writes, per partition it holds, **one transaction**:

1. the partition's journal record (its entries, the input positions they reached, and the
   delivered mark: the highest outcome sequence in this transaction or an earlier one);
2. the callbacks and dead letters those entries released (attached to the partition's part of
   the batch by :class:`~purgatory.service.journal.release.TransactionalRelease`, in decision
   order; ``reply_to`` topics included);
3. the input offsets reached (``send_offsets_to_transaction``, for the source's group).

All of it becomes visible to ``read_committed`` readers at the commit, or none of it: a crash
anywhere before the commit leaves nothing (the broker aborts the open transaction when the next
owner calls ``init_transactions``, or at the transaction timeout), and the next owner restores
from the committed journal, re-reads the uncommitted inputs, and decides the same outcomes with
the same sequences. After a commit, and only then, the HTTP answers (the changelog's
``durable``), the
waiters and the metrics follow (the releases queued with the changelog's ``after``).

What changes from the acknowledged writer
(:class:`~purgatory.service.journal.acknowledged.AcknowledgedWriter`):

* **Fencing is the broker's.** Taking a partition opens its producer before the restore reads
  the changelog (:meth:`TransactionalWriter.open_partition`): that fences every earlier owner
  at once, before it can write. A fenced producer's commit fails with ``ProducerFencedError``:
  nothing of it is visible, nothing it decided is released, and the partition is dropped as a
  fenced one is (``on_fenced``). Offsets are not compared (transaction markers take offsets too).
* **Refused records.** A record refused for good (larger than the broker takes, a ``reply_to``
  topic whose metadata the producer cannot get) aborts the transaction; it is replaced by its
  dead letter (``undeliverable``) and the transaction is tried again at once, so one bad
  destination cannot hold its partition. There is no ``reply_to_timeout_ms`` window: a
  ``reply_to`` topic must exist when the outcome is released. A journal record, or a record to
  the service's own topics, refused for good stops the service, as in the acknowledged journal.
* **Aborted transactions** (a broker away, a leader change, the transaction timeout) are tried
  again with back-off, whole, with the same records; ``journal_stalled`` and ``/readyz`` report
  a wait past ``wait_ms`` as before.
* **No delivered marks at a stop**: every committed transaction carries its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field

import trio

from purgatory._core import TransportError
from purgatory.service.journal.batch import RETRY, Batch, Stall, journal_record
from purgatory.service.kafka.config import raising_single_errors
from purgatory.service.kafka.transport import (
    OutRecord,
    ProducerFencedError,
    RecordRefusedError,
    SendFailure,
    TransactionAbortedError,
    Transactions,
)
from purgatory.service.telemetry.logging import get_logger

__all__ = ["TransactionalWriter"]

_log = get_logger()


@dataclass
class _Round:
    """One batch's transactions, side by side: what they share."""

    batch: Batch
    fenced: Set[int]
    stall: Stall | None
    void: set[int] = field(default_factory=set)
    failures: list[TransportError] = field(default_factory=list)


class TransactionalWriter:
    """Writes a batch as one transaction per partition, side by side.

    Args:
        transactions: the partitions' transactional producers.
        topic: the changelog topic (partition p holds input partition p's journal).
        undeliverable: the dead letter that replaces a record refused for good.
        own_topics: the service's own output topics (a record to them refused for good
            stops the service instead of being dead-lettered).
        delivered: the partition's highest outcome sequence acknowledged on the callbacks
            topic.
    """

    def __init__(
        self,
        transactions: Transactions,
        *,
        topic: str,
        undeliverable: Callable[[OutRecord, SendFailure], OutRecord],
        own_topics: Iterable[str],
        delivered: Callable[[int], int] = lambda _partition: 0,
    ) -> None:
        self._transactions = transactions
        self._topic = topic
        self._undeliverable = undeliverable
        self._own_topics = frozenset(own_topics)
        self._delivered = delivered
        self.batches = 0
        self.records = 0
        self.bytes = 0
        self.retries = 0

    async def open_partition(self, partition: int) -> None:
        """Take ``partition``'s transactional id before its restore reads the changelog: every
        earlier writer is fenced, and what it left open is aborted (so the restore reads to
        the end of what was committed)."""
        await self._transactions.open(partition)

    async def close_partition(self, partition: int) -> None:
        """``partition`` left this replica: let its producer go (its next owner fences it
        anyway; closing frees the connection now)."""
        await self._transactions.close(partition)

    def expect(self, partition: int, offset: int) -> None:
        """Nothing to remember: offsets are not checked (the broker fences by producer
        epoch)."""

    def forget(self, partition: int) -> None:
        """Nothing to forget."""

    async def mark_delivered(self, partitions: Iterable[int], fenced: Set[int]) -> dict[int, bool]:
        """Nothing to write: every committed transaction carries its delivered mark."""
        await trio.lowlevel.checkpoint()
        return {}

    async def write(self, batch: Batch, fenced: Set[int], stall: Stall | None) -> dict[int, bool]:
        """One transaction per partition of ``batch``, side by side; the partitions fenced
        (their transactions are void), each as its current owner's."""
        round_ = _Round(batch, fenced, stall)
        async with trio.open_nursery() as nursery:
            for partition in sorted(batch.parts):
                nursery.start_soon(self._transact, round_, partition)
        if round_.failures:
            raise round_.failures[0]
        self.batches += 1
        self.records += len(batch.parts)
        return dict.fromkeys(round_.void, True)

    async def _transact(self, round_: _Round, partition: int) -> None:
        try:
            await self._transact_until_done(round_, partition)
        except TransportError as exc:  # failed for good: the journal stops
            round_.failures.append(exc)

    async def _transact_until_done(self, round_: _Round, partition: int) -> None:
        part = round_.batch.parts[partition]
        if partition in round_.fenced:
            round_.void.add(partition)
            return
        mark = max(self._delivered(partition), part.sequence)
        journal = journal_record(self._topic, partition, part, mark)
        records = [journal, *part.outbound]
        offsets = {(topic, partition): offset for topic, offset in part.positions.items()}
        self.bytes += len(journal.value)
        attempt = 0
        while True:
            try:
                await self._committed(round_, partition, records, offsets)
                return
            except ProducerFencedError as exc:
                round_.void.add(partition)
                _log.error(
                    "partition_fenced",
                    partition=partition,
                    reason=str(exc),
                    detail="another owner took this partition's transactional id: nothing this"
                    " writer decided since its last commit is visible or released",
                )
                return
            except RecordRefusedError as exc:
                if not (exc.failure.retriable and self._own(records, exc.index)):
                    records[exc.index] = self._refused(records, exc)
                    continue
                self.retries += 1  # no metadata for an own topic: the broker away
                _log.warning("transaction_retry", partition=partition, reason=str(exc))
                await trio.sleep(RETRY.delay_s(attempt))
                attempt += 1
            except TransactionAbortedError as exc:
                self.retries += 1
                _log.warning("transaction_retry", partition=partition, reason=str(exc))
                await trio.sleep(RETRY.delay_s(attempt))
                attempt += 1

    async def _committed(
        self,
        round_: _Round,
        partition: int,
        records: list[OutRecord],
        offsets: dict[tuple[str, int], int],
    ) -> None:
        """Commit, reporting the stall once the batch has waited ``wait_ms``."""
        commit = self._transactions.commit(partition, records, offsets)
        batch, stall, since_s = round_.batch, round_.stall, round_.batch.since_s
        if stall is None or stall.since_s is not None or since_s is None:
            await commit
            return
        done = trio.Event()
        watched = stall

        async def watch() -> None:
            with trio.move_on_at(since_s + watched.wait_ms / 1000):
                await done.wait()
                return
            if watched.since_s is None:
                watched.report(since_s, batch, "no transaction committed")

        with raising_single_errors():  # the commit's own error, not a group of one
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch)
                try:
                    await commit
                finally:
                    done.set()

    def _own(self, records: list[OutRecord], index: int) -> bool:
        """Whether ``records[index]`` is the journal record or goes to the service's own
        topics."""
        return index == 0 or records[index].topic in self._own_topics

    def _refused(self, records: list[OutRecord], exc: RecordRefusedError) -> OutRecord:
        """The dead letter of a record refused for good; a journal record, or one to the
        service's own topics, refused for good fails the journal."""
        record = records[exc.index]
        if self._own(records, exc.index):
            raise TransportError(
                f"topic {record.topic!r} refused a record for good: {exc.failure.reason}"
            )
        _log.error("callback_dead_lettered", topic=record.topic, reason=exc.failure.reason)
        return self._undeliverable(record, exc.failure)
