"""Tests for reaper._clock: trio seconds <-> core milliseconds, exact at the millisecond."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from purgatory import UsageError
from reaper import Clock

EPOCH_2025_MS = 1_763_769_600_000


async def test_now_ms_is_offset_plus_floored_trio_milliseconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock(offset_ms=EPOCH_2025_MS)
    assert clock.now_ms() == EPOCH_2025_MS
    await trio.sleep(1.2345)
    assert clock.now_ms() == EPOCH_2025_MS + 1234


def test_default_offset_is_zero() -> None:
    assert Clock().offset_ms == 0


@pytest.mark.parametrize("bad", [1.5, "0", None, True])
def test_offset_must_be_an_int(bad: object) -> None:
    with pytest.raises(UsageError, match="offset_ms"):
        Clock(offset_ms=bad)  # type: ignore[arg-type]


async def test_from_wall_clock_gives_epoch_milliseconds() -> None:
    clock = Clock.from_wall_clock()
    # Any date after 2020 and before 2100 will do: it is epoch milliseconds, not seconds.
    assert 1_577_836_800_000 < clock.now_ms() < 4_102_444_800_000


def test_to_trio_seconds_floors_back_to_the_same_millisecond() -> None:
    # The naive inverse is a millisecond early: 1001 / 1000 * 1000 == 1000.9999999999999.
    assert math.floor(1001 / 1000 * 1000) == 1000
    seconds = Clock().to_trio_seconds(1001)
    assert math.floor(seconds * 1000) == 1001
    assert seconds < 1.0011


@given(
    offset_ms=st.integers(min_value=-(10**13), max_value=10**13),
    time_ms=st.integers(min_value=0, max_value=10**12),
)
def test_to_trio_seconds_round_trips_exactly(offset_ms: int, time_ms: int) -> None:
    clock = Clock(offset_ms=offset_ms)
    seconds = clock.to_trio_seconds(offset_ms + time_ms)
    assert offset_ms + math.floor(seconds * 1000) == offset_ms + time_ms
    # The earliest such instant, give or take float steps: never a whole millisecond late.
    assert seconds <= (time_ms + 0.5) / 1000


@given(
    offset_ms=st.integers(min_value=0, max_value=10**13),
    start_s=st.floats(min_value=0, max_value=10**6, allow_nan=False, allow_infinity=False),
    ahead_ms=st.integers(min_value=0, max_value=10**9),
)
def test_sleeping_until_to_trio_seconds_wakes_in_that_millisecond(
    offset_ms: int, start_s: float, ahead_ms: int
) -> None:
    mock = trio.testing.MockClock(autojump_threshold=0)
    mock.jump(start_s)
    clock = Clock(offset_ms=offset_ms)

    async def main() -> None:
        target_ms = clock.now_ms() + ahead_ms
        await trio.sleep_until(clock.to_trio_seconds(target_ms))
        now_ms = clock.now_ms()
        assert target_ms <= now_ms < target_ms + 1

    trio.run(main, clock=mock)
