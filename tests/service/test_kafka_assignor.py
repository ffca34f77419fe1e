"""The group's assignor: co-partitioned ranges, ranked members, a shared owner map."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from purgatory.service._kafka_assignor import CoPartitionedAssignor


@dataclass
class _Member:
    member_id: str
    group_instance_id: str | None
    metadata: Any


class _Cluster:
    def __init__(self, partitions: dict[str, int]) -> None:
        self._partitions = partitions

    def partitions_for_topic(self, topic: str) -> set[int] | None:
        count = self._partitions.get(topic)
        return None if count is None else set(range(count))


TOPICS = ["requests", "signals"]


def _members(*urls: str | None, static: bool = False) -> list[_Member]:
    return [
        _Member(
            f"m-{chr(ord('z') - i)}",  # member ids in the reverse order of the urls
            f"pod-{i}" if static else None,
            CoPartitionedAssignor(url).metadata(TOPICS),
        )
        for i, url in enumerate(urls)
    ]


def _assign(members: list[_Member], partitions: int) -> dict[str, Any]:
    cluster = _Cluster({t: partitions for t in TOPICS})
    return CoPartitionedAssignor("http://leader").assign(cluster, members)


def test_one_member_owns_a_partition_number_of_every_topic_and_all_know_the_owners() -> None:
    members = _members("http://a", "http://b", "http://c", static=True)
    assignments = _assign(members, 8)
    owned = {}
    for member in members:
        parts = dict(assignments[member.member_id].assigned_partitions)
        assert parts["requests"] == parts["signals"]  # co-partitioned
        owned[member.group_instance_id] = parts["requests"]
    # Static members ranked by instance id, partitions by Flink's range formula.
    assert owned == {"pod-0": [0, 1, 2], "pod-1": [3, 4, 5], "pod-2": [6, 7]}
    followers = []
    for member in members:
        follower = CoPartitionedAssignor(None)
        follower.on_assignment(assignments[member.member_id], generation=1)
        followers.append(follower.owners())
    expected = {p: "http://a" for p in (0, 1, 2)} | {p: "http://b" for p in (3, 4, 5)}
    expected |= {6: "http://c", 7: "http://c"}
    assert followers == [expected] * 3


def test_dynamic_members_rank_by_member_id_and_a_member_without_url_is_left_out() -> None:
    members = _members("http://a", None)  # ids m-z (a) and m-y (no url): m-y ranks first
    assignments = _assign(members, 2)
    assert dict(assignments["m-y"].assigned_partitions)["requests"] == [0]
    assert dict(assignments["m-z"].assigned_partitions)["requests"] == [1]
    follower = CoPartitionedAssignor(None)
    follower.on_assignment(assignments["m-y"], generation=3)
    assert follower.owners() == {1: "http://a"}


def test_a_garbled_assignment_leaves_no_owner_map() -> None:
    follower = CoPartitionedAssignor(None)

    @dataclass
    class _Assignment:
        user_data: Any

    for garbage in (b"", b"not json", b"[1]", b'{"owners": 3}', None):
        follower.on_assignment(_Assignment(garbage), generation=1)
        assert follower.owners() == {}
