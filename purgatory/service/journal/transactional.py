"""The journal as Kafka transactions: exactly once for ``read_committed`` readers (service layer).

In transactional delivery (``PURGATORY_DELIVERY=transactional``) each input partition has its
own transactional producer (:class:`~purgatory.service.kafka.transport.Transactions`), and a
group commit writes, per partition it holds, **one transaction**:

1. the partition's journal record (its entries, the input positions they reached, and the
   delivered mark: the highest outcome sequence in this transaction or an earlier one);
2. the callbacks and dead letters those entries released (:meth:`TransactionalChangelog.attach`,
   in decision order; ``reply_to`` topics included);
3. the input offsets reached (``send_offsets_to_transaction``, for the source's group).

All of it becomes visible to ``read_committed`` readers at the commit, or none of it: a crash
anywhere before the commit leaves nothing (the broker aborts the open transaction when the next
owner calls ``init_transactions``, or at the transaction timeout), and the next owner restores
from the committed journal, re-reads the uncommitted inputs, and decides the same outcomes with
the same sequences. After a commit, and only then, the HTTP answers (:meth:`durable`), the
waiters and the metrics follow (the releases queued with :meth:`after`).

What changes from the acknowledged journal
(:class:`~purgatory.service.journal.changelog.Changelog`):

* **Fencing is the broker's.** Taking a partition opens its producer before the restore reads
  the changelog (:meth:`open_partition`): that fences every earlier owner at once, before it can
  write. A fenced producer's commit fails with ``ProducerFencedError``: nothing of it is
  visible, nothing it decided is released, and the partition is dropped as a fenced one is
  (``on_fenced``). Offsets are not compared (transaction markers take offsets too).
* **Refused records.** A record refused for good (larger than the broker takes, a ``reply_to``
  topic whose metadata the producer cannot get) aborts the transaction; it is replaced by its
  dead letter
  (``undeliverable``) and the transaction is tried again at once, so one bad destination cannot
  hold its partition. There is no ``reply_to_timeout_ms`` window: a ``reply_to`` topic must
  exist when the outcome is released. A journal record, or a record to the service's own
  topics, refused for good stops the service, as in the acknowledged journal.
* **Aborted transactions** (a broker away, a leader change, the transaction timeout) are tried
  again with back-off, whole, with the same records; ``journal_stalled`` and ``/readyz`` report
  a wait past ``wait_ms`` as before.
* **No delivered marks at a stop**: every committed transaction carries its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import trio

from purgatory._core import TransportError
from purgatory.service.journal.changelog import RETRY, Changelog, _Batch, _Part
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

__all__ = ["TransactionalChangelog"]

_log = get_logger()


class TransactionalChangelog(Changelog):
    """The changelog written as one transaction per partition and group commit.

    Args:
        transactions: the partitions' transactional producers.
        undeliverable: the dead letter that replaces a record refused for good.
        own_topics: the service's own output topics (a record to them refused for good
            stops the service instead of being dead-lettered).
        **kwargs: as :class:`~purgatory.service.journal.changelog.Changelog` (its ``sink``
            is unused: every record goes through ``transactions``).
    """

    def __init__(
        self,
        transactions: Transactions,
        *,
        undeliverable: Callable[[OutRecord, SendFailure], OutRecord],
        own_topics: Iterable[str],
        **kwargs: Any,
    ) -> None:
        super().__init__(_NoSink(), **kwargs)
        self._transactions = transactions
        self._undeliverable = undeliverable
        self._own_topics = frozenset(own_topics)

    def attach(
        self,
        partition: int,
        records: Sequence[OutRecord],
        *,
        sequence: int = 0,
        release: Callable[[], None] | None = None,
    ) -> None:
        """Write ``records`` in the transaction that holds ``partition``'s entries recorded so
        far (or a later one); ``release`` follows its commit. ``sequence``: the highest
        outcome sequence among them (the delivered mark moves with the commit)."""
        self._check()
        if partition in self._fenced:
            return
        part = self._open.parts.get(partition)
        if part is None:
            part = self._open.parts[partition] = _Part()
        part.outbound.extend(records)
        part.sequence = max(part.sequence, sequence)
        if release is not None:
            self._open.releases.append((partition, release))
        self._touch()

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
        """This writer serves ``partition`` again (a fence is lifted); offsets are not
        checked (the broker fences by producer epoch)."""
        self._fenced.discard(partition)

    async def mark_delivered(self, partitions: Iterable[int]) -> None:
        """Nothing to write: every committed transaction carries its delivered mark."""
        await trio.lowlevel.checkpoint()

    def _delivered_mark(self, partition: int, part: _Part) -> int:
        return max(self._delivered(partition), part.sequence)

    async def _write(self, batch: _Batch) -> dict[int, bool]:
        """One transaction per partition of ``batch``, side by side; the partitions fenced
        (their transactions are void), each as its current owner's."""
        fenced: set[int] = set()
        failures: list[TransportError] = []
        async with trio.open_nursery() as nursery:
            for partition in sorted(batch.parts):
                nursery.start_soon(self._transact, batch, partition, fenced, failures)
        if failures:
            raise failures[0]
        parts = batch.parts.values()
        entries = sum(len(part.entries) for part in parts)
        self._counts["batches"] += 1
        self._counts["records"] += len(batch.parts)
        self._counts["entries"] += entries
        self._pending_entries -= entries
        return dict.fromkeys(fenced, True)

    async def _transact(
        self, batch: _Batch, partition: int, fenced: set[int], failures: list[TransportError]
    ) -> None:
        try:
            await self._transact_until_done(batch, partition, fenced)
        except TransportError as exc:  # failed for good: the journal stops
            failures.append(exc)

    async def _transact_until_done(self, batch: _Batch, partition: int, fenced: set[int]) -> None:
        part = batch.parts[partition]
        if partition in self._fenced:
            fenced.add(partition)
            return
        journal = self._record(partition, part)
        records = [journal, *part.outbound]
        offsets = {(topic, partition): offset for topic, offset in part.positions.items()}
        self._counts["bytes"] += len(journal.value)
        attempt = 0
        while True:
            try:
                await self._committed(batch, partition, records, offsets)
                return
            except ProducerFencedError as exc:
                fenced.add(partition)
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
                self._counts["retries"] += 1  # no metadata for an own topic: the broker away
                _log.warning("transaction_retry", partition=partition, reason=str(exc))
                await trio.sleep(RETRY.delay_s(attempt))
                attempt += 1
            except TransactionAbortedError as exc:
                self._counts["retries"] += 1
                _log.warning("transaction_retry", partition=partition, reason=str(exc))
                await trio.sleep(RETRY.delay_s(attempt))
                attempt += 1

    async def _committed(
        self,
        batch: _Batch,
        partition: int,
        records: list[OutRecord],
        offsets: dict[tuple[str, int], int],
    ) -> None:
        """Commit, logging ``journal_stalled`` once the batch has waited ``wait_ms``."""
        commit = self._transactions.commit(partition, records, offsets)
        since_s = batch.since_s
        if self._stalled_since_s is not None or since_s is None:
            await commit
            return
        done = trio.Event()

        async def watch() -> None:
            with trio.move_on_at(since_s + self.wait_ms / 1000):
                await done.wait()
                return
            if self._stalled_since_s is None:
                self._report_stall(since_s, batch, "no transaction committed")

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


class _NoSink:
    """The sink a transactional changelog never uses."""

    async def send_batch(self, records: Sequence[OutRecord]) -> Any:
        raise TransportError("a transactional changelog writes through its transactions")
