"""Reading a topic back in the Spark bridge tests (a bounded loop on the real broker)."""

from __future__ import annotations

import time
from typing import Any


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
