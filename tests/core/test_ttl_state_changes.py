"""TtlState's change hook, ``peek`` and ``remove_expired``: totals kept from the hook always equal
what is stored, whatever removes an entry (expiry, cleanup, reads, deletes, restores)."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from purgatory._core.flink.ttl_state import CleanupStrategy, TtlConfig, TtlState, UpdateType

_KEY_NAMES = ("a", "b", "c", "d")
_KEYS = st.sampled_from(_KEY_NAMES)
_VALUES = st.integers(0, 9)


class Totals:
    """What an owner keeps from the hook alone: a count and a sum of the stored values."""

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.calls: list[tuple[str, int | None, int | None]] = []

    def __call__(self, key: str, old: int | None, new: int | None) -> None:
        assert old is not None or new is not None
        self.calls.append((key, old, new))
        self.count += (new is not None) - (old is not None)
        self.total += (new or 0) - (old or 0)


def test_the_hook_sees_creation_overwrite_removal_and_not_a_refresh() -> None:
    totals = Totals()
    state = TtlState(TtlConfig(10, UpdateType.ON_READ_AND_WRITE), on_change=totals)
    state.put("a", 1, now_ms=0)
    state.put("a", 5, now_ms=1)
    assert state.get("a", now_ms=2) == 5  # a refresh: no change
    state.put("b", 2, now_ms=2)
    assert state.delete("b")
    assert state.advance_clock(12) == 1  # "a", refreshed at 2, expires at 12
    assert totals.calls == [("a", None, 1), ("a", 1, 5), ("b", None, 2), ("b", 2, None),
                            ("a", 5, None)]  # fmt: skip


def test_peek_is_not_an_access() -> None:
    state: TtlState[str, int] = TtlState(TtlConfig(10, UpdateType.ON_READ_AND_WRITE))
    state.put("a", 1, now_ms=0)
    assert state.peek("a") == 1
    assert state.peek("z") is None
    assert state.statistics().reads == 0
    assert state.get_entry("a", now_ms=5) is not None
    assert state.peek("a") == 1  # expired at 15 now: peek shows what is stored, even expired
    assert state.peek_live("a", now_ms=14) == 1
    assert state.peek_live("a", now_ms=15) is None  # expired at 15, still stored
    assert state.peek_live("z", now_ms=0) is None
    assert state.statistics().reads == 1 and state.peek("a") == 1  # neither read nor removed
    assert state.get("a", now_ms=20) is None


@pytest.mark.parametrize("cleanup", list(CleanupStrategy))
def test_remove_expired_removes_exactly_the_expired_entries(cleanup: CleanupStrategy) -> None:
    totals = Totals()
    state = TtlState(TtlConfig(10, cleanup=cleanup, cleanup_budget=1), on_change=totals)
    for i, key in enumerate("abcd"):
        state.put(key, i, now_ms=i)
    assert state.remove_expired(12) == 3  # a, b and c expire at 10, 11 and 12
    assert [k for k, _ in state.items(now_ms=12)] == ["d"]
    assert (len(state), totals.count, totals.total) == (1, 1, 3)
    assert state.remove_expired(12) == 0


class HookMachine(RuleBasedStateMachine):
    """A TtlState whose hook keeps totals; they must equal a recount of what is stored."""

    def __init__(self, cleanup: CleanupStrategy) -> None:
        super().__init__()
        self.cleanup = cleanup
        self.now = 0
        self.totals = Totals()
        self.state: TtlState[str, int] = TtlState(TtlConfig(1))

    @initialize(ttl=st.integers(1, 30), budget=st.integers(1, 3), refresh=st.booleans())
    def setup(self, ttl: int, budget: int, refresh: bool) -> None:
        update = UpdateType.ON_READ_AND_WRITE if refresh else UpdateType.ON_CREATE_AND_WRITE
        config = TtlConfig(ttl, update, cleanup=self.cleanup, cleanup_budget=budget)
        self.state = TtlState(config, on_change=self.totals)

    @rule(key=_KEYS, value=_VALUES)
    def put(self, key: str, value: int) -> None:
        self.state.put(key, value, now_ms=self.now)

    @rule(key=_KEYS)
    def get(self, key: str) -> None:
        self.state.get(key, now_ms=self.now)

    @rule(key=_KEYS)
    def delete(self, key: str) -> None:
        self.state.delete(key)

    @rule(step=st.integers(0, 40))
    def advance(self, step: int) -> None:
        self.now += step
        self.state.advance_clock(self.now)

    @rule()
    def to_the_next_expiry(self) -> None:
        # Exactly on a deadline boundary, where off-by-one bugs hide.
        stored = [self.state._slots[k].deadline_ms for k in self.state._slots]
        if stored:
            self.now = max(self.now, min(stored))
        self.state.remove_expired(self.now)
        assert not [k for k in self.state._slots if self.state._slots[k].deadline_ms <= self.now]

    @rule(key=_KEYS, value=_VALUES, age=st.integers(0, 40))
    def restore(self, key: str, value: int, age: int) -> None:
        self.state.restore(key, value, last_access_ms=max(0, self.now - age), now_ms=self.now)

    @invariant()
    def peek_live_is_a_read_without_its_effects(self) -> None:
        # What a read at this moment would return (under NEVER_RETURN_EXPIRED), by the
        # stored deadlines, and nothing read, refreshed or removed.
        reads, stored = self.state.statistics().reads, len(self.state)
        for key in _KEY_NAMES:
            slot = self.state._slots.get(key)
            live = None if slot is None or slot.deadline_ms <= self.now else slot.value
            assert self.state.peek_live(key, now_ms=self.now) == live
        assert (self.state.statistics().reads, len(self.state)) == (reads, stored)

    @invariant()
    def totals_match_what_is_stored(self) -> None:
        stored = [self.state.peek(k) for k in list(self.state._slots)]
        assert self.totals.count == len(self.state) == len(stored)
        assert self.totals.total == sum(v for v in stored if v is not None)


@pytest.mark.parametrize("cleanup", list(CleanupStrategy))
def test_hook_totals_match_the_stored_entries(cleanup: CleanupStrategy) -> None:
    class Bound(HookMachine):
        def __init__(self) -> None:
            super().__init__(cleanup)

    run_state_machine_as_test(
        Bound, settings=settings(max_examples=150, stateful_step_count=40, deadline=None)
    )
