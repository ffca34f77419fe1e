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

The protocol is eager: a rebalance revokes every partition first (each member hands its
partitions over, see ``Service._hand_over``), then assigns them again.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from kafka.coordinator.assignors.abstract import AbstractPartitionAssignor
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

    name = "purgatory-copartitioned"
    version = 0

    def __init__(self, url: str | None) -> None:
        self._url = url
        self._lock = threading.Lock()
        self._owners: dict[int, str] = {}

    def owners(self) -> dict[int, str]:
        """``{partition: owner's URL}`` as of the last assignment (owners without a URL left
        out)."""
        with self._lock:
            return dict(self._owners)

    def metadata(self, topics: Sequence[str]) -> Any:
        user_data = json.dumps({"url": self._url}).encode()
        return ConsumerProtocolSubscription(self.version, sorted(topics), user_data)

    def assign(self, cluster: Any, members: Sequence[Any]) -> dict[str, Any]:
        ranked = sorted(
            members,
            key=lambda m: (m.group_instance_id is None, m.group_instance_id or "", m.member_id),
        )
        topics = sorted({t for m in members for t in m.metadata.topics})
        numbers = sorted({p for t in topics for p in (cluster.partitions_for_topic(t) or ())})
        owned: dict[str, list[int]] = {m.member_id: [] for m in ranked}
        owners: dict[int, str] = {}
        for index, partition in enumerate(numbers):
            member = ranked[index * len(ranked) // len(numbers)]
            owned[member.member_id].append(partition)
            url = _url_of(member.metadata.user_data)
            if url is not None:
                owners[partition] = url
        shared = json.dumps({"owners": {str(p): u for p, u in owners.items()}}).encode()
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
        owners = _owners_of(assignment.user_data)
        with self._lock:
            self._owners = owners


def _url_of(user_data: object) -> str | None:
    try:
        doc = json.loads(user_data) if isinstance(user_data, bytes | str) else None
    except ValueError:
        return None
    url = doc.get("url") if isinstance(doc, dict) else None
    return url if isinstance(url, str) and url else None


def _owners_of(user_data: object) -> dict[int, str]:
    try:
        doc = json.loads(user_data) if isinstance(user_data, bytes | str) else None
    except ValueError:
        return {}
    owners = doc.get("owners") if isinstance(doc, dict) else None
    if not isinstance(owners, Mapping):
        return {}
    return {int(p): u for p, u in owners.items() if isinstance(u, str) and str(p).isdigit()}
