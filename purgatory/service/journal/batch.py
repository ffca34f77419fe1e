"""What the journal's writer writes, and the protocol of its two writers (service layer: journal).

The changelog (:mod:`purgatory.service.journal.changelog`) records entries into batches and
writes one batch at a time (group commit); how a batch reaches the broker is the delivery
mode's (:mod:`purgatory.service.journal.modes`), behind one protocol, :class:`JournalWriter`:

* :class:`~purgatory.service.journal.acknowledged.AcknowledgedWriter`: one record per
  partition, written through the service's producer; each must land at the offset its writer
  expects (``at``), or it is void and its partition fenced;
* :class:`~purgatory.service.journal.transactional.TransactionalWriter`: one Kafka transaction
  per partition, with the callbacks and dead letters the entries released and the input
  offsets; the broker fences an earlier writer by producer epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from purgatory._core import TransportError
from purgatory._core._backoff import Backoff
from purgatory.service.journal.format import JOURNAL_KEY, encode_journal_record, marker_size
from purgatory.service.kafka.transport import OutRecord
from purgatory.service.telemetry.logging import get_logger

__all__ = ["RETRY", "Batch", "JournalWriter", "Part", "Stall", "journal_record"]

_log = get_logger()

#: The pause before a journal record the broker refused (retriable) is sent again.
RETRY = Backoff(first_s=0.05, max_s=1.0)


@dataclass
class Part:
    """One partition's share of a batch: its entries, and what goes with them."""

    entries: list[str] = field(default_factory=list)
    size: int = 0  # bytes of the entries and of the ``inputs`` markers, as encoded
    positions: dict[str, int] = field(default_factory=dict)
    inputs: list[list[Any]] = field(default_factory=list)  # [first, end, topic, offset]
    outbound: list[OutRecord] = field(default_factory=list)  # released with it (transactional)
    sequence: int = 0  # the highest outcome sequence among them

    def end_input(self) -> None:
        """The consumed record being applied produced no more entries here."""
        if self.inputs and self.inputs[-1][1] is None:
            if self.inputs[-1][0] == len(self.entries):
                _first, _end, topic, offset = self.inputs.pop()  # it produced none here
                self.size -= marker_size(topic, offset)  # (refused, or a mere duplicate)
            else:
                self.inputs[-1][1] = len(self.entries)


@dataclass
class Batch:
    """What one group commit writes: a part per partition, and what waits for them."""

    parts: dict[int, Part] = field(default_factory=dict)
    releases: list[tuple[int | None, Callable[[], None]]] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)
    error: TransportError | None = None
    since_s: float | None = None  # when it got its first entry or release (trio's clock)

    def empty(self) -> bool:
        return not self.parts and not self.releases


def journal_record(
    topic: str, partition: int, part: Part, delivered: int, at: int | None = None
) -> OutRecord:
    """The changelog record of ``part`` (its delivered mark ``delivered``; ``at``: where it
    must land, None: unchecked)."""
    part.end_input()
    value = encode_journal_record(
        partition, part.entries, part.positions, delivered, part.inputs, at=at
    )
    return OutRecord(topic, JOURNAL_KEY, value, partition=partition)


class Stall:
    """Whether the journal is stalled: its oldest unacknowledged entry waited ``wait_ms``.

    Logs ``journal_stalled`` once per stall, and ``journal_resumed`` once it is over.
    """

    def __init__(self, wait_ms: int, pending_entries: Callable[[], int]) -> None:
        self.wait_ms = wait_ms
        self.since_s: float | None = None  # when a write's wait passed wait_ms
        self._pending_entries = pending_entries

    def report(self, since_s: float, batch: Batch, what: str) -> None:
        """The journal is stalled since ``since_s`` (``what`` did not happen in time)."""
        self.since_s = since_s
        _log.warning(
            "journal_stalled",
            wait_ms=self.wait_ms,
            partitions=sorted(batch.parts),
            pending_entries=self._pending_entries(),
            detail=f"{what} within PURGATORY_JOURNAL_WAIT_MS: HTTP writes answer 503 with"
            " Retry-After, consumed inputs wait in their topics, nothing decided is released",
        )

    def resumed(self, still_stalled: bool) -> None:
        """Log ``journal_resumed`` once a stall is over (no entry left has waited
        ``wait_ms``: the batches recorded during the stall are written first)."""
        if self.since_s is not None and not still_stalled:
            _log.info(
                "journal_resumed",
                stalled_s=round(trio.current_time() - self.since_s, 3),
                pending_entries=self._pending_entries(),
            )
            self.since_s = None


class JournalWriter(Protocol):
    """How a batch of the journal reaches the broker: the delivery mode's part.

    Attributes:
        batches: batches written so far (delivered marks included).
        records: journal records written so far.
        bytes: bytes of journal records written so far.
        retries: writes tried again so far.
    """

    batches: int
    records: int
    bytes: int
    retries: int

    async def write(self, batch: Batch, fenced: Set[int], stall: Stall | None) -> dict[int, bool]:
        """Write ``batch``; the partitions whose record is void (another writer wrote there
        meanwhile), each with whether its current owner here wrote it. ``fenced``: the
        partitions fenced and not taken over again (their records are void too).

        Raises:
            TransportError: the broker refused a record for good.
        """
        ...

    async def mark_delivered(self, partitions: Iterable[int], fenced: Set[int]) -> dict[int, bool]:
        """Write each partition's delivered mark now, if this mode writes them apart; the
        partitions whose mark is void (as :meth:`write`)."""
        ...

    def expect(self, partition: int, offset: int) -> None:
        """This writer takes ``partition`` over at ``offset`` (the end it restored to)."""
        ...

    def forget(self, partition: int) -> None:
        """This writer no longer owns ``partition``."""
        ...

    async def open_partition(self, partition: int) -> None:
        """Before ``partition``'s restore reads the changelog."""
        ...

    async def close_partition(self, partition: int) -> None:
        """``partition`` left this replica."""
        ...
