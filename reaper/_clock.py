"""The clock (reaper layer concept: time conversion; the one bridge between trio and the core).

The core is told the time as integer milliseconds; trio measures it in float seconds on a clock
of its own (``trio.current_time()``, which ``MockClock`` replaces in tests). :class:`Clock` is the
only place that converts between the two: ``now_ms()`` is ``offset_ms`` plus trio's time floored
to the millisecond, and :meth:`Clock.to_trio_seconds` is its inverse, rounded so that sleeping
until the returned instant never wakes a millisecond early. Production captures the offset once
from the wall clock, so the core's milliseconds are epoch milliseconds; tests pick any offset.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import trio

from purgatory._core import UsageError

__all__ = ["Clock"]


@dataclass(frozen=True, slots=True)
class Clock:
    """Converts trio's float seconds to the core's integer milliseconds and back.

    ``now_ms() == offset_ms + floor(trio.current_time() * 1000)``.

    Args:
        offset_ms: the core time, in ms, that corresponds to trio time 0.

    Raises:
        UsageError: (a ``ValueError``) if ``offset_ms`` is not an int.
    """

    offset_ms: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.offset_ms, bool) or not isinstance(self.offset_ms, int):
            raise UsageError(f"offset_ms must be an int of milliseconds, got {self.offset_ms!r}")

    @classmethod
    def from_wall_clock(cls) -> Clock:
        """A clock whose milliseconds are Unix epoch milliseconds.

        Reads the wall clock once, here, and never again: afterwards time flows from trio's
        clock, which is monotonic, so a wall-clock step (NTP, leap smear) cannot move the core's
        time backward. Must be called inside ``trio.run``.

        Returns:
            A :class:`Clock` with the offset that maps trio's current time to the wall clock.
        """
        wall_ms = time.time_ns() // 1_000_000
        return cls(offset_ms=wall_ms - math.floor(trio.current_time() * 1000))

    def now_ms(self) -> int:
        """The current time in integer milliseconds (must be called inside ``trio.run``).

        Returns:
            ``offset_ms + floor(trio.current_time() * 1000)``.
        """
        return self.offset_ms + math.floor(trio.current_time() * 1000)

    def to_trio_seconds(self, time_ms: int) -> float:
        """The trio instant at which ``now_ms()`` first reaches ``time_ms``.

        ``time_ms / 1000`` alone can round to a float a hair below the millisecond, and
        ``now_ms()`` would then read ``time_ms - 1`` right after ``trio.sleep_until``: the wheel
        would be advanced to one ms before the deadline it woke for. So the result is nudged up,
        one float at a time (at most a few steps), until it floors back to ``time_ms``.

        Args:
            time_ms: a time on this clock, in ms.

        Returns:
            Trio seconds ``s`` such that ``offset_ms + floor(s * 1000) == time_ms``; sleeping
            until ``s`` therefore wakes with ``now_ms() >= time_ms``.
        """
        target = time_ms - self.offset_ms
        seconds = target / 1000
        while math.floor(seconds * 1000) < target:
            seconds = math.nextafter(seconds, math.inf)
        return seconds
