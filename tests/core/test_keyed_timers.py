"""Tests of keyed timers (Flink semantics) against their contract and a model."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from purgatory import UsageError
from purgatory._core.engine.validate import MAX_TIME_MS
from purgatory._core.flink.keyed_timers import FiredTimer, KeyedTimers, TimeDomain

P, E = TimeDomain.PROCESSING_TIME, TimeDomain.EVENT_TIME


def test_duplicate_registration_is_one_timer_and_missing_delete_is_a_no_op() -> None:
    timers = KeyedTimers()
    assert timers.register_processing_time_timer("s", "k", "ns", 100) is True
    assert timers.register_processing_time_timer("s", "k", "ns", 100) is False
    assert len(timers) == 1
    assert timers.delete_processing_time_timer("s", "k", "ns", 999) is False
    assert timers.delete_event_time_timer("s", "k", "ns", 100) is False
    assert timers.poll(100) == [FiredTimer(100, P, "s", "k", "ns")]
    assert timers.poll(1_000) == []
    assert len(timers) == 0


def test_timer_in_the_past_fires_at_next_poll_never_inside_register() -> None:
    timers = KeyedTimers()
    timers.poll(1_000)
    assert timers.register_processing_time_timer("s", "k", "ns", 10) is True
    timers.advance_watermark("s", 500)
    assert timers.register_event_time_timer("s", "k", "ns", 400) is True
    assert len(timers) == 2
    assert timers.next_expiration_ms(1_000) == 1_000
    assert timers.poll(1_000) == [
        FiredTimer(10, P, "s", "k", "ns"),
        FiredTimer(400, E, "s", "k", "ns"),
    ]


def test_event_time_follows_the_scope_watermark_which_is_monotonic() -> None:
    timers = KeyedTimers()
    timers.register_event_time_timer("a", "k", "ns", 100)
    timers.register_event_time_timer("b", "k", "ns", 100)
    assert timers.advance_watermark("a", 99) is True
    assert timers.poll(10**9) == []
    assert timers.advance_watermark("a", 100) is True
    assert timers.advance_watermark("a", 50) is False  # backward: a documented no-op
    assert timers.current_watermark("a") == 100
    assert timers.poll(0) == [FiredTimer(100, E, "a", "k", "ns")]
    assert timers.current_watermark("b") is None


def test_rearm_replaces_the_inactivity_timer() -> None:
    timers = KeyedTimers()
    for event_ms in (0, 300, 600):
        timers.rearm(P, "s", "session-1", "inactivity", event_ms + 900)
    assert timers.timestamps(P, "s", "session-1", "inactivity") == [1_500]
    assert timers.poll(1_499) == []
    assert timers.poll(1_500) == [FiredTimer(1_500, P, "s", "session-1", "inactivity")]


def test_deterministic_order_independent_of_registration_order() -> None:
    specs = [("s2", "k", 5), ("s1", "z", 5), ("s1", "a", 5), ("s1", "a", 3)]
    results = []
    for order in (specs, list(reversed(specs))):
        timers = KeyedTimers()
        for scope, key, ts in order:
            timers.register_processing_time_timer(scope, key, "n", ts)
        results.append([(f.timestamp_ms, f.scope, f.key) for f in timers.poll(5)])
    assert (
        results[0] == results[1] == [(3, "s1", "a"), (5, "s1", "a"), (5, "s1", "z"), (5, "s2", "k")]
    )


def test_coalescing_rounds_up_and_deduplicates() -> None:
    timers = KeyedTimers(coalesce_ms=100)
    assert timers.register_processing_time_timer("s", "k", "n", 101) is True
    assert timers.register_processing_time_timer("s", "k", "n", 199) is False
    assert timers.register_processing_time_timer("s", "k", "n", MAX_TIME_MS) is True
    assert timers.poll(199) == []
    assert timers.poll(200) == [FiredTimer(200, P, "s", "k", "n")]
    assert timers.delete_processing_time_timer("s", "k", "n", MAX_TIME_MS - 5) is True


def test_restore_flags_overdue_timers_late_and_bounds_catch_up() -> None:
    source = KeyedTimers()
    for i in range(25):
        source.register_processing_time_timer("s", f"k{i:02}", "n", 1_000 + i)
    source.register_processing_time_timer("s", "future", "n", 50_000)
    source.register_event_time_timer("s", "e", "n", 10)
    source.advance_watermark("s", 5)
    restored = KeyedTimers(max_fire_per_poll=10)
    restored.restore(source.registered(), source.watermarks(), now_ms=2_000)
    assert len(restored) == 27
    batches = [restored.poll(2_000) for _ in range(4)]
    assert [len(b) for b in batches] == [10, 10, 5, 0]
    fired = [f for batch in batches for f in batch]
    assert [f.key for f in fired] == [f"k{i:02}" for i in range(25)]
    assert all(f.late for f in fired)
    restored.advance_watermark("s", 10)
    late_event = restored.poll(2_000)
    assert late_event == [FiredTimer(10, E, "s", "e", "n", late=False)]
    assert restored.poll(50_000) == [FiredTimer(50_000, P, "s", "future", "n", late=False)]
    assert restored.statistics().late_fired == 25


def test_deleted_timer_waiting_in_the_backlog_never_fires() -> None:
    timers = KeyedTimers(max_fire_per_poll=1)
    timers.register_processing_time_timer("s", "a", "n", 1)
    timers.register_processing_time_timer("s", "b", "n", 1)
    assert [f.key for f in timers.poll(5)] == ["a"]
    timers.delete_processing_time_timer("s", "b", "n", 1)
    assert timers.poll(5) == []


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda t: t.register_processing_time_timer("", "k", "n", 1), "scope"),
        (lambda t: t.register_event_time_timer("s", None, "n", 1), "key"),
        (lambda t: t.register_event_time_timer("s", "k", 3, 1), "namespace"),
        (lambda t: t.register_processing_time_timer("s", "k", "n", -1), "timestamp_ms"),
        (lambda t: t.advance_watermark("s", 1.5), "watermark_ms"),
        (lambda t: t.poll(-1), "now_ms"),
        (lambda t: KeyedTimers(coalesce_ms=0), "coalesce_ms"),
        (lambda t: KeyedTimers(max_fire_per_poll=0), "max_fire_per_poll"),
    ],
)
def test_bad_input_names_the_argument(call: object, name: str) -> None:
    timers = KeyedTimers()
    with pytest.raises(UsageError, match=name):
        call(timers)  # type: ignore[operator]
    assert len(timers) == 0


_SCOPES = st.sampled_from(["s1", "s2"])
_KEYS = st.sampled_from(["k1", "k2"])


class KeyedTimersMachine(RuleBasedStateMachine):
    """Keyed timers against a model: a set of identities, watermarks and a clock."""

    @initialize(budget=st.sampled_from([1, 3, 1_000]), coalesce=st.sampled_from([1, 1, 10]))
    def setup(self, budget: int, coalesce: int) -> None:
        self.timers = KeyedTimers(max_fire_per_poll=budget, coalesce_ms=coalesce)
        self.budget = budget
        self.coalesce = coalesce
        self.model: set[tuple[int, str, str, str]] = set()  # (ts, domain, scope, key)
        self.watermarks: dict[str, int] = {}
        self.now = 0

    def _round(self, ts: int) -> int:
        return -(-ts // self.coalesce) * self.coalesce

    @rule(
        domain=st.sampled_from(list(TimeDomain)),
        scope=_SCOPES,
        key=_KEYS,
        offset=st.integers(-20, 200),
    )
    def register(self, domain: TimeDomain, scope: str, key: str, offset: int) -> None:
        ts = self._round(max(0, self.now + offset))
        ident = (ts, domain.value, scope, key)
        new = self.timers._register(domain, scope, key, "n", ts)
        assert new == (ident not in self.model)
        self.model.add(ident)

    @rule(
        domain=st.sampled_from(list(TimeDomain)),
        scope=_SCOPES,
        key=_KEYS,
        offset=st.integers(-20, 200),
    )
    def rearm(self, domain: TimeDomain, scope: str, key: str, offset: int) -> None:
        ts = self._round(max(0, self.now + offset))
        self.model = {i for i in self.model if i[1:] != (domain.value, scope, key)}
        self.model.add((ts, domain.value, scope, key))
        self.timers.rearm(domain, scope, key, "n", ts)

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        if not self.model:
            return
        ts, domain, scope, key = data.draw(st.sampled_from(sorted(self.model)))
        assert self.timers._delete(TimeDomain(domain), scope, key, "n", ts) is True
        self.model.discard((ts, domain, scope, key))

    @rule(scope=_SCOPES, step=st.integers(-30, 150))
    def watermark(self, scope: str, step: int) -> None:
        wm = max(0, self.watermarks.get(scope, 0) + step)
        moved = self.timers.advance_watermark(scope, wm)
        assert moved == (wm > self.watermarks.get(scope, -1))
        if moved:
            self.watermarks[scope] = wm

    def _due(self) -> list[tuple[int, str, str, str]]:
        return sorted(
            i
            for i in self.model
            if (i[1] == "processing_time" and i[0] <= self.now)
            or (i[1] == "event_time" and i[0] <= self.watermarks.get(i[2], -1))
        )

    def _poll(self) -> None:
        due = self._due()
        fired = [
            (f.timestamp_ms, f.domain.value, f.scope, f.key) for f in self.timers.poll(self.now)
        ]
        assert fired == sorted(fired)
        assert len(fired) == min(self.budget, len(due))
        assert set(fired) <= set(due)
        if self.budget >= len(due):
            assert fired == due
        self.model -= set(fired)

    @rule(step=st.integers(0, 120))
    def advance(self, step: int) -> None:
        self.now += step
        self._poll()

    @rule()
    def advance_exactly_to_next_processing_deadline(self) -> None:
        pending = [i[0] for i in self.model if i[1] == "processing_time" and i[0] > self.now]
        if pending:
            self.now = min(pending) - 1
            self._poll()
            self.now += 1
            self._poll()

    @invariant()
    def counts_match(self) -> None:
        assert len(self.timers) == len(self.model)


KeyedTimersMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
test_keyed_timers_against_model = KeyedTimersMachine.TestCase
