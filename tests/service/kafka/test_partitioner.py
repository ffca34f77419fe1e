"""The service's producers place every record where kafka-python's default partitioner does."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.partitioner.default import DefaultPartitioner

from purgatory.service.kafka.partitioner import KeyHashPartitioner
from purgatory.service.ownership.partitioning import partition_for


class _Cluster:
    """The two lookups a partitioner makes of kafka-python's ClusterMetadata."""

    def __init__(self, topic: str, partitions: set[int], available: set[int]) -> None:
        self._topic, self._partitions, self._available = topic, partitions, available

    def topics(self) -> set[str]:
        return {self._topic}

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        return self._partitions if topic == self._topic else None

    def available_partitions_for_topic(self, topic: str) -> set[int]:
        return self._available if topic == self._topic else set()


@given(
    keys=st.lists(st.binary(max_size=40), min_size=1, max_size=30),
    partitions=st.sets(st.integers(0, 200), min_size=1, max_size=40),
)
def test_keyed_records_go_where_kafka_pythons_partitioner_puts_them(
    keys: list[bytes], partitions: set[int]
) -> None:
    cluster: Any = _Cluster("t", partitions, partitions)
    ours, theirs = KeyHashPartitioner(), DefaultPartitioner()
    for key in keys + keys:  # the second time from the remembered hash
        expected = theirs.partition("t", None, key, None, None, cluster)
        assert ours.partition("t", None, key, None, None, cluster) == expected


@given(scope=st.text(max_size=30), count=st.integers(1, 64))
def test_a_scope_lands_on_its_input_partition_number(scope: str, count: int) -> None:
    cluster: Any = _Cluster("callbacks", set(range(count)), set(range(count)))
    key = scope.encode("utf-8", "surrogatepass")
    assert KeyHashPartitioner().partition("callbacks", None, key, None, None, cluster) == (
        partition_for(scope, count)
    )


def test_records_without_a_key_go_to_an_available_partition_and_unknown_topics_fail() -> None:
    cluster: Any = _Cluster("t", {0, 1, 2, 3}, {2})
    partitioner = KeyHashPartitioner()
    assert {partitioner.partition("t", None, None, None, b"v", cluster) for _ in range(20)} == {2}
    unavailable: Any = _Cluster("t", {0, 1}, set())
    assert {partitioner.partition("t", None, None, None, b"v", unavailable) for _ in range(50)} <= {
        0,
        1,
    }
    with pytest.raises(ValueError, match="other"):
        partitioner.partition("other", None, b"k", None, None, cluster)
