"""How long to wait before trying again (core concept: back-off; pure, told the attempt).

Every retry loop of the service waits by one policy: the first pause, doubled at each attempt
up to a ceiling, and, where two parties must not retry in step (two writers fenced by each
other), scaled by a random factor in [0.5, 1). Attempts count from 0. The callers:

========================  ===========  =========  =========================================
who                       first        most       what it waits for
========================  ===========  =========  =========================================
changelog write           50 ms        1 s        a journal record the broker refused, retriable
outbox send, commit       100 ms       5 s        a callback, dead letter or offset commit
fenced partition          0.5 s        10 s       restoring a partition another writer fenced
snapshotter restart       1 s          60 s       a snapshotter that exited after a short run
========================  ===========  =========  =========================================

(The HTTP clients pause as the service's ``Retry-After`` says instead: the service knows when
its partition will be back.)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from purgatory._core._errors import UsageError

__all__ = ["Backoff"]

_MAX_DOUBLINGS = 64  # 2**64 times any first pause is past every ceiling


@dataclass(frozen=True, slots=True)
class Backoff:
    """Exponential back-off: ``first_s``, doubling at each attempt, at most ``max_s``.

    Raises:
        UsageError: a pause is not positive, or ``max_s`` is below ``first_s``.
    """

    first_s: float
    max_s: float

    def __post_init__(self) -> None:
        if not 0 < self.first_s <= self.max_s:
            raise UsageError(
                f"need 0 < first_s <= max_s, got first_s={self.first_s}, max_s={self.max_s}"
            )

    def delay_s(self, attempt: int, jitter: random.Random | None = None) -> float:
        """The pause before retry number ``attempt`` (0: the first retry); scaled by a factor
        drawn from ``jitter`` in [0.5, 1) when given."""
        if attempt < 0:
            raise UsageError(f"attempt must be >= 0, got {attempt}")
        pause = min(self.max_s, self.first_s * 2.0 ** min(attempt, _MAX_DOUBLINGS))
        return pause * jitter.uniform(0.5, 1.0) if jitter is not None else pause
