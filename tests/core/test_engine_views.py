"""The engine's views for operators (``busiest_scopes``, ``next_deadlines``, ``missing_keys``)
against an obviously correct model: the pending operations the engine reported, with their
deadlines, counted per scope and sorted. Views are driven step by step, some with inputs applied
between two steps, as the service's overview drives them."""

from __future__ import annotations

from collections.abc import Generator
from typing import TypeVar

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from purgatory._core._errors import ConflictError, LimitError
from purgatory._core.engine.engine import Engine
from purgatory._core.engine.engine_types import EngineConfig, RegistrationStatus
from purgatory._core.engine.model import Condition, OperationSpec, Outcome
from purgatory._core.flink.keyed_timers import TimeDomain

T = TypeVar("T")

SCOPES = ("a", "b", "c", "d")
KEYS = ("k1", "k2", "k3")
op_ids = st.sampled_from([f"op{i}" for i in range(12)])


def drive(view: Generator[None, None, tuple[list[T], bool]]) -> tuple[list[T], bool, int]:
    """The view's answer, whether it is complete, and how many steps it took."""
    steps = 0
    while True:
        try:
            next(view)
        except StopIteration as done:
            answer, complete = done.value
            return answer, complete, steps
        steps += 1


class Views(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.engine = Engine(EngineConfig(tick_ms=1, wheel_size=4), start_ms=self.now)
        self.pending: dict[tuple[str, str], OperationSpec] = {}
        self.signalled: set[tuple[str, str]] = set()

    def finished(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            del self.pending[(outcome.scope, outcome.op_id)]

    @rule(
        scope=st.sampled_from(SCOPES),
        op_id=op_ids,
        keys=st.lists(st.sampled_from(KEYS), max_size=3, unique=True),
        ahead_ms=st.one_of(st.integers(-5, 40), st.integers(0, 100_000)),
        event_time=st.booleans(),
        any_key=st.booleans(),
    )
    def register(
        self,
        *,
        scope: str,
        op_id: str,
        keys: list[str],
        ahead_ms: int,
        event_time: bool,
        any_key: bool,
    ) -> None:
        spec = OperationSpec(
            op_id=op_id,
            scope=scope,
            keys=tuple(keys),
            deadline_ms=max(0, self.now + ahead_ms),
            condition=Condition.ANY if any_key and keys else Condition.ALL,
            time_domain=TimeDomain.EVENT_TIME if event_time else TimeDomain.PROCESSING_TIME,
        )
        try:
            registration = self.engine.register(spec, now_ms=self.now)
        except (ConflictError, LimitError):
            return
        if registration.status in (RegistrationStatus.PENDING, RegistrationStatus.REARMED):
            self.pending[(scope, op_id)] = spec

    @rule(scope=st.sampled_from(SCOPES), key=st.sampled_from(KEYS))
    def signal(self, scope: str, key: str) -> None:
        self.signalled.add((scope, key))
        self.finished(self.engine.signal(scope, key, now_ms=self.now))

    @rule(scope=st.sampled_from(SCOPES), op_id=op_ids)
    def cancel(self, scope: str, op_id: str) -> None:
        outcome = self.engine.cancel(scope, op_id, now_ms=self.now)
        self.finished([outcome] if outcome is not None else [])

    @rule(by_ms=st.one_of(st.integers(0, 30), st.integers(0, 50_000)))
    def advance(self, by_ms: int) -> None:
        self.now += by_ms
        self.finished(self.engine.advance_clock(self.now))

    @precondition(lambda self: any(self.timed()))
    @rule()
    def advance_exactly_to_the_next_deadline(self) -> None:
        self.now = max(self.now, min(spec.deadline_ms for spec in self.timed()))
        self.finished(self.engine.advance_clock(self.now))

    @rule(count=st.integers(1, 6), step=st.integers(1, 4), scope=st.sampled_from(SCOPES))
    def a_view_read_while_inputs_go_on(self, count: int, step: int, scope: str) -> None:
        view = self.engine.next_deadlines(count, step=step)
        next(view)  # the visit of the wheel
        self.signal(scope, "k1")  # between two steps, as the service's inputs would
        answer, _, _ = drive(view)
        deadlines = [spec.deadline_ms for spec in answer]
        assert deadlines == sorted(deadlines)
        for spec in answer:  # only operations still pending, placed by their deadline now
            assert self.pending[(spec.scope, spec.op_id)] == spec

    def timed(self) -> list[OperationSpec]:
        return [
            spec for spec in self.pending.values() if spec.time_domain is TimeDomain.PROCESSING_TIME
        ]

    @invariant()
    def the_next_deadlines_are_the_earliest_pending(self) -> None:
        expected = sorted(spec.deadline_ms for spec in self.timed())
        for count in (1, 3, 50):
            for step in (1, 2, 10_000):
                answer, complete, _ = drive(self.engine.next_deadlines(count, step=step))
                assert complete
                deadlines = [spec.deadline_ms for spec in answer]
                assert deadlines == expected[:count]
                if deadlines:  # below the last place, exactly the model's operations
                    below = {(s.scope, s.op_id) for s in answer if s.deadline_ms < deadlines[-1]}
                    assert below == {
                        (s.scope, s.op_id) for s in self.timed() if s.deadline_ms < deadlines[-1]
                    }
                for spec in answer:
                    assert self.pending[(spec.scope, spec.op_id)] == spec

    @invariant()
    def the_busiest_scopes_are_counted_right(self) -> None:
        counts: dict[str, int] = {}
        for scope, _ in self.pending:
            counts[scope] = counts.get(scope, 0) + 1
        expected = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        assert self.engine.pending_scopes == len(counts)
        assert self.engine.pending_operations == len(self.pending)
        for count in (1, 2, 10):
            for step in (1, 3, 10_000):
                answer, complete, _ = drive(self.engine.busiest_scopes(count, step=step))
                assert complete
                assert [n for _, n in answer] == [n for _, n in expected[:count]]
                assert all(counts[scope] == n for scope, n in answer)
                assert answer == sorted(answer, key=lambda item: (-item[1], item[0]))

    @invariant()
    def missing_keys_are_the_keys_not_signalled(self) -> None:
        for (scope, _), spec in self.pending.items():
            missing = [k for k in spec.keys if (scope, k) not in self.signalled]
            assert self.engine.missing_keys(spec) == tuple(missing)


def test_views_match_the_model() -> None:
    run_state_machine_as_test(
        Views, settings=settings(max_examples=100, stateful_step_count=40, deadline=None)
    )


@pytest.mark.parametrize("step", [1, 7, 10_000])
def test_views_take_steps_of_at_most_step_items(step: int) -> None:
    engine = Engine(EngineConfig(), start_ms=0)
    for i in range(40):  # one far bucket: every deadline in one 512 ms tick of level 1
        spec = OperationSpec(op_id=f"o{i:02d}", scope=f"s{i % 8}", keys=("k",), deadline_ms=600)
        engine.register(spec, now_ms=0)
    answer, complete, steps = drive(engine.next_deadlines(5, step=step))
    assert complete and [s.deadline_ms for s in answer] == [600] * 5
    assert [s.op_id for s in answer] == ["o00", "o01", "o02", "o03", "o04"]  # the add order
    assert steps == 1 + 40 // step  # the visit, then a pause after each whole slice
    answer_scopes, complete, steps = drive(engine.busiest_scopes(3, step=step))
    assert complete and answer_scopes == [("s0", 5), ("s1", 5), ("s2", 5)]
    assert steps == -(-8 // step)  # a pause after each slice


def test_a_collection_that_changes_size_while_read_makes_the_view_partial() -> None:
    engine = Engine(EngineConfig(), start_ms=0)
    for i in range(10):
        engine.register(
            OperationSpec(op_id=f"o{i}", scope=f"s{i}", keys=("k",), deadline_ms=10_000),
            now_ms=0,
        )
    view = engine.busiest_scopes(3, step=4)
    next(view)
    engine.register(OperationSpec(op_id="new", scope="t", keys=("k",), deadline_ms=9), now_ms=0)
    answer, complete, _ = drive(view)
    assert not complete
    assert len(answer) == 3 and all(n == 1 for _, n in answer)
    deadlines = engine.next_deadlines(3, step=4)
    next(deadlines)  # the visit: one far bucket of 10, and the new near one
    next(deadlines)
    engine.register(OperationSpec(op_id="x", scope="u", keys=("k",), deadline_ms=10_000), now_ms=0)
    answer_specs, complete, _ = drive(deadlines)
    assert not complete
    assert [s.op_id for s in answer_specs][:1] == ["new"]


def test_event_time_operations_are_not_deadlines_on_the_clock() -> None:
    engine = Engine(EngineConfig(), start_ms=0)
    for i in range(3):
        engine.register(
            OperationSpec(
                op_id=f"e{i}",
                scope="s",
                keys=("k",),
                deadline_ms=5,
                time_domain=TimeDomain.EVENT_TIME,
            ),
            now_ms=0,
        )
    engine.register(OperationSpec(op_id="p", scope="s", keys=("k",), deadline_ms=7), now_ms=0)
    answer, complete, _ = drive(engine.next_deadlines(10))
    assert complete and [s.op_id for s in answer] == ["p"]
