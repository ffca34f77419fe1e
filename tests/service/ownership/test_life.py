"""The table of a partition's life: every transition, and random lives against a model."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory._core import InvariantError
from purgatory.service.ownership.life import (
    FENCE_BACKOFF,
    RESTORE_BACKOFF,
    LifeEvent,
    LifeTable,
    PartitionState,
)

S, E = PartitionState, LifeEvent

# The table of the module docstring, written out once more: (state, event) -> next state.
ALLOWED = {
    (S.TAKEN, E.BEGIN): S.RESTORING,
    (S.FENCED, E.BEGIN): S.RESTORING,
    (S.RESTORING, E.RESTORED): S.SERVING,
    (S.RESTORING, E.FAILED): S.TAKEN,
    (S.TAKEN, E.FENCED): S.TAKEN,
    (S.RESTORING, E.FENCED): S.FENCED,
    (S.SERVING, E.FENCED): S.FENCED,
    (S.FENCED, E.FENCED): S.FENCED,
    (S.HANDING_OVER, E.FENCED): S.HANDING_OVER,
    (S.TAKEN, E.REVOKED): S.HANDING_OVER,
    (S.RESTORING, E.REVOKED): S.HANDING_OVER,
    (S.SERVING, E.REVOKED): S.HANDING_OVER,
    (S.FENCED, E.REVOKED): S.HANDING_OVER,
    (S.HANDING_OVER, E.REVOKED): S.HANDING_OVER,
    (S.HANDING_OVER, E.HANDED_OVER): S.DROPPED,
}

# A path from ``taken`` to each state, to test every (state, event) pair from there.
PATHS = {
    S.TAKEN: [],
    S.RESTORING: [E.BEGIN],
    S.SERVING: [E.BEGIN, E.RESTORED],
    S.FENCED: [E.BEGIN, E.RESTORED, E.FENCED],
    S.HANDING_OVER: [E.REVOKED],
}


@pytest.mark.parametrize("state", list(PATHS), ids=lambda s: s.value)
@pytest.mark.parametrize("event", list(LifeEvent), ids=lambda e: e.value)
def test_every_event_in_every_state_moves_as_the_table_says_or_is_a_bug(
    state: PartitionState, event: LifeEvent
) -> None:
    table = LifeTable(random.Random(0))
    table.take(3, 0.0)
    for step in PATHS[state]:
        table.on(3, step, 1.0)
    assert table.state(3) is state
    expected = ALLOWED.get((state, event))
    if expected is None:
        with pytest.raises(InvariantError, match=f"{event.value} for partition 3"):
            table.on(3, event, 2.0)
        assert table.state(3) is state  # nothing changed
    else:
        table.on(3, event, 2.0)
        assert table.state(3) is expected
        assert (table.get(3) is None) == (expected is S.DROPPED)


def test_a_restore_that_fails_waits_a_growing_back_off_with_its_reason() -> None:
    table = LifeTable(random.Random(0))
    table.take(0, 0.0)
    waits = []
    now = 0.0
    for _ in range(4):
        assert table.due(now) == [0]
        table.on(0, E.BEGIN, now)
        life = table.on(0, E.FAILED, now, reason="RequestTimedOutError")
        assert life.state is S.TAKEN and life.reason == "RequestTimedOutError"
        waits.append(life.until_s - now)
        assert table.due(now) == []  # not before its back-off is over
        now = life.until_s
    # Each wait is within the back-off's bounds for its attempt (jitter: [0.5, 1) of it).
    for attempt, wait in enumerate(waits):
        assert 0.5 * RESTORE_BACKOFF.delay_s(attempt) <= wait < RESTORE_BACKOFF.delay_s(attempt)
    table.on(0, E.BEGIN, now)
    life = table.on(0, E.RESTORED, now)
    assert (life.state, life.reason, life.failures) == (S.SERVING, None, 0)


def test_fences_in_a_row_double_the_hold_off_and_are_counted_across_lives() -> None:
    table = LifeTable(random.Random(0))
    table.take(1, 0.0)
    table.on(1, E.BEGIN, 0.0)
    table.on(1, E.RESTORED, 0.0)
    now = 0.0
    for streak in range(1, 4):
        life = table.on(1, E.FENCED, now)
        assert (life.state, life.streak, life.fences) == (S.FENCED, streak, streak)
        hold = life.until_s - now
        assert 0.5 * FENCE_BACKOFF.delay_s(streak - 1) <= hold < FENCE_BACKOFF.delay_s(streak - 1)
        now = life.until_s
        table.on(1, E.BEGIN, now)
        table.on(1, E.RESTORED, now)
    table.on(1, E.REVOKED, now)
    table.on(1, E.HANDED_OVER, now)
    assert table.get(1) is None and table.fences() == {1: 3}
    again = table.take(1, now)  # given back: a new life, its fences remembered
    assert (again.state, again.fences, again.streak) == (S.TAKEN, 3, 0)


def test_a_partition_is_taken_once_and_events_need_it_held() -> None:
    table = LifeTable(random.Random(0))
    table.take(2, 0.0)
    with pytest.raises(InvariantError, match="taken twice"):
        table.take(2, 0.0)
    with pytest.raises(InvariantError, match="not held"):
        table.on(5, E.BEGIN, 0.0)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([*LifeEvent, "take"]), st.floats(0, 5)),
        max_size=60,
    )
)
def test_random_lives_match_a_model_of_the_table(
    steps: list[tuple[int, LifeEvent | str, float]],
) -> None:
    """A model: a dict of states moved by ``ALLOWED``; the table agrees after every step, and
    its queries (held, in_state, due) agree with the model."""
    table = LifeTable(random.Random(1))
    model: dict[int, PartitionState] = {}
    fences: dict[int, int] = {}
    now = 0.0
    for partition, event, dt in steps:
        now += dt
        if event == "take":
            if partition in model:
                with pytest.raises(InvariantError):
                    table.take(partition, now)
            else:
                table.take(partition, now)
                model[partition] = S.TAKEN
            continue
        assert isinstance(event, LifeEvent)
        expected = ALLOWED.get((model[partition], event)) if partition in model else None
        if expected is None:
            with pytest.raises(InvariantError):
                table.on(partition, event, now)
            continue
        table.on(partition, event, now)
        if event is E.FENCED:
            fences[partition] = fences.get(partition, 0) + 1
        if expected is S.DROPPED:
            del model[partition]
        else:
            model[partition] = expected
        assert [life.partition for life in table.held()] == sorted(model)
        for state in PartitionState:
            assert table.in_state(state) == {p for p, s in model.items() if s is state}
        for p in table.due(now):
            life = table.get(p)
            assert life is not None and model[p] in {S.TAKEN, S.FENCED} and now >= life.until_s
        assert table.fences() == fences
