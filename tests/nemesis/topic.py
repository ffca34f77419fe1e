"""The callbacks topic read back, from its start to its end, as the checker needs it.

A :class:`TopicReader` is one kafka-python consumer assigned every partition of the callbacks
topic from offset 0, with no group, reading ``read_committed`` or ``read_uncommitted``. While the
run settles it tells which operations have a callback yet; at the end, with the replicas gone,
it reads up to the end offsets (for ``read_committed``, the last stable offset), so that
nothing written is missed. Every wait is bounded.
"""

from __future__ import annotations

import json

from kafka import KafkaConsumer, TopicPartition

from tests.nemesis._clock import Deadline
from tests.nemesis.history import Callback

__all__ = ["TopicReader"]


class TopicReader:
    """Reads ``topic`` (``partitions`` of them) from its start.

    Args:
        bootstrap_servers: the broker.
        topic: the callbacks topic.
        partitions: its partition count.
        committed: read ``read_committed`` (else ``read_uncommitted``).
    """

    def __init__(
        self, bootstrap_servers: str, topic: str, partitions: int, *, committed: bool
    ) -> None:
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap_servers,
            enable_auto_commit=False,
            isolation_level="read_committed" if committed else "read_uncommitted",
            request_timeout_ms=10_000,
        )
        self._parts = [TopicPartition(topic, p) for p in range(partitions)]
        self._consumer.assign(self._parts)
        self._consumer.seek_to_beginning(*self._parts)
        self.records: list[Callback] = []
        self.seen: set[tuple[str, str]] = set()

    def poll(self) -> None:
        for batch in self._consumer.poll(timeout_ms=200).values():
            for r in batch:
                self.records.append(Callback(r.partition, r.offset, r.timestamp, r.value))
                doc = json.loads(r.value)
                self.seen.add((doc["scope"], doc["op_id"]))

    def wait_for(self, expected: set[tuple[str, str]], timeout_s: float) -> set[tuple[str, str]]:
        """Poll until every ``expected`` operation has a callback; what is still missing."""
        deadline = Deadline(timeout_s)
        self.poll()
        while not expected <= self.seen and not deadline.passed():
            self.poll()
        return expected - self.seen

    def read_to_end(self, timeout_s: float) -> bool:
        """Read up to the end offsets as they are now; False if that took over ``timeout_s``."""
        deadline = Deadline(timeout_s)
        ends = self._consumer.end_offsets(self._parts)
        while not deadline.passed():
            self.poll()
            if all(self._consumer.position(tp) >= ends[tp] for tp in self._parts):
                return True
        return False

    def close(self) -> None:
        self._consumer.close()
