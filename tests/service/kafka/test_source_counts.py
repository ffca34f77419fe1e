"""The consumer thread publishes the topics' partition counts from its cached metadata only.

``KafkaConsumer.partitions_for_topic`` asks the broker for every topic's metadata when its cache
lacks the topic, waits for the answer without a bound and raises whatever ends the wait. A
metadata answer with an error for a topic drops the topic from the cache, which happens while a
broker fences itself and leaders move; the broker may be unreachable for the next request. The
thread then hung, and a failed request (retriable as it was) ended the source, and with it
``purgatory serve``. A stub stands in for kafka-python's consumer here.
"""

from __future__ import annotations

from kafka.errors import MetadataEmptyBrokerList

from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.source import _ConsumerThread


class _Cluster:
    """kafka-python's ``ClusterMetadata``: None for a topic it holds no partitions of."""

    def __init__(self, partitions: dict[str, set[int]]) -> None:
        self.partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self.partitions.get(topic)


class _Consumer:
    def __init__(self, cluster: _Cluster) -> None:
        self._cluster = cluster

    def partitions_for_topic(self, topic: str) -> set[int]:
        """As kafka-python's, for a topic its cache lacks, with the broker fenced: the update
        it waits for fails (a metadata answer that lists no broker)."""
        if self._cluster.partitions_for_topic(topic) is None:
            raise MetadataEmptyBrokerList("MetadataResponse lists no broker")
        return self._cluster.partitions_for_topic(topic) or set()


def test_a_topic_dropped_from_the_metadata_keeps_its_count_and_asks_nothing() -> None:
    thread = _ConsumerThread(
        KafkaClientConfig(bootstrap_servers="kafka:9092"), {}, ["req", "sig"], None, "earliest", 10
    )
    thread.partition_counts = {"req": 4, "sig": 4}
    cluster = _Cluster({"req": {0, 1, 2, 3}})  # "sig" answered with an error: dropped
    thread._publish_counts(_Consumer(cluster))
    assert thread.partition_counts == {"req": 4, "sig": 4}
    cluster.partitions = {"req": {0, 1, 2, 3}, "sig": set(range(6))}  # back, and grown
    thread._publish_counts(_Consumer(cluster))
    assert thread.partition_counts == {"req": 4, "sig": 6}
