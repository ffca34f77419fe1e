"""Kafka transactions, in memory, over the fake broker: the model transactional tests run on.

What Kafka does, reduced to what the service relies on (KIP-98, transaction protocol v1):

* **Epochs fence.** A transactional id has an epoch; :meth:`Transactions.init`
  (``init_transactions``) bumps it and aborts whatever the previous epoch left open. Every later
  call made with an older epoch raises :class:`ProducerFencedError`, and nothing it sends or
  commits is ever seen.
* **Records are in the log at once, seen at the commit.** A record sent in a transaction takes
  its offset when it is sent, but a ``read_committed`` reader (:meth:`Transactions.visible`)
  sees it only once its transaction committed, never once aborted; and it reads no further than
  the partition's last stable offset: the first offset of a transaction still open there. A
  ``read_uncommitted`` reader (the broker's plain ``records``) sees everything.
* **Offsets ride along.** Offsets sent to a transaction (``send_offsets_to_transaction``) become
  the group's committed offsets when, and only when, it commits.
* **Timeouts abort.** A transaction open longer than ``timeout_s`` (virtual time: trio's clock)
  is aborted by the coordinator; its producer's next call raises
  :class:`TransactionAbortedError` (it may begin another).

Records written outside any transaction (tests feed inputs with ``FakeBroker.append``) are
committed as they land.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import trio

from purgatory._core import TransportError
from purgatory.service.kafka.transport import (
    ConsumedRecord,
    OutRecord,
    ProducerFencedError,
    RecordRefusedError,
    TransactionAbortedError,
)
from tests.service.fake_kafka import FakeBroker

__all__ = [
    "FakeProducers",
    "ProducerFencedError",
    "TransactionAbortedError",
    "Transactions",
]

_Where = tuple[str, int, int]  # (topic, partition, offset)


@dataclass
class _Open:
    epoch: int
    started_s: float
    records: list[_Where] = field(default_factory=list)
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)


@dataclass
class Transactions:
    """The transaction coordinator of ``broker``."""

    broker: FakeBroker
    group_id: str = "g"
    timeout_s: float = 60.0
    epochs: dict[str, int] = field(default_factory=dict)
    _open: dict[str, _Open] = field(default_factory=dict)
    _timed_out: set[tuple[str, int]] = field(default_factory=set)  # (id, epoch) aborted by timeout
    _status: dict[_Where, str] = field(default_factory=dict)  # "open" | "committed" | "aborted"

    # -- the producer's calls ----------------------------------------------------------------

    def init(self, txid: str) -> int:
        """``init_transactions``: a new epoch of ``txid`` (aborting what the last one left open)."""
        self._expire()
        if txid in self._open:
            self._end(txid, "aborted")
        self.epochs[txid] = self.epochs.get(txid, -1) + 1
        return self.epochs[txid]

    def begin(self, txid: str, epoch: int) -> None:
        """``begin_transaction``."""
        self._check(txid, epoch)
        assert txid not in self._open, "a transaction is already open"
        self._open[txid] = _Open(epoch, trio.current_time())

    def send(
        self,
        txid: str,
        epoch: int,
        topic: str,
        value: bytes | None,
        *,
        partition: int | None,
        key: bytes | None = b"k",
    ) -> ConsumedRecord:
        """Send one record in the open transaction; it takes its offset now."""
        txn = self._current(txid, epoch)
        record = self.broker.append(topic, key, value, partition)
        where = (record.topic, record.partition, record.offset)
        txn.records.append(where)
        self._status[where] = "open"
        return record

    def send_offsets(self, txid: str, epoch: int, offsets: Mapping[tuple[str, int], int]) -> None:
        """``send_offsets_to_transaction``: commit these with the transaction."""
        self._current(txid, epoch).offsets.update(offsets)

    def commit(self, txid: str, epoch: int) -> None:
        """``commit_transaction``: its records become visible, its offsets committed."""
        txn = self._current(txid, epoch)
        self.broker.committed.update(txn.offsets)
        self._end(txid, "committed")

    def abort(self, txid: str, epoch: int) -> None:
        """``abort_transaction``: its records are never seen, its offsets never committed."""
        self._check(txid, epoch)
        if txid in self._open:
            self._end(txid, "aborted")

    # -- readers -----------------------------------------------------------------------------

    def visible(self, topic: str, partition: int) -> list[ConsumedRecord]:
        """What a ``read_committed`` reader reads of the partition: committed and plain records
        before the last stable offset."""
        self._expire()
        seen = []
        for record in self.broker.topics[topic][partition]:
            status = self._status.get((topic, partition, record.offset), "committed")
            if status == "open":
                break  # the last stable offset
            if status == "committed":
                seen.append(record)
        return seen

    def last_stable_offset(self, topic: str, partition: int) -> int:
        """The first offset of a transaction still open in the partition (else its end)."""
        self._expire()
        for record in self.broker.topics[topic][partition]:
            if self._status.get((topic, partition, record.offset)) == "open":
                return record.offset
        return len(self.broker.topics[topic][partition])

    # -- internals ---------------------------------------------------------------------------

    def _check(self, txid: str, epoch: int) -> None:
        self._expire()
        current = self.epochs.get(txid)
        if current is None or epoch < current:
            raise ProducerFencedError(f"{txid!r} epoch {epoch} is fenced (now {current})")
        assert epoch == current, f"{txid!r} epoch {epoch} was never given (now {current})"
        if (txid, epoch) in self._timed_out:
            self._timed_out.discard((txid, epoch))
            raise TransactionAbortedError(f"{txid!r}: the transaction timed out and was aborted")

    def _current(self, txid: str, epoch: int) -> _Open:
        self._check(txid, epoch)
        txn = self._open.get(txid)
        assert txn is not None, "no transaction is open: call begin first"
        return txn

    def _end(self, txid: str, status: str) -> None:
        txn = self._open.pop(txid)
        for where in txn.records:
            self._status[where] = status

    def _expire(self) -> None:
        now = trio.current_time()
        for txid, txn in list(self._open.items()):
            if now - txn.started_s >= self.timeout_s:
                self._end(txid, "aborted")
                self._timed_out.add((txid, txn.epoch))


@dataclass
class FakeProducers:
    """The service's :class:`~purgatory.service.kafka.transport.Transactions` over a
    :class:`Transactions` coordinator, one producer (an epoch) per partition.

    Each call is a step of the broker (``txn-init``, ``txn-begin``, ``txn-send`` per record,
    ``txn-offsets``, ``txn-commit``), so a crash can be tried before and after each one. A
    record ``broker.refuse`` refuses aborts the transaction: ``TransactionAbortedError`` when
    retriable, ``RecordRefusedError`` naming it when not. The commit waits ``ack_delay_s`` and
    for ``broker.stall`` (a stalled broker commits nothing).
    """

    coordinator: Transactions
    id_prefix: str
    group_id: str
    ack_delay_s: float = 0.002
    epochs: dict[int, int] = field(default_factory=dict)

    @property
    def broker(self) -> FakeBroker:
        return self.coordinator.broker

    async def open(self, partition: int) -> None:
        await trio.sleep(0)
        self.broker.step("txn-init")
        if self.broker.fail_opens:
            self.broker.fail_opens -= 1
            await trio.sleep(5)  # kafka-python's max_block_ms
            raise TransportError(
                f"init_transactions for '{self.id_prefix}-{partition}' failed:"
                " KafkaTimeoutError: Timeout after waiting for 5000 ms."
            )
        self.epochs[partition] = self.coordinator.init(f"{self.id_prefix}-{partition}")

    async def commit(
        self,
        partition: int,
        records: Sequence[OutRecord],
        offsets: Mapping[tuple[str, int], int],
    ) -> list[int | None]:
        epoch = self.epochs.get(partition)
        if epoch is None:
            raise ProducerFencedError(f"partition {partition} has no open producer")
        txid, coordinator = f"{self.id_prefix}-{partition}", self.coordinator
        try:
            coordinator.begin(txid, epoch)
            self.broker.step("txn-begin")
            written: list[int | None] = []
            for index, record in enumerate(records):
                failure = self.broker.refuse(record)
                if failure is not None:
                    coordinator.abort(txid, epoch)
                    if failure.retriable:
                        raise TransactionAbortedError(failure.reason)
                    raise RecordRefusedError(index, failure)
                sent = coordinator.send(
                    txid,
                    epoch,
                    record.topic,
                    record.value,
                    partition=record.partition,
                    key=record.key,
                )
                written.append(sent.offset)
                self.broker.step("txn-send")
            await trio.sleep(self.ack_delay_s)
            await self.broker.stall.wait()
            if offsets:
                assert self.group_id
                coordinator.send_offsets(txid, epoch, offsets)
                self.broker.step("txn-offsets")
            coordinator.commit(txid, epoch)
        except ProducerFencedError:
            self.epochs.pop(partition, None)
            raise
        self.broker.step("txn-commit")
        return written

    async def close(self, partition: int) -> None:
        await trio.sleep(0)
        self.epochs.pop(partition, None)
