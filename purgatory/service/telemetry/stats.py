"""What the stages report, as values (service layer: telemetry, at the bottom).

Each stage counts its own work and gives it as one of these records (the outbox, the journal's
writer, the snapshot watch and the snapshotter's supervisor, the topics' layout); the metrics
read them at scrape time, so telemetry imports none of the stages that fill them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = [
    "ChangelogStatistics",
    "CountChange",
    "LayoutStatus",
    "OutboxStatistics",
    "SnapshotStatus",
    "SupervisorStatistics",
]


@dataclass(frozen=True, slots=True)
class OutboxStatistics:
    """Counts describing the outbox at one instant."""

    #: entries waiting to be handed to the producer (callbacks and dead letters)
    queued: int
    #: records handed to the producer and not yet acknowledged or settled
    in_flight: int
    #: callbacks acknowledged by the broker
    delivered: int
    #: records sent to the dead-letter topic instead (refused callbacks and inputs)
    dead_lettered: int
    #: re-sends of records the broker refused with a retriable error
    retries: int
    #: offset commits done, and failed (a failed commit is retried with later offsets)
    commits: int
    commit_failures: int


@dataclass(frozen=True, slots=True)
class ChangelogStatistics:
    """Counts of the journal writer since the start."""

    batches: int
    records: int
    entries: int
    bytes: int
    retries: int
    pending_entries: int
    unacknowledged_s: float = 0.0  # how long the oldest unacknowledged entry has waited
    stalled: bool = False  # that is wait_ms or longer


@dataclass(frozen=True, slots=True)
class SnapshotStatus:
    """One partition's latest snapshot, for the metrics.

    Attributes:
        partition: its number.
        age_s: seconds since its latest snapshot was written (none found yet: since the watch
            began).
        lag_records: changelog records after that snapshot (none: every record).
        journal_offset: the changelog offset the snapshot covers up to (0 without one).
        found: whether a snapshot was found at all.
    """

    partition: int
    age_s: float
    lag_records: int
    journal_offset: int
    found: bool


@dataclass(frozen=True, slots=True)
class SupervisorStatistics:
    """The supervisor's counts.

    Attributes:
        starts: children started, the first included (a start that failed is counted too).
        restarts: starts after the first: each follows an exit or a failed start.
        pid: the running child's process id (None while the back-off waits).
        last_exit: the last exit status (``-N``: killed by signal N), None before any exit.
    """

    starts: int
    restarts: int
    pid: int | None
    last_exit: int | None


@dataclass(frozen=True, slots=True)
class CountChange:
    """A topic's partition count changed while the service ran."""

    topic: str
    old: int
    new: int


@dataclass(frozen=True, slots=True)
class LayoutStatus:
    """The topics' partition counts at one instant (``/readyz`` and the metrics).

    Attributes:
        counts: the latest count seen of each topic checked.
        partitions: the one count they had at start (None: not checked yet).
        changes: every change seen while running, in order.
        inputs_stopped: why the service takes no inputs (None: it takes them).
    """

    counts: Mapping[str, int] = field(default_factory=dict)
    partitions: int | None = None
    changes: tuple[CountChange, ...] = ()
    inputs_stopped: str | None = None
