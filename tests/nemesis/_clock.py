"""The nemesis's one home for real time: wall-clock milliseconds and real pauses.

The harness drives real processes over a real network, so it waits for real. Every process of a
run (the broker, the replicas, the harness) reads the same machine clock, so the wall-clock
milliseconds recorded here compare with the service's ``registered_ms``, ``outcome_ms`` and
``deadline_ms`` (epoch milliseconds) and with Kafka's record timestamps. Durations are measured
on the monotonic ``perf_counter``.
"""

from __future__ import annotations

import time

__all__ = ["Deadline", "elapsed_s", "pause", "wall_ms"]


def wall_ms() -> int:
    """Epoch milliseconds now (the clock the service's outcomes are stamped with)."""
    return time.time_ns() // 1_000_000


def elapsed_s() -> float:
    """A monotonic reading in seconds, for durations."""
    return time.perf_counter()


def pause(seconds: float) -> None:
    """Wait for real: processes and a network, not a virtual clock, are under test."""
    if seconds > 0:
        time.sleep(seconds)  # noqa: TID251 - real processes: real time


class Deadline:
    """A moment ``seconds`` from now on the monotonic clock."""

    def __init__(self, seconds: float) -> None:
        self._at_s = elapsed_s() + seconds

    def left_s(self) -> float:
        """Seconds until it passes (0 once passed)."""
        return max(0.0, self._at_s - elapsed_s())

    def passed(self) -> bool:
        return elapsed_s() >= self._at_s
