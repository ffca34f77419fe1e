"""The group's assignor: co-partitioned ranges, ranked members, a shared owner map."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory.service.kafka.assignor import CoPartitionedAssignor


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
        assigned_partitions: list[Any]

    for garbage in (b"", b"not json", b"[1]", b'{"owners": 3}', None):
        follower.on_assignment(_Assignment(garbage, []), generation=1)
        assert follower.owners() == {}


class _Group:
    """Members that each keep their assignor (so their subscriptions say what they own), and a
    coordinator that runs cooperative rounds until no member lost a partition."""

    def __init__(self, partitions: int) -> None:
        self.cluster = _Cluster({t: partitions for t in TOPICS})
        self.assignors: dict[str, CoPartitionedAssignor] = {}
        self.owned: dict[str, set[int]] = {}

    def join(self, name: str) -> None:
        self.assignors[name] = CoPartitionedAssignor(f"http://{name}")
        self.owned[name] = set()

    def leave(self, name: str) -> None:
        del self.assignors[name]
        del self.owned[name]

    def rebalance(self) -> list[dict[str, set[int]]]:
        """Run rounds until stable; returns each round's assignment. Checks in every round that
        a member is only ever given a partition nobody owned before the round."""
        rounds: list[dict[str, set[int]]] = []
        for _ in range(4):
            members = [_Member(n, n, a.metadata(TOPICS)) for n, a in sorted(self.assignors.items())]
            result = next(iter(self.assignors.values())).assign(self.cluster, members)
            given: dict[str, set[int]] = {}
            lost = False
            for name, assignment in result.items():
                parts = dict(assignment.assigned_partitions)
                assert parts["requests"] == parts["signals"]
                given[name] = set(parts["requests"])
                for partition in given[name] - self.owned[name]:
                    others = [n for n, o in self.owned.items() if n != name and partition in o]
                    assert others == [], f"{partition} given to {name} while {others} own it"
                lost |= bool(self.owned[name] - given[name])
            for name, assignment in result.items():
                self.assignors[name].on_assignment(assignment, generation=len(rounds))
                self.owned[name] = given[name]
            rounds.append(given)
            if not lost:
                return rounds
        raise AssertionError(f"no stable assignment after {rounds}")


def test_a_resize_moves_only_the_partitions_that_change_owner_in_two_rounds() -> None:
    group = _Group(8)
    group.join("pod-0")
    group.join("pod-1")
    assert group.rebalance() == [{"pod-0": {0, 1, 2, 3}, "pod-1": {4, 5, 6, 7}}]
    group.join("pod-2")
    assert [a.take_rejoin() for a in group.assignors.values()] == [False] * 3
    first, second = group.rebalance()
    # Round one: partitions that stay keep their owner; 3, 6 and 7 move, so nobody gets them.
    assert first == {"pod-0": {0, 1, 2}, "pod-1": {4, 5}, "pod-2": set()}
    # Round two: the revoked partitions land on their new owners.
    assert second == {"pod-0": {0, 1, 2}, "pod-1": {3, 4, 5}, "pod-2": {6, 7}}
    assert group.assignors["pod-2"].owners() == {
        **{p: "http://pod-0" for p in (0, 1, 2)},
        **{p: "http://pod-1" for p in (3, 4, 5)},
        **{p: "http://pod-2" for p in (6, 7)},
    }


def test_while_a_partition_moves_the_shared_map_names_no_owner_for_it() -> None:
    group = _Group(4)
    group.join("pod-0")
    group.rebalance()
    group.join("pod-1")
    members = [_Member(n, n, a.metadata(TOPICS)) for n, a in sorted(group.assignors.items())]
    first = group.assignors["pod-0"].assign(group.cluster, members)
    follower = CoPartitionedAssignor(None)
    follower.on_assignment(first["pod-1"], generation=1)
    assert follower.owners() == {0: "http://pod-0", 1: "http://pod-0"}  # 2, 3 between owners
    # Every member asks for the second round, once (a broker that does not rebalance when a
    # static member rejoins still runs it).
    assert (follower.take_rejoin(), follower.take_rejoin()) == (True, False)
    follower.on_assignment(group.assignors["pod-0"].assign(group.cluster, members)["pod-1"], 2)
    assert follower.take_rejoin()  # pod-0 still claims 2 and 3 in its old subscription


def test_a_partition_two_members_claim_goes_to_nobody_first() -> None:
    a, b = CoPartitionedAssignor("http://a"), CoPartitionedAssignor("http://b")
    both = _Assign([("requests", [0, 1]), ("signals", [0, 1])])
    a.on_assignment(both, generation=1)
    b.on_assignment(both, generation=1)
    members = [_Member("a", "a", a.metadata(TOPICS)), _Member("b", "b", b.metadata(TOPICS))]
    result = a.assign(_Cluster({t: 2 for t in TOPICS}), members)
    assert dict(result["a"].assigned_partitions)["requests"] == []  # 0 is a's, but b claims it
    assert dict(result["b"].assigned_partitions)["requests"] == []


@dataclass
class _Assign:
    assigned_partitions: list[Any]
    user_data: bytes = b"{}"


@settings(max_examples=60, deadline=None)
@given(
    partitions=st.integers(1, 12),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 4)), min_size=1, max_size=8),
)
def test_any_sequence_of_joins_and_leaves_never_gives_a_partition_two_owners(
    partitions: int, steps: list[tuple[bool, int]]
) -> None:
    group = _Group(partitions)
    group.join("pod-0")
    group.rebalance()
    for joins, pod in steps:
        name = f"pod-{pod}"
        if joins and name not in group.assignors:
            group.join(name)
        elif not joins and name in group.assignors and len(group.assignors) > 1:
            group.leave(name)
        else:
            continue
        rounds = group.rebalance()
        assert len(rounds) <= 2
        # Stable: the range formula over the members ranked by instance id, every partition owned.
        ranked = sorted(group.assignors)
        expected: dict[str, set[int]] = {name: set() for name in ranked}
        for p in range(partitions):
            expected[ranked[p * len(ranked) // partitions]].add(p)
        assert rounds[-1] == expected
