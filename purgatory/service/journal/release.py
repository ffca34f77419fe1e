"""Where decided outcomes go: journaled first, then out (service layer: journal).

Every outcome an engine decides flows into one object, the service's :class:`Release`, which
holds it until the entries that decided it are durable and then hands it to egress (the outbox:
callbacks, dead letters, and the acknowledgements that follow). The composition root picks one:

* :class:`JournaledRelease`: after the changelog acknowledges the batch that holds the entries
  (write-ahead: no callback, no waiter woken, no offset committed before the journal);
* :class:`ImmediateRelease`: at once, without a journal (``PURGATORY_JOURNAL=false``).

A transactional delivery mode is one more class here: the outcomes of a batch released with the
transaction that holds its journal records.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from purgatory._core import Outcome
from purgatory.service.journal.changelog import Changelog

__all__ = ["ImmediateRelease", "JournaledRelease", "Release", "release_for"]

#: Hands released outcomes to egress (the outbox's ``put``).
Deliver = Callable[[Sequence[Outcome]], None]


class Release(Protocol):
    """Takes the outcomes one input decided (all of one partition, in sequence order)."""

    def decided(self, outcomes: Sequence[Outcome]) -> None: ...


@dataclass(frozen=True, slots=True)
class JournaledRelease:
    """Delivers once the changelog has acknowledged the entries that decided the outcomes."""

    changelog: Changelog
    deliver: Deliver

    def decided(self, outcomes: Sequence[Outcome]) -> None:
        """Queue ``outcomes`` behind the entries recorded so far for their partition."""
        release = functools.partial(self.deliver, outcomes)
        self.changelog.after(release, partition=outcomes[0].partition)


@dataclass(frozen=True, slots=True)
class ImmediateRelease:
    """Delivers at once: nothing is journaled."""

    deliver: Deliver

    def decided(self, outcomes: Sequence[Outcome]) -> None:
        """Hand ``outcomes`` to egress now."""
        self.deliver(outcomes)


def release_for(changelog: Changelog | None, deliver: Deliver) -> Release:
    """The release of a service with ``changelog`` (None: without a journal)."""
    if changelog is None:
        return ImmediateRelease(deliver)
    return JournaledRelease(changelog, deliver)
