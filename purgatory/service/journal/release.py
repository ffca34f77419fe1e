"""Where decided outcomes go: journaled first, then out (service layer: journal).

Everything the service must write because of its inputs flows into one object, the service's
:class:`Release`: the outcomes an engine decides, the dead letters of refused input records,
and the input offsets a consumed batch reached. It holds them until the entries that caused
them are durable, then hands them to egress (the :class:`Outlet`: the outbox's callbacks, dead
letters, offset commits, and the acknowledgements that follow). The delivery mode picks one
(:mod:`purgatory.service.journal.modes`):

* :class:`JournaledRelease` (``PURGATORY_DELIVERY=acknowledged``): after the changelog
  acknowledges the batch that holds the entries (write-ahead: no callback, no waiter woken, no
  offset committed before the journal);
* :class:`TransactionalRelease` (``PURGATORY_DELIVERY=transactional``): in the same Kafka
  transaction as the journal record that holds the entries, with the input offsets; the
  acknowledgements follow the commit
  (:mod:`purgatory.service.journal.transactional`);
* :class:`ImmediateRelease`: at once, without a journal (``PURGATORY_JOURNAL=false``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from purgatory._core import Outcome
from purgatory.service.journal.changelog import Changelog
from purgatory.service.kafka.transport import OutRecord, Refusal, SendFailure

__all__ = [
    "ImmediateRelease",
    "JournaledRelease",
    "Outlet",
    "Release",
    "TransactionalRelease",
]

Offsets = Mapping[tuple[str, int], int]


class Outlet(Protocol):
    """What egress (the outbox) offers the release."""

    def put(self, outcomes: Sequence[Outcome]) -> None: ...

    def put_dead_letter(self, refusal: Refusal) -> None: ...

    def put_commit(self, offsets: Offsets) -> None: ...

    def records_for(self, outcomes: Sequence[Outcome]) -> list[OutRecord]: ...

    def settled(self, outcomes: Sequence[Outcome]) -> None: ...

    def letter_for(self, refusal: Refusal) -> OutRecord: ...

    def letter_settled(self, letter: OutRecord, *, source_topic: str, label: str) -> None: ...

    def undeliverable(self, record: OutRecord, failure: SendFailure) -> OutRecord: ...


class Release(Protocol):
    """Takes what the inputs caused, all of one partition in decision order."""

    def decided(self, outcomes: Sequence[Outcome]) -> None:
        """The outcomes one input decided (or a restore re-sends)."""
        ...

    def refused(self, refusal: Refusal) -> None:
        """A consumed record the service refused: its dead letter, with the reason."""
        ...

    def consumed(self, partition: int, offsets: Offsets) -> None:
        """The input offsets a consumed batch reached in ``partition``."""
        ...

    def resent(self, outcomes: Sequence[Outcome]) -> None:
        """Outcomes a restore found journaled but not delivered: sent again."""
        ...


@dataclass(frozen=True, slots=True)
class JournaledRelease:
    """Hands everything to the outbox once the changelog acknowledged what caused it."""

    changelog: Changelog
    outlet: Outlet

    def decided(self, outcomes: Sequence[Outcome]) -> None:
        """Queue ``outcomes`` behind the entries recorded so far for their partition."""
        release = functools.partial(self.outlet.put, outcomes)
        self.changelog.after(release, partition=outcomes[0].partition)

    def refused(self, refusal: Refusal) -> None:
        """Queue the dead letter now (the outbox keeps decision order; the offset commit
        after it waits for the journal)."""
        self.outlet.put_dead_letter(refusal)

    def consumed(self, partition: int, offsets: Offsets) -> None:
        """Commit the offsets once the journal and everything queued before are
        acknowledged (never, if the partition is fenced first)."""
        release = functools.partial(self.outlet.put_commit, offsets)
        self.changelog.after(release, partition=partition)

    def resent(self, outcomes: Sequence[Outcome]) -> None:
        """To the outbox at once: they are journaled already."""
        self.outlet.put(outcomes)


@dataclass(frozen=True, slots=True)
class TransactionalRelease:
    """Writes everything in the transaction of the journal record that caused it."""

    changelog: Changelog
    outlet: Outlet

    def decided(self, outcomes: Sequence[Outcome]) -> None:
        """Attach the callbacks to their partition's transaction; settle them at its commit."""
        self.changelog.attach(
            outcomes[0].partition,
            self.outlet.records_for(outcomes),
            sequence=max(outcome.sequence for outcome in outcomes),
            release=functools.partial(self.outlet.settled, outcomes),
        )

    def refused(self, refusal: Refusal) -> None:
        """Attach the dead letter to the record's partition's transaction."""
        letter = self.outlet.letter_for(refusal)
        record = refusal.record
        settle = functools.partial(
            self.outlet.letter_settled, letter, source_topic=record.topic, label=refusal.label
        )
        self.changelog.attach(record.partition, [letter], release=settle)

    def consumed(self, partition: int, offsets: Offsets) -> None:
        """Nothing to do: the journal record's positions are committed as the group's offsets
        in the same transaction."""

    def resent(self, outcomes: Sequence[Outcome]) -> None:
        """In the partition's next transaction, whose delivered mark then covers them."""
        self.decided(outcomes)


@dataclass(frozen=True, slots=True)
class ImmediateRelease:
    """Hands everything to the outbox at once: nothing is journaled."""

    outlet: Outlet

    def decided(self, outcomes: Sequence[Outcome]) -> None:
        """Hand ``outcomes`` to egress now."""
        self.outlet.put(outcomes)

    def refused(self, refusal: Refusal) -> None:
        """Queue the dead letter now."""
        self.outlet.put_dead_letter(refusal)

    def consumed(self, partition: int, offsets: Offsets) -> None:
        """Commit once everything queued before is acknowledged."""
        self.outlet.put_commit(offsets)

    def resent(self, outcomes: Sequence[Outcome]) -> None:
        """Nothing is journaled, so nothing is ever re-sent; sent if asked."""
        self.outlet.put(outcomes)
