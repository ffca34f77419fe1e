"""The one back-off policy: doubling from the first pause up to the most, optionally jittered."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from purgatory._core import UsageError
from purgatory._core._backoff import Backoff

_PAUSES = st.floats(min_value=0.001, max_value=100.0)


@given(first=_PAUSES, extra=_PAUSES, attempt=st.integers(0, 10_000))
def test_the_pause_doubles_from_the_first_up_to_the_most(
    first: float, extra: float, attempt: int
) -> None:
    policy = Backoff(first_s=first, max_s=first + extra)
    model = first
    for _ in range(min(attempt, 80)):
        model = min(first + extra, model * 2)
    assert policy.delay_s(attempt) == pytest.approx(model)
    assert policy.delay_s(0) == first
    assert policy.delay_s(attempt) <= policy.delay_s(attempt + 1) <= first + extra


@given(seed=st.integers(0, 2**32), attempt=st.integers(0, 50))
def test_jitter_scales_the_pause_into_its_upper_half(seed: int, attempt: int) -> None:
    policy = Backoff(first_s=0.5, max_s=10.0)
    pause = policy.delay_s(attempt, random.Random(seed))
    assert 0.5 * policy.delay_s(attempt) <= pause < policy.delay_s(attempt)


def test_the_callers_pauses_are_the_documented_ones() -> None:
    assert [Backoff(0.05, 1.0).delay_s(n) for n in range(6)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0]
    assert [Backoff(0.1, 5.0).delay_s(n) for n in (0, 5, 6)] == [0.1, 3.2, 5.0]


@pytest.mark.parametrize(("first", "most"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_a_pause_that_is_not_positive_or_a_ceiling_below_it_is_refused(
    first: float, most: float
) -> None:
    with pytest.raises(UsageError, match="first_s"):
        Backoff(first_s=first, max_s=most)


def test_a_negative_attempt_is_refused() -> None:
    with pytest.raises(UsageError, match="attempt"):
        Backoff(0.1, 1.0).delay_s(-1)
