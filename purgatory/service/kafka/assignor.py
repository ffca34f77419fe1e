"""The consumer group's assignor (service layer): sticky, warmed moves and a shared owner map.

In group mode the consumer group decides which replica owns which input partition; this
assignor is how, so that ownership comes from Kafka and from nothing of ours:

* partition *number* p of every subscribed topic (requests and signals are co-partitioned) goes
  to one member;
* each member's subscription carries its advertised URL, and every member's assignment carries
  the whole map ``{partition: owner URL}``: after each rebalance every replica knows where each
  scope's partition lives, and forwards a request to it.

**Where a partition should be** (its target) is sticky and balanced: every member that is not
leaving gets ``n // k`` or ``n // k + 1`` of the ``n`` partitions (the larger share to those
that hold more now); a member keeps what it holds up to its share, lowest numbers first; the
rest (new, orphaned, over a share, held by a member that leaves) go to members under their
share: one that keeps the partition warm first, else the member Flink's range formula names
(rank ``p * k // n``, members ranked by their static ``group.instance.id`` when they have one,
else by member id), else the one with the fewest. With nothing held (a new group), that is the
range formula exactly.

**A partition moves only warm.** A move costs the partition's next owner a restore, during
which the partition is served nowhere; so a partition that its current owner still holds stays
with it until its target has a warm standby of it (restored and tailing the journal, see
:mod:`purgatory.service.dispatch.standby`): the target's assignment asks it to warm the
partition, and once warm the target says so in its subscription and asks for a rebalance,
which moves it. A partition that nobody holds (a member died, a new group) goes to its target
at once, warm or not. A member that stops gracefully says it is *leaving*: it is nobody's
target any more, keeps serving what it holds until each partition's target is warm, and is
told when no member is left to take over (then it just goes).

The protocol is cooperative (KIP-429, Kafka's incremental rebalancing): a member keeps
serving every partition that stays its own through a rebalance; nothing is revoked up front.
Each member's subscription names the partitions it owns. A partition whose owner changes
moves in two rounds: the first assignment gives it to nobody, so its current owner revokes it
(hands it over, see ``Follower.hand_over``: stops applying it, flushes, journals, commits) and
asks for a second rebalance, which gives it to its new owner, who takes over its standby (or
restores it) before serving it. So no partition ever has two owners. A partition claimed by
two members at once (a stale claim after a partition of the network) also goes to nobody
first. While a partition is between owners the shared map names no owner for it, so a
request for its scopes is answered 503 with ``Retry-After`` and the clients retry.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor, RebalanceProtocol
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

__all__ = ["Candidate", "CoPartitionedAssignor", "Plan", "plan"]


class CoPartitionedAssignor(AbstractPartitionAssignor):  # type: ignore[misc]
    """See the module docstring.

    Args:
        url: this member's base URL for forwarded requests (None: it takes none).
    """

    name = "purgatory-cooperative"
    version = 1  # the subscription's version 1 carries the partitions each member owns

    def __init__(self, url: str | None) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._owners: dict[int, str] = {}
        self._owned: list[tuple[str, list[int]]] = []
        self._rejoin = False
        self._warm: frozenset[int] = frozenset()  # standbys caught up (said in subscriptions)
        self._warmups: frozenset[int] = frozenset()  # what the last assignment asks to warm
        self._leaving = False
        self._alone = False  # leaving, and the last assignment found nobody to take over

    def supported_protocols(self) -> list[Any]:
        return [RebalanceProtocol.COOPERATIVE]

    def owners(self) -> dict[int, str]:
        """``{partition: owner's URL}`` as of the last assignment (owners without a URL left
        out)."""
        with self._lock:
            return dict(self._owners)

    def metadata(self, topics: Sequence[str]) -> Any:
        with self._lock:
            user_data = json.dumps(
                {"url": self._url, "warm": sorted(self._warm), "leaving": self._leaving}
            ).encode()
            owned = [
                ConsumerProtocolSubscription.TopicPartition(topic=t, partitions=ps)
                for t, ps in self._owned
            ]
        return ConsumerProtocolSubscription(
            version=self.version,
            topics=sorted(topics),
            user_data=user_data,
            owned_partitions=owned,
        )

    def assign(self, cluster: Any, members: Sequence[Any]) -> dict[str, Any]:
        ranked = sorted(
            members,
            key=lambda m: (m.group_instance_id is None, m.group_instance_id or "", m.member_id),
        )
        topics = sorted({t for m in members for t in m.metadata.topics})
        numbers = sorted({p for t in topics for p in (cluster.partitions_for_topic(t) or ())})
        docs = {m.member_id: _document(m.metadata.user_data) for m in ranked}
        candidates = [
            Candidate(
                m.member_id,
                claims=_claimed(m),
                warm=frozenset(_numbers(docs[m.member_id].get("warm"))),
                leaving=docs[m.member_id].get("leaving") is True,
            )
            for m in ranked
        ]
        decided = plan(candidates, numbers)
        owners: dict[int, str] = {}
        for member in ranked:
            url = _url_in(docs[member.member_id])
            if url is not None:
                owners.update(dict.fromkeys(decided.owned[member.member_id], url))
        result = {}
        for member, candidate in zip(ranked, candidates, strict=True):
            mine = decided.owned[member.member_id]
            assignment = [
                (t, [p for p in mine if p in (cluster.partitions_for_topic(t) or ())])
                for t in sorted(member.metadata.topics)
            ]
            doc = {
                "owners": {str(p): u for p, u in sorted(owners.items())},
                "moving": decided.moving,
                "warm": decided.warmups.get(member.member_id, []),
                "leaving": candidate.leaving,
                "alone": decided.alone,
            }
            user_data = json.dumps(doc).encode()
            result[member.member_id] = ConsumerProtocolAssignment(
                self.version, assignment, user_data
            )
        return result

    def on_assignment(self, assignment: Any, generation: int) -> None:
        doc = _document(assignment.user_data)
        owners = _owners_of(doc)
        owned = [(t, sorted(ps)) for t, ps in assignment.assigned_partitions]
        moving = bool(doc.get("moving"))
        with self._lock:
            self._owners = owners
            self._owned = owned
            self._rejoin = moving
            self._warmups = frozenset(_numbers(doc.get("warm")))
            self._alone = self._leaving and doc.get("leaving") is True and doc.get("alone") is True

    # -- what the service tells the group, and asks of it -------------------------------------

    def warmups(self) -> frozenset[int]:
        """The partitions the last assignment asks this member to warm before they move here."""
        with self._lock:
            return self._warmups

    def report_warm(self, partitions: frozenset[int]) -> None:
        """The partitions this member keeps warm now; one that the group asked for and that
        just became warm asks for a rebalance (which moves it here)."""
        with self._lock:
            if partitions == self._warm:
                return
            newly = (partitions - self._warm) & self._warmups
            self._warm = partitions
            self._rejoin = self._rejoin or bool(newly)

    def leave(self) -> None:
        """Ask the group to move every partition of this member to the others, each once its
        next owner is warm (a graceful stop); the member keeps serving them meanwhile."""
        with self._lock:
            if not self._leaving:
                self._leaving = True
                self._rejoin = True

    def left_alone(self) -> bool:
        """Whether this member is leaving and the group has no other member to take over."""
        with self._lock:
            return self._alone

    def take_rejoin(self) -> bool:
        """Whether the last assignment left partitions between owners and this member has not
        yet asked for the second round (then it asks now: True once per such assignment).

        The owner that revokes a moving partition asks for the second round anyway; every
        member asking too is what makes a broker that does not rebalance when a static
        member rejoins (the embedded broker) run it all the same."""
        with self._lock:
            rejoin, self._rejoin = self._rejoin, False
            return rejoin


@dataclass(frozen=True, slots=True)
class Candidate:
    """A member as its subscription describes it."""

    member_id: str
    claims: frozenset[int] = frozenset()  # the partitions it says it owns
    warm: frozenset[int] = frozenset()  # those it keeps a warm standby of
    leaving: bool = False


@dataclass(slots=True)
class Plan:
    """One assignment: who owns what now, what moves, what is to be warmed first."""

    owned: dict[str, list[int]]
    moving: list[int] = field(default_factory=list)  # given to nobody: its owner revokes it
    warmups: dict[str, list[int]] = field(default_factory=dict)
    alone: bool = False  # no member that is not leaving


def plan(ranked: Sequence[Candidate], numbers: Sequence[int]) -> Plan:
    """Assign ``numbers`` to the members ``ranked`` (see the module docstring)."""
    claimants: dict[int, list[str]] = {}
    for member in ranked:
        for partition in member.claims:
            claimants.setdefault(partition, []).append(member.member_id)
    targets = _targets(ranked, numbers, claimants)
    warm = {m.member_id: m.warm for m in ranked}
    decided = Plan(owned={m.member_id: [] for m in ranked})
    decided.alone = all(m.leaving for m in ranked)
    for partition in numbers:
        target, held_by = targets[partition], claimants.get(partition, [])
        if len(held_by) > 1:
            decided.moving.append(partition)  # claimed twice: nobody first
            if partition in warm[target]:
                decided.warmups.setdefault(target, []).append(partition)
        elif not held_by or held_by[0] == target:
            decided.owned[target].append(partition)
        elif decided.alone:  # everyone leaves: each keeps what it holds until it goes
            decided.owned[held_by[0]].append(partition)
        elif partition in warm[target]:
            decided.moving.append(partition)  # its owner revokes it, a second round moves it
            decided.warmups.setdefault(target, []).append(partition)  # kept warm meanwhile
        else:
            decided.owned[held_by[0]].append(partition)
            decided.warmups.setdefault(target, []).append(partition)
    return decided


def _targets(
    ranked: Sequence[Candidate], numbers: Sequence[int], claimants: Mapping[int, list[str]]
) -> dict[int, str]:
    """Where each partition should be: sticky, balanced over the members not leaving."""
    eligible = [m for m in ranked if not m.leaving] or list(ranked)
    n, k = len(numbers), len(eligible)
    if not k:
        return {}
    wanted = set(numbers)
    counted = {p for p in numbers if len(claimants.get(p, ())) == 1}
    load = {m.member_id: len(m.claims & counted) for m in eligible}
    by_load = sorted(range(k), key=lambda i: -load[eligible[i].member_id])
    quota = {eligible[i].member_id: n // k + (rank < n % k) for rank, i in enumerate(by_load)}
    count = dict.fromkeys(quota, 0)
    targets: dict[int, str] = {}
    for member in eligible:
        for partition in sorted(member.claims & wanted & counted):
            if count[member.member_id] < quota[member.member_id]:
                targets[partition] = member.member_id
                count[member.member_id] += 1
    for index, partition in enumerate(numbers):
        if partition in targets:
            continue
        under = [m for m in eligible if count[m.member_id] < quota[m.member_id]]
        ranged = eligible[index * k // n]
        pick = next((m for m in under if partition in m.warm), None)
        if pick is None:
            pick = ranged if ranged in under else min(under, key=lambda m: count[m.member_id])
        targets[partition] = pick.member_id
        count[pick.member_id] += 1
    return targets


def _numbers(value: object) -> list[int]:
    """A JSON list of partition numbers (anything else, or garbage in it: none)."""
    if not isinstance(value, list):
        return []
    return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]


def _claimed(member: Any) -> frozenset[int]:
    """The partition numbers a member's subscription says it owns (a version-0 subscription
    claims nothing)."""
    owned = getattr(member.metadata, "owned_partitions", None) or ()
    return frozenset(p for entry in owned for p in entry.partitions)


def _document(user_data: object) -> dict[str, Any]:
    """The JSON object a subscription or an assignment carries (empty when garbled)."""
    try:
        doc = json.loads(user_data) if isinstance(user_data, bytes | str) else None
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _url_in(doc: Mapping[str, Any]) -> str | None:
    url = doc.get("url")
    return url if isinstance(url, str) and url else None


def _owners_of(doc: Mapping[str, Any]) -> dict[int, str]:
    owners = doc.get("owners")
    if not isinstance(owners, Mapping):
        return {}
    return {int(p): u for p, u in owners.items() if isinstance(u, str) and str(p).isdigit()}
