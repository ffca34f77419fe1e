"""Who owns each input partition, and where to reach it (service layer).

In ordinal mode (``PURGATORY_PEER_URLS`` and ``PURGATORY_REPLICA_ORDINAL``), ownership is static
and known to every replica: partition ``p`` of ``P`` belongs to the replica of ordinal
``p * R // P`` of ``R`` (Flink's key-group range formula, the one the Helm chart uses to give
each pod its partitions), whose base URL is ``peer_urls[ordinal]``. Nothing is elected or
leased: the consumer of the replica reads exactly those partitions (explicit assignment), so
the broker's assignment and this map are one and the same.

In group mode (``PURGATORY_ADVERTISED_URL``, no static partitions), the group's assignor
shares each member's advertised URL with the assignment (:class:`GroupOwners` reads it from the
source).

A replica that does not own a scope's partition forwards the request to the owner
(:mod:`purgatory.service.ownership.forward`); a request already forwarded once is never forwarded
again (a disagreement between two replicas' maps answers 503 instead of looping).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from purgatory._core import UsageError
from purgatory.service.kafka.transport import RecordSource
from purgatory.service.settings import Settings

__all__ = ["GroupOwners", "Owners", "StaticOwners", "owners_for", "range_owner"]


def range_owner(partition: int, *, partitions: int, replicas: int) -> int:
    """The ordinal of the replica that owns ``partition`` (``p * R // P``)."""
    return partition * replicas // partitions


@dataclass(frozen=True, slots=True)
class StaticOwners:
    """The ordinal-mode ownership map.

    Args:
        peer_urls: every replica's base URL, by ordinal.
        ordinal: this replica's.
        partitions: the input topics' partition count.
    """

    peer_urls: Sequence[str]
    ordinal: int
    partitions: int

    def __post_init__(self) -> None:
        if not 0 <= self.ordinal < len(self.peer_urls):
            raise UsageError(f"ordinal {self.ordinal} is not an index of {len(self.peer_urls)}")
        if self.partitions < len(self.peer_urls):
            raise UsageError(
                f"{len(self.peer_urls)} replicas need at least as many partitions,"
                f" the input topics have {self.partitions}"
            )

    @property
    def me(self) -> str:
        """How this replica names itself to the others (its ordinal)."""
        return str(self.ordinal)

    def owner_of(self, partition: int) -> int:
        """The ordinal owning ``partition``."""
        return range_owner(partition, partitions=self.partitions, replicas=len(self.peer_urls))

    def url_of(self, partition: int) -> str | None:
        """The owner's base URL, or None when this replica owns ``partition``."""
        owner = self.owner_of(partition)
        return None if owner == self.ordinal else self.peer_urls[owner].rstrip("/")

    def own(self) -> tuple[int, ...]:
        """The partitions this replica owns."""
        return tuple(p for p in range(self.partitions) if self.owner_of(p) == self.ordinal)


@dataclass(frozen=True, slots=True)
class GroupOwners:
    """The owners the group's assignment names (group mode).

    Attributes:
        source: the input topics' consumer (it knows each partition's owner's advertised URL,
            as the group assigned it).
        me: this replica's advertised URL.
    """

    source: RecordSource
    me: str

    def url_of(self, partition: int) -> str | None:
        """The owner's base URL, or None when this replica owns ``partition`` (or no owner is
        known)."""
        url = self.source.owner_urls().get(partition)
        return None if url is None or url == self.me else url.rstrip("/")


Owners = StaticOwners | GroupOwners


def owners_for(settings: Settings, source: RecordSource, partitions: int) -> Owners | None:
    """Who owns which partition as ``settings`` say: static ordinals
    (``PURGATORY_PEER_URLS`` and ``PURGATORY_REPLICA_ORDINAL``), the group's members
    (``PURGATORY_ADVERTISED_URL`` without static partitions), or nobody else (None).

    Raises:
        UsageError: the static partitions are not the ones the ordinal owns.
    """
    if settings.peer_urls is not None and settings.replica_ordinal is not None:
        owners = StaticOwners(settings.peer_urls, settings.replica_ordinal, partitions)
        if settings.kafka_static_partitions is None or sorted(
            settings.kafka_static_partitions
        ) != list(owners.own()):
            raise UsageError(
                f"PURGATORY_KAFKA_STATIC_PARTITIONS must be the partitions replica"
                f" {settings.replica_ordinal} of {len(settings.peer_urls)} owns by"
                f" PURGATORY_PEER_URLS ({','.join(map(str, owners.own()))}), got"
                f" {settings.kafka_static_partitions}"
            )
        return owners
    if settings.advertised_url is not None and settings.kafka_static_partitions is None:
        return GroupOwners(source, settings.advertised_url)
    return None
