"""Reading a whole partition to its end with kafka-python (service layer): the changelog restore.

Each :meth:`KafkaLogReader.read` runs one consumer without a group in a worker thread: it is
assigned the partition, seeks to the start offset, and polls until its position reaches the high
watermark reported by a fetch response. ListOffsets alone is not trusted for "the end" (the
embedded broker's can lag the last batch); the fetch's high watermark is what the broker has
acknowledged. A ``read_committed`` reader (transactional delivery) skips aborted records and
transaction markers, and its end is the last stable offset as ListOffsets reports it for
``read_committed`` (the first offset of a transaction still open, else the high watermark):
what was committed when the read began. A restore reads after its own producer took the
partition (``init_transactions`` aborted or completed what an earlier owner left open), so
its end is everything committed. The batches are handed to ``handle`` in the same thread, so
a replay there runs off the event loop.

Whatever a kafka-python call raises for a broker fault is a ``TransportError``
(:mod:`purgatory.service.kafka.faults`: ``AssertionError`` and ``ValueError`` under partial
metadata too), which the reader's callers retry; an error of ``handle`` is the caller's own and
passes unchanged. Closing the consumer cannot fail a read: a fault there is logged, and the
read's result (or its error) stands.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
from kafka import KafkaConsumer, TopicPartition

from purgatory._core import TransportError
from purgatory.service.kafka.config import KafkaClientConfig, no_client_metrics, no_topic_creation
from purgatory.service.kafka.faults import client_faults
from purgatory.service.kafka.transport import ConsumedRecord
from purgatory.service.telemetry.logging import get_logger

__all__ = ["KafkaLogReader", "open_kafka_reader"]

_log = get_logger()

#: One poll's wait: a read whose partition has nothing new (a restore's tail, mostly) waits it
#: in full before it sees the end, so it is short (at 200 ms a restart paid 0.25 s for it).
_POLL_TIMEOUT_MS = 20
#: The longest ``position`` and ``end_offsets`` wait for the offset lookups behind them, which
#: kafka-python retries without a bound unless given one (each request is bounded, the retries
#: are not). Right after a broker restart (leaders re-elected, a new leader epoch to validate)
#: such a wait could hold a restore, silently, for as long as the lookups fail; bounded, a read
#: that makes no progress fails after its stall timeout and the restore is tried again.
_CALL_TIMEOUT_MS = 10_000


class KafkaLogReader:
    """Reads whole partitions (see the module docstring).

    Args:
        config: how to reach the brokers.
        stall_timeout_s: how long a read may make no progress (no fetch answered) before it
            fails.
        max_fetch_bytes: the most one fetch of the partition may return.
        read_committed: read only records of committed transactions (and every record written
            outside one).
    """

    def __init__(
        self,
        config: KafkaClientConfig,
        *,
        stall_timeout_s: float = 60.0,
        max_fetch_bytes: int = 16 * 1024 * 1024,
        read_committed: bool = False,
    ) -> None:
        self._config = config
        self._committed = read_committed
        self._isolation = "read_committed" if read_committed else "read_uncommitted"
        self._stall_timeout_s = stall_timeout_s
        self._max_fetch_bytes = max_fetch_bytes

    async def read(
        self,
        topic: str,
        partition: int,
        start: int,
        handle: Callable[[list[ConsumedRecord]], None],
    ) -> int:
        """Hand every record of the partition from ``start`` to its end to ``handle``.

        Raises:
            TransportError: the broker cannot be reached, or the read stalled.
        """
        return await trio.to_thread.run_sync(
            self._read, topic, partition, start, handle, abandon_on_cancel=True
        )

    async def end_offset(self, topic: str, partition: int) -> int:
        """The offset after the partition's last record, from a fetch's high watermark."""
        return await trio.to_thread.run_sync(
            self._read, topic, partition, None, None, abandon_on_cancel=True
        )

    async def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has.

        Raises:
            TransportError: the topic does not exist, or the broker cannot be reached.
        """
        return await trio.to_thread.run_sync(self._count, topic, abandon_on_cancel=True)

    def _count(self, topic: str) -> int:
        consumer = self._consumer()
        try:
            with client_faults(f"metadata of {topic!r}"):
                partitions = consumer.partitions_for_topic(topic)
        finally:
            _close(consumer)
        if not partitions:
            raise TransportError(f"topic {topic!r} does not exist (or has no partitions)")
        return len(partitions)

    def _consumer(self) -> Any:
        options = {
            **no_topic_creation(short_lived=True),
            **no_client_metrics(),
            "group_id": None,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest",
            "fetch_max_wait_ms": 50,
            "max_partition_fetch_bytes": self._max_fetch_bytes,
            "fetch_max_bytes": self._max_fetch_bytes,
            "max_poll_records": 10_000,
            "isolation_level": self._isolation,
        }
        with client_faults(f"cannot reach Kafka at {self._config.servers()}"):
            return KafkaConsumer(**self._config.kafka_kwargs(), **options)

    def _read(
        self,
        topic: str,
        partition: int,
        start: int | None,
        handle: Callable[[list[ConsumedRecord]], None] | None,
    ) -> int:
        consumer = self._consumer()
        tp = TopicPartition(topic, partition)
        failed = f"reading {topic}[{partition}] failed"
        try:
            with client_faults(failed):
                if partition not in (consumer.partitions_for_topic(topic) or set()):
                    raise TransportError(f"topic {topic!r} has no partition {partition}")
                consumer.assign([tp])
                if start is None:  # the end only: read from the last offset ListOffsets knows
                    consumer.seek_to_end(tp)
                else:
                    consumer.seek(tp, start)
                stable = (
                    consumer.end_offsets([tp], _CALL_TIMEOUT_MS)[tp] if self._committed else None
                )
            idle_polls = 0
            max_idle_polls = max(1, int(self._stall_timeout_s * 1000 / _POLL_TIMEOUT_MS))
            seen: tuple[int | None, int | None] = (None, None)
            while True:
                with client_faults(failed):
                    records = consumer.poll(timeout_ms=_POLL_TIMEOUT_MS).get(tp, [])
                if records and handle is not None:  # the caller's code: its errors are its own
                    handle(
                        [
                            ConsumedRecord(
                                r.topic, r.partition, r.offset, r.key, r.value, r.timestamp
                            )
                            for r in records
                        ]
                    )
                with client_faults(failed):
                    highwater = consumer.highwater(tp) if stable is None else stable
                    position = consumer.position(tp, timeout_ms=_CALL_TIMEOUT_MS)
                if highwater is not None and position is not None and position >= highwater:
                    return int(highwater) if start is None else int(position)
                if (highwater, position) != seen:  # a fetch answered, or records came
                    seen = (highwater, position)
                    idle_polls = 0
                elif (idle_polls := idle_polls + 1) > max_idle_polls:  # each waits a poll timeout
                    raise TransportError(
                        f"reading {topic}[{partition}] made no progress for"
                        f" {self._stall_timeout_s:.0f} s (at offset {position})"
                    )
        finally:
            _close(consumer)


def _close(consumer: Any) -> None:
    """Close a reader's consumer, which is dropped either way: a fault of the client here is
    logged, so that it replaces neither the read's result nor the error it ended on."""
    try:
        with client_faults("closing a reader's consumer"):
            consumer.close(autocommit=False)
    except TransportError as exc:
        _log.warning("kafka_reader_close_failed", error=str(exc))


@asynccontextmanager
async def open_kafka_reader(
    config: KafkaClientConfig, *, read_committed: bool = False
) -> AsyncIterator[KafkaLogReader]:
    """A reader of whole partitions (it holds no connection between reads)."""
    yield KafkaLogReader(config, read_committed=read_committed)
