"""Tests of TTL'd per-key state against its contract and an obviously correct model."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from purgatory._core._errors import UsageError
from purgatory._core.engine.validate import MAX_TIME_MS
from purgatory._core.flink.ttl_state import (
    CleanupStrategy,
    StateVisibility,
    TtlConfig,
    TtlEntry,
    TtlState,
    TtlStatistics,
    UpdateType,
)

TIMERS = CleanupStrategy.TIMERS
INCREMENTAL = CleanupStrategy.INCREMENTAL


def _state(ttl_ms: int = 10, **kwargs: object) -> TtlState[str, str]:
    return TtlState(TtlConfig(ttl_ms, **kwargs))  # type: ignore[arg-type]


# -- unit tests ------------------------------------------------------------------------------


@pytest.mark.parametrize("cleanup", list(CleanupStrategy))
def test_entry_is_expired_exactly_at_last_access_plus_ttl(cleanup: CleanupStrategy) -> None:
    state = _state(10, cleanup=cleanup)
    state.put("k", "v", now_ms=100)
    assert state.get_entry("k", now_ms=109) == TtlEntry("v", 100, 110)
    assert state.get("k", now_ms=110) is None
    assert len(state) == 0


def test_timers_remove_exactly_the_due_entries() -> None:
    state = _state(10)
    state.put("a", "1", now_ms=0)
    state.put("b", "2", now_ms=5)
    assert state.next_expiration_ms() == 10
    assert state.advance_clock(9) == 0
    assert state.advance_clock(10) == 1
    assert len(state) == 1
    assert state.next_expiration_ms() == 15
    assert state.advance_clock(15) == 1
    assert state.next_expiration_ms() is None
    assert state.statistics() == TtlStatistics(entries=0, expired_removed=2, reads=0, writes=2)


def test_rewrite_moves_the_timer() -> None:
    state = _state(10)
    state.put("k", "old", now_ms=0)
    state.put("k", "new", now_ms=8)
    assert state.next_expiration_ms() == 18
    assert state.advance_clock(17) == 0
    assert state.get("k", now_ms=17) == "new"
    assert state.advance_clock(18) == 1


@pytest.mark.parametrize("cleanup", list(CleanupStrategy))
def test_read_refreshes_only_under_on_read_and_write(cleanup: CleanupStrategy) -> None:
    on_write = _state(10, cleanup=cleanup)
    on_read = _state(10, cleanup=cleanup, update_type=UpdateType.ON_READ_AND_WRITE)
    for state in (on_write, on_read):
        state.put("k", "v", now_ms=0)
        assert state.get("k", now_ms=7) == "v"
    assert on_write.get("k", now_ms=12) is None
    assert on_read.get_entry("k", now_ms=12) == TtlEntry("v", 12, 22)
    assert on_read.get("k", now_ms=21) == "v"


@pytest.mark.parametrize("cleanup", list(CleanupStrategy))
def test_return_expired_returns_it_once_then_it_is_cleaned(cleanup: CleanupStrategy) -> None:
    state = _state(
        10,
        cleanup=cleanup,
        update_type=UpdateType.ON_READ_AND_WRITE,
        visibility=StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP,
    )
    state.put("k", "v", now_ms=0)
    assert state.get_entry("k", now_ms=30) == TtlEntry("v", 0, 10)  # not refreshed
    assert state.get("k", now_ms=30) is None
    state.put("k", "v", now_ms=40)
    state.advance_clock(50)
    if cleanup is TIMERS:
        assert state.get("k", now_ms=50) is None


def test_incremental_cleanup_examines_the_budget_round_robin() -> None:
    state = _state(5, cleanup=INCREMENTAL, cleanup_budget=3)
    for i in range(10):
        state.put(f"k{i}", "v", now_ms=0)
    state.put("fresh", "v", now_ms=4)
    assert len(state) == 11
    assert state.get("missing", now_ms=5) is None
    assert len(state) == 8
    removed = [state.advance_clock(5) for _ in range(4)]
    assert all(count <= 3 for count in removed)
    assert sum(removed) == 7
    assert [key for key, _ in state.items(now_ms=5)] == ["fresh"]
    assert state.next_expiration_ms() is None
    assert state.statistics().expired_removed == 10


def test_expiry_saturates_at_max_time() -> None:
    state = _state(1 << 62)
    state.put("k", "v", now_ms=5)
    assert state.get_entry("k", now_ms=MAX_TIME_MS - 1) == TtlEntry("v", 5, MAX_TIME_MS)
    upcoming = state.next_expiration_ms()
    assert upcoming is not None
    assert upcoming <= MAX_TIME_MS  # a far entry sits in a coarse bucket that starts earlier
    assert state.advance_clock(MAX_TIME_MS - 1) == 0
    assert state.next_expiration_ms() == MAX_TIME_MS
    assert state.advance_clock(MAX_TIME_MS) == 1
    near_end = _state(100, cleanup=INCREMENTAL)
    near_end.put("k", "v", now_ms=MAX_TIME_MS - 10)
    assert near_end.get_entry("k", now_ms=MAX_TIME_MS - 1) == TtlEntry(
        "v", MAX_TIME_MS - 10, MAX_TIME_MS
    )
    assert near_end.items(now_ms=MAX_TIME_MS) == []


@pytest.mark.parametrize("cleanup", list(CleanupStrategy))
def test_restore_skips_expired_entries(cleanup: CleanupStrategy) -> None:
    state = _state(10, cleanup=cleanup)
    assert state.restore("old", "v", last_access_ms=0, now_ms=10) is False
    assert state.restore("live", "v", last_access_ms=0, now_ms=9) is True
    assert len(state) == 1
    assert state.items(now_ms=9) == [("live", TtlEntry("v", 0, 10))]
    if cleanup is TIMERS:
        assert state.next_expiration_ms() == 10


def test_items_never_contain_expired_state() -> None:
    state = _state(10, cleanup=INCREMENTAL)
    state.put("a", "1", now_ms=0)
    state.put("b", "2", now_ms=5)
    assert len(state) == 2
    assert state.items(now_ms=12) == [("b", TtlEntry("2", 5, 15))]


def test_time_may_go_backward_but_removal_is_not_undone() -> None:
    state = _state(10)
    state.put("k", "v", now_ms=100)
    assert state.get("k", now_ms=50) == "v"
    assert state.advance_clock(200) == 1
    assert state.get("k", now_ms=105) is None
    state.put("k", "v", now_ms=150)  # earlier than the wheel's clock: due at the next advance
    assert state.advance_clock(160) == 1


def test_delete() -> None:
    state = _state(10)
    state.put("k", "v", now_ms=0)
    assert state.delete("k") is True
    assert state.delete("k") is False
    assert state.next_expiration_ms() is None


def test_config_accepts_enum_strings() -> None:
    config = TtlConfig(
        5,
        update_type="on_read_and_write",  # type: ignore[arg-type]
        visibility="return_expired_if_not_cleaned_up",  # type: ignore[arg-type]
        cleanup="incremental",  # type: ignore[arg-type]
    )
    assert config.update_type is UpdateType.ON_READ_AND_WRITE
    assert config.visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
    assert config.cleanup is CleanupStrategy.INCREMENTAL


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"ttl_ms": 0}, "ttl_ms"),
        ({"ttl_ms": -5}, "ttl_ms"),
        ({"ttl_ms": True}, "ttl_ms"),
        ({"ttl_ms": "10"}, "ttl_ms"),
        ({"ttl_ms": 1 << 63}, "ttl_ms"),
        ({"ttl_ms": 10, "cleanup_budget": 0}, "cleanup_budget"),
        ({"ttl_ms": 10, "update_type": "sometimes"}, "update_type"),
        ({"ttl_ms": 10, "visibility": 3}, "visibility"),
        ({"ttl_ms": 10, "cleanup": None}, "cleanup"),
    ],
)
def test_invalid_config_names_the_field(kwargs: dict[str, object], name: str) -> None:
    with pytest.raises(UsageError, match=rf"^{name} "):
        TtlConfig(**kwargs)  # type: ignore[arg-type]


def test_invalid_times_name_the_argument() -> None:
    state = _state(10)
    with pytest.raises(UsageError, match=r"^now_ms "):
        state.put("k", "v", now_ms=-1)
    with pytest.raises(UsageError, match=r"^now_ms "):
        state.get("k", now_ms=1.5)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"^now_ms "):
        state.advance_clock(MAX_TIME_MS + 1)
    with pytest.raises(UsageError, match=r"^now_ms "):
        state.items(now_ms=None)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"^last_access_ms "):
        state.restore("k", "v", last_access_ms=-1, now_ms=0)
    with pytest.raises(UsageError, match=r"^config "):
        TtlState(10)  # type: ignore[arg-type]


# -- the state machine -----------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c", "d", "e"])


class TtlMachine(RuleBasedStateMachine):
    """Drives a TtlState beside a dict of key -> (value, last_access_ms).

    The model holds every entry that is live, plus expired ones that the state may or may not
    have cleaned up yet; expiry is the formula itself.
    """

    def __init__(self, cleanup: CleanupStrategy, update: UpdateType, vis: StateVisibility) -> None:
        super().__init__()
        self.cleanup, self.update, self.vis = cleanup, update, vis
        self.model: dict[str, tuple[int, int]] = {}
        self.now = 0
        self.ttl = 1
        self.reads = self.writes = 0
        self.state: TtlState[str, int] = TtlState(TtlConfig(1))

    @initialize(
        ttl=st.integers(1, 50),
        budget=st.integers(1, 4),
        start=st.sampled_from([0, 1_000, MAX_TIME_MS - 150]),
    )
    def setup(self, ttl: int, budget: int, start: int) -> None:
        self.ttl, self.now = ttl, start
        config = TtlConfig(ttl, self.update, self.vis, self.cleanup, budget)
        self.state = TtlState(config)

    def expires(self, last_access: int) -> int:
        return min(last_access + self.ttl, MAX_TIME_MS)

    def expired(self, key: str) -> bool:
        return self.expires(self.model[key][1]) <= self.now

    def live(self) -> dict[str, tuple[int, int]]:
        return {k: v for k, v in self.model.items() if self.expires(v[1]) > self.now}

    def advance(self, now: int) -> None:
        self.now = now
        removed = self.state.advance_clock(now)
        if self.cleanup is TIMERS:
            due = [key for key in self.model if self.expired(key)]
            assert removed == len(due)
            for key in due:
                del self.model[key]
            # after advance_clock(now) no stored entry is expired at now
            assert len(self.state) == len(self.model)
            upcoming = self.state.next_expiration_ms()
            assert upcoming is None or upcoming > now

    @rule(key=KEYS, value=st.integers())
    def put(self, key: str, value: int) -> None:
        self.state.put(key, value, now_ms=self.now)
        self.writes += 1
        self.model[key] = (value, self.now)

    @rule(key=KEYS)
    def get(self, key: str) -> None:
        entry = self.state.get_entry(key, now_ms=self.now)
        self.reads += 1
        if key not in self.model:
            assert entry is None
            return
        value, last_access = self.model[key]
        if self.expired(key):
            del self.model[key]  # a read of an expired entry cleans it up
            if self.vis is StateVisibility.NEVER_RETURN_EXPIRED:
                assert entry is None
            else:
                assert entry in (None, TtlEntry(value, last_access, self.expires(last_access)))
            return
        if self.update is UpdateType.ON_READ_AND_WRITE:
            last_access = self.now
            self.model[key] = (value, last_access)
        assert entry == TtlEntry(value, last_access, self.expires(last_access))

    @rule(key=KEYS)
    def delete(self, key: str) -> None:
        deleted = self.state.delete(key)
        if key not in self.model:
            assert not deleted
            return
        if not self.expired(key):
            assert deleted
        del self.model[key]

    @rule(key=KEYS, value=st.integers(), age=st.integers(-60, 120))
    def restore(self, key: str, value: int, age: int) -> None:
        last_access = min(max(self.now - age, 0), MAX_TIME_MS)
        restored = self.state.restore(key, value, last_access_ms=last_access, now_ms=self.now)
        assert restored == (self.expires(last_access) > self.now)
        if restored:
            self.model[key] = (value, last_access)

    @rule(delta=st.integers(0, 120))
    def advance_by(self, delta: int) -> None:
        self.advance(min(self.now + delta, MAX_TIME_MS))

    @precondition(lambda self: bool(self.live()))
    @rule(before=st.booleans())
    def advance_to_next_expiration(self, before: bool) -> None:
        """Land exactly on the earliest expiration (or 1 ms before it): the off-by-one edge."""
        live = self.live()
        target = min(self.expires(last) for _, last in live.values())
        if self.cleanup is TIMERS:
            upcoming = self.state.next_expiration_ms()
            assert upcoming is not None
            assert upcoming <= target
        self.advance(target - 1 if before else target)
        for key, (value, last) in sorted(live.items()):
            entry = self.state.get_entry(key, now_ms=self.now)
            self.reads += 1
            if self.expires(last) > self.now:
                refreshed = self.now if self.update is UpdateType.ON_READ_AND_WRITE else last
                self.model[key] = (value, refreshed)
                assert entry == TtlEntry(value, refreshed, self.expires(refreshed))
            else:
                if self.vis is StateVisibility.NEVER_RETURN_EXPIRED or self.cleanup is TIMERS:
                    assert entry is None
                else:
                    assert entry in (None, TtlEntry(value, last, self.expires(last)))
                self.model.pop(key, None)  # removed by advance_clock or by this read

    @invariant()
    def snapshot_is_exactly_the_live_entries(self) -> None:
        expected = [
            (key, TtlEntry(value, last, self.expires(last)))
            for key, (value, last) in sorted(self.live().items())
        ]
        assert sorted(self.state.items(now_ms=self.now)) == expected

    @invariant()
    def stored_entries_are_bounded_by_the_model(self) -> None:
        stored = len(self.state)
        if self.cleanup is TIMERS:
            assert stored == len(self.model)
            assert (self.state.next_expiration_ms() is None) == (not self.model)
        else:
            assert len(self.live()) <= stored <= len(self.model)
            assert self.state.next_expiration_ms() is None

    @invariant()
    def statistics_count_the_calls(self) -> None:
        stats = self.state.statistics()
        assert (stats.entries, stats.reads, stats.writes) == (
            len(self.state),
            self.reads,
            self.writes,
        )


@pytest.mark.parametrize("visibility", list(StateVisibility))
@pytest.mark.parametrize("update_type", list(UpdateType))
@pytest.mark.parametrize("cleanup", list(CleanupStrategy))
def test_ttl_state_against_model(
    cleanup: CleanupStrategy, update_type: UpdateType, visibility: StateVisibility
) -> None:
    class Bound(TtlMachine):
        def __init__(self) -> None:
            super().__init__(cleanup, update_type, visibility)

    run_state_machine_as_test(
        Bound,
        settings=settings(max_examples=100, stateful_step_count=50, deadline=None),
    )
