"""Tests of the declarative engine: barriers, quorum, timers, event time, limits, snapshots."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from purgatory._core._engine import (
    ConflictError,
    Engine,
    EngineConfig,
    LimitError,
    RegistrationStatus,
)
from purgatory._core._errors import BadRecordError, UsageError
from purgatory._core._keyed_timers import TimeDomain
from purgatory._core._model import Condition, OperationSpec, Outcome, OutcomeKind
from purgatory._core._snapshot import restore_engine, snapshot_engine
from purgatory._core._ttl_state import TtlConfig

NIGHT = "ingest@2026-11-22"
KEYS = ("ingest/orders", "ingest/users", "ingest/stock")


def barrier(op_id: str = "nightly", deadline: int = 6_000, **kw: object) -> OperationSpec:
    return OperationSpec(op_id=op_id, scope=NIGHT, keys=KEYS, deadline_ms=deadline, **kw)  # type: ignore[arg-type]


def run_due(engine: Engine, now: int) -> list[Outcome]:
    for task in engine.advance_clock(now):
        task.run()
    return engine.drain_outcomes()


def test_barrier_completes_when_all_keys_signalled() -> None:
    engine = Engine()
    assert engine.register(barrier(payload='{"job": "report"}'), now_ms=0).status == "pending"
    assert engine.signal(NIGHT, "ingest/orders", now_ms=10, payload="o") == 0
    assert engine.signal(NIGHT, "ingest/users", now_ms=20) == 0
    assert engine.signal(NIGHT, "ingest/stock", now_ms=30, payload="s") == 1
    [out] = engine.drain_outcomes()
    assert out.outcome is OutcomeKind.COMPLETED
    assert (out.registered_ms, out.outcome_ms, out.sequence) == (0, 30, 1)
    assert out.keys == KEYS and out.missing == ()
    assert out.signals == {"ingest/orders": "o", "ingest/users": None, "ingest/stock": "s"}
    assert out.payload == '{"job": "report"}'
    assert run_due(engine, 10_000) == []


def test_barrier_expires_with_the_missing_keys_exactly_at_its_deadline() -> None:
    engine = Engine()
    engine.register(barrier(), now_ms=0)
    engine.signal(NIGHT, "ingest/users", now_ms=1)
    assert run_due(engine, 5_999) == []
    [out] = run_due(engine, 6_000)
    assert out.outcome is OutcomeKind.EXPIRED
    assert out.missing == ("ingest/orders", "ingest/stock")
    assert out.keys == ("ingest/users",)
    assert out.outcome_ms == out.deadline_ms == 6_000


def test_an_expiry_run_late_still_reports_its_deadline_as_outcome_time() -> None:
    engine = Engine()
    engine.register(barrier(), now_ms=0)
    due = engine.advance_clock(6_000)
    engine.advance_clock(6_250)  # the executor gets to it 250 ms later
    for task in due:
        task.run()
    [out] = engine.drain_outcomes()
    assert (out.outcome, out.outcome_ms) == (OutcomeKind.EXPIRED, 6_000)


def test_signal_before_its_waiter_counts() -> None:
    engine = Engine()
    for key in KEYS:
        engine.signal(NIGHT, key, now_ms=5)
    reg = engine.register(barrier(), now_ms=100)
    assert reg.status is RegistrationStatus.COMPLETED
    assert reg.outcome is not None and reg.outcome.outcome is OutcomeKind.COMPLETED
    assert engine.statistics().pending == 0


def test_yesterdays_signal_expires_with_its_ttl() -> None:
    engine = Engine(EngineConfig(signal_ttl=TtlConfig(ttl_ms=1_000)))
    engine.signal(NIGHT, "ingest/orders", now_ms=0)
    engine.advance_clock(1_000)
    assert engine.statistics().signals == 0
    engine.register(
        OperationSpec(op_id="a", scope=NIGHT, keys=("ingest/orders",), deadline_ms=5_000),
        now_ms=1_000,
    )
    assert engine.statistics().pending == 1


def test_any_and_count_conditions() -> None:
    engine = Engine()
    engine.register(barrier("any", condition=Condition.ANY), now_ms=0)
    engine.register(barrier("two", condition=Condition.COUNT, count=2), now_ms=0)
    assert engine.signal(NIGHT, "ingest/stock", now_ms=1) == 1
    assert (
        engine.signal(NIGHT, "ingest/stock", now_ms=2) == 0
    )  # the same key again is not a second key
    assert engine.signal(NIGHT, "ingest/users", now_ms=3) == 1
    assert [o.op_id for o in engine.drain_outcomes()] == ["any", "two"]


def test_signal_at_the_deadline_loses_to_the_expiry() -> None:
    engine = Engine()
    engine.register(barrier(condition=Condition.ANY), now_ms=0)
    assert engine.signal(NIGHT, "ingest/stock", now_ms=6_000) == 0  # expiry wins at the deadline
    [out] = run_due(engine, 6_000)
    assert out.outcome is OutcomeKind.EXPIRED
    late_key = OperationSpec(op_id="b", scope=NIGHT, keys=("ingest/users",), deadline_ms=7_000)
    assert engine.register(late_key, now_ms=6_000).status is RegistrationStatus.PENDING
    assert engine.signal(NIGHT, "ingest/users", now_ms=6_999) == 1  # one ms before: completes


def test_event_time_deadline_follows_the_watermark_and_replays_identically() -> None:
    def replay() -> list[tuple[str, str, int]]:
        engine = Engine()
        spec = barrier(deadline=1_000, time_domain=TimeDomain.EVENT_TIME)
        engine.register(spec, now_ms=123)
        engine.register(
            barrier("later", deadline=5_000, time_domain=TimeDomain.EVENT_TIME), now_ms=124
        )
        out: list[Outcome] = []
        for wall, watermark in ((200, 500), (10_000, 999), (10_001, 400), (99_000, 1_000)):
            engine.advance_watermark(NIGHT, watermark)
            out += run_due(engine, wall)
        return [(o.op_id, o.outcome.value, o.deadline_ms) for o in out]

    assert replay() == replay() == [("nightly", "expired", 1_000)]


def test_timer_fires_rearms_and_deduplicates() -> None:
    engine = Engine()
    timer = OperationSpec(op_id="session-42", scope="clicks", keys=(), deadline_ms=900)
    assert engine.register(timer, now_ms=0).status is RegistrationStatus.PENDING
    assert engine.register(timer, now_ms=1).status is RegistrationStatus.DUPLICATE
    moved = OperationSpec(op_id="session-42", scope="clicks", keys=(), deadline_ms=1_500)
    assert engine.register(moved, now_ms=600).status is RegistrationStatus.REARMED
    assert run_due(engine, 1_499) == []
    [out] = run_due(engine, 1_500)
    assert (out.op_id, out.outcome, out.deadline_ms) == ("session-42", OutcomeKind.EXPIRED, 1_500)
    again = engine.register(moved, now_ms=1_600)
    assert again.status is RegistrationStatus.DUPLICATE and again.outcome == out
    fresh = OperationSpec(op_id="session-42", scope="clicks", keys=(), deadline_ms=3_000)
    assert engine.register(fresh, now_ms=1_700).status is RegistrationStatus.PENDING


def test_cancel_is_a_terminal_outcome() -> None:
    engine = Engine()
    engine.register(barrier(), now_ms=0)
    out = engine.cancel(NIGHT, "nightly", now_ms=10)
    assert out is not None and out.outcome is OutcomeKind.CANCELLED and out.missing == KEYS
    assert engine.cancel(NIGHT, "nightly", now_ms=11) is None
    for key in KEYS:
        engine.signal(NIGHT, key, now_ms=12)
    assert run_due(engine, 100_000) == [out]  # only the cancel itself was emitted


def test_idempotent_registration_and_conflicts() -> None:
    engine = Engine()
    engine.register(barrier(), now_ms=0)
    with pytest.raises(ConflictError, match="op_id"):
        engine.register(barrier(deadline=9_999), now_ms=1)
    for key in KEYS:
        engine.signal(NIGHT, key, now_ms=2)
    assert engine.register(barrier(), now_ms=3).status is RegistrationStatus.DUPLICATE
    with pytest.raises(ConflictError):
        engine.register(barrier(payload="other"), now_ms=4)


def test_limits_answer_limit_error_and_change_nothing() -> None:
    engine = Engine(EngineConfig(max_pending_per_scope=2, max_pending=3))
    engine.register(barrier("a"), now_ms=0)
    engine.register(barrier("b"), now_ms=0)
    with pytest.raises(LimitError, match="max_pending_per_scope"):
        engine.register(barrier("c"), now_ms=0)
    engine.register(OperationSpec(op_id="x", scope="other", keys=("k",), deadline_ms=9), now_ms=0)
    with pytest.raises(LimitError, match="max_pending "):
        engine.register(
            OperationSpec(op_id="y", scope="third", keys=("k",), deadline_ms=9), now_ms=0
        )
    assert engine.statistics().pending == 3


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"op_id": ""}, "op_id"),
        ({"scope": None}, "scope"),
        ({"keys": ["a"]}, "keys"),
        ({"keys": ("a", "a")}, "keys"),
        ({"keys": ("a", "")}, "keys"),
        ({"deadline_ms": -1}, "deadline_ms"),
        ({"condition": "most"}, "condition"),
        ({"condition": "count", "count": 4}, "count"),
        ({"count": 1}, "count"),
        ({"time_domain": "wall"}, "time_domain"),
        ({"payload": 5}, "payload"),
    ],
)
def test_bad_specs_name_the_field(kwargs: dict[str, object], field: str) -> None:
    base: dict[str, object] = {
        "op_id": "o",
        "scope": "s",
        "keys": ("a", "b", "c"),
        "deadline_ms": 1,
    }
    with pytest.raises(UsageError, match=field):
        OperationSpec(**{**base, **kwargs})  # type: ignore[arg-type]


def test_restore_flags_overdue_operations_late_and_catches_up_in_bounded_steps() -> None:
    engine = Engine()
    for i in range(25):
        engine.register(barrier(f"op{i:02}", deadline=1_000 + i), now_ms=0)
    engine.register(barrier("future", deadline=90_000), now_ms=0)
    data = snapshot_engine(engine)
    restored = restore_engine(data, now_ms=50_000, config=EngineConfig(max_fire_per_step=10))
    batches = [run_due(restored, 50_000) for _ in range(4)]
    assert [len(b) for b in batches] == [10, 10, 5, 0]
    fired = [o for b in batches for o in b]
    assert [o.op_id for o in fired] == [f"op{i:02}" for i in range(25)]
    assert all(o.late and o.outcome is OutcomeKind.EXPIRED for o in fired)
    assert [o.sequence for o in fired] == list(range(1, 26))
    [future] = run_due(restored, 90_000)
    assert not future.late


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"nonsense", "magic"),
        (b"PURGATORY-SNAPSHOT\n\x00\x09rest", "version 9"),
        (b"PURGATORY-SNAPSHOT\n\x00\x01not zlib", "damaged"),
    ],
)
def test_bad_snapshots_are_rejected_clearly(data: bytes, message: str) -> None:
    with pytest.raises(BadRecordError, match=message):
        restore_engine(data, now_ms=0)


# -- snapshot round trip as a property: restore(snapshot(x)) behaves as x -----------------------

_SCOPES = st.sampled_from(["s1", "s2"])
_KEYNAMES = st.sampled_from(["a", "b", "c"])
_SPECS = st.builds(
    lambda op_id, scope, keys, delay, cond, domain: (op_id, scope, keys, delay, cond, domain),
    st.sampled_from(["o1", "o2", "o3", "o4"]),
    _SCOPES,
    st.lists(_KEYNAMES, unique=True, max_size=3).map(tuple),
    st.integers(0, 500),
    st.sampled_from(["all", "any"]),
    st.sampled_from(list(TimeDomain)),
)
_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("register"), _SPECS),
        st.tuples(st.just("signal"), st.tuples(_SCOPES, _KEYNAMES)),
        st.tuples(st.just("watermark"), st.tuples(_SCOPES, st.integers(0, 800))),
        st.tuples(st.just("cancel"), st.tuples(_SCOPES, st.sampled_from(["o1", "o2"]))),
        st.tuples(st.just("advance"), st.integers(0, 200)),
    ),
    max_size=40,
)


def _apply(engine: Engine, action: tuple[str, Any], now: int) -> int:
    kind, arg = action
    if kind == "register":
        op_id, scope, keys, delay, cond, domain = arg
        spec = OperationSpec(
            op_id=op_id,
            scope=scope,
            keys=keys,
            deadline_ms=now + delay,
            condition=Condition(cond) if keys else Condition.ALL,
            time_domain=domain,
        )
        with contextlib.suppress(ConflictError):
            engine.register(spec, now_ms=now)
    elif kind == "signal":
        scope, key = arg
        engine.signal(scope, key, now_ms=now)
    elif kind == "watermark":
        scope, wm = arg
        engine.advance_watermark(scope, wm)
    elif kind == "cancel":
        scope, op_id = arg
        engine.cancel(scope, op_id, now_ms=now)
    else:
        now += arg
        for task in engine.advance_clock(now):
            task.run()
    return now


@settings(max_examples=200, deadline=None)
@given(before=_ACTIONS, after=_ACTIONS, ttl=st.sampled_from([50, 100_000]))
def test_snapshot_round_trip_behaves_as_the_original(
    before: list[tuple[str, Any]], after: list[tuple[str, Any]], ttl: int
) -> None:
    config = EngineConfig(signal_ttl=TtlConfig(ttl_ms=ttl), outcome_ttl_ms=300)
    original = Engine(config, start_ms=1_000)
    now = 1_000
    for action in before:
        now = _apply(original, action, now)
    for task in original.advance_clock(now):
        task.run()
    original.drain_outcomes()
    data = snapshot_engine(original)
    restored = restore_engine(data, now_ms=now, config=config)
    assert snapshot_engine(restored) == data
    event(f"pending at snapshot: {min(original.statistics().pending, 3)}")
    assert restored.statistics().pending == original.statistics().pending
    now_a = now_b = now
    for action in after:
        now_a = _apply(original, action, now_a)
        now_b = _apply(restored, action, now_b)
    for engine, t in ((original, now_a), (restored, now_b)):
        for task in engine.advance_clock(t + 10_000):
            task.run()
    outcomes = original.drain_outcomes()
    assert restored.drain_outcomes() == outcomes
    event(f"outcomes after restore: {min(len(outcomes), 3)}")
    assert restored.pending() == original.pending()
