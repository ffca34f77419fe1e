"""Bounds on real waits grow with the slowest start seen, within limits."""

from __future__ import annotations

import pytest

from tests import bounds


def test_a_bound_grows_with_the_slowest_start_and_no_further_than_its_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(bounds, "_seen", {})  # this process's own figures stay as they are
    assert bounds.bound(30) == 30  # nothing timed yet: a quiet machine
    bounds.observe("kafka start", 4.0, 8.0)  # faster than quiet: never shrinks a bound
    assert bounds.bound(30) == 30
    bounds.observe("kafka start", 24.0, 8.0)
    bounds.observe("tansu start", 3.0, 1.5)
    assert bounds.factor() == 3.0  # the slowest ratio
    assert bounds.bound(30) == 90
    bounds.observe("purgatory dev ready", 1_000.0, 10.0)
    assert bounds.factor() == bounds.MAX_FACTOR  # past the cap a wait is stuck, not slow
