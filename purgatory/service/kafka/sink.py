"""The Kafka sink: one producer thread fed from trio (service layer).

``send_batch`` puts a batch of records in a bounded memory channel (it waits when the channel is
full: back-pressure) and returns a :class:`~purgatory.service.kafka.transport.Delivery` at once; the
producer thread takes what is queued, in one hop, and hands each record to kafka-python's
producer, whose own I/O thread batches and delivers them. Each record's acknowledgement (or
error) arrives on that I/O thread and is written into its delivery under a lock; the last one of
a batch wakes the trio side through the run's ``TrioToken``. So the service learns the fate of
every record, one by one: a record the broker refuses (too large, unknown topic) fails alone.

A record whose topic has no metadata makes ``producer.send`` block for ``max_block_ms``; the
other records of that topic in the same hand-over then fail at once as retriable (the caller
retries them), so a missing topic cannot stall the thread once per record, and records of other
topics are not affected. No client of the service creates topics, so a topic that does not exist
(a client's ``reply_to`` not created yet) stays missing: ``max_block_ms`` is therefore
``metadata_timeout_ms``, short, not the delivery timeout, or each attempt at such a record would
hold every other record of the thread for as long.

``flush`` travels through the same channel as a marker, so it covers exactly the records sent
before it: the thread flushes the producer and answers with the delivery failures seen since the
previous flush.

The direct path: ``producer.send`` only appends to kafka-python's accumulator (its I/O thread
does the sending), and blocks only for the metadata of a topic it has none of. So a batch whose
topics all have metadata, sent while nothing is waiting in the channel or being handed over by
the thread, is handed to the producer at once from the trio thread: no hop through the channel
and the producer thread, no wait for either to be scheduled (at a low rate, where each poll
makes a small batch, those hops were most of a callback's cost). Any other batch takes the
channel, and so does every batch after it until the thread has handed everything over, so the
records of a partition still reach the producer in the order they were sent.

The producer is kafka-python's default, idempotent one (the journal counts on it: a produce
request retried after a timeout whose first try was written is not written twice, so the
record's offset is where its writer expects it). kafka-python 3.0.12 strands such a producer
after a broker outage longer than the delivery timeout: when a batch that was already sent
expires (its request timed out after 30 s, it was queued again, and 120 s have passed since it
was made), the producer drops its producer id, since it cannot know which sequence numbers the
broker holds, but it never asks for a new one. Java's producer returns to its initial state
there, and its I/O thread then asks for a new id as at the start; kafka-python stays ``READY``,
its I/O thread asks for an id only when ``UNINITIALIZED``, and sends nothing without one. Every
record sent afterwards stays queued, not even failed, for good: the journal would stall forever
though the broker came back. :func:`_renew_producer_id_after_reset` puts the missing step back,
so the producer gets a new id once the broker answers and sends what waited. What is left is
weather: a record that expired may have been written after all, so its resend lands one past
where the journal expected it and is treated as another writer's (a restore of the partition,
not a loss); and the pass in which kafka-python drops the id does not send the batches it has
just taken out of its queue (another sent batch expiring once the broker is back), which then
fail only at their own delivery timeout, and are sent again.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import trio
from kafka import KafkaProducer
from kafka.errors import KafkaError
from kafka.producer.transaction_manager import TransactionState

from purgatory._core import TransportError, UsageError
from purgatory.service.kafka.config import (
    KafkaClientConfig,
    no_client_metrics,
    no_topic_creation,
    raising_single_errors,
)
from purgatory.service.kafka.partitioner import KeyHashPartitioner
from purgatory.service.kafka.transport import OutRecord, SendFailure

__all__ = ["KafkaDelivery", "KafkaSink", "SinkStatistics", "open_kafka_sink"]

_TAKE_MAX = 1000
_CLOSE_TIMEOUT_S = 5.0
#: How ``producer.send`` refuses a record whose topic or partition is missing from its metadata
#: at that moment: a ``ValueError``, not a KafkaError (kafka-python's ``KafkaProducer._partition``,
#: then the partitioner it calls, :mod:`purgatory.service.kafka.partitioner`).
_NO_PARTITION = (
    "Unrecognized partition",
    "Partitioner did not assign a partition",
    "not found in ClusterMetadata",
)


@dataclass(frozen=True, slots=True)
class SinkStatistics:
    """Records handed to the producer, acknowledged by the broker, and failed, since opening."""

    sent: int
    acked: int
    failed: int


class KafkaDelivery:
    """The acknowledgements of one batch, filled in by kafka-python's I/O thread."""

    __slots__ = (
        "_done",
        "_lock",
        "_offsets",
        "_remaining",
        "_results",
        "_token",
        "report_at_flush",
    )

    def __init__(
        self, size: int, token: trio.lowlevel.TrioToken, *, report_at_flush: bool = False
    ) -> None:
        #: whether failures are also reported by the next ``flush`` (for ``send``, whose
        #: callers do not read the delivery)
        self.report_at_flush = report_at_flush
        self._results: list[SendFailure | None] = [None] * size
        self._offsets: list[int | None] = [None] * size
        self._remaining = size
        self._lock = threading.Lock()
        self._done = trio.Event()
        self._token = token
        if not size:
            self._done.set()

    def resolve(self, index: int, failure: SendFailure | None, offset: int | None = None) -> None:
        """Record the fate of record ``index`` (from any thread), and where it was written."""
        with self._lock:
            self._results[index] = failure
            self._offsets[index] = offset
            self._remaining -= 1
            last = self._remaining == 0
        if last:
            self._token.run_sync_soon(self._done.set)

    async def results(self) -> list[SendFailure | None]:
        """Wait for every record's acknowledgement; one entry per record, None when acked."""
        await self._done.wait()
        return self._results

    async def offsets(self) -> list[int | None]:
        """Wait for every acknowledgement; the offset each record was written at (None: not
        written)."""
        await self._done.wait()
        return self._offsets


@dataclass(frozen=True, slots=True)
class _Batch:
    records: Sequence[OutRecord]
    delivery: KafkaDelivery


@dataclass(slots=True)
class _Flush:
    done: trio.Event
    error: TransportError | None = None


_Item = _Batch | _Flush


def _failure(exc: BaseException) -> SendFailure:
    retriable = bool(getattr(exc, "retriable", False))
    return SendFailure(f"{type(exc).__name__}: {exc}", retriable)


async def _take(receive: trio.MemoryReceiveChannel[_Item]) -> list[_Item]:
    """Take what is queued, or wait for one item (one thread hop per batch).

    Queued items are taken before any checkpoint, so a cancelled sink still hands them over.
    """
    items: list[_Item] = []
    while len(items) < _TAKE_MAX:
        try:
            items.append(receive.receive_nowait())
        except trio.WouldBlock:
            break
    return items or [await receive.receive()]


class _ProducerThread:
    """Owns the producer; ``_main`` and what it calls run in the owning thread, the ``_on_*``
    callbacks in kafka-python's I/O thread."""

    def __init__(
        self, config: KafkaClientConfig, options: dict[str, Any], flush_timeout_s: float
    ) -> None:
        self._config = config
        self._options = options  # the producer's own arguments, beside the connection's
        self._flush_timeout_s = flush_timeout_s
        #: the producer while it takes records (set by the thread, read by the trio side)
        self.producer: Any = None
        #: batches and flushes queued for the thread or being handed over by it (changed on
        #: the trio thread only)
        self.queued = 0
        self._lock = threading.Lock()
        self._sent = 0
        self._acked = 0
        self._failed = 0
        self._unreported = 0
        self._first_error: str | None = None

    async def run(
        self,
        receive: trio.MemoryReceiveChannel[_Item],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        with receive:
            # Abandoned when cancelled (a close past its bound): kafka-python's flush cannot be
            # interrupted, and the thread then finishes on its own, in the background.
            await trio.to_thread.run_sync(
                self._main,
                receive,
                task_status,
                limiter=trio.CapacityLimiter(1),
                abandon_on_cancel=True,
            )

    def statistics(self) -> SinkStatistics:
        with self._lock:
            return SinkStatistics(sent=self._sent, acked=self._acked, failed=self._failed)

    def _main(
        self, receive: trio.MemoryReceiveChannel[_Item], task_status: trio.TaskStatus[None]
    ) -> None:
        try:
            producer = KafkaProducer(**self._config.kafka_kwargs(), **self._options)
        except KafkaError as exc:
            servers = self._config.servers()
            raise TransportError(f"cannot reach Kafka at {servers}: {exc}") from exc
        try:
            _renew_producer_id_after_reset(producer)
            self.producer = producer
            trio.from_thread.run_sync(task_status.started)
            while True:
                try:
                    items = trio.from_thread.run(_take, receive)
                except trio.EndOfChannel:
                    return
                unreachable: set[str] = set()
                for item in items:
                    if isinstance(item, _Flush):
                        self._flush(producer, item)
                        unreachable.clear()
                    else:
                        for index, record in enumerate(item.records):
                            self._produce(producer, record, item.delivery, index, unreachable)
                trio.from_thread.run_sync(self._handed_over, len(items))
        finally:
            self.producer = None
            # What does not make it is counted as failed by the callbacks, here or on close.
            with contextlib.suppress(KafkaError):
                producer.flush(timeout=self._flush_timeout_s)
            producer.close(timeout=_CLOSE_TIMEOUT_S)

    def _handed_over(self, items: int) -> None:
        self.queued -= items

    def sends_directly(self, records: Sequence[OutRecord]) -> Any:
        """The producer, if ``records`` may be handed to it now from the trio thread (nothing
        queued before them, metadata for each topic); else None."""
        producer = self.producer
        if producer is None or self.queued:
            return None
        metadata = producer._metadata  # a cached lookup: what send() checks first
        topics = {record.topic for record in records}
        if any(metadata.partitions_for_topic(topic) is None for topic in topics):
            return None
        return producer

    def produce(self, producer: Any, records: Sequence[OutRecord], delivery: KafkaDelivery) -> None:
        """Hand ``records`` to ``producer`` (from any thread), each resolving ``delivery``."""
        unreachable: set[str] = set()
        for index, record in enumerate(records):
            self._produce(producer, record, delivery, index, unreachable)

    def _produce(
        self,
        producer: Any,
        record: OutRecord,
        delivery: KafkaDelivery,
        index: int,
        unreachable: set[str],
    ) -> None:
        with self._lock:
            self._sent += 1
        if record.topic in unreachable:
            # send() already blocked for max_block_ms on this topic's metadata in this hand-over;
            # failing the rest of the topic at once (retriable) keeps it from stalling per record.
            self._on_error(delivery, index, TransportError(f"no metadata for {record.topic!r}"))
            return
        try:
            future = producer.send(
                record.topic, key=record.key, value=record.value, partition=record.partition
            )
        except KafkaError as exc:  # too large for the producer, or no metadata in time
            if getattr(exc, "retriable", False):
                unreachable.add(record.topic)
            self._on_error(delivery, index, exc)
            return
        except ValueError as exc:
            if not any(text in str(exc) for text in _NO_PARTITION):
                raise  # a record kafka-python cannot take at all: a bug, not the broker
            # Its metadata lacked the topic or the partition for a moment: a metadata answer
            # with an error for the topic drops it (a broker fencing itself, leaders moving),
            # and the I/O thread can do so between send's own check and its use. Retriable.
            missing = TransportError(f"{record.topic}[{record.partition}]: {exc}")
            self._on_error(delivery, index, missing)
            return
        future.add_callback(functools.partial(self._on_ack, delivery, index))
        future.add_errback(functools.partial(self._on_error, delivery, index))

    def _flush(self, producer: Any, marker: _Flush) -> None:
        timed_out: KafkaError | None = None
        try:
            producer.flush(timeout=self._flush_timeout_s)
        except KafkaError as exc:
            timed_out = exc
        with self._lock:
            failed, first = self._unreported, self._first_error
            self._unreported, self._first_error = 0, None
        servers = self._config.servers()
        if failed:
            marker.error = TransportError(
                f"{failed} record(s) could not be delivered to Kafka at {servers}: {first}"
            )
        elif timed_out is not None:
            marker.error = TransportError(
                f"flush to Kafka at {servers} did not finish in {self._flush_timeout_s} s: "
                f"{timed_out}"
            )
        trio.from_thread.run_sync(marker.done.set)

    def _on_ack(self, delivery: KafkaDelivery, index: int, metadata: Any) -> None:
        with self._lock:
            self._acked += 1
        offset = getattr(metadata, "offset", None)
        delivery.resolve(index, None, offset if isinstance(offset, int) and offset >= 0 else None)

    def _on_error(self, delivery: KafkaDelivery, index: int, exc: BaseException) -> None:
        failure = _failure(exc)
        if isinstance(exc, TransportError):
            failure = SendFailure(failure.reason, retriable=True)
        with self._lock:
            self._failed += 1
            if delivery.report_at_flush:
                self._unreported += 1
                if self._first_error is None:
                    self._first_error = failure.reason
        delivery.resolve(index, failure)


class KafkaSink:
    """The trio side of a producer: ``send_batch``, ``send``, ``flush`` and ``statistics``."""

    def __init__(self, send: trio.MemorySendChannel[_Item], thread: _ProducerThread) -> None:
        self._send = send
        self._thread = thread
        self._token = trio.lowlevel.current_trio_token()

    async def send_batch(
        self, records: Sequence[OutRecord], *, report_at_flush: bool = False
    ) -> KafkaDelivery:
        """Queue ``records`` for the producer in one hop; waits while the queue is full.

        Their failures are reported by the returned delivery only (also by the next
        :meth:`flush` with ``report_at_flush``).

        Returns:
            The delivery that tells each record's fate once the broker answered.

        Raises:
            UsageError: a topic is empty, or a key or value is not bytes.
        """
        for record in records:
            if not record.topic:
                raise UsageError("topic must not be empty")
            key, value = record.key, record.value
            if not isinstance(value, bytes) or not (key is None or isinstance(key, bytes)):
                raise UsageError("key and value must be bytes (key may be None)")
        delivery = KafkaDelivery(len(records), self._token, report_at_flush=report_at_flush)
        if not records:
            return delivery
        producer = self._thread.sends_directly(records)
        if producer is not None:
            self._thread.produce(producer, records, delivery)
            await trio.lowlevel.checkpoint()
            return delivery
        await self._queue(_Batch(records, delivery))
        return delivery

    async def _queue(self, item: _Item) -> None:
        self._thread.queued += 1
        try:
            await self._send.send(item)
        except BaseException:
            self._thread.queued -= 1
            raise

    async def send(self, topic: str, key: bytes | None, value: bytes) -> KafkaDelivery:
        """Queue one record for the producer; waits while the queue is full.

        A failure is reported by the returned delivery and by the next :meth:`flush`.

        Raises:
            UsageError: ``topic`` is empty, or ``key``/``value`` are not bytes.
        """
        return await self.send_batch([OutRecord(topic, key, value)], report_at_flush=True)

    async def flush(self) -> None:
        """Wait until every record sent before this call is acknowledged or has failed.

        Raises:
            TransportError: at least one record queued with :meth:`send` since the previous
                flush was not delivered (the message counts them and shows the first error);
                ``send_batch`` callers read each record's fate from its delivery instead.
        """
        marker = _Flush(trio.Event())
        await self._queue(marker)
        await marker.done.wait()
        if marker.error is not None:
            raise marker.error

    def statistics(self) -> SinkStatistics:
        """Counters since the sink was opened."""
        return self._thread.statistics()


@asynccontextmanager
async def open_kafka_sink(
    config: KafkaClientConfig,
    *,
    linger_ms: int = 0,
    batch_bytes: int = 512 * 1024,
    max_in_flight: int = 1_000,
    max_request_bytes: int = 1_048_576,
    delivery_timeout_ms: int = 120_000,
    connect_timeout_ms: int = 30_000,
    metadata_timeout_ms: int = 1_000,
    close_timeout_ms: int | None = None,
) -> AsyncIterator[KafkaSink]:
    """Produce through a dedicated thread; yield a ``KafkaSink`` while it runs.

    On a normal exit the sink flushes (``TransportError`` on delivery failures), for at most
    ``close_timeout_ms``: past it (a broker that stopped answering) the producer thread is left
    to finish alone and ``TransportError`` is raised, so a stop is bounded (none of its records
    was acknowledged: the journal has them as not delivered, the next owner re-sends them). On
    cancellation or an error the producer is still flushed and closed; records still queued in
    the channel may be dropped.

    Args:
        config: how to reach the brokers.
        linger_ms: how long the producer waits to fill a batch. 0 by default: ``send_batch``
            hands a whole batch over in one hop, so records batch without waiting, and a wait
            would only add latency (measured: lower p99 and no loss of throughput).
        batch_bytes: the producer's ``batch_size``, at most ``max_request_bytes``. 512 KiB
            by default, not kafka-python's 16 KiB: a hand-over of a few hundred callbacks
            then fills one batch per partition instead of a dozen, each of which woke the
            producer's I/O thread to send a small request while the trio thread was still
            appending (measured on the embedded broker: about 125 µs of CPU per signal at
            16 KiB, 90-105 µs at 512 KiB, and linger 0 still the lowest p99).
        max_in_flight: batches queued between trio and the producer thread (back-pressure).
        max_request_bytes: the largest record the producer sends (larger ones fail alone,
            not retriable).
        delivery_timeout_ms: how long a record may take to be acknowledged before it fails.
        connect_timeout_ms: how long to try to reach a bootstrap server.
        metadata_timeout_ms: how long ``send`` waits for the metadata of a topic it has none
            of (at most ``delivery_timeout_ms``); the record then fails, retriable. The producer
            thread waits meanwhile: a topic that does not exist costs this much per attempt.
        close_timeout_ms: how long the exit waits for the last flush (None: unbounded).

    Raises:
        UsageError: a bad argument (the message names it).
        TransportError: the brokers cannot be reached, or a delivery failed (on exit).
    """
    if max_in_flight < 1:
        raise UsageError(f"max_in_flight must be >= 1, got {max_in_flight}")
    if batch_bytes < 1:
        raise UsageError(f"batch_bytes must be >= 1, got {batch_bytes}")
    options = _producer_options(
        linger_ms, delivery_timeout_ms, metadata_timeout_ms, max_request_bytes
    ) | {
        "bootstrap_timeout_ms": connect_timeout_ms,
        "batch_size": min(batch_bytes, max_request_bytes),
    }
    thread = _ProducerThread(config, options, flush_timeout_s=delivery_timeout_ms / 1000 + 5)
    send, receive = trio.open_memory_channel[_Item](max_in_flight)
    with raising_single_errors():
        async with trio.open_nursery() as nursery:
            await nursery.start(thread.run, receive)
            with send:
                sink = KafkaSink(send, thread)
                yield sink
                finished = await _flush_within(sink, close_timeout_ms)
            if not finished:
                nursery.cancel_scope.cancel()  # abandons the producer thread
                raise TransportError(
                    f"the producer did not finish within {close_timeout_ms} ms of the close: the"
                    f" broker at {config.servers()} does not acknowledge (its records"
                    " were not acknowledged, so nothing was promised for them)"
                )


def _renew_producer_id_after_reset(producer: Any) -> None:
    """Have kafka-python's idempotent ``producer`` ask for a new producer id whenever it drops
    its own (a batch that expired after it was sent; see the module docstring).

    kafka-python 3.0.12's ``TransactionManager.reset_producer_id`` forgets the id and the
    sequence numbers but leaves the state ``READY``, and its I/O thread asks for an id only in
    ``UNINITIALIZED`` (``init_producer_id``), so it never sends again. Java's
    ``resetIdempotentProducerId`` also returns to ``UNINITIALIZED``; this does the same right
    after kafka-python's reset, under the manager's lock. Only from ``READY``: a reset while an
    id is being asked for (``INITIALIZING``, ``BUMPING_PRODUCER_EPOCH``) gets one from that
    request, and a fatal state stays fatal. A kafka-python that makes the step itself leaves
    nothing to do here. Not for a transactional producer, whose reset kafka-python refuses.
    """
    manager = producer._transaction_manager
    if manager is None or manager.is_transactional():
        return
    reset = manager.reset_producer_id

    def reset_and_renew() -> None:
        with manager._lock:
            reset()
            if manager._current_state is TransactionState.READY:
                manager._current_state = TransactionState.UNINITIALIZED

    manager.reset_producer_id = reset_and_renew


def _producer_options(
    linger_ms: int,
    delivery_timeout_ms: int,
    metadata_timeout_ms: int,
    max_request_bytes: int,
) -> dict[str, Any]:
    """kafka-python's producer settings for :func:`open_kafka_sink`, beside the connection's
    (``UsageError`` when they do not fit together)."""
    if metadata_timeout_ms < 1:
        raise UsageError(f"metadata_timeout_ms must be >= 1, got {metadata_timeout_ms}")
    if linger_ms < 0 or delivery_timeout_ms <= linger_ms:
        raise UsageError(
            f"need 0 <= linger_ms < delivery_timeout_ms, got {linger_ms} and {delivery_timeout_ms}"
        )
    return {
        **no_topic_creation(),
        **no_client_metrics(),
        "linger_ms": linger_ms,
        "acks": "all",
        "delivery_timeout_ms": delivery_timeout_ms,
        "request_timeout_ms": min(30_000, delivery_timeout_ms - linger_ms),
        "max_block_ms": min(metadata_timeout_ms, delivery_timeout_ms),
        "max_request_size": max_request_bytes,
        "partitioner": KeyHashPartitioner(),
    }


async def _flush_within(sink: KafkaSink, timeout_ms: int | None) -> bool:
    """Flush ``sink``; whether it finished within ``timeout_ms`` (None: no bound)."""
    with trio.move_on_after(math.inf if timeout_ms is None else timeout_ms / 1000) as waited:
        await sink.flush()
    return not waited.cancelled_caught
