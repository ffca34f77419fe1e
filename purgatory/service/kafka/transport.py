"""The Kafka seam (service layer): what the service needs from a broker, as protocols.

The service reads batches of :class:`ConsumedRecord` from a :class:`RecordSource`, commits their
offsets there, and writes :class:`OutRecord` batches to a :class:`RecordSink`, which answers each
batch with a :class:`Delivery`: one result per record, known once the broker acknowledged or
refused it. A :class:`Transport` opens both. The kafka-python implementation is
:class:`KafkaTransport`; tests use an in-memory one that can fail on cue (a send refused, a
delivery that fails, a commit that fails), so every crash point can be tried under virtual time.

In transactional delivery (:class:`Transactions`) the service writes instead, per input
partition, one transaction at a time: its journal record, the callbacks and dead letters that
record released, and the input offsets it reached, all visible to ``read_committed`` readers at
its commit, or none of them.

Errors of a sink are per record, never per topic or per batch: a refused record cannot take any
other record with it. A :class:`SendFailure` says whether retrying can help (``retriable``: a
timeout, a leader change, a broker away) or not (a record too large, a topic that does not
exist, an authorization failure).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

import trio

from purgatory._core import TransportError

__all__ = [
    "ConsumedRecord",
    "Delivery",
    "LogReader",
    "OutRecord",
    "ProducerFencedError",
    "RecordRefusedError",
    "RecordSink",
    "RecordSource",
    "Refusal",
    "SendFailure",
    "TransactionAbortedError",
    "Transactions",
    "Transport",
]


@dataclass(frozen=True, slots=True)
class ConsumedRecord:
    """One record read from Kafka, detached from kafka-python.

    ``offset`` is the record's own offset; the offset to commit after applying it is
    ``offset + 1``. ``epoch`` counts the resumes of its partition before it was fetched (see
    :meth:`~purgatory.service.kafka.transport.RecordSource.resume_epoch`): a record fetched before
    the latest seek carries a lower one.
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class Refusal:
    """A consumed record the service refused, and why: what its dead letter says.

    Attributes:
        record: the record refused.
        reason: why, naming the field at fault (``key: the message key is null; ...``).
        field: the field at fault (None: the record as a whole).
        label: the reason's class in the metrics (``invalid``: bad input; ``refused``: valid,
            but not taken here: a limit, a conflict, inputs stopped).
        scope: the record's scope, if it decoded that far.
    """

    record: ConsumedRecord
    reason: str
    field: str | None
    label: str
    scope: str | None = None


@dataclass(frozen=True, slots=True)
class OutRecord:
    """One record to produce: to ``partition`` when given, else to the key's partition."""

    topic: str
    key: bytes | None
    value: bytes
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class SendFailure:
    """Why the broker (or the client) did not take a record, and whether a retry can help."""

    reason: str
    retriable: bool


class ProducerFencedError(TransportError):
    """Another producer took the partition's transactional id (a newer owner called
    ``init_transactions``): this one may write nothing more there."""


class TransactionAbortedError(TransportError):
    """The transaction was aborted (a send failed and may succeed later, the transaction's
    timeout passed, the broker was away): nothing of it is visible; it may be tried again."""


class RecordRefusedError(TransactionAbortedError):
    """The transaction was aborted because the broker refused one of its records for good
    (``index`` in the records handed over: too large, its topic does not exist); the others
    may be tried again without it."""

    def __init__(self, index: int, failure: SendFailure) -> None:
        super().__init__(f"record {index} refused: {failure.reason}")
        self.index = index
        self.failure = failure


class Delivery(Protocol):
    """The acknowledgements of one batch handed to a sink."""

    async def results(self) -> list[SendFailure | None]:
        """Wait until every record of the batch is acknowledged or refused.

        Returns:
            One entry per record, in the batch's order: None when the broker acknowledged it.
        """
        ...

    async def offsets(self) -> list[int | None]:
        """Wait like :meth:`results`; the offset each record was written at (None: refused, or
        not known)."""
        ...


class RecordSink(Protocol):
    """Where records go."""

    async def send_batch(self, records: Sequence[OutRecord]) -> Delivery:
        """Hand ``records`` to the producer (waits while its queue is full); returns at once
        with the :class:`Delivery` that will tell each record's fate."""
        ...


class RecordSource(Protocol):
    """Where records come from.

    Attributes:
        receive: batches of records in poll order (per-partition order is kept).
    """

    receive: trio.MemoryReceiveChannel[list[ConsumedRecord]]

    async def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit ``{(topic, partition): next offset to read}`` and wait for the broker.

        Raises:
            TransportError: the commit failed.
        """
        ...

    def lag(self) -> dict[tuple[str, int], int]:
        """Records behind each assigned partition's end, as of the last poll."""
        ...

    def assignment(self) -> frozenset[tuple[str, int]]:
        """The partitions held now."""
        ...

    def held(self) -> frozenset[tuple[str, int]]:
        """The partitions assigned but not read until :meth:`resume`."""
        ...

    def joined(self) -> bool:
        """Whether the source was given its partitions at least once (a group's first join
        may give it none)."""
        ...

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (known once the source is open), as of the latest
        metadata: Kafka can add partitions to a live topic, and this follows within seconds."""
        ...

    def owner_urls(self) -> dict[int, str]:
        """Where each partition's owner answers, as the group shared it (group mode)."""
        ...

    def warm_wanted(self) -> frozenset[int]:
        """The partitions the group asks this member to keep warm before they move to it
        (group mode; otherwise none)."""
        ...

    def report_warm(self, partitions: frozenset[int]) -> None:
        """Tell the group which partitions this member keeps warm now (one it asked for that
        just became warm asks for a rebalance, which moves it here)."""
        ...

    def leave(self) -> None:
        """A graceful stop: ask the group to move every partition held to the other members,
        each once its next owner keeps it warm; they are served here meanwhile."""
        ...

    def left_alone(self) -> bool:
        """Whether nobody is left to take this member's partitions after :meth:`leave` (always
        true outside group mode)."""
        ...

    def on_revoke(
        self, handler: Callable[[frozenset[tuple[str, int]]], Awaitable[None]] | None
    ) -> None:
        """Have ``handler`` called with the partitions taken away, before they go to another
        member (the service stops applying them and makes its journal durable)."""
        ...

    async def resume(self, positions: Mapping[tuple[str, int], int | None]) -> None:
        """Start reading assigned partitions, each at its position (None: the group's committed
        offset, or the start). Every partition is held, not read, from the moment it is
        assigned until it is resumed, so the service can restore its state first. A partition
        read already (the service restores it again after a fence) is read again from its
        position; the records fetched before carry a lower ``epoch``, so the service skips
        those still on their way."""
        ...

    def resume_epoch(self, topic: str, partition: int) -> int:
        """The ``epoch`` the partition's records carry once it is next resumed (one more than
        its resumes so far)."""
        ...

    def stop_reading(self) -> None:
        """A graceful stop: hand over no more records, but keep taking part in the group
        (heartbeats, rebalances, commits) until the source closes."""
        ...


class Transactions(Protocol):
    """One transactional producer per input partition (transactional delivery)."""

    async def open(self, partition: int) -> None:
        """Take ``partition``'s transactional id: every earlier producer of it (another
        replica, a paused zombie, this process before a crash) is fenced, and whatever it left
        open is aborted, before this returns.

        Raises:
            TransportError: the broker cannot do transactions, or could not be reached.
        """
        ...

    async def commit(
        self,
        partition: int,
        records: Sequence[OutRecord],
        offsets: Mapping[tuple[str, int], int],
    ) -> list[int | None]:
        """Write ``records`` and commit ``offsets`` (``{(topic, partition): next offset}``,
        for the source's group) in one transaction of ``partition``'s producer.

        Returns:
            The offset each record was written at (None: not known).

        Raises:
            ProducerFencedError: another producer took the transactional id.
            RecordRefusedError: a record was refused for good; nothing was written.
            TransactionAbortedError: nothing was written; trying again may succeed.
            TransportError: the producer failed for good.
        """
        ...

    async def close(self, partition: int) -> None:
        """Let ``partition``'s producer go (the partition left this replica)."""
        ...


class LogReader(Protocol):
    """Reads one partition of a topic from an offset to its end (a changelog, at restore)."""

    async def read(
        self,
        topic: str,
        partition: int,
        start: int,
        handle: Callable[[list[ConsumedRecord]], None],
    ) -> int:
        """Hand every record from ``start`` to the end, batch by batch, to ``handle``.

        The end is the high watermark a fetch reported after the last record was read (never a
        ListOffsets answer alone, which can lag). ``handle`` may run in a worker thread.

        Returns:
            The end offset (the offset after the last record).

        Raises:
            TransportError: the partition could not be read.
        """
        ...

    async def end_offset(self, topic: str, partition: int) -> int:
        """The offset after the last record of the partition, as a fetch reports it."""
        ...

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has."""
        ...


class Transport(Protocol):
    """Opens the service's source and sink."""

    def open_source(
        self, *, topics: list[str], group_id: str, assignment: list[tuple[str, int]] | None
    ) -> AbstractAsyncContextManager[RecordSource]:
        """A source of ``topics`` for ``group_id`` (or the explicit ``assignment``)."""
        ...

    def open_sink(self) -> AbstractAsyncContextManager[RecordSink]:
        """A sink; on exit it has handed over every record sent to it."""
        ...

    def open_reader(
        self, *, read_committed: bool = False
    ) -> AbstractAsyncContextManager[LogReader]:
        """A reader of whole partitions (the changelog): of every record written, or
        (``read_committed``) of those whose transaction committed, to the last stable offset."""
        ...

    def open_transactions(
        self, *, id_prefix: str, group_id: str
    ) -> AbstractAsyncContextManager[Transactions]:
        """Transactional producers, ``{id_prefix}-{partition}`` each, committing offsets for
        the group ``group_id`` (the source's)."""
        ...
