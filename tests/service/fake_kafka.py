"""An in-memory broker behind the service's Kafka seam, that can fail or crash on cue.

:class:`FakeBroker` holds topics as lists of records per partition and the group's committed
offsets. :class:`FakeTransport` opens a source and a sink over it that behave as the kafka-python
ones do, in trio and in virtual time: the source polls every millisecond and hands batches over a
bounded channel; the sink acknowledges each batch after ``ack_delay_s``, record by record.

Faults, all deterministic:

* ``refuse``: a function deciding, per record, a :class:`SendFailure` (too large, retriable);
* ``fail_commits``: how many of the next commits raise ``TransportError``;
* ``fail_reads``: how many of the next reads of a partition (a restore's) raise
  ``TransportError``, as a read that timed out does (``fail_opens`` likewise for the next
  ``init_transactions`` of the fake transactions);
* ``stall``: while cleared, nothing is acknowledged (a stalled broker);
* ``crash_at``: at that step (every poll handing a batch, send, acknowledgement and commit is a
  step, counted in ``steps``), the scope given in ``crash_scope`` is cancelled, which is what a
  SIGKILL does to everything the service held in memory; the broker keeps what it acknowledged;
* ``add_partitions``: a topic grows, as Kafka's CreatePartitions does to a live topic; producers
  (``append``) place keys by the new count at once, and the source and the reader report it,
  while a source keeps reading only the partitions it was given (as a static assignment does);
* ``FakeTransport.link``: one client's link to the broker. While it is cleared (cut), what
  that client sends stays in flight and lands when it is set again (healed), after whatever
  the other clients wrote meanwhile; its source fetches nothing, and its reads and commits
  wait.

The source holds every partition it is given until the service resumes it at a position (as
the kafka-python source does), and the reader reads a partition to its end (the changelog).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio

from purgatory._core import TransportError
from purgatory.service.kafka.transport import ConsumedRecord, OutRecord, SendFailure
from purgatory.service.ownership.partitioning import partition_for

__all__ = ["FakeBroker", "FakeTransport", "Link"]


class Link:
    """One client's link to the broker: up, or cut until it is healed."""

    def __init__(self) -> None:
        self._up = trio.Event()
        self._up.set()

    def cut(self) -> None:
        """From now on nothing crosses the link (what is under way waits)."""
        if self._up.is_set():
            self._up = trio.Event()

    def heal(self) -> None:
        """What waited crosses now."""
        self._up.set()

    async def wait(self) -> None:
        """Return once the link is up."""
        while not self._up.is_set():
            await self._up.wait()


@dataclass
class FakeBroker:
    """Topics in memory, the group's committed offsets, and the faults to inject."""

    partitions: Mapping[str, int]
    refuse: Callable[[OutRecord], SendFailure | None] = lambda _record: None
    fail_commits: int = 0
    fail_reads: int = 0
    fail_opens: int = 0
    crash_at: int | None = None
    crash_scope: trio.CancelScope | None = None
    steps: int = 0
    log: list[str] = field(default_factory=list)
    topics: dict[str, list[list[ConsumedRecord]]] = field(init=False)
    committed: dict[tuple[str, int], int] = field(default_factory=dict)
    stall: trio.Event = field(default_factory=trio.Event)
    _changed: trio.Event = field(init=False, default_factory=trio.Event)

    def __post_init__(self) -> None:
        self.topics = {t: [[] for _ in range(n)] for t, n in self.partitions.items()}
        self.stall.set()

    def changed(self) -> None:
        """Something a consumer's poll reads changed: a record, a position, an assignment."""
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        """Return at the next :meth:`changed` (a consumer's long poll, without the ticks)."""
        await self._changed.wait()

    def partition_for(self, topic: str, key: bytes | None) -> int:
        """Kafka's default partitioner (murmur2 of the key), as the service computes it."""
        return partition_for((key or b"").decode("utf-8", "surrogatepass"), len(self.topics[topic]))

    def append(
        self, topic: str, key: bytes | None, value: bytes | None, partition: int | None = None
    ) -> ConsumedRecord:
        """Write a record as a producer would (tests feed inputs this way)."""
        if partition is None:
            partition = self.partition_for(topic, key)
        records = self.topics[topic][partition]
        record = ConsumedRecord(topic, partition, len(records), key, value, 1_000)
        records.append(record)
        self.changed()
        return record

    def add_partitions(self, topic: str, count: int) -> None:
        """Grow ``topic`` to ``count`` partitions (Kafka never takes partitions away)."""
        partitions = self.topics[topic]
        assert count > len(partitions), f"{topic} has {len(partitions)} partitions already"
        partitions.extend([] for _ in range(count - len(partitions)))
        self.changed()

    def records(self, topic: str) -> list[ConsumedRecord]:
        """Every record of ``topic``, partition by partition."""
        return [r for part in self.topics[topic] for r in part]

    def step(self, what: str) -> None:
        self.steps += 1
        self.log.append(what)
        if self.crash_at is not None and self.steps == self.crash_at:
            assert self.crash_scope is not None
            self.crash_scope.cancel()


class _Delivery:
    def __init__(self, size: int) -> None:
        self.results_: list[SendFailure | None] = [None] * size
        self.offsets_: list[int | None] = [None] * size
        self.done = trio.Event()

    async def results(self) -> list[SendFailure | None]:
        await self.done.wait()
        return self.results_

    async def offsets(self) -> list[int | None]:
        await self.done.wait()
        return self.offsets_


class FakeSink:
    def __init__(
        self, broker: FakeBroker, send: trio.MemorySendChannel[tuple[list[OutRecord], _Delivery]]
    ) -> None:
        self._broker = broker
        self._send = send
        self.sent = 0

    async def send_batch(self, records: Sequence[OutRecord]) -> _Delivery:
        self._broker.step("send")
        delivery = _Delivery(len(records))
        self.sent += len(records)
        await self._send.send((list(records), delivery))
        return delivery


class FakeSource:
    def __init__(
        self,
        broker: FakeBroker,
        receive: trio.MemoryReceiveChannel[list[ConsumedRecord]],
        assigned: list[tuple[str, int]],
        link: Link | None = None,
    ) -> None:
        self._broker = broker
        self._link = link if link is not None else Link()
        self.receive = receive
        self._assigned = assigned
        self.positions: dict[tuple[str, int], int] = {}
        self.paused: set[tuple[str, int]] = set(assigned)
        self.quiet = False  # stop_reading: nothing more is polled
        self.epochs: dict[tuple[str, int], int] = {}  # resumes so far, per partition
        self.owners: dict[int, str] = {}  # as a group would share them
        self.warm_asked: set[int] = set()  # what the group asks this member to warm
        self.warm_reported: list[frozenset[int]] = []  # what the member said it keeps warm
        self.leaving = False
        self.alone = True  # after leave(): nobody takes over (a test may say otherwise)
        self._on_revoke: Callable[[frozenset[tuple[str, int]]], Awaitable[None]] | None = None
        #: rebalance listeners running, and the event set when none is: kafka-python runs the
        #: listener inside the consumer thread's poll, and that thread serves the commits
        #: between polls, so a commit waits for the listener (KafkaSource._serve_commits)
        self._listening = 0
        self._listeners_done = trio.Event()

    async def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        broker = self._broker
        broker.step("commit")
        while self._listening:
            await self._listeners_done.wait()
        await trio.sleep(0.001)  # a round trip
        await self._link.wait()
        if broker.fail_commits:
            broker.fail_commits -= 1
            raise TransportError("commit refused (injected)")
        for tp, offset in offsets.items():
            if offset > broker.committed.get(tp, 0):
                broker.committed[tp] = offset

    def lag(self) -> dict[tuple[str, int], int]:
        topics = self._broker.topics
        return {
            (t, p): len(topics[t][p]) - self.positions.get((t, p), 0) for t, p in self._assigned
        }

    def assignment(self) -> frozenset[tuple[str, int]]:
        return frozenset(self._assigned)

    def held(self) -> frozenset[tuple[str, int]]:
        return frozenset(self.paused)

    def joined(self) -> bool:
        return True

    def partition_count(self, topic: str) -> int:
        return len(self._broker.topics[topic])

    def owner_urls(self) -> dict[int, str]:
        return dict(self.owners)

    def warm_wanted(self) -> frozenset[int]:
        return frozenset(self.warm_asked)

    def report_warm(self, partitions: frozenset[int]) -> None:
        self.warm_reported.append(partitions)

    def leave(self) -> None:
        self.leaving = True

    def left_alone(self) -> bool:
        return self.alone

    def on_revoke(
        self, handler: Callable[[frozenset[tuple[str, int]]], Awaitable[None]] | None
    ) -> None:
        self._on_revoke = handler

    async def revoke(
        self, partitions: set[tuple[str, int]], *, listener_after_s: float = 0.0
    ) -> None:
        """A group rebalance takes ``partitions`` away (after the service handed them over).

        ``listener_after_s``: the new assignment is seen this long before the rebalance
        listener runs (kafka-python's I/O thread changes the assignment, then calls the
        listener, while the consumer thread publishes the assignment after each poll)."""
        self._assigned[:] = [tp for tp in self._assigned if tp not in partitions]
        self.paused -= partitions
        self._broker.changed()
        if listener_after_s:
            await trio.sleep(listener_after_s)
        if self._on_revoke is not None:
            self._listening += 1
            try:
                await self._on_revoke(frozenset(partitions))
            finally:
                self._listening -= 1
                if not self._listening:
                    self._listeners_done.set()
                    self._listeners_done = trio.Event()

    def give(self, partitions: set[tuple[str, int]]) -> None:
        """A group rebalance gives ``partitions`` to this member: held until resumed."""
        self._assigned.extend(sorted(set(partitions) - set(self._assigned)))
        self.paused |= partitions
        for tp in partitions:  # read from the group's committed offset unless resumed elsewhere
            self.positions[tp] = self._broker.committed.get(tp, 0)
        self._broker.changed()

    async def resume(self, positions: Mapping[tuple[str, int], int | None]) -> None:
        for tp, asked in positions.items():
            if tp not in self._assigned:
                continue
            position = asked
            if position is None and tp not in self.paused:  # taken again while read
                position = self._broker.committed.get(tp, 0)
            if position is not None:
                self.positions[tp] = position
            self.epochs[tp] = self.resume_epoch(*tp)
            self.paused.discard(tp)
        self._broker.changed()

    def resume_epoch(self, topic: str, partition: int) -> int:
        return self.epochs.get((topic, partition), 0) + 1

    def stop_reading(self) -> None:
        self.quiet = True
        self._broker.changed()


class FakeReader:
    """Reads a partition to its end, in batches, as the restore does."""

    def __init__(
        self,
        broker: FakeBroker,
        batch: int = 100,
        committed: Callable[[str, int], tuple[list[ConsumedRecord], int]] | None = None,
        link: Link | None = None,
    ) -> None:
        self._broker = broker
        self._link = link if link is not None else Link()
        self._batch = batch
        self._committed = committed  # read_committed: (records visible, last stable offset)

    async def read(
        self,
        topic: str,
        partition: int,
        start: int,
        handle: Callable[[list[ConsumedRecord]], None],
    ) -> int:
        self._broker.step("read")
        await self._link.wait()
        if self._broker.fail_reads:
            self._broker.fail_reads -= 1
            await trio.sleep(1)  # the request's timeout
            raise TransportError(f"reading {topic}[{partition}] failed: RequestTimedOutError")
        if self._committed is not None:
            visible, end = self._committed(topic, partition)
            records = [r for r in visible if r.offset >= start]
            for first in range(0, len(records), self._batch):
                handle(records[first : first + self._batch])
                await trio.sleep(0)
            return max(start, end)
        log = self._broker.topics[topic][partition]
        offset = start
        while offset < len(log):
            taken = log[offset : offset + self._batch]
            handle(taken)
            offset += len(taken)
            await trio.sleep(0)
        return offset

    async def end_offset(self, topic: str, partition: int) -> int:
        if self._committed is not None:
            return self._committed(topic, partition)[1]
        return len(self._broker.topics[topic][partition])

    async def partition_count(self, topic: str) -> int:
        if topic not in self._broker.topics:
            raise TransportError(f"topic {topic!r} does not exist (or has no partitions)")
        return len(self._broker.topics[topic])


@dataclass
class FakeTransport:
    """Opens a :class:`FakeSource` and a :class:`FakeSink` over ``broker``."""

    broker: FakeBroker
    ack_delay_s: float = 0.002
    max_batch: int = 500
    #: this client's link to the broker: cleared, it is cut (see the module docstring)
    link: Link = field(default_factory=Link)
    #: the transaction coordinator (``fake_transactions.Transactions``): what
    #: ``open_transactions`` writes through and ``read_committed`` readers read
    transactions: Any = None

    @asynccontextmanager
    async def open_source(
        self, *, topics: list[str], group_id: str, assignment: list[tuple[str, int]] | None
    ) -> AsyncIterator[FakeSource]:
        broker = self.broker
        assigned = assignment or [(t, p) for t in topics for p in range(len(broker.topics[t]))]
        send, receive = trio.open_memory_channel[list[ConsumedRecord]](4)
        source = FakeSource(broker, receive, assigned, self.link)
        for tp in assigned:
            source.positions[tp] = broker.committed.get(tp, 0)

        async def poll() -> None:
            async with send:
                while True:
                    await self.link.wait()
                    batch: list[ConsumedRecord] = []
                    for tp in assigned:
                        if tp in source.paused or source.quiet:
                            continue
                        log = broker.topics[tp[0]][tp[1]]
                        start = source.positions[tp]
                        taken = log[start : start + self.max_batch - len(batch)]
                        epoch = source.epochs.get(tp, 0)
                        batch += [dataclasses.replace(r, epoch=epoch) for r in taken]
                        source.positions[tp] = start + len(taken)
                    if batch:
                        await send.send(batch)
                        broker.step("poll")
                    else:
                        await broker.wait_changed()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poll)
            yield source
            nursery.cancel_scope.cancel()

    @asynccontextmanager
    async def open_reader(self, *, read_committed: bool = False) -> AsyncIterator[FakeReader]:
        coordinator = self.transactions
        if read_committed and coordinator is not None:

            def committed(topic: str, partition: int) -> tuple[list[ConsumedRecord], int]:
                return (
                    coordinator.visible(topic, partition),
                    coordinator.last_stable_offset(topic, partition),
                )

            yield FakeReader(self.broker, committed=committed, link=self.link)
        else:
            yield FakeReader(self.broker, link=self.link)

    @asynccontextmanager
    async def open_transactions(self, *, id_prefix: str, group_id: str) -> AsyncIterator[Any]:
        from tests.service.fake_transactions import FakeProducers, Transactions  # noqa: PLC0415

        if self.transactions is None:
            self.transactions = Transactions(self.broker)
        yield FakeProducers(self.transactions, id_prefix, group_id, ack_delay_s=self.ack_delay_s)

    @asynccontextmanager
    async def open_sink(self) -> AsyncIterator[FakeSink]:
        broker = self.broker
        send, receive = trio.open_memory_channel[tuple[list[OutRecord], _Delivery]](1_000)

        async def acknowledge() -> None:
            async for records, delivery in receive:
                await trio.sleep(self.ack_delay_s)
                await broker.stall.wait()
                await self.link.wait()
                for index, record in enumerate(records):
                    failure = broker.refuse(record)
                    if failure is None:
                        written = broker.append(
                            record.topic, record.key, record.value, record.partition
                        )
                        delivery.offsets_[index] = written.offset
                    delivery.results_[index] = failure
                    broker.step("ack")
                delivery.done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(acknowledge)
            yield FakeSink(broker, send)
            send.close()
