"""The fake transaction coordinator keeps Kafka's promises, whatever two producers do.

Two producers share one transactional id, each re-initialising at random (the later one fences
the earlier), beside plain writes, in virtual time long enough for transactions to time out.
After every step a ``read_committed`` reader must see exactly the records of committed
transactions and plain writes, up to the first still-open transaction; a commit that returned
is never lost; a fenced or timed-out producer's records never show; and the group's offsets are
those of the commits that returned, in order.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory.service.kafka.transport import ConsumedRecord
from tests.service.fake_kafka import FakeBroker
from tests.service.fake_transactions import (
    ProducerFencedError,
    TransactionAbortedError,
    Transactions,
)

TOPIC, PARTITIONS, TXID = "callbacks", 2, "purgatory-0"
_WHO = st.integers(0, 1)
_PARTITION = st.integers(0, PARTITIONS - 1)
# A step is a whole transaction of one producer (begin, sends, maybe offsets, then commit,
# abort, or left open for later steps to interleave with), a re-initialisation (the other
# producer, or the same one again: a new epoch), a plain write, or time passing.
_STEP = st.one_of(
    st.tuples(
        st.just("txn"),
        _WHO,
        st.lists(_PARTITION, min_size=1, max_size=3),
        st.one_of(st.none(), st.integers(0, 100)),
        st.sampled_from(["commit", "commit", "abort", "open"]),
    ),
    st.tuples(st.just("init"), _WHO),
    st.tuples(st.just("plain"), _PARTITION),
    st.tuples(st.just("wait"), st.sampled_from([1.0, 30.0])),
)


class _Run:
    """The coordinator, two producers, and what the test knows happened."""

    def __init__(self) -> None:
        self.broker = FakeBroker({TOPIC: PARTITIONS, "requests": 1})
        self.txns = Transactions(self.broker, timeout_s=45.0)
        self.epoch: dict[int, int | None] = {0: None, 1: None}
        self.number = {0: 0, 1: 0}  # each producer's transactions, counted at begin
        self.sent: dict[tuple[str, int, int], tuple[int, int]] = {}  # where -> (who, number)
        self.committed_txns: set[tuple[int, int]] = set()
        self.plain: set[tuple[str, int, int]] = set()
        self.expected_offsets: dict[tuple[str, int], int] = {}
        self.pending_offsets: dict[int, dict[tuple[str, int], int]] = {0: {}, 1: {}}
        self.open_txn: dict[int, int] = {}  # who -> the number of its transaction left open

    async def apply(self, step: tuple[Any, ...]) -> None:
        kind = step[0]
        if kind == "wait":
            await trio.sleep(step[1])
        elif kind == "plain":
            record = self.broker.append(TOPIC, b"k", b"plain", step[1])
            self.plain.add(_where(record))
        elif kind == "init":  # a new epoch: whatever this producer had open is aborted
            self.epoch[step[1]] = self.txns.init(TXID)
            self.open_txn.pop(step[1], None)
            self.pending_offsets[step[1]] = {}
        else:
            _, who, partitions, offset, end = step
            if self.epoch[who] is not None:
                try:
                    self._transaction(who, partitions, offset, end)
                except (ProducerFencedError, TransactionAbortedError):
                    # fenced by the other producer, or its transaction timed out: whatever it
                    # had sent is aborted
                    self.pending_offsets[who] = {}

    def _transaction(self, who: int, partitions: list[int], offset: int | None, end: str) -> None:
        epoch = self.epoch[who]
        assert epoch is not None
        if who in self.open_txn:  # left open by an earlier step: go on with it
            number = self.open_txn.pop(who)
        else:
            self.txns.begin(TXID, epoch)
            self.number[who] += 1
            number = self.number[who]
        offsets: dict[tuple[str, int], int] = {}
        for partition in partitions:
            record = self.txns.send(TXID, epoch, TOPIC, b"v", partition=partition)
            self.sent[_where(record)] = (who, number)
        if offset is not None:
            offsets = {("requests", 0): offset}
            self.txns.send_offsets(TXID, epoch, offsets)
        self.pending_offsets[who].update(offsets)
        if end == "commit":
            self.txns.commit(TXID, epoch)
            self.committed_txns.add((who, number))
            self.expected_offsets.update(self.pending_offsets[who])
        elif end == "abort":
            self.txns.abort(TXID, epoch)
        else:
            self.open_txn[who] = number
            return
        self.pending_offsets[who] = {}

    def check(self) -> None:
        for partition in range(PARTITIONS):
            seen = [_where(r) for r in self.txns.visible(TOPIC, partition)]
            lso = self.txns.last_stable_offset(TOPIC, partition)
            every = [_where(r) for r in self.broker.topics[TOPIC][partition]]
            expected = [
                w
                for w in every
                if w[2] < lso and (w in self.plain or self.sent.get(w) in self.committed_txns)
            ]
            assert seen == expected, (partition, seen, expected)
        assert self.broker.committed == self.expected_offsets


def _where(record: ConsumedRecord) -> tuple[str, int, int]:
    return (record.topic, record.partition, record.offset)


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(_STEP, max_size=30))
def test_read_committed_sees_exactly_the_committed_records(steps: list[tuple[Any, ...]]) -> None:
    async def scenario() -> None:
        run = _Run()
        run.epoch[0] = run.txns.init(TXID)  # the first owner
        for step in steps:
            await run.apply(step)
            run.check()
        # Everything ends: whatever is still open is aborted by a new epoch; nothing committed
        # is lost, and the last stable offset is each partition's end.
        run.txns.init(TXID)
        run.check()
        for partition in range(PARTITIONS):
            end = len(run.broker.topics[TOPIC][partition])
            assert run.txns.last_stable_offset(TOPIC, partition) == end

    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))


async def test_a_new_epoch_fences_the_old_producer_and_aborts_its_open_transaction(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker({TOPIC: 1})
    txns = Transactions(broker)
    old = txns.init(TXID)
    txns.begin(TXID, old)
    txns.send(TXID, old, TOPIC, b"zombie", partition=0)
    new = txns.init(TXID)  # the partition moved: its new owner initialises
    with pytest.raises(ProducerFencedError):
        txns.commit(TXID, old)
    assert txns.visible(TOPIC, 0) == []  # the zombie's record is in the log, never seen
    txns.begin(TXID, new)
    txns.send(TXID, new, TOPIC, b"owner", partition=0)
    txns.commit(TXID, new)
    assert [r.value for r in txns.visible(TOPIC, 0)] == [b"owner"]
    assert [r.value for r in broker.records(TOPIC)] == [b"zombie", b"owner"]  # uncommitted read


async def test_a_transaction_open_past_its_timeout_is_aborted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker({TOPIC: 1, "requests": 1})
    txns = Transactions(broker, timeout_s=10.0)
    epoch = txns.init(TXID)
    txns.begin(TXID, epoch)
    txns.send(TXID, epoch, TOPIC, b"late", partition=0)
    txns.send_offsets(TXID, epoch, {("requests", 0): 7})
    assert txns.last_stable_offset(TOPIC, 0) == 0  # open: readers wait before it
    await trio.sleep(10)
    assert txns.last_stable_offset(TOPIC, 0) == 1  # aborted by the coordinator
    with pytest.raises(TransactionAbortedError):
        txns.commit(TXID, epoch)
    assert txns.visible(TOPIC, 0) == [] and broker.committed == {}
    txns.begin(TXID, epoch)  # the producer may go on with a new transaction
    txns.send(TXID, epoch, TOPIC, b"again", partition=0)
    txns.commit(TXID, epoch)
    assert [r.value for r in txns.visible(TOPIC, 0)] == [b"again"]
