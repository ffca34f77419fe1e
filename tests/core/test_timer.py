"""Tests of the hierarchical timing wheel against its contract and an obviously correct model."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from purgatory import MAX_TIME_MS, Timer, TimerTask, UsageError


def test_worked_example_from_the_module_docstring() -> None:
    timer = Timer(tick_ms=1, wheel_size=20)
    a, b, c = TimerTask(deadline_ms=5), TimerTask(deadline_ms=30), TimerTask(deadline_ms=450)
    for task in (a, b, c):
        timer.add(task)
    assert timer.statistics().levels == 3
    assert timer.next_expiration_ms() == 5
    assert timer.advance_clock(20) == [a]
    assert timer.next_expiration_ms() == 30
    assert timer.advance_clock(29) == []
    assert timer.advance_clock(30) == [b]
    assert timer.next_expiration_ms() == 400
    assert timer.advance_clock(1000) == [c]
    assert len(timer) == 0
    assert timer.next_expiration_ms() is None
    assert timer.statistics().fired == 3


def test_due_task_is_not_dropped_but_returned_by_next_advance() -> None:
    timer = Timer(start_ms=1_000)
    past, now = TimerTask(deadline_ms=10), TimerTask(deadline_ms=1_000)
    timer.add(past)
    timer.add(now)
    assert len(timer) == 2
    assert timer.next_expiration_ms() == 10
    assert timer.advance_clock(1_000) == [past, now]


def test_ties_come_back_in_insertion_order_across_levels() -> None:
    timer = Timer(tick_ms=1, wheel_size=4)
    early = TimerTask(deadline_ms=100)
    timer.add(early)  # lands on a high level
    assert timer.advance_clock(95) == []
    late = TimerTask(deadline_ms=100)
    timer.add(late)  # lands on level 0, added after `early`
    assert timer.advance_clock(100) == [early, late]


def test_coarse_tick_is_still_exact_to_the_millisecond() -> None:
    timer = Timer(tick_ms=100, wheel_size=10)
    tasks = [TimerTask(deadline_ms=d) for d in (150, 101, 199, 250)]
    for task in tasks:
        timer.add(task)
    assert timer.advance_clock(100) == []
    assert [t.deadline_ms for t in timer.advance_clock(150)] == [101, 150]
    assert timer.next_expiration_ms() == 199
    assert [t.deadline_ms for t in timer.advance_clock(249)] == [199]
    assert [t.deadline_ms for t in timer.advance_clock(250)] == [250]


def test_cancel_and_readd_move_a_task() -> None:
    timer = Timer()
    task = TimerTask(deadline_ms=50)
    timer.add(task)
    task.cancel()
    task.cancel()  # idempotent
    assert len(timer) == 0
    assert not task.is_scheduled
    assert timer.advance_clock(60) == []
    timer.add(task)
    timer.add(task)  # re-adding moves, never duplicates
    assert len(timer) == 1
    task.deadline_ms = 500  # setting the deadline of a scheduled task moves it
    assert timer.advance_clock(499) == []
    assert timer.advance_clock(500) == [task]


def test_clock_never_moves_backward() -> None:
    timer = Timer(start_ms=100)
    timer.advance_clock(50)
    assert timer.clock_ms == 100
    task = TimerTask(deadline_ms=70)
    timer.add(task)
    assert timer.advance_clock(60) == []
    assert timer.advance_clock(70) == [task]


def test_far_deadline_grows_levels_and_fires_exactly() -> None:
    timer = Timer()
    task = TimerTask(deadline_ms=MAX_TIME_MS)
    timer.add(task)
    assert timer.advance_clock(MAX_TIME_MS - 1) == []
    assert timer.advance_clock(MAX_TIME_MS) == [task]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"tick_ms": 0}, "tick_ms"),
        ({"tick_ms": 1.5}, "tick_ms"),
        ({"wheel_size": 1}, "wheel_size"),
        ({"wheel_size": "20"}, "wheel_size"),
        ({"start_ms": -1}, "start_ms"),
    ],
)
def test_invalid_timer_arguments_name_the_argument(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(ValueError, match=name):
        Timer(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("deadline", [-1, 1.0, "5", True, None, MAX_TIME_MS + 1, 10**30])
def test_invalid_deadline_names_the_argument(deadline: object) -> None:
    with pytest.raises(UsageError, match="deadline_ms"):
        TimerTask(deadline_ms=deadline)  # type: ignore[arg-type]
    task = TimerTask(deadline_ms=1)
    with pytest.raises(UsageError, match="deadline_ms"):
        task.deadline_ms = deadline  # type: ignore[assignment]


def test_invalid_now_names_the_argument() -> None:
    with pytest.raises(UsageError, match="now_ms"):
        Timer().advance_clock(-5)


class TimerMachine(RuleBasedStateMachine):
    """The wheel against a model: a dict of live tasks; due = deadline <= now, sorted."""

    tasks = Bundle("tasks")

    @initialize(
        tick=st.sampled_from([1, 1, 2, 7, 100]),
        size=st.sampled_from([2, 3, 8, 20]),
        start=st.integers(0, 10_000),
    )
    def setup(self, tick: int, size: int, start: int) -> None:
        self.timer = Timer(tick_ms=tick, wheel_size=size, start_ms=start)
        self.now = start
        self.model: dict[TimerTask, int] = {}  # task -> insertion sequence
        self.seq = 0

    def _schedule(self, task: TimerTask) -> None:
        self.timer.add(task)
        self.model.pop(task, None)
        self.seq += 1
        self.model[task] = self.seq

    @rule(target=tasks, offset=st.integers(-50, 5_000) | st.integers(5_000, 10**7))
    def add(self, offset: int) -> TimerTask:
        task = TimerTask(deadline_ms=max(0, self.now + offset))
        self._schedule(task)
        return task

    @rule(task=tasks)
    def cancel(self, task: TimerTask) -> None:
        task.cancel()
        self.model.pop(task, None)

    @rule(task=tasks, offset=st.integers(-10, 3_000))
    def readd(self, task: TimerTask, offset: int) -> None:
        task.deadline_ms = max(0, self.now + offset)
        self._schedule(task)

    @rule(task=consumes(tasks))
    def forget(self, task: TimerTask) -> None:
        task.cancel()
        self.model.pop(task, None)

    def _advance(self, now: int) -> None:
        got = self.timer.advance_clock(now)
        expected = sorted(
            (t for t in self.model if t.deadline_ms <= now),
            key=lambda t: (t.deadline_ms, self.model[t]),
        )
        assert got == expected
        for task in got:
            del self.model[task]
            assert not task.is_scheduled
        self.now = max(self.now, now)

    @rule(step=st.integers(0, 30) | st.integers(30, 100_000))
    def advance(self, step: int) -> None:
        self._advance(self.now + step)

    @precondition(lambda self: self.model)
    @rule()
    def advance_exactly_to_next_deadline(self) -> None:
        earliest = min(t.deadline_ms for t in self.model)
        nxt = self.timer.next_expiration_ms()
        assert nxt is not None
        assert nxt <= max(earliest, self.now), "the reaper would wake too late"
        if earliest > self.now:
            self._advance(earliest - 1)  # one millisecond early: nothing of it is due
            assert any(t.deadline_ms == earliest for t in self.model)
        self._advance(earliest)

    @rule(back=st.integers(1, 100))
    def advance_backward_is_harmless(self, back: int) -> None:
        self._advance(max(0, self.now - back))

    @invariant()
    def counts_match(self) -> None:
        assert len(self.timer) == len(self.model)
        assert self.timer.statistics().pending == len(self.model)
        if not self.model:
            assert self.timer.next_expiration_ms() is None


TimerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
test_timer_against_model = TimerMachine.TestCase


@settings(max_examples=300, deadline=None)
@given(
    start=st.integers(0, 5_000),
    tick=st.sampled_from([1, 3, 10]),
    deadlines=st.lists(st.integers(0, 40_000), max_size=40),
    advances=st.lists(st.integers(0, 20_000), min_size=1, max_size=6),
)
def test_adding_all_at_once_is_adding_one_by_one(
    start: int, tick: int, deadlines: list[int], advances: list[int]
) -> None:
    """``_add_all`` (a restore's bulk path) schedules exactly as ``add`` in a loop: the same
    tasks come back at the same advances, in the same order."""
    ones, alls = (
        Timer(tick_ms=tick, wheel_size=8, start_ms=start),
        Timer(tick_ms=tick, wheel_size=8, start_ms=start),
    )
    by_one = [TimerTask(deadline_ms=d) for d in sorted(deadlines, key=lambda d: d % 7)]
    at_once = [TimerTask(deadline_ms=t.deadline_ms) for t in by_one]
    for task in by_one:
        ones.add(task)
    alls._add_all(at_once)
    assert len(alls) == len(ones)
    index = {id(t): i for i, t in enumerate(by_one)} | {id(t): i for i, t in enumerate(at_once)}
    now = start
    for step in advances:
        now += step
        assert [index[id(t)] for t in alls.advance_clock(now)] == [
            index[id(t)] for t in ones.advance_clock(now)
        ]
        assert alls.next_expiration_ms() == ones.next_expiration_ms()
    assert len(alls) == len(ones)
