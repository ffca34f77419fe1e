"""A record ``producer.send`` refuses for a moment of partial metadata fails alone, retriable.

kafka-python's ``send`` checks that its metadata has the record's topic, then picks the
partition (``KafkaProducer._partition``), which raises ``ValueError``, not a ``KafkaError``, when
the topic or the explicit partition is missing from that metadata: its I/O thread can replace
it in between with an answer that dropped the topic (an error for it, while a broker fences
itself and leaders move). Unconverted, the ``ValueError`` left the producer thread (or the
trio task of the direct path) and ended ``purgatory serve``. A stub producer stands in for
kafka-python's, raising from kafka-python's own ``_partition``.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from kafka import KafkaProducer

from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.sink import KafkaDelivery, _ProducerThread
from purgatory.service.kafka.transport import OutRecord, SendFailure


class _Metadata:
    """kafka-python's ``ClusterMetadata``, as ``_partition`` reads it."""

    def __init__(self, partitions: dict[str, set[int]]) -> None:
        self.partitions = partitions

    def topics(self) -> set[str]:
        return set(self.partitions)

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.partitions.get(topic)


class _Future:
    def add_callback(self, callback: Any) -> None:
        callback(None)  # acknowledged at once

    def add_errback(self, _errback: Any) -> None:
        pass


class _Producer:
    def __init__(self, metadata: _Metadata) -> None:
        self._metadata = metadata
        self.config: dict[str, Any] = {}

    def send(self, topic: str, *, key: bytes | None, value: bytes, partition: int | None) -> Any:
        """As kafka-python 3.0's ``send`` once its check of the topic's metadata passed."""
        if not key and not value:
            raise ValueError("Need at least one: key or value")
        chosen = KafkaProducer._partition(self, topic, partition, key, value, key, value)
        if chosen is None:
            raise ValueError(f"Partitioner did not assign a partition for topic {topic}!")
        return _Future()


async def _produce(producer: _Producer, *records: OutRecord) -> list[SendFailure | None]:
    thread = _ProducerThread(KafkaClientConfig(bootstrap_servers="kafka:9092"), {}, 1.0)
    delivery = KafkaDelivery(len(records), trio.lowlevel.current_trio_token())
    thread.produce(producer, records, delivery)
    return await delivery.results()


async def test_a_partition_missing_from_the_metadata_fails_its_record_as_retriable() -> None:
    metadata = _Metadata({"journal": {0}, "callbacks": {0, 1}})  # journal's partition 1 missing
    results = await _produce(
        _Producer(metadata),
        OutRecord("journal", b"k", b"v", partition=1),
        OutRecord("callbacks", b"k", b"v", partition=1),
    )
    failure = results[0]
    assert failure is not None and failure.retriable, failure
    assert "Unrecognized partition 1 for topic journal" in failure.reason
    assert results[1] is None  # the other record goes on


async def test_a_topic_dropped_between_sends_checks_fails_its_record_as_retriable() -> None:
    (failure,) = await _produce(_Producer(_Metadata({})), OutRecord("journal", b"k", b"v", 0))
    assert failure is not None and failure.retriable, failure
    assert "did not assign a partition" in failure.reason


async def test_a_record_the_producer_can_never_take_is_a_bug_and_surfaces() -> None:
    with pytest.raises(ValueError, match="Need at least one"):
        await _produce(_Producer(_Metadata({"journal": {0}})), OutRecord("journal", None, b""))
