"""The delivery modes, chosen in one place (service layer: journal).

``PURGATORY_DELIVERY`` and ``PURGATORY_JOURNAL`` choose how what the inputs decide reaches the
broker, and this module is the only one that reads them: :func:`delivery_mode` returns one of

* :class:`Acknowledged` (the default): the write-ahead journal, one record per partition and
  group commit, checked where it landed
  (:class:`~purgatory.service.journal.acknowledged.AcknowledgedWriter`); callbacks, dead
  letters and offset commits follow its acknowledgement
  (:class:`~purgatory.service.journal.release.JournaledRelease`). At least once: after a
  crash, consumers drop repeats by id.
* :class:`Transactional`: one Kafka transaction per partition and group commit, with the
  callbacks, dead letters and input offsets of its entries
  (:class:`~purgatory.service.journal.transactional.TransactionalWriter`,
  :class:`~purgatory.service.journal.release.TransactionalRelease`). Exactly once for
  ``read_committed`` readers; the broker must do transactions, which is checked before
  anything starts, and the changelog is read committed.
* :class:`Unjournaled` (``PURGATORY_JOURNAL=false``): nothing is journaled, everything decided
  goes to the outbox at once (:class:`~purgatory.service.journal.release.ImmediateRelease`),
  and nothing survives a restart.

Each mode builds the stages between dispatch and egress (:class:`Journal`: the changelog, what
the intake and HTTP wait on, the release), says how the changelog is read, checks the broker
before the start, and opens the transactional producers it needs. Nothing else branches on the
mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from purgatory._core import UsageError
from purgatory.service.journal.acknowledged import AcknowledgedWriter
from purgatory.service.journal.changelog import Changelog, Gate, NoJournal
from purgatory.service.journal.release import (
    ImmediateRelease,
    JournaledRelease,
    Outlet,
    Release,
    TransactionalRelease,
)
from purgatory.service.journal.transactional import TransactionalWriter
from purgatory.service.kafka.clients import KafkaTransport
from purgatory.service.kafka.transactions import check_transactions
from purgatory.service.kafka.transport import RecordSink, RecordSource, Transactions, Transport
from purgatory.service.settings import Delivery, Settings

__all__ = [
    "Acknowledged",
    "DeliveryMode",
    "Journal",
    "Over",
    "Transactional",
    "Unjournaled",
    "delivery_mode",
    "own_topics",
]


def own_topics(settings: Settings) -> tuple[str, ...]:
    """Every topic the service reads or writes (reply_to topics aside)."""
    return (
        settings.topic_requests,
        settings.topic_signals,
        settings.topic_callbacks,
        settings.topic_dead_letters,
        settings.topic_changelog,
        settings.topic_snapshots,
    )


@dataclass(frozen=True, slots=True)
class Journal:
    """The stages a mode puts between dispatch and egress.

    Attributes:
        changelog: the write-ahead journal (None: nothing is journaled).
        gate: what the intake and the HTTP answers wait on (the changelog, or nothing).
        release: where decided outcomes, dead letters and offsets go.
    """

    changelog: Changelog | None
    gate: Gate
    release: Release


@dataclass(frozen=True, slots=True)
class Over:
    """What a mode's journal is built over.

    Attributes:
        sink: the service's producer.
        transactions: the partitions' transactional producers (None: not opened).
        outlet: egress (the outbox).
        delivered: a partition's highest outcome sequence acknowledged (its mark).
        on_fenced: called with a partition another writer wrote to.
    """

    sink: RecordSink
    transactions: Transactions | None
    outlet: Outlet
    delivered: Callable[[int], int]
    on_fenced: Callable[[int], None]


class DeliveryMode(Protocol):
    """How what the inputs decide reaches the broker.

    Attributes:
        name: as ``PURGATORY_DELIVERY`` names it.
        promise: what a consumer of the callbacks can count on.
        needs_transactions: the broker must do transactions (the embedded one cannot).
    """

    @property
    def name(self) -> str: ...

    @property
    def promise(self) -> str: ...

    @property
    def needs_transactions(self) -> bool: ...

    @property
    def read_committed(self) -> bool:
        """Whether the changelog (and the restore) reads committed records only."""
        ...

    async def check(self, transport: Transport) -> None:
        """Before anything starts: refuse a broker this mode cannot use."""
        ...

    def transactions(
        self, transport: Transport, source: RecordSource
    ) -> contextlib.AbstractAsyncContextManager[Transactions | None]:
        """The partitions' transactional producers, if the mode writes through them."""
        ...

    def journal(self, over: Over) -> Journal:
        """The stages between dispatch and egress, over what ``over`` gives."""
        ...


@dataclass(frozen=True, slots=True)
class _WithoutTransactions:
    """A mode any broker serves: no check, no transactional producer."""

    settings: Settings
    read_committed: bool = False
    needs_transactions: bool = False

    async def check(self, transport: Transport) -> None:
        """Any broker will do."""

    @contextlib.asynccontextmanager
    async def transactions(
        self, transport: Transport, source: RecordSource
    ) -> AsyncIterator[Transactions | None]:
        """None needed."""
        yield None


@dataclass(frozen=True, slots=True)
class Unjournaled(_WithoutTransactions):
    """Nothing journaled (``PURGATORY_JOURNAL=false``)."""

    name: str = "acknowledged"
    promise: str = "at most once: nothing is journaled, a crash loses what was pending"

    def journal(self, over: Over) -> Journal:
        """No changelog; everything released at once."""
        return Journal(None, NoJournal(), ImmediateRelease(over.outlet))


@dataclass(frozen=True, slots=True)
class Acknowledged(_WithoutTransactions):
    """The write-ahead journal through the service's producer (the default)."""

    name: str = "acknowledged"
    promise: str = (
        "at least once (after a crash, consumers drop repeats by id);"
        " PURGATORY_DELIVERY=transactional with --broker kafka for exactly once"
    )

    def journal(self, over: Over) -> Journal:
        """A changelog written by :class:`AcknowledgedWriter`; releases follow it."""
        settings = self.settings
        topic = settings.topic_changelog
        writer = AcknowledgedWriter(over.sink, topic=topic, delivered=over.delivered)
        changelog = _changelog(writer, settings, over.on_fenced)
        return Journal(changelog, changelog, JournaledRelease(changelog, over.outlet))


@dataclass(frozen=True, slots=True)
class Transactional:
    """One Kafka transaction per partition and group commit."""

    settings: Settings
    read_committed: bool = True
    name: str = "transactional"
    promise: str = "exactly once for consumers that read committed records"
    needs_transactions: bool = True

    async def check(self, transport: Transport) -> None:
        """The broker must do transactions (waits out a coordinator still loading); only the
        real Kafka transport is probed (the in-memory one models them)."""
        if isinstance(transport, KafkaTransport):
            await check_transactions(
                transport.config, transactional_id=f"{self.settings.kafka_group_id}-probe"
            )

    @contextlib.asynccontextmanager
    async def transactions(
        self, transport: Transport, source: RecordSource
    ) -> AsyncIterator[Transactions | None]:
        """A transactional producer per partition, committing the source group's offsets."""
        async with transport.open_transactions(
            id_prefix=self.settings.kafka_group_id, group_id=self.settings.kafka_group_id
        ) as transactions:
            yield transactions

    def journal(self, over: Over) -> Journal:
        """A changelog written by :class:`TransactionalWriter`; releases ride its
        transactions.

        Raises:
            UsageError: no transactional producers were given.
        """
        if over.transactions is None:
            raise UsageError("a transactional service needs its transactional producers")
        settings = self.settings
        writer = TransactionalWriter(
            over.transactions,
            topic=settings.topic_changelog,
            undeliverable=over.outlet.undeliverable,
            own_topics=own_topics(settings),
            delivered=over.delivered,
        )
        changelog = _changelog(writer, settings, over.on_fenced)
        return Journal(changelog, changelog, TransactionalRelease(changelog, over.outlet))


def delivery_mode(settings: Settings) -> DeliveryMode:
    """The delivery mode ``settings`` choose (the one place that reads them)."""
    if not settings.journal:
        return Unjournaled(settings)
    if settings.delivery is Delivery.TRANSACTIONAL:
        return Transactional(settings)
    return Acknowledged(settings)


def _changelog(
    writer: AcknowledgedWriter | TransactionalWriter,
    settings: Settings,
    on_fenced: Callable[[int], None],
) -> Changelog:
    return Changelog(
        writer,
        max_record_bytes=settings.max_record_bytes,
        on_fenced=on_fenced,
        wait_ms=settings.journal_wait_ms,
    )
