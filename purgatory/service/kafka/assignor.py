"""The consumer group's assignor (service layer): co-partitioned ranges and a shared owner map.

In group mode the consumer group decides which replica owns which input partition; this
assignor is how, so that ownership comes from Kafka and from nothing of ours:

* partition *number* p of every subscribed topic (requests and signals are co-partitioned) goes
  to the same member, the member of rank ``p * members // partitions`` (Flink's range formula,
  as in ordinal mode), members ranked by their static ``group.instance.id`` when they have one
  (so a restarted pod gets its partitions back), else by member id;
* each member's subscription carries its advertised URL, and every member's assignment carries
  the whole map ``{partition: owner URL}``: after each rebalance every replica knows where each
  scope's partition lives, and forwards a request to it (as in ordinal mode).

The protocol is cooperative (KIP-429, Kafka's incremental rebalancing): a member keeps
serving every partition that stays its own through a rebalance; nothing is revoked up front.
Each member's subscription names the partitions it owns. A partition whose owner changes
moves in two rounds: the first assignment gives it to nobody, so its current owner revokes it
(hands it over, see ``Follower.hand_over``: stops applying it, flushes, journals, commits) and
asks for a second rebalance, which gives it to its new owner, who restores it before serving
it. So no partition ever has two owners, and a resize moves (and restores) only the partitions
that change hands. A partition claimed by two members at once (a stale claim after a
partition of the network) also goes to nobody first. While a partition is between owners the
shared map names no owner for it, so a request for its scopes is answered 503 with
``Retry-After`` and the clients retry.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor, RebalanceProtocol
from kafka.protocol.consumer.metadata import (
    ConsumerProtocolAssignment,
    ConsumerProtocolSubscription,
)

__all__ = ["CoPartitionedAssignor"]


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

    def supported_protocols(self) -> list[Any]:
        return [RebalanceProtocol.COOPERATIVE]

    def owners(self) -> dict[int, str]:
        """``{partition: owner's URL}`` as of the last assignment (owners without a URL left
        out)."""
        with self._lock:
            return dict(self._owners)

    def metadata(self, topics: Sequence[str]) -> Any:
        user_data = json.dumps({"url": self._url}).encode()
        with self._lock:
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
        claims = _claims(members)
        urls = {m.member_id: _url_of(m.metadata.user_data) for m in ranked}
        owned: dict[str, list[int]] = {m.member_id: [] for m in ranked}
        owners: dict[int, str] = {}
        moving: list[int] = []
        for index, partition in enumerate(numbers):
            member = ranked[index * len(ranked) // len(numbers)]
            if not claims.get(partition, set()) <= {member.member_id}:
                moving.append(partition)  # its owner revokes it first, a second round gives it
                continue
            owned[member.member_id].append(partition)
            url = urls[member.member_id]
            if url is not None:
                owners[partition] = url
        shared = json.dumps(
            {"owners": {str(p): u for p, u in owners.items()}, "moving": moving}
        ).encode()
        result = {}
        for member in ranked:
            mine = owned[member.member_id]
            assignment = [
                (t, [p for p in mine if p in (cluster.partitions_for_topic(t) or ())])
                for t in sorted(member.metadata.topics)
            ]
            result[member.member_id] = ConsumerProtocolAssignment(self.version, assignment, shared)
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

    def take_rejoin(self) -> bool:
        """Whether the last assignment left partitions between owners and this member has not
        yet asked for the second round (then it asks now: True once per such assignment).

        The owner that revokes a moving partition asks for the second round anyway; every
        member asking too is what makes a broker that does not rebalance when a static
        member rejoins (the embedded broker) run it all the same."""
        with self._lock:
            rejoin, self._rejoin = self._rejoin, False
            return rejoin


def _claims(members: Sequence[Any]) -> dict[int, set[str]]:
    """``{partition number: ids of the members that say they own it}``, from the members'
    subscriptions (a version-0 subscription claims nothing)."""
    claims: dict[int, set[str]] = {}
    for member in members:
        for entry in getattr(member.metadata, "owned_partitions", None) or ():
            for partition in entry.partitions:
                claims.setdefault(partition, set()).add(member.member_id)
    return claims


def _document(user_data: object) -> dict[str, Any]:
    """The JSON object a subscription or an assignment carries (empty when garbled)."""
    try:
        doc = json.loads(user_data) if isinstance(user_data, bytes | str) else None
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _url_of(user_data: object) -> str | None:
    url = _document(user_data).get("url")
    return url if isinstance(url, str) and url else None


def _owners_of(doc: Mapping[str, Any]) -> dict[int, str]:
    owners = doc.get("owners")
    if not isinstance(owners, Mapping):
        return {}
    return {int(p): u for p, u in owners.items() if isinstance(u, str) and str(p).isdigit()}
