"""Helpers of the Spark bridge tests: a sink's writer, a failure's message, a topic read back."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def writer(df: DataFrame, fmt: str, servers: str, topic: str, **options: str) -> Any:
    """``df.write`` in append mode to the sink ``fmt`` at ``servers``/``topic``."""
    return df.write.format(fmt).option("bootstrap_servers", servers).option("topic", topic) \
        .options(**options).mode("append")  # fmt: skip


def failure(action: Any, raises: type[Exception] = Exception) -> str:
    """The message of what ``action()`` raises (Spark wraps the sink's own error), which must
    be a ``raises``."""
    with pytest.raises(raises) as info:
        action()
    return str(info.value)


def read_records(servers: str, topic: str, count: int, timeout_s: float = 20.0) -> list[Any]:
    """Exactly ``count`` records of ``topic`` (counted: the broker's end offsets can lag)."""
    from kafka import KafkaConsumer, TopicPartition  # noqa: PLC0415

    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    try:
        partitions = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))
        ]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        records: list[Any] = []
        deadline = time.monotonic() + timeout_s  # noqa: TID251 - a bound on a real broker
        while len(records) < count and time.monotonic() < deadline:  # noqa: TID251
            for batch in consumer.poll(timeout_ms=200).values():
                records.extend(batch)
        # A short extra poll: more than ``count`` would be a bug too.
        for batch in consumer.poll(timeout_ms=500).values():
            records.extend(batch)
        return records
    finally:
        consumer.close()


SENTINEL = b"sentinel"


def left_on(servers: str, topic: str, timeout_s: float = 20.0) -> list[bytes]:
    """The values on ``topic``, read up to a sentinel produced now (one partition: in order)."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: PLC0415

    producer = KafkaProducer(bootstrap_servers=servers)
    try:
        producer.send(topic, value=SENTINEL).get(timeout=timeout_s)
    finally:
        producer.close(timeout=5)
    consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        values: list[bytes] = []
        deadline = time.monotonic() + timeout_s  # noqa: TID251 - a bound on a real broker
        while SENTINEL not in values and time.monotonic() < deadline:  # noqa: TID251
            for batch in consumer.poll(timeout_ms=200).values():
                values.extend(record.value for record in batch)
    finally:
        consumer.close()
    assert SENTINEL in values, f"no sentinel on {topic!r} after {values!r}"
    return values[: values.index(SENTINEL) + 1]
