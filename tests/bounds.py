"""Bounds on real waits that grow with what this machine showed.

A wait on a real process (a broker to start, the service to be ready, a command to answer) has
a bound in seconds that holds on a quiet machine; a loaded one (a laptop with a browser open, a
CI runner beside other jobs) is slower, not broken. Each start the tests time is compared with
its quiet-machine figure, and every bound is multiplied by the largest ratio seen in this
process so far (at least 1, at most :data:`MAX_FACTOR`): a machine that took 40 s to start a
Kafka that starts in 8 s gets five times the bounds. A wait that runs out still fails, and says
what it waited for and the bound it had.
"""

from __future__ import annotations

__all__ = ["MAX_FACTOR", "bound", "factor", "observe"]

#: The most a bound grows: past this a wait is not slow, it is stuck.
MAX_FACTOR = 8.0

_seen: dict[str, float] = {}  # what was timed -> its ratio to the quiet-machine figure


def observe(what: str, took_s: float, quiet_s: float) -> None:
    """``what`` took ``took_s``; on a quiet machine it takes ``quiet_s``."""
    _seen[what] = max(_seen.get(what, 0.0), took_s / quiet_s)


def factor() -> float:
    """How much slower than a quiet one this machine showed itself (1 to :data:`MAX_FACTOR`)."""
    return min(MAX_FACTOR, max([1.0, *_seen.values()]))


def bound(seconds: float) -> float:
    """``seconds``, the bound on a quiet machine, grown by :func:`factor`."""
    return seconds * factor()
