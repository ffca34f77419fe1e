"""The group's assignor: co-partitioned ranges, ranked members, a shared owner map."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory.service.kafka.assignor import Candidate, CoPartitionedAssignor, Plan, plan


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
    """Members that each keep their assignor (so their subscriptions say what they own and
    what they keep warm), and a coordinator that runs cooperative rounds until stable. With
    ``warms``, a member asked to warm partitions has them warm by the next round (its
    standbys caught up), as a replica that restores them meanwhile does."""

    def __init__(self, partitions: int, *, warms: bool = True) -> None:
        self.cluster = _Cluster({t: partitions for t in TOPICS})
        self.assignors: dict[str, CoPartitionedAssignor] = {}
        self.owned: dict[str, set[int]] = {}
        self.warms = warms

    def join(self, name: str) -> None:
        self.assignors[name] = CoPartitionedAssignor(f"http://{name}")
        self.owned[name] = set()

    def leave(self, name: str) -> None:
        del self.assignors[name]
        del self.owned[name]

    def members(self) -> list[_Member]:
        return [_Member(n, n, a.metadata(TOPICS)) for n, a in sorted(self.assignors.items())]

    def rebalance(self) -> list[dict[str, set[int]]]:
        """Run rounds until stable; returns each round's assignment. Checks in every round that
        a member is only ever given a partition nobody owned before the round, and that a
        partition somebody owned goes only to a member that kept it warm."""
        rounds: list[dict[str, set[int]]] = []
        for _ in range(6):
            members = self.members()
            result = next(iter(self.assignors.values())).assign(self.cluster, members)
            given: dict[str, set[int]] = {}
            changed = False
            for name, assignment in result.items():
                parts = dict(assignment.assigned_partitions)
                assert parts["requests"] == parts["signals"]
                given[name] = set(parts["requests"])
                for partition in given[name] - self.owned[name]:
                    others = [n for n, o in self.owned.items() if n != name and partition in o]
                    assert others == [], f"{partition} given to {name} while {others} own it"
                changed |= bool(self.owned[name] - given[name])  # lost one: round two
            for name, assignment in result.items():
                assignor = self.assignors[name]
                assignor.on_assignment(assignment, generation=len(rounds))
                self.owned[name] = given[name]
                if self.warms:
                    assignor.report_warm(assignor.warmups())
                changed |= assignor.take_rejoin()
            rounds.append(given)
            if not changed:
                return rounds
        raise AssertionError(f"no stable assignment after {rounds}")


def test_a_new_member_is_given_partitions_once_it_keeps_them_warm() -> None:
    group = _Group(8, warms=False)
    group.join("pod-0")
    group.join("pod-1")
    assert group.rebalance() == [{"pod-0": {0, 1, 2, 3}, "pod-1": {4, 5, 6, 7}}]
    group.join("pod-2")
    assert [a.take_rejoin() for a in group.assignors.values()] == [False] * 3
    (first,) = group.rebalance()
    # Nothing moves yet: the owners keep serving, the new member is asked to warm two
    # partitions (sticky: the owners keep their lowest numbers, 3 and 7 are over a share).
    assert first == {"pod-0": {0, 1, 2, 3}, "pod-1": {4, 5, 6, 7}, "pod-2": set()}
    assert group.assignors["pod-2"].warmups() == {3, 7}
    assert not group.assignors["pod-2"].take_rejoin()
    group.assignors["pod-2"].report_warm(frozenset({7}))  # 7 caught up first
    assert group.assignors["pod-2"].take_rejoin()
    group.warms = True
    first, second, third = group.rebalance()
    # Round one: 7 (warm) leaves pod-1; 3 stays with pod-0 until warm. Round two: 7 lands on
    # pod-2 (and 3 is now warm: pod-0 revokes it). Round three: 3 lands.
    assert first == {"pod-0": {0, 1, 2, 3}, "pod-1": {4, 5, 6}, "pod-2": set()}
    assert second == {"pod-0": {0, 1, 2}, "pod-1": {4, 5, 6}, "pod-2": {7}}
    assert third == {"pod-0": {0, 1, 2}, "pod-1": {4, 5, 6}, "pod-2": {3, 7}}
    assert group.assignors["pod-0"].owners() == {
        **{p: "http://pod-0" for p in (0, 1, 2)},
        **{p: "http://pod-1" for p in (4, 5, 6)},
        **{p: "http://pod-2" for p in (3, 7)},
    }


def test_a_leaving_member_serves_until_its_partitions_are_warm_elsewhere() -> None:
    group = _Group(6, warms=False)
    for name in ("pod-0", "pod-1", "pod-2"):
        group.join(name)
    group.rebalance()
    assert group.owned == {"pod-0": {0, 1}, "pod-1": {2, 3}, "pod-2": {4, 5}}
    leaver = group.assignors["pod-0"]
    leaver.leave()
    assert leaver.take_rejoin()
    (first,) = group.rebalance()
    assert first["pod-0"] == {0, 1}  # still its own: nobody is warm yet
    assert (group.assignors["pod-1"].warmups(), group.assignors["pod-2"].warmups()) == (
        frozenset({0}),
        frozenset({1}),
    )
    assert not leaver.left_alone()
    group.warms = True
    group.assignors["pod-1"].report_warm(frozenset({0}))
    group.assignors["pod-2"].report_warm(frozenset({1}))
    rounds = group.rebalance()
    assert rounds[-1] == {"pod-0": set(), "pod-1": {0, 2, 3}, "pod-2": {1, 4, 5}}
    assert rounds[0]["pod-0"] == set()  # both revoked in the first round
    assert not leaver.left_alone()


def test_a_leaving_member_with_nobody_to_take_over_is_told_so() -> None:
    group = _Group(2)
    group.join("pod-0")
    group.rebalance()
    group.assignors["pod-0"].leave()
    assert group.rebalance() == [{"pod-0": {0, 1}}]
    assert group.assignors["pod-0"].left_alone()


def test_a_dead_members_partitions_go_to_their_targets_at_once() -> None:
    group = _Group(6, warms=False)
    for name in ("pod-0", "pod-1", "pod-2"):
        group.join(name)
    group.rebalance()
    group.leave("pod-1")  # its session expired: it claims nothing any more
    (only,) = group.rebalance()
    assert only == {"pod-0": {0, 1, 2}, "pod-2": {3, 4, 5}}


def test_while_a_partition_moves_the_shared_map_names_no_owner_for_it() -> None:
    group = _Group(4)
    group.join("pod-0")
    group.rebalance()
    group.join("pod-1")
    group.assignors["pod-1"].report_warm(frozenset({2, 3}))
    first = group.assignors["pod-0"].assign(group.cluster, group.members())
    follower = CoPartitionedAssignor(None)
    follower.on_assignment(first["pod-1"], generation=1)
    assert follower.owners() == {0: "http://pod-0", 1: "http://pod-0"}  # 2, 3 between owners
    # Every member asks for the second round, once (a broker that does not rebalance when a
    # static member rejoins still runs it).
    assert (follower.take_rejoin(), follower.take_rejoin()) == (True, False)
    follower.on_assignment(
        group.assignors["pod-0"].assign(group.cluster, group.members())["pod-1"], 2
    )
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


def test_a_garbled_subscription_claims_nothing_warm_and_is_not_leaving() -> None:
    cluster = _Cluster({t: 2 for t in TOPICS})
    for garbage in (b"", b"[]", b'{"warm": "x", "leaving": 1}', b'{"warm": [true, "1", 0.5]}'):
        member = _Member("a", None, CoPartitionedAssignor("http://a").metadata(TOPICS))
        member.metadata.user_data = garbage
        result = CoPartitionedAssignor(None).assign(cluster, [member])
        assert dict(result["a"].assigned_partitions)["requests"] == [0, 1]
        assert json.loads(result["a"].user_data)["warm"] == []


@dataclass
class _Assign:
    assigned_partitions: list[Any]
    user_data: bytes = b"{}"


def _model_ok(decided: Plan, ranked: list[Candidate], numbers: list[int]) -> None:
    """What every plan keeps, whatever the members say."""
    owners: dict[int, list[str]] = {}
    for member_id, partitions in decided.owned.items():
        for partition in partitions:
            owners.setdefault(partition, []).append(member_id)
    by_id = {m.member_id: m for m in ranked}
    for partition in numbers:
        held_by = [m.member_id for m in ranked if partition in m.claims]
        mine = owners.get(partition, [])
        assert len(mine) <= 1, f"{partition} has owners {mine}"
        if partition in decided.moving:
            assert not mine
            if len(held_by) == 1:  # moves to a warm target, which keeps it warm meanwhile
                (target,) = [t for t, ps in decided.warmups.items() if partition in ps]
                assert partition in by_id[target].warm and target not in held_by
            continue
        assert mine, f"{partition} is neither owned nor moving"
        if held_by:  # a partition held stays with its holder (the only one) or moves warm
            assert mine == held_by
        targets = [t for t, ps in decided.warmups.items() if partition in ps]
        assert len(targets) <= 1
        if targets:
            assert targets[0] != mine[0] and not by_id[targets[0]].leaving
    assert decided.alone == all(m.leaving for m in ranked)


@settings(max_examples=200, deadline=None)
@given(
    numbers=st.integers(1, 12).map(lambda n: list(range(n))),
    members=st.lists(
        st.tuples(
            st.frozensets(st.integers(0, 11), max_size=6),
            st.frozensets(st.integers(0, 11), max_size=6),
            st.booleans(),
        ),
        min_size=1,
        max_size=5,
    ),
)
def test_a_plan_never_gives_a_held_partition_elsewhere_cold(
    numbers: list[int], members: list[tuple[frozenset[int], frozenset[int], bool]]
) -> None:
    ranked = [Candidate(f"m{i}", c, w, leaving) for i, (c, w, leaving) in enumerate(members)]
    decided = plan(ranked, numbers)
    _model_ok(decided, ranked, numbers)
    for partition in decided.moving:  # moves only from a double claim, or to a warm target
        held_by = [m for m in ranked if partition in m.claims]
        assert len(held_by) != 1 or any(partition in m.warm for m in ranked if m not in held_by)


@settings(max_examples=60, deadline=None)
@given(
    partitions=st.integers(1, 12),
    steps=st.lists(
        st.tuples(st.sampled_from(["join", "leave", "die"]), st.integers(0, 4)),
        min_size=1,
        max_size=8,
    ),
)
def test_any_sequence_of_joins_leaves_and_deaths_settles_balanced(
    partitions: int, steps: list[tuple[str, int]]
) -> None:
    group = _Group(partitions)
    group.join("pod-0")
    group.rebalance()
    for what, pod in steps:
        name = f"pod-{pod}"
        if what == "join" and name not in group.assignors:
            group.join(name)
        elif what != "join" and name in group.assignors and len(group.assignors) > 1:
            if what == "leave":  # graceful: everything moves off it warm, then it goes
                group.assignors[name].leave()
                assert group.rebalance()[-1][name] == set()
            group.leave(name)
        else:
            continue
        rounds = group.rebalance()
        assert len(rounds) <= 4
        # Stable: every partition owned once, shares within one of each other.
        final = rounds[-1]
        owned = sorted(p for ps in final.values() for p in ps)
        assert owned == list(range(partitions))
        sizes = [len(ps) for ps in final.values()]
        assert max(sizes) - min(sizes) <= 1
