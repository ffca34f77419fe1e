"""Pages of a scope's pending operations (``Engine.pending_page``) against an obviously correct
model: the sorted set of the op_ids the engine reported pending and not yet finished."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from purgatory._core._errors import ConflictError, LimitError
from purgatory._core.durability.snapshot import restore_engine, snapshot_engine
from purgatory._core.engine import sorted_ids as _sorted_ids
from purgatory._core.engine.engine import Engine
from purgatory._core.engine.engine_types import EngineConfig, RegistrationStatus
from purgatory._core.engine.model import OperationSpec, Outcome
from purgatory._core.engine.sorted_ids import _SortedIds
from purgatory._core.flink.keyed_timers import TimeDomain

SCOPES = ("a", "b")
KEYS = ("k1", "k2", "k3")
op_ids = st.text(alphabet="xyz0", min_size=1, max_size=3)
CONFIG = EngineConfig(max_pending_per_scope=40)


def all_pages(engine: Engine, scope: str, limit: int) -> Iterator[list[str]]:
    """Every page of ``scope``, each from the last op_id of the one before."""
    after: str | None = None
    while True:
        page = [spec.op_id for spec in engine.pending_page(scope, after, limit)]
        if not page:
            return
        yield page
        after = page[-1]


class Pages(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.now = 1_000
        self.engine = Engine(CONFIG, start_ms=self.now)
        self.pending: dict[str, set[str]] = {scope: set() for scope in SCOPES}
        self.deadlines: dict[tuple[str, str], int] = {}  # processing-time deadlines pending

    def finished(self, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            self.pending[outcome.scope].remove(outcome.op_id)
            self.deadlines.pop((outcome.scope, outcome.op_id), None)

    @rule(
        scope=st.sampled_from(SCOPES),
        op_id=op_ids,
        keys=st.lists(st.sampled_from(KEYS), max_size=3, unique=True),
        ahead_ms=st.integers(-5, 50),
        event_time=st.booleans(),
    )
    def register(
        self, scope: str, op_id: str, keys: list[str], ahead_ms: int, event_time: bool
    ) -> None:
        domain = TimeDomain.EVENT_TIME if event_time else TimeDomain.PROCESSING_TIME
        spec = OperationSpec(
            op_id=op_id,
            scope=scope,
            keys=tuple(keys),
            deadline_ms=max(0, self.now + ahead_ms),
            time_domain=domain,
        )
        try:
            registration = self.engine.register(spec, now_ms=self.now)
        except (ConflictError, LimitError):
            return
        if registration.status is RegistrationStatus.PENDING:
            assert op_id not in self.pending[scope]
            self.pending[scope].add(op_id)
            if not event_time:
                self.deadlines[(scope, op_id)] = spec.deadline_ms
        elif registration.status is RegistrationStatus.REARMED and not event_time:
            self.deadlines[(scope, op_id)] = spec.deadline_ms

    @rule(scope=st.sampled_from(SCOPES), key=st.sampled_from(KEYS))
    def signal(self, scope: str, key: str) -> None:
        self.finished(self.engine.signal(scope, key, now_ms=self.now))

    @rule(scope=st.sampled_from(SCOPES), op_id=op_ids)
    def cancel(self, scope: str, op_id: str) -> None:
        outcome = self.engine.cancel(scope, op_id, now_ms=self.now)
        self.finished([outcome] if outcome is not None else [])

    @rule(by_ms=st.integers(0, 30))
    def advance(self, by_ms: int) -> None:
        self.now += by_ms
        self.finished(self.engine.advance_clock(self.now))

    @precondition(lambda self: bool(self.deadlines))
    @rule()
    def advance_exactly_to_the_next_deadline(self) -> None:
        self.now = max(self.now, min(self.deadlines.values()))
        self.finished(self.engine.advance_clock(self.now))

    @rule(scope=st.sampled_from(SCOPES), watermark_ms=st.integers(0, 1_200))
    def watermark(self, scope: str, watermark_ms: int) -> None:
        self.engine.advance_watermark(scope, watermark_ms)
        self.finished(self.engine.advance_clock(self.now))

    @rule()
    def restore_from_a_snapshot(self) -> None:
        data = snapshot_engine(self.engine)
        self.engine = restore_engine(data, now_ms=self.now, config=CONFIG)

    @rule(scope=st.sampled_from(SCOPES), after=op_ids, limit=st.integers(1, 5))
    def a_page_after_any_op_id(self, scope: str, after: str, limit: int) -> None:
        page = [spec.op_id for spec in self.engine.pending_page(scope, after, limit)]
        assert page == sorted(op for op in self.pending[scope] if op > after)[:limit]

    @invariant()
    def pages_list_the_pending_operations_once_in_order(self) -> None:
        for scope in SCOPES:
            expected = sorted(self.pending[scope])
            for limit in (1, 3, 100):
                pages = list(all_pages(self.engine, scope, limit))
                assert all(len(page) == limit for page in pages[:-1])
                assert [op for page in pages for op in page] == expected
            reference = sorted(spec.op_id for spec in self.engine.pending(scope))
            assert reference == expected


@pytest.mark.parametrize("block", [1, 512])
def test_pages_match_the_model(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Blocks of 1 make a scope of 3 operations switch to blocks, and split them.
    monkeypatch.setattr(_sorted_ids, "_BLOCK", block)
    run_state_machine_as_test(
        Pages, settings=settings(max_examples=100, stateful_step_count=40, deadline=None)
    )


def test_a_large_scope_is_paged_from_any_point() -> None:
    engine = Engine(EngineConfig(), start_ms=0)
    ids = [f"op-{i:05d}" for i in range(5_000)]
    for op_id in reversed(ids):  # registered out of order
        engine.register(OperationSpec(op_id, "big", ("k",), deadline_ms=10_000), now_ms=0)
    for op_id in ids[::3]:
        engine.cancel("big", op_id, now_ms=1)
    left = [op_id for i, op_id in enumerate(ids) if i % 3]
    assert [op for page in all_pages(engine, "big", 100) for op in page] == left
    page = engine.pending_page("big", "op-02500", 4)
    assert [spec.op_id for spec in page] == ["op-02501", "op-02503", "op-02504", "op-02506"]
    assert engine.pending_page("big", "op-99999", 10) == []
    assert engine.pending_page("nothing", None, 10) == []


@pytest.mark.parametrize("block", [1, 2, 8])
def test_sorted_ids_against_a_set(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # Small blocks split (over 2 * block items) and, from 8 on, merge (under block // 4).
    monkeypatch.setattr(_sorted_ids, "_BLOCK", block)
    items = st.text(alphabet="abcdef", min_size=1, max_size=2)

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.tuples(st.booleans() | st.just(True), items), max_size=300))
    def check(ops: list[tuple[bool, str]]) -> None:
        ids = _SortedIds([])
        model: set[str] = set()
        for add, item in ops:
            if add and item not in model:
                ids.add(item)
                model.add(item)
            elif not add and item in model:
                ids.remove(item)
                model.remove(item)
            assert bool(ids) == bool(model)
            assert ids.after(None, 1_000) == sorted(model)
            assert ids.after(item, 2) == sorted(x for x in model if x > item)[:2]

    check()
