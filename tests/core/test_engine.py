"""Tests of the declarative engine: barriers, quorum, timers, event time, limits, snapshots."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import zlib
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from purgatory._core._errors import BadRecordError, ConflictError, LimitError, UsageError
from purgatory._core.durability.snapshot import _pending_rows, restore_engine, snapshot_engine
from purgatory._core.engine.engine import Engine
from purgatory._core.engine.engine_types import EngineConfig, RegistrationStatus
from purgatory._core.engine.model import Condition, OperationSpec, Outcome, OutcomeKind
from purgatory._core.flink.keyed_timers import TimeDomain
from purgatory._core.flink.ttl_state import TtlConfig

NIGHT = "ingest@2026-11-22"
KEYS = ("ingest/orders", "ingest/users", "ingest/stock")


def barrier(op_id: str = "nightly", deadline: int = 6_000, **kw: object) -> OperationSpec:
    return OperationSpec(op_id=op_id, scope=NIGHT, keys=KEYS, deadline_ms=deadline, **kw)  # type: ignore[arg-type]


def run_due(engine: Engine, now: int) -> list[Outcome]:
    return engine.advance_clock(now)


def test_barrier_completes_when_all_keys_signalled() -> None:
    engine = Engine()
    assert engine.register(barrier(payload='{"job": "report"}'), now_ms=0).status == "pending"
    assert engine.signal(NIGHT, "ingest/orders", now_ms=10, payload="o") == []
    assert engine.signal(NIGHT, "ingest/users", now_ms=20) == []
    [out] = engine.signal(NIGHT, "ingest/stock", now_ms=30, payload="s")
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
    [out] = engine.advance_clock(6_250)  # the reaper wakes 250 ms late
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
    [first] = engine.signal(NIGHT, "ingest/stock", now_ms=1)
    assert engine.signal(NIGHT, "ingest/stock", now_ms=2) == []  # the same key is not a second
    [second] = engine.signal(NIGHT, "ingest/users", now_ms=3)
    assert [first.op_id, second.op_id] == ["any", "two"]


def test_signal_at_the_deadline_loses_to_the_expiry() -> None:
    engine = Engine()
    engine.register(barrier(condition=Condition.ANY), now_ms=0)
    assert engine.signal(NIGHT, "ingest/stock", now_ms=6_000) == []  # expiry wins at the deadline
    [out] = run_due(engine, 6_000)
    assert out.outcome is OutcomeKind.EXPIRED
    late_key = OperationSpec(op_id="b", scope=NIGHT, keys=("ingest/users",), deadline_ms=7_000)
    assert engine.register(late_key, now_ms=6_000).status is RegistrationStatus.PENDING
    assert len(engine.signal(NIGHT, "ingest/users", now_ms=6_999)) == 1  # one ms before: done


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


def test_a_retried_timer_is_a_duplicate_of_what_it_finds_pending_or_fired() -> None:
    engine = Engine()

    def sent(now_ms: int) -> OperationSpec:  # a relative timeout becomes a deadline at arrival
        return OperationSpec(
            op_id="t", scope="s", keys=(), deadline_ms=now_ms + 500, timeout_ms=500
        )

    assert engine.register(sent(0), now_ms=0).status is RegistrationStatus.PENDING
    retried = engine.register(sent(200), now_ms=200, retry=True)
    assert retried.status is RegistrationStatus.DUPLICATE  # not moved to 700
    [out] = run_due(engine, 500)
    assert out.deadline_ms == 500
    late = engine.register(sent(900), now_ms=900, retry=True)
    assert late.status is RegistrationStatus.DUPLICATE and late.outcome == out  # no 2nd round
    assert run_due(engine, 5_000) == []
    # Unmarked, the same request is how an inactivity timer is pushed back: a new round.
    assert engine.register(sent(1_000), now_ms=1_000).status is RegistrationStatus.PENDING
    # A retry with another timeout is another request: it moves the timer as usual.
    other = OperationSpec(op_id="t", scope="s", keys=(), deadline_ms=1_900, timeout_ms=800)
    assert engine.register(other, now_ms=1_100, retry=True).status is RegistrationStatus.REARMED
    # A barrier's retry is what it always was: a duplicate of the same request.
    barrier = OperationSpec(op_id="b", scope="s", keys=("k",), deadline_ms=3_000, timeout_ms=900)
    assert engine.register(barrier, now_ms=2_100).status is RegistrationStatus.PENDING
    later = dataclasses.replace(barrier, deadline_ms=3_100)
    assert engine.register(later, now_ms=2_200, retry=True).status is RegistrationStatus.DUPLICATE


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
    assert run_due(engine, 100_000) == []  # the cancel was the only outcome


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


def _apply(
    engine: Engine, action: tuple[str, Any], now: int, out: list[Outcome] | None = None
) -> int:
    """Apply one action; the outcomes it decides are appended to ``out``."""
    decided: list[Outcome] = [] if out is None else out
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
            registration = engine.register(spec, now_ms=now)
            if registration.status is RegistrationStatus.COMPLETED:
                assert registration.outcome is not None
                decided.append(registration.outcome)
    elif kind == "signal":
        scope, key = arg
        decided += engine.signal(scope, key, now_ms=now)
    elif kind == "watermark":
        scope, wm = arg
        engine.advance_watermark(scope, wm)
    elif kind == "cancel":
        scope, op_id = arg
        cancelled = engine.cancel(scope, op_id, now_ms=now)
        decided += [cancelled] if cancelled is not None else []
    else:
        now += arg
        decided += engine.advance_clock(now)
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
    original.advance_clock(now)
    data = snapshot_engine(original)
    restored = restore_engine(data, now_ms=now, config=config)
    assert snapshot_engine(restored) == data
    event(f"pending at snapshot: {min(original.statistics().pending, 3)}")
    assert restored.statistics().pending == original.statistics().pending
    now_a = now_b = now
    outcomes: list[Outcome] = []
    replayed: list[Outcome] = []
    for action in after:
        now_a = _apply(original, action, now_a, outcomes)
        now_b = _apply(restored, action, now_b, replayed)
    outcomes += original.advance_clock(now_a + 10_000)
    replayed += restored.advance_clock(now_b + 10_000)
    assert replayed == outcomes
    event(f"outcomes after restore: {min(len(outcomes), 3)}")
    assert restored.pending() == original.pending()


def test_a_retry_with_the_same_relative_timeout_is_a_duplicate_not_a_conflict() -> None:
    engine = Engine()
    first = barrier(deadline=3_600_000, timeout_ms=3_600_000)
    assert engine.register(first, now_ms=0).status is RegistrationStatus.PENDING
    retry = barrier(deadline=3_600_010, timeout_ms=3_600_000)  # sent again 10 ms later
    assert engine.register(retry, now_ms=10).status is RegistrationStatus.DUPLICATE
    assert engine.lookup(NIGHT, "nightly") == (first, None)  # the first deadline holds
    with pytest.raises(ConflictError, match="another body"):
        engine.register(barrier(deadline=3_600_010, timeout_ms=3_600_010), now_ms=10)
    with pytest.raises(ConflictError, match="another body"):  # absolute: the deadline is the body
        engine.register(barrier(deadline=3_600_010), now_ms=10)
    [out] = engine.advance_clock(3_600_000)
    late_retry = barrier(deadline=3_700_000, timeout_ms=3_600_000)
    again = engine.register(late_retry, now_ms=100_000)
    assert again.status is RegistrationStatus.DUPLICATE and again.outcome == out


def test_a_timer_re_sent_with_its_timeout_re_arms_from_the_new_arrival() -> None:
    engine = Engine()
    timer = OperationSpec("session", "clicks", (), deadline_ms=900, timeout_ms=900)
    engine.register(timer, now_ms=0)
    again = OperationSpec("session", "clicks", (), deadline_ms=1_400, timeout_ms=900)
    assert engine.register(again, now_ms=500).status is RegistrationStatus.REARMED
    assert engine.advance_clock(1_399) == []
    [out] = engine.advance_clock(1_400)
    assert out.deadline_ms == 1_400


SMALL = EngineConfig(max_signal_bytes_per_operation=100)


def test_a_signal_that_would_grow_a_callback_past_the_bound_is_refused_and_changes_nothing() -> (
    None
):
    engine = Engine(SMALL)
    engine.register(barrier(), now_ms=0)
    assert engine.signal(NIGHT, KEYS[0], now_ms=1, payload="x" * 60) == []
    with pytest.raises(LimitError, match=r"^payload: .*'nightly'.*max_signal_bytes_per_operation"):
        engine.signal(NIGHT, KEYS[1], now_ms=2, payload="y" * 41)
    assert engine.lookup(NIGHT, "nightly") is not None
    assert engine.statistics().signals == 1  # the refused signal was not remembered
    assert engine.signal(NIGHT, KEYS[1], now_ms=3, payload="y" * 40) == []  # exactly at the bound
    [out] = engine.signal(NIGHT, KEYS[2], now_ms=4)
    assert sum(len(p or "") for p in out.signals.values()) == 100
    with pytest.raises(LimitError, match=r"^payload: 101 bytes"):
        engine.signal("other", "k", now_ms=5, payload="z" * 101)


def test_replacing_a_key_payload_counts_the_new_one_only_and_utf8_bytes_count() -> None:
    engine = Engine(SMALL)
    engine.register(barrier(), now_ms=0)
    engine.signal(NIGHT, KEYS[0], now_ms=1, payload="x" * 90)
    engine.signal(NIGHT, KEYS[0], now_ms=2, payload="x" * 100)  # replaces: 100 in all
    with pytest.raises(LimitError):
        engine.signal(NIGHT, KEYS[1], now_ms=3, payload="é")  # 2 UTF-8 bytes


def test_a_registration_whose_keys_already_carry_too_much_is_refused() -> None:
    engine = Engine(SMALL)
    engine.signal(NIGHT, KEYS[0], now_ms=1, payload="x" * 60)
    engine.signal(NIGHT, KEYS[1], now_ms=1, payload="y" * 60)
    with pytest.raises(LimitError, match=r"^keys: .*max_signal_bytes_per_operation \(100\)"):
        engine.register(barrier(), now_ms=2)
    assert engine.statistics().pending == 0
    one_key = OperationSpec("one", NIGHT, (KEYS[0],), deadline_ms=6_000)
    assert engine.register(one_key, now_ms=2).status is RegistrationStatus.COMPLETED


def test_a_bulk_restore_rebuilds_what_registration_built() -> None:
    original = Engine(start_ms=0)
    for i in range(50):
        keys = (f"k{i}", f"shared{i % 3}") if i % 5 else ()
        domain = TimeDomain.EVENT_TIME if i % 7 == 0 else TimeDomain.PROCESSING_TIME
        spec = OperationSpec(f"o{i}", f"s{i % 4}", keys, deadline_ms=1_000 + i, time_domain=domain)
        original.register(spec, now_ms=0)
    original.signal("s1", "shared1", now_ms=1, payload='"p"')
    restored = restore_engine(snapshot_engine(original), now_ms=1, config=original.config)
    mine, theirs = restored.statistics(), original.statistics()
    assert (mine.pending, mine.watched, mine.watch_keys) == (
        theirs.pending,
        theirs.watched,
        theirs.watch_keys,
    )
    assert restored.pending() == original.pending()
    assert [o.op_id for o in restored.signal("s1", "k1", now_ms=2)] == ["o1"]
    assert [o.op_id for o in original.signal("s1", "k1", now_ms=2)] == ["o1"]
    assert restored.advance_clock(2_000) == original.advance_clock(2_000)


def test_a_restored_operation_whose_deadline_passed_expires_late_even_if_satisfiable() -> None:
    # Signalled at its deadline (the expiry wins), snapshotted before the expiry ran: restored,
    # it must expire, flagged late, not complete.
    engine = Engine(start_ms=0)
    engine.register(OperationSpec("o", "s", ("k",), deadline_ms=100), now_ms=0)
    assert engine.signal("s", "k", now_ms=100) == []
    restored = restore_engine(snapshot_engine(engine), now_ms=5_000, config=engine.config)
    [out] = restored.advance_clock(5_000)
    assert (out.outcome, out.late, out.outcome_ms) == (OutcomeKind.EXPIRED, True, 100)


# -- partitions: every outcome names the partition whose engine decided it ----------------------


def test_every_outcome_carries_the_engines_partition() -> None:
    engine = Engine(start_ms=0, partition=3)
    engine.signal("s", "a", now_ms=0)
    at_once = engine.register(OperationSpec("at-once", "s", ("a",), deadline_ms=500), now_ms=1)
    assert at_once.status is RegistrationStatus.COMPLETED and at_once.outcome is not None
    engine.register(OperationSpec("by-signal", "s", ("b",), deadline_ms=500), now_ms=1)
    [by_signal] = engine.signal("s", "b", now_ms=2)
    engine.register(OperationSpec("timer", "s", (), deadline_ms=50), now_ms=2)
    [expired] = engine.advance_clock(50)
    engine.register(OperationSpec("dropped", "s", ("c",), deadline_ms=500), now_ms=50)
    cancelled = engine.cancel("s", "dropped", now_ms=51)
    assert cancelled is not None
    outcomes = [at_once.outcome, by_signal, expired, cancelled]
    assert [o.outcome for o in outcomes] == [
        OutcomeKind.COMPLETED,
        OutcomeKind.COMPLETED,
        OutcomeKind.EXPIRED,
        OutcomeKind.CANCELLED,
    ]
    assert [(o.partition, o.sequence) for o in outcomes] == [(3, 1), (3, 2), (3, 3), (3, 4)]
    again = engine.register(OperationSpec("at-once", "s", ("a",), deadline_ms=500), now_ms=60)
    assert again.status is RegistrationStatus.DUPLICATE and again.outcome == at_once.outcome
    # Outside the service the partition is 0.
    plain = Engine(start_ms=0)
    plain.register(OperationSpec("t", "s", (), deadline_ms=5), now_ms=0)
    assert [o.partition for o in plain.advance_clock(5)] == [0]


@pytest.mark.parametrize("restored_at", [0, 100, 200, 5_000])
def test_the_partition_survives_a_snapshot_on_pending_and_finished_operations(
    restored_at: int,
) -> None:
    engine = Engine(start_ms=0, partition=5)
    engine.register(OperationSpec("done", "s", ("k",), deadline_ms=9_000), now_ms=0)
    [done] = engine.signal("s", "k", now_ms=10)
    engine.register(OperationSpec("dropped", "s", ("x",), deadline_ms=9_000), now_ms=20)
    dropped = engine.cancel("s", "dropped", now_ms=30)
    engine.register(OperationSpec("waiting", "s", ("y",), deadline_ms=6_000), now_ms=40)
    engine.register(
        OperationSpec("event", "s", (), deadline_ms=700, time_domain=TimeDomain.EVENT_TIME),
        now_ms=50,
    )
    engine.advance_clock(100)
    data = snapshot_engine(engine)

    restored = restore_engine(data, now_ms=restored_at, config=engine.config)
    assert restored.partition == 5
    assert restored.lookup("s", "done") == engine.lookup("s", "done")
    assert restored.lookup("s", "dropped") == engine.lookup("s", "dropped")
    finished = [restored.lookup("s", "done"), restored.lookup("s", "dropped")]
    assert [f[1] for f in finished if f is not None] == [done, dropped]
    assert {done.partition, dropped is not None and dropped.partition} == {5}
    repeat = restored.register(OperationSpec("done", "s", ("k",), deadline_ms=9_000), now_ms=200)
    assert repeat.status is RegistrationStatus.DUPLICATE and repeat.outcome == done
    # Pending operations decided after the restore carry it too, as the original's do.
    for e in (engine, restored):
        e.advance_watermark("s", 700)
    later = restored.advance_clock(6_000)
    assert later == engine.advance_clock(6_000)
    assert [(o.op_id, o.outcome, o.partition) for o in later] == [
        ("waiting", OutcomeKind.EXPIRED, 5),
        ("event", OutcomeKind.EXPIRED, 5),
    ]


# -- resume: after a restore, what is overdue expires flagged late ------------------------------


def _resumable() -> Engine:
    """An engine at 0 holding operations overdue, due and not due at 300, in both domains."""
    engine = Engine(start_ms=0, partition=1)
    engine.register(OperationSpec("past", "s", (), deadline_ms=100), now_ms=0)
    engine.register(OperationSpec("edge", "s", ("k",), deadline_ms=300), now_ms=0)
    engine.register(OperationSpec("future", "s", ("k",), deadline_ms=301), now_ms=0)
    event_time = TimeDomain.EVENT_TIME
    engine.register(OperationSpec("ev", "s", (), deadline_ms=50, time_domain=event_time), now_ms=0)
    engine.register(
        OperationSpec("ev-later", "s", ("k",), deadline_ms=10_000, time_domain=event_time),
        now_ms=0,
    )
    engine.advance_watermark("s", 100)  # "ev" is overdue in event time
    return engine


def test_resume_flags_only_overdue_processing_time_operations_late() -> None:
    restored = restore_engine(snapshot_engine(_resumable()), now_ms=0)
    assert restored.resume(300) == 2  # "past" and "edge"; not "future", not event time
    assert restored.resume(300) == 0  # already flagged: nothing new
    assert restored.clock_ms == 300  # the clock moves to the restart's time
    outcomes = restored.advance_clock(300)
    got = {o.op_id: (o.outcome, o.late, o.outcome_ms, o.partition) for o in outcomes}
    assert got == {
        "past": (OutcomeKind.EXPIRED, True, 100, 1),
        "edge": (OutcomeKind.EXPIRED, True, 300, 1),
        "ev": (OutcomeKind.EXPIRED, False, 300, 1),
    }
    assert restored.statistics().late == 2
    [future] = restored.advance_clock(301)
    assert (future.op_id, future.late) == ("future", False)
    assert [s.op_id for s in restored.pending()] == ["ev-later"]
    assert restored.resume(1_000_000) == 0  # event time is never flagged by the wall clock


def test_resume_counts_and_flags_the_same_on_a_live_engine() -> None:
    engine = _resumable()
    assert engine.resume(299) == 1  # only "past": "edge" is due at 300
    assert engine.resume(300) == 1  # now "edge"
    late = {o.op_id for o in engine.advance_clock(300) if o.late}
    assert late == {"past", "edge"}


def test_a_flagged_operation_is_past_its_deadline_so_a_signal_no_longer_completes_it() -> None:
    engine = Engine(start_ms=0)
    engine.register(OperationSpec("o", "s", ("k",), deadline_ms=100), now_ms=0)
    assert engine.resume(100) == 1
    assert engine.clock_ms == 100
    assert engine.signal("s", "k", now_ms=99) == []  # told an earlier time: the clock holds
    [out] = engine.advance_clock(100)
    # The signal came when the clock stood at the deadline: too late to count, so missing.
    assert (out.op_id, out.outcome, out.late) == ("o", OutcomeKind.EXPIRED, True)
    assert (out.keys, out.missing) == ((), ("k",))
    assert engine.statistics().late == 1


@pytest.mark.parametrize("bad", [-5, "300", None, True, 1.5, 2**80])
def test_resume_rejects_a_bad_time_like_every_other_input(bad: Any) -> None:
    engine = _resumable()  # no journal
    with pytest.raises(UsageError, match=r"^now_ms"):
        engine.resume(bad)


def test_an_operation_overdue_at_the_snapshot_clock_is_restored_exactly_not_late() -> None:
    # Registered with a deadline already passed (and one due at the very clock), snapshotted
    # before any advance: restored at the snapshot's own clock nothing is late, as in the original.
    engine = Engine(start_ms=1_000, partition=2)
    engine.register(OperationSpec("passed", "s", (), deadline_ms=900), now_ms=1_000)
    engine.register(OperationSpec("due", "s", ("k",), deadline_ms=1_000), now_ms=1_000)
    engine.register(OperationSpec("open", "s", ("k",), deadline_ms=1_001), now_ms=1_000)
    data = snapshot_engine(engine)
    for at in (0, 1_000):
        restored = restore_engine(data, now_ms=at, config=engine.config)
        assert snapshot_engine(restored) == data
        [opened] = restored.signal("s", "k", now_ms=1_000, payload="p")
        assert opened.op_id == "open"  # at its deadline, "due" loses to its expiry
        outcomes = restored.advance_clock(1_000)
        assert [(o.op_id, o.late, o.outcome_ms) for o in outcomes] == [
            ("passed", False, 1_000),  # registered after its deadline: expired as it came
            ("due", False, 1_000),
        ]
        assert restored.statistics().late == 0
    # The original, told the same, decides the same outcomes.
    [opened_here] = engine.signal("s", "k", now_ms=1_000, payload="p")
    assert [opened_here, *engine.advance_clock(1_000)] == [opened, *outcomes]
    # Restored later than the snapshot (the previous behaviour): they are flagged late.
    later = restore_engine(data, now_ms=1_001, config=engine.config)
    assert [(o.op_id, o.late) for o in later.advance_clock(1_001)] == [
        ("passed", True),
        ("due", True),
        ("open", True),
    ]


def test_a_late_flag_set_by_resume_is_kept_by_a_snapshot() -> None:
    engine = Engine(start_ms=0)
    engine.register(OperationSpec("o", "s", (), deadline_ms=100), now_ms=0)
    engine.register(OperationSpec("p", "s", (), deadline_ms=500), now_ms=0)
    assert engine.resume(100) == 1
    data = snapshot_engine(engine)
    restored = restore_engine(data, now_ms=0, config=engine.config)
    assert snapshot_engine(restored) == data
    assert restored.resume(100) == 0  # "o" came back already flagged
    assert [(o.op_id, o.late) for o in restored.advance_clock(500)] == [
        ("o", True),
        ("p", False),
    ]


def test_a_rearmed_timer_expires_in_the_same_order_after_a_snapshot() -> None:
    engine = Engine(start_ms=0)
    engine.register(OperationSpec("a", "s", (), deadline_ms=50), now_ms=0)
    engine.register(OperationSpec("b", "s", (), deadline_ms=100), now_ms=0)
    moved = engine.register(OperationSpec("a", "s", (), deadline_ms=100), now_ms=0)
    assert moved.status is RegistrationStatus.REARMED
    restored = restore_engine(snapshot_engine(engine), now_ms=0, config=engine.config)
    assert restored.advance_clock(100) == engine.advance_clock(100)  # b then a, sequences 1, 2


def test_a_rearm_clears_the_late_flag_a_restore_set() -> None:
    engine = Engine(start_ms=0)
    engine.register(OperationSpec("t", "s", (), deadline_ms=100), now_ms=0)
    restored = restore_engine(snapshot_engine(engine), now_ms=500, config=engine.config)
    restored.register(OperationSpec("t", "s", (), deadline_ms=900), now_ms=500)  # re-armed
    [expired] = restored.advance_clock(900)
    assert (expired.op_id, expired.outcome_ms, expired.late) == ("t", 900, False)


# -- an outcome never contradicts its inputs ---------------------------------------------------


def test_a_registration_after_its_deadline_completes_by_the_signals_that_came_before_it() -> None:
    # A journal replayed behind another writer's records, or a client's clock behind the
    # partition's: the registration is applied when the clock is past its deadline, and the
    # signals the partition holds came before it. They satisfy it: completed, not expired
    # with nothing missing.
    engine = Engine(start_ms=0)
    for at, key in enumerate(KEYS, start=1):
        engine.signal(NIGHT, key, now_ms=at * 100)
    engine.advance_clock(9_000)
    reg = engine.register(barrier(deadline=6_000), now_ms=5_000)  # the entry's time: behind
    assert reg.status is RegistrationStatus.COMPLETED and reg.outcome is not None
    out = reg.outcome
    assert (out.outcome, out.keys, out.missing) == (OutcomeKind.COMPLETED, KEYS, ())
    assert out.registered_ms == out.outcome_ms == 9_000  # the partition's clock
    assert engine.advance_clock(10_000) == []


def test_a_registration_after_its_deadline_expires_as_it_registers_naming_what_was_late() -> None:
    engine = Engine(start_ms=0)
    engine.signal(NIGHT, "ingest/orders", now_ms=100)
    engine.signal(NIGHT, "ingest/users", now_ms=7_000)  # after the deadline: does not count
    reg = engine.register(barrier(deadline=6_000), now_ms=8_000)
    assert reg.status is RegistrationStatus.PENDING  # never decided inside the register call
    [out] = engine.advance_clock(8_000)
    assert out.outcome is OutcomeKind.EXPIRED
    assert (out.keys, out.missing) == (("ingest/orders",), ("ingest/users", "ingest/stock"))
    assert (out.registered_ms, out.outcome_ms, out.deadline_ms) == (8_000, 8_000, 6_000)


def test_an_expiry_run_late_does_not_count_a_signal_that_came_after_the_deadline() -> None:
    # The reaper runs late (a paused process, a restore): a signal that arrived in between
    # does not complete the operation, and its expiry names the key as missing.
    engine = Engine(start_ms=0)
    engine.register(barrier(deadline=6_000), now_ms=0)
    engine.signal(NIGHT, "ingest/orders", now_ms=10)
    engine.signal(NIGHT, "ingest/users", now_ms=20)
    assert engine.signal(NIGHT, "ingest/stock", now_ms=6_500) == []
    [out] = engine.advance_clock(6_600)
    assert out.outcome is OutcomeKind.EXPIRED
    assert (out.keys, out.missing, out.outcome_ms) == (KEYS[:2], ("ingest/stock",), 6_000)


def test_an_event_time_registration_behind_the_watermark_counts_signals_by_event_time() -> None:
    engine = Engine(start_ms=0)
    engine.signal(NIGHT, "ingest/orders", now_ms=1, event_time_ms=500)
    engine.signal(NIGHT, "ingest/users", now_ms=2)  # no event time: it is not after anything
    engine.signal(NIGHT, "ingest/stock", now_ms=3, event_time_ms=1_500)  # after the deadline
    engine.advance_watermark(NIGHT, 2_000)
    spec = barrier(deadline=1_000, time_domain=TimeDomain.EVENT_TIME)
    assert engine.register(spec, now_ms=4).status is RegistrationStatus.PENDING
    [out] = engine.advance_clock(5)
    assert out.outcome is OutcomeKind.EXPIRED
    assert out.missing == ("ingest/stock",)
    two = OperationSpec(
        "two", NIGHT, KEYS[:2], deadline_ms=1_000, time_domain=TimeDomain.EVENT_TIME
    )
    reg = engine.register(two, now_ms=6)
    assert reg.outcome is not None and reg.outcome.outcome is OutcomeKind.COMPLETED


_STEP = st.one_of(
    st.tuples(st.just("register"), st.integers(0, 5), st.integers(-300, 600), st.integers(0, 3)),
    st.tuples(st.just("signal"), st.sampled_from(KEYS), st.integers(-300, 600)),
    st.tuples(st.just("advance"), st.integers(0, 600)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, max_size=40))
def test_no_outcome_contradicts_the_inputs_it_was_decided_on(
    steps: list[tuple[Any, ...]],
) -> None:
    """Registrations late or early against the clock, signals told times behind it, clock
    steps: an expiry always names what did not come before its deadline, and only that; no
    outcome is before its registration; a completion has what it needed, in time."""
    engine = Engine(start_ms=1_000)
    arrived: dict[str, list[int]] = {}  # key -> the clock at each of its signals
    specs: dict[str, OperationSpec] = {}
    outcomes: list[Outcome] = []
    clock = 1_000
    for step in steps:
        if step[0] == "register":
            _, n, ahead, needed = step
            keys = KEYS[: max(1, needed)]
            spec = OperationSpec(
                f"op{n}", NIGHT, keys, deadline_ms=clock + ahead,
                condition=Condition.COUNT if needed == 0 else Condition.ALL,
                count=1 if needed == 0 else None,
            )  # fmt: skip
            with contextlib.suppress(ConflictError):
                reg = engine.register(spec, now_ms=clock - 50)
                specs.setdefault(spec.op_id, spec)
                outcomes += [reg.outcome] if reg.outcome is not None else []
        elif step[0] == "signal":
            _, key, behind = step
            outcomes += engine.signal(NIGHT, key, now_ms=max(0, clock - behind))
            arrived.setdefault(key, []).append(engine.clock_ms)
        else:
            clock += step[1]
            outcomes += engine.advance_clock(clock)
    for out in outcomes:
        assert out.outcome_ms >= out.registered_ms, out
        if out.outcome is OutcomeKind.EXPIRED:
            in_time = {
                k
                for k in out.keys + out.missing
                if min(arrived.get(k, [clock + 1])) < out.deadline_ms
            }
            assert out.missing, out
            assert set(out.keys) <= in_time, out
        else:
            assert out.keys and set(out.keys) <= set(arrived), out


# -- the compact form of a pending operation gives back the spec it was registered with ----------


@st.composite
def _any_spec(draw: st.DrawFn) -> OperationSpec:
    keys = tuple(draw(st.lists(st.sampled_from(["a", "b", "c", "k"]), unique=True, max_size=3)))
    condition = draw(st.sampled_from(list(Condition))) if keys else Condition.ALL
    relative = draw(st.booleans())
    return OperationSpec(
        op_id=draw(st.sampled_from(["o1", "o2", "o3"])),
        scope="".join(["s", draw(st.sampled_from(["1", "2"]))]),  # a string of its own
        keys=keys,
        deadline_ms=draw(st.integers(1_000, 5_000)),
        condition=condition,
        count=draw(st.integers(1, len(keys))) if condition is Condition.COUNT else None,
        time_domain=draw(st.sampled_from(list(TimeDomain)))
        if not relative
        else TimeDomain.PROCESSING_TIME,
        payload=draw(st.one_of(st.none(), st.text(max_size=3))),
        reply_to=draw(st.one_of(st.none(), st.just("callbacks.other"))),
        timeout_ms=draw(st.integers(1, 4_000)) if relative else None,
    )


@settings(max_examples=300, deadline=None)
@given(specs=st.lists(_any_spec(), max_size=6))
def test_a_pending_operation_gives_back_its_spec_live_and_restored(
    specs: list[OperationSpec],
) -> None:
    engine = Engine(start_ms=0)
    held: dict[tuple[str, str], OperationSpec] = {}
    for spec in specs:
        with contextlib.suppress(ConflictError):
            status = engine.register(spec, now_ms=0).status
            if status is RegistrationStatus.PENDING or status is RegistrationStatus.REARMED:
                held[spec.scope, spec.op_id] = spec
    restored = restore_engine(snapshot_engine(engine), now_ms=0)
    for (scope, op_id), spec in held.items():
        assert engine.lookup(scope, op_id) == (spec, None)
        assert restored.lookup(scope, op_id) == (spec, None)
    assert sorted(engine.pending(), key=repr) == sorted(held.values(), key=repr)
    for live in (engine, restored):
        for (scope, op_id), spec in held.items():
            outcome = live.cancel(scope, op_id, now_ms=0)
            assert outcome is not None
            assert (outcome.op_id, outcome.scope, outcome.deadline_ms) == (
                op_id,
                scope,
                spec.deadline_ms,
            )
            assert (outcome.time_domain, outcome.payload, outcome.reply_to) == (
                spec.time_domain,
                spec.payload,
                spec.reply_to,
            )
            assert outcome.missing == spec.keys


def _as_version_1(data: bytes) -> bytes:
    """A version 2 snapshot rewritten as version 1 wrote it: one row per pending operation."""
    magic = b"PURGATORY-SNAPSHOT\n"
    doc = json.loads(zlib.decompress(data[len(magic) + 2 :]))
    rows = []
    for scope, op_id, keys, deadline, registered, timeout, payload, late, rest in _pending_rows(
        doc.pop("pending")
    ):
        rows.append([
            op_id, scope, list(keys), deadline,
            "all" if rest is None else rest.condition.value,
            None if rest is None else rest.count,
            "processing_time" if rest is None else rest.time_domain.value,
            payload, None if rest is None else rest.reply_to, timeout, registered, late,
        ])  # fmt: skip
    doc["operations"] = rows
    return magic + (1).to_bytes(2, "big") + zlib.compress(json.dumps(doc).encode())


@settings(max_examples=200, deadline=None)
@given(before=_ACTIONS, after=_ACTIONS)
def test_a_snapshot_of_version_1_restores_as_its_version_2(
    before: list[tuple[str, Any]], after: list[tuple[str, Any]]
) -> None:
    """A snapshot written before an upgrade restores after it: the same state, the same
    outcomes."""
    config = EngineConfig(outcome_ttl_ms=300)
    original = Engine(config, start_ms=1_000)
    now = 1_000
    for action in before:
        now = _apply(original, action, now)
    data = snapshot_engine(original)
    old = restore_engine(_as_version_1(data), now_ms=now + 50, config=config)
    new = restore_engine(data, now_ms=now + 50, config=config)
    assert snapshot_engine(old) == snapshot_engine(new)
    now_a = now_b = now + 50
    outcomes: list[Outcome] = []
    replayed: list[Outcome] = []
    for action in after:
        now_a = _apply(new, action, now_a, outcomes)
        now_b = _apply(old, action, now_b, replayed)
    assert replayed == outcomes
    event(f"pending at snapshot: {min(original.statistics().pending, 3)}")
