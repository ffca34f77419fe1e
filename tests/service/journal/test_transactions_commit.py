"""One transaction's commit over a scripted producer: a record that failed is never committed.

kafka-python 3.0 commits a transaction one of whose records expired unsent (a broker away
longer than the producer's delivery timeout) as if it held it: a ``read_committed`` reader then
sees the transaction without that record (a journal record, a callback or a dead letter lost
with the offsets committed past it). The commit checks every record first: one that failed
aborts the transaction, retried whole (``TransactionAbortedError``), or, refused for good,
names its record (``RecordRefusedError``) to be dead-lettered.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from kafka.errors import CommitFailedError, KafkaTimeoutError, MessageSizeTooLargeError
from kafka.structs import ConsumerGroupMetadata

from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.transactions import KafkaTransactions
from purgatory.service.kafka.transport import (
    OutRecord,
    ProducerFencedError,
    RecordRefusedError,
    TransactionAbortedError,
)


@dataclass
class _Metadata:
    offset: int


@dataclass
class _Future:
    exception: BaseException | None = None
    value: _Metadata | None = None
    is_done: bool = True

    def failed(self) -> bool:
        return self.exception is not None

    def succeeded(self) -> bool:
        return self.exception is None


@dataclass
class _Producer:
    """Sends fail as scripted (an exception per record index); every call is recorded."""

    failures: dict[int, BaseException] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    refuse_commit: BaseException | None = None

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send(self, topic: str, value: bytes | None, **_kw: Any) -> _Future:
        index = sum(call == "send" for call in self.calls)
        self.calls.append("send")
        failure = self.failures.get(index)
        return _Future(failure, None if failure else _Metadata(100 + index))

    def send_offsets_to_transaction(self, offsets: Any, group: object) -> None:
        self.calls.append("offsets")

    def flush(self) -> None:
        self.calls.append("flush")

    def commit_transaction(self) -> None:
        self.calls.append("commit")
        if self.refuse_commit is not None:
            raise self.refuse_commit

    def abort_transaction(self) -> None:
        self.calls.append("abort")


RECORDS = [OutRecord("changelog", b"journal", b"{}", partition=0), OutRecord("cb", b"s", b"x")]
OFFSETS = {("requests", 0): 7}


def _transactions() -> KafkaTransactions:
    return KafkaTransactions(
        KafkaClientConfig(bootstrap_servers="127.0.0.1:1"), id_prefix="g", group_metadata=object
    )


def test_a_transaction_whose_records_were_all_sent_commits_after_a_flush() -> None:
    producer = _Producer()
    offsets = _transactions()._commit(producer, RECORDS, OFFSETS)
    assert offsets == [100, 101]
    assert producer.calls == ["begin", "send", "send", "offsets", "flush", "commit"]


def test_a_record_that_expired_unsent_aborts_the_transaction_to_be_tried_again() -> None:
    producer = _Producer({1: KafkaTimeoutError("Expiring 1 record(s): 120000 ms has passed")})
    with pytest.raises(TransactionAbortedError, match="KafkaTimeoutError"):
        _transactions()._commit(producer, RECORDS, OFFSETS)
    assert "commit" not in producer.calls
    assert producer.calls[-1] == "abort"


def test_a_record_refused_for_good_aborts_and_is_named() -> None:
    producer = _Producer({1: MessageSizeTooLargeError("too large")})
    with pytest.raises(RecordRefusedError) as refused:
        _transactions()._commit(producer, RECORDS, OFFSETS)
    assert refused.value.index == 1 and not refused.value.failure.retriable
    assert "commit" not in producer.calls and producer.calls[-1] == "abort"


class _Group:
    """The consumer's group membership as the transaction reads it: each read is the next one
    of ``generations`` (the last one stays), with ``member`` as the member id."""

    def __init__(self, *generations: int, member: str = "m-1") -> None:
        self._generations = list(generations)
        self._member = member

    def __call__(self) -> ConsumerGroupMetadata:
        generation = (
            self._generations.pop(0) if len(self._generations) > 1 else self._generations[0]
        )
        return ConsumerGroupMetadata("g", generation, self._member)


def _refused_by_the_group(group: _Group) -> _Producer:
    producer = _Producer(refuse_commit=CommitFailedError("consumer group metadata mismatch"))
    transactions = KafkaTransactions(
        KafkaClientConfig(bootstrap_servers="127.0.0.1:1"), id_prefix="g", group_metadata=group
    )
    transactions._closed.set()  # no real pause between two looks at the membership
    with pytest.raises((TransactionAbortedError, ProducerFencedError)) as raised:
        transactions._commit(producer, RECORDS, OFFSETS)
    producer.calls.append(type(raised.value).__name__)
    return producer


def test_offsets_refused_by_a_rebalance_this_member_is_part_of_are_tried_again() -> None:
    # The offsets went with generation 4; a rebalance (a warm move, say) began generation 5,
    # which this member joined: the transaction aborts, to be tried again with generation 5.
    producer = _refused_by_the_group(_Group(4, 4, 5))
    assert producer.calls[-2:] == ["abort", "TransactionAbortedError"]


def test_offsets_refused_with_no_newer_generation_for_this_member_are_a_fence() -> None:
    # The group moved on without this member (a zombie that has not rejoined): fenced.
    producer = _refused_by_the_group(_Group(4))
    assert producer.calls[-1] == "ProducerFencedError"
    left = _refused_by_the_group(_Group(4, 5, member=""))  # evicted: no member id any more
    assert left.calls[-1] == "ProducerFencedError"
