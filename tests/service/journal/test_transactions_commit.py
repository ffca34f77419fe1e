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

from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.transactions import KafkaTransactions
from purgatory.service.kafka.transport import (
    OutRecord,
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
    group: object = None  # what the offsets went with

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def send(self, topic: str, value: bytes | None, **_kw: Any) -> _Future:
        index = sum(call == "send" for call in self.calls)
        self.calls.append("send")
        failure = self.failures.get(index)
        return _Future(failure, None if failure else _Metadata(100 + index))

    def send_offsets_to_transaction(self, offsets: Any, group: object) -> None:
        self.calls.append("offsets")
        self.group = group

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
        KafkaClientConfig(bootstrap_servers="127.0.0.1:1"), id_prefix="g", group_id="g"
    )


def test_a_transaction_whose_records_were_all_sent_commits_after_a_flush() -> None:
    producer = _Producer()
    offsets = _transactions()._commit(producer, RECORDS, OFFSETS)
    assert offsets == [100, 101]
    assert producer.calls == ["begin", "send", "send", "offsets", "flush", "commit"]
    assert producer.group == "g"  # the group's id, no member generation for the broker to check


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


def test_offsets_the_group_refuses_abort_the_transaction_to_be_tried_again() -> None:
    # The offsets go with the group's id alone, so no rebalance refuses them; should the group
    # refuse them anyway, the epoch is what fences: the transaction is aborted and tried again.
    producer = _Producer(refuse_commit=CommitFailedError("consumer group metadata mismatch"))
    with pytest.raises(TransactionAbortedError, match="CommitFailedError"):
        _transactions()._commit(producer, RECORDS, OFFSETS)
    assert producer.calls[-1] == "abort"
