"""What the service settled lately (service layer): bounded rings of the last outcomes and dead
letters, for the operators' page (:mod:`purgatory.service.ops.overview`).

They are fed where the service counts them in its metrics: an outcome once its callback is
acknowledged (or dead-lettered), through the outbox's ``on_delivered``; a dead letter once the
broker acknowledged it, through the outbox's ``on_dead_lettered`` (beside its metric), so the
ring holds exactly what reached the dead-letters topic, with the reason the record carries.
Each entry is a small summary (no payload, no signal, texts cut to :data:`MAX_TEXT`), and each
ring keeps its last ``capacity`` entries: memory is bounded whatever the traffic, and feeding
costs a few hundred nanoseconds per outcome on the delivery path.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from purgatory._core import Outcome, UsageError
from purgatory.service.kafka.transport import OutRecord

__all__ = ["MAX_RECENT", "MAX_TEXT", "Recent", "RecentDeadLetter", "RecentOutcome", "Ring"]

T = TypeVar("T")

#: The most characters of a reason or a record key an entry keeps.
MAX_TEXT = 500
#: The most entries a ring of :class:`Recent` keeps.
MAX_RECENT = 100


class Ring(Generic[T]):
    """The last ``capacity`` items added; :attr:`added` counts every item ever added."""

    __slots__ = ("_items", "added")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise UsageError(f"capacity must be >= 1, got {capacity}")
        self._items: deque[T] = deque(maxlen=capacity)
        self.added = 0

    def add(self, item: T) -> None:
        """Keep ``item``, forgetting the oldest one if the ring is full."""
        self._items.append(item)
        self.added += 1

    def latest(self) -> list[T]:
        """The items kept, newest first."""
        return list(reversed(self._items))


@dataclass(frozen=True, slots=True)
class RecentOutcome:
    """An outcome whose callback was settled, as the page shows it (``at_ms``: when)."""

    at_ms: int
    scope: str
    op_id: str
    outcome: str
    late: bool
    registered_ms: int
    outcome_ms: int
    deadline_ms: int
    time_domain: str
    missing: tuple[str, ...]
    partition: int
    sequence: int


@dataclass(frozen=True, slots=True)
class RecentDeadLetter:
    """A dead letter the broker acknowledged (``at_ms``: when), from the record it sent.

    Attributes:
        topic, partition, offset: where the refused record was read (for a callback that
            could not be delivered: the topic it was for, and -1).
        reason, field: why it was refused, and the field at fault (None: no one field).
        key: the record's key as the dead letter carries it (None: no key).
    """

    at_ms: int
    topic: str
    partition: int
    offset: int
    reason: str
    field: str | None
    key: str | None


class Recent:
    """The rings of recent outcomes and dead letters, and their feeds.

    Args:
        now_ms: the service's clock (epoch ms), read once per entry.
        outcomes: how many outcomes to keep (1 to :data:`MAX_RECENT`).
        dead_letters: how many dead letters to keep (1 to :data:`MAX_RECENT`).

    Raises:
        UsageError: a capacity out of range.
    """

    def __init__(
        self,
        now_ms: Callable[[], int],
        *,
        outcomes: int = MAX_RECENT,
        dead_letters: int = MAX_RECENT,
    ) -> None:
        for name, capacity in (("outcomes", outcomes), ("dead_letters", dead_letters)):
            if not 1 <= capacity <= MAX_RECENT:
                raise UsageError(f"{name} must be in [1, {MAX_RECENT}], got {capacity}")
        self._now_ms = now_ms
        self._outcomes: Ring[tuple[Any, ...]] = Ring(outcomes)  # RecentOutcome's fields
        self.dead_letters: Ring[RecentDeadLetter] = Ring(dead_letters)

    def outcome(self, outcome: Outcome) -> None:
        """Keep a settled outcome's summary (a tuple: this runs once per callback)."""
        o = outcome
        self._outcomes.add(
            (
                self._now_ms(),
                o.scope,
                o.op_id,
                o.outcome.value,
                o.late,
                o.registered_ms,
                o.outcome_ms,
                o.deadline_ms,
                o.time_domain.value,
                o.missing,
                o.partition,
                o.sequence,
            )
        )

    def latest_outcomes(self) -> list[RecentOutcome]:
        """The outcomes kept, newest first."""
        return [RecentOutcome(*fields) for fields in self._outcomes.latest()]

    @property
    def outcomes_added(self) -> int:
        """How many outcomes were settled since the start."""
        return self._outcomes.added

    def dead_letter(self, record: OutRecord) -> None:
        """Keep the summary of an acknowledged dead letter (``purgatory._codec``'s format); a
        record of another format (a topic shared with something else) is ignored."""
        try:
            letter = json.loads(record.value)
        except ValueError:
            return
        if not isinstance(letter, dict) or letter.get("type") != "dead_letter":
            return
        self.dead_letters.add(
            RecentDeadLetter(
                at_ms=self._now_ms(),
                topic=_text(letter.get("topic")) or "",
                partition=_number(letter.get("partition")),
                offset=_number(letter.get("offset")),
                reason=_text(letter.get("reason")) or "",
                field=_text(letter.get("field")),
                key=_text(letter.get("key")),
            )
        )


def _text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return value if len(value) <= MAX_TEXT else value[: MAX_TEXT - 3] + "..."


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else -1
