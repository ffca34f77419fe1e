"""How long a fenced partition waits before it is restored again (service layer: dispatch).

Another writer appended to a partition's changelog: this replica stops serving it, and the
assignment follower restores it again from the changelog (if it is still ours) after a back-off
that doubles while the fences go on: two writers on one partition (a misconfiguration, which
the log, the metric and ``/readyz`` name) then take turns instead of fencing each other on every
batch. Fences more than ``streak_reset_s`` apart start the doubling again.
"""

from __future__ import annotations

import random

import trio

from purgatory._core._backoff import Backoff

__all__ = ["FENCE_BACKOFF", "FenceHoldOff"]

#: After a fence, a partition waits this long (doubling per fence in a row, up to the most;
#: with jitter) before it is restored again.
FENCE_BACKOFF = Backoff(first_s=0.5, max_s=10.0)
_STREAK_RESET_S = 300.0


class FenceHoldOff:
    """Each partition's fences, and until when it is held off.

    Args:
        jitter: draws the factor that keeps two writers from retrying in step.
    """

    def __init__(self, jitter: random.Random) -> None:
        self._jitter = jitter
        self.counts: dict[int, int] = {}  # partition -> times fenced
        self._streak: dict[int, tuple[int, float]] = {}  # partition -> (in a row, last)
        self._until: dict[int, float] = {}  # partition -> when it may be restored again

    def fenced(self, partition: int) -> tuple[float, int]:
        """Count a fence of ``partition``; its hold-off in seconds and fences in a row."""
        self.counts[partition] = self.counts.get(partition, 0) + 1
        now = trio.current_time()
        streak, last = self._streak.get(partition, (0, now))
        streak = streak + 1 if now - last < _STREAK_RESET_S else 1
        self._streak[partition] = (streak, now)
        delay = FENCE_BACKOFF.delay_s(streak - 1, self._jitter)  # two writers: not in step
        self._until[partition] = now + delay
        return delay, streak

    def holding_off(self, partition: int) -> bool:
        """Whether ``partition`` waits out its hold-off now."""
        return trio.current_time() < self._until.get(partition, 0.0)
