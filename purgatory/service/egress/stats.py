"""The outbox's statistics record (service layer), apart so that the metrics can read it."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["OutboxStatistics"]


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
