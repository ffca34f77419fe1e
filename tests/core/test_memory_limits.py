"""The engine's byte accounting and its limits in bytes and in remembered signals.

The totals the engine keeps up to date (pending, remembered, finished bytes; per scope and in
total) must always equal a recount of what it holds, and, once expired state is cleaned up, a
simple model's recount; a snapshot restore and a journal replay must rebuild the same totals and
decide every limit the same way.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

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

from purgatory._core._errors import ConflictError, LimitError, SizeLimitError, UsageError
from purgatory._core.durability.journal import JournalRecorder, replay_journal
from purgatory._core.durability.snapshot import restore_engine, snapshot_engine
from purgatory._core.engine.engine import Engine
from purgatory._core.engine.engine_types import EngineConfig, RegistrationStatus
from purgatory._core.engine.footprint import finished_bytes, operation_bytes, signal_bytes
from purgatory._core.engine.model import OperationSpec, Outcome, SignalFact
from purgatory._core.flink.keyed_timers import TimeDomain
from purgatory._core.flink.ttl_state import CleanupStrategy, TtlConfig

NIGHT = "ingest@2026-11-22"


def spec(
    op_id: str, keys: tuple[str, ...] = ("k",), scope: str = NIGHT, **kw: Any
) -> OperationSpec:
    return OperationSpec(op_id=op_id, scope=scope, keys=keys, deadline_ms=1_000_000, **kw)


def fact(payload: str | None = None) -> SignalFact:
    return SignalFact(0, None, payload)


# -- limits, one at a time ---------------------------------------------------------------------


def test_the_limits_are_validated_naming_them() -> None:
    for name in (
        "max_pending_bytes_per_scope",
        "max_remembered_signals_per_scope",
        "max_remembered_bytes_per_scope",
    ):
        with pytest.raises(UsageError, match=name):
            EngineConfig(**{name: 0})  # type: ignore[arg-type]


def test_the_count_limits_name_their_field() -> None:
    engine = Engine(EngineConfig(max_pending=1, max_pending_per_scope=1))
    engine.register(spec("a"), now_ms=0)
    with pytest.raises(LimitError) as caught:
        engine.register(spec("b"), now_ms=0)
    assert caught.value.field == "max_pending"
    engine = Engine(EngineConfig(max_pending_per_scope=1))
    engine.register(spec("a"), now_ms=0)
    with pytest.raises(LimitError) as caught:
        engine.register(spec("b"), now_ms=0)
    assert caught.value.field == "max_pending_per_scope"
    assert SizeLimitError("payload", "too big").field == "payload"


def test_pending_bytes_per_scope_refuses_the_operation_that_would_cross_it() -> None:
    payload = "p" * 60_000  # the 60 KB payloads that a count limit let through
    one = operation_bytes(spec("op-0", payload=payload))
    engine = Engine(EngineConfig(max_pending_bytes_per_scope=3 * one + 10))
    for i in range(3):
        engine.register(spec(f"op-{i}", payload=payload), now_ms=0)
    before = engine.statistics()
    with pytest.raises(LimitError, match="max_pending_bytes_per_scope") as caught:
        engine.register(spec("op-3", payload=payload), now_ms=0)
    assert caught.value.field == "max_pending_bytes_per_scope"
    assert engine.statistics() == before  # nothing changed
    with pytest.raises(LimitError):  # the 10 bytes left hold no operation, however small
        engine.register(spec("small"), now_ms=0)
    assert engine.statistics().pending_bytes == 3 * one


def test_pending_bytes_are_per_scope_and_come_back_when_an_operation_finishes() -> None:
    big = spec("op-0", payload="p" * 5_000)
    engine = Engine(EngineConfig(max_pending_bytes_per_scope=operation_bytes(big)))
    engine.register(big, now_ms=0)
    with pytest.raises(LimitError):
        engine.register(spec("op-1", payload="p" * 5_000), now_ms=0)
    engine.register(spec("op-1", scope="elsewhere", payload="p" * 5_000), now_ms=0)
    [done] = engine.signal(NIGHT, "k", now_ms=1)
    assert done.op_id == "op-0"
    engine.register(spec("op-1", keys=("j",), payload="p" * 5_000), now_ms=2)
    assert engine.statistics().pending == 2


def test_remembered_signals_are_capped_per_scope_in_count() -> None:
    engine = Engine(EngineConfig(max_remembered_signals_per_scope=2))
    engine.signal(NIGHT, "a", now_ms=0)
    engine.signal(NIGHT, "b", now_ms=0)
    before = engine.statistics()
    with pytest.raises(LimitError, match="max_remembered_signals_per_scope") as caught:
        engine.signal(NIGHT, "c", now_ms=0)
    assert caught.value.field == "max_remembered_signals_per_scope"
    assert engine.statistics() == before
    engine.signal(NIGHT, "a", now_ms=1, payload="again")  # a fact re-stated: not one more
    engine.signal("other-scope", "c", now_ms=1)
    assert engine.statistics().remembered_signals == 3


def test_remembered_signals_are_capped_per_scope_in_bytes() -> None:
    small = signal_bytes(NIGHT, "a", fact("x" * 100))
    engine = Engine(EngineConfig(max_remembered_bytes_per_scope=2 * small))
    engine.signal(NIGHT, "a", now_ms=0, payload="x" * 100)
    engine.signal(NIGHT, "b", now_ms=0, payload="x" * 100)
    with pytest.raises(LimitError) as caught:
        engine.signal(NIGHT, "c", now_ms=0)
    assert caught.value.field == "max_remembered_bytes_per_scope"
    with pytest.raises(LimitError):
        engine.signal(NIGHT, "a", now_ms=0, payload="x" * 101)  # grows it: one byte over
    engine.signal(NIGHT, "a", now_ms=0, payload="x" * 10)  # shrinks it
    engine.signal(NIGHT, "b", now_ms=0, payload="x" * 100)  # the same size
    assert engine.statistics().remembered_bytes == 2 * small - 90


def test_a_signal_that_a_pending_operation_awaits_is_taken_beyond_the_limits() -> None:
    engine = Engine(EngineConfig(max_remembered_signals_per_scope=1))
    engine.signal(NIGHT, "early", now_ms=0)
    engine.register(spec("barrier", keys=("x", "y")), now_ms=0)
    assert engine.awaits(NIGHT, "x") and not engine.awaits(NIGHT, "early")
    assert engine.signal(NIGHT, "x", now_ms=1) == []
    with pytest.raises(LimitError):
        engine.signal(NIGHT, "nobody-waits", now_ms=1)
    [done] = engine.signal(NIGHT, "y", now_ms=2)
    assert done.keys == ("x", "y")
    assert engine.statistics().remembered_signals == 3
    with pytest.raises(LimitError):  # no longer awaited: "y" is taken, "z" is not
        engine.signal(NIGHT, "z", now_ms=3)


def test_signals_expired_but_not_cleaned_up_do_not_count() -> None:
    # A snapshot never holds them, so a restored engine would decide differently if they did.
    config = EngineConfig(signal_ttl=TtlConfig(ttl_ms=100), max_remembered_signals_per_scope=2)
    recorder = JournalRecorder()
    engine = Engine(config, journal=recorder)
    engine.signal(NIGHT, "a", now_ms=0)
    engine.signal(NIGHT, "b", now_ms=50)
    restored = restore_engine(snapshot_engine(engine), now_ms=100, config=config)
    assert engine.statistics().remembered_signals == 2  # "a" expired at 100, still stored
    assert restored.statistics().remembered_signals == 1
    for target in (engine, restored):
        target.signal(NIGHT, "c", now_ms=100)
        with pytest.raises(LimitError):
            target.signal(NIGHT, "d", now_ms=100)
    replayed = Engine(config)
    replay_journal(replayed, recorder.entries)
    for target in (engine, restored, replayed):
        assert sorted(k for (_, k), _ in target.signals.items(now_ms=100)) == ["b", "c"]
        assert target.statistics().remembered_bytes == engine.statistics().remembered_bytes


def test_a_signal_again_of_a_key_expired_but_not_cleaned_up_counts_whole() -> None:
    # Its stored signal is gone for the limits: the new one adds its whole size, not the
    # difference of two payloads (zero here), as in a restored engine that never held it.
    # Found by TestAccounting (below).
    big, small = signal_bytes(NIGHT, "big", fact("y" * 40)), signal_bytes(NIGHT, "a", fact("x"))
    config = EngineConfig(
        signal_ttl=TtlConfig(ttl_ms=100), max_remembered_bytes_per_scope=big + small - 1
    )
    engine = Engine(config)
    engine.signal(NIGHT, "a", now_ms=0, payload="x")
    engine.register(spec("o", keys=("big",)), now_ms=50)
    [done] = engine.signal(NIGHT, "big", now_ms=50, payload="y" * 40)  # awaited: taken all the same
    assert done.keys == ("big",)
    restored = restore_engine(snapshot_engine(engine), now_ms=100, config=config)
    assert engine.statistics().remembered_signals == 2  # "a" expired at 100, still stored
    for target in (engine, restored):
        with pytest.raises(LimitError) as caught:
            target.signal(NIGHT, "a", now_ms=100, payload="x")
        assert caught.value.field == "max_remembered_bytes_per_scope"


def test_a_cancelled_operation_lingering_in_a_watch_list_limits_nothing() -> None:
    # Until a purge it is still in its keys' watch lists; a restored engine has no trace of it,
    # so counting it would refuse here what the restored engine takes.
    config = EngineConfig(max_signal_bytes_per_operation=10, max_remembered_signals_per_scope=1)
    engine = Engine(config)
    engine.register(spec("o", keys=("k1", "k2")), now_ms=0)
    engine.signal(NIGHT, "k1", now_ms=1, payload="x" * 8)
    engine.cancel(NIGHT, "o", now_ms=2)
    restored = restore_engine(snapshot_engine(engine), now_ms=2, config=config)
    for target in (engine, restored):
        with pytest.raises(LimitError) as caught:  # "k2" is awaited no more
            target.signal(NIGHT, "k2", now_ms=3, payload="y" * 5)
        assert caught.value.field == "max_remembered_signals_per_scope"
    config = EngineConfig(max_signal_bytes_per_operation=10)
    engine = Engine(config)
    engine.register(spec("o", keys=("k1", "k2")), now_ms=0)
    engine.signal(NIGHT, "k1", now_ms=1, payload="x" * 8)
    engine.cancel(NIGHT, "o", now_ms=2)
    engine.signal(NIGHT, "k2", now_ms=3, payload="y" * 5)  # its callback is no more


def test_a_replay_refuses_exactly_what_was_refused() -> None:
    config = EngineConfig(max_pending_bytes_per_scope=1_300, max_remembered_signals_per_scope=1)
    recorder = JournalRecorder()
    engine = Engine(config, journal=recorder)
    refused = 0
    for i in range(6):
        try:
            engine.register(spec(f"op-{i}", keys=(f"k{i}",)), now_ms=i)
        except LimitError:
            refused += 1
        try:
            engine.signal(NIGHT, f"free-{i}", now_ms=i)
        except LimitError:
            refused += 1
    assert refused == 4 + 5
    replayed = Engine(config)
    assert replay_journal(replayed, recorder.entries) == []
    assert replayed.pending() == engine.pending()
    assert replayed.statistics() == engine.statistics()


def test_snapshot_restore_rebuilds_the_totals() -> None:
    engine = Engine()
    engine.register(spec("a", keys=("k1", "k2"), payload="p" * 30), now_ms=0)
    engine.register(spec("t", keys=(), time_domain=TimeDomain.EVENT_TIME), now_ms=0)
    engine.signal(NIGHT, "k1", now_ms=1, payload="s")
    engine.register(spec("b"), now_ms=2)
    engine.cancel(NIGHT, "b", now_ms=3)
    restored = restore_engine(snapshot_engine(engine), now_ms=3)
    for name in ("pending_bytes", "remembered_signals", "remembered_bytes", "finished_bytes"):
        assert getattr(restored.statistics(), name) == getattr(engine.statistics(), name), name
    assert restored.memory_bytes == engine.memory_bytes > 0


# -- the state machine -------------------------------------------------------------------------

_SCOPES = st.sampled_from(["a", "b"])
_KEYS = ["k1", "k2", "k3"]
_OP_IDS = st.sampled_from(["o1", "o2", "o3", "o4"])
_PAYLOADS = st.sampled_from([None, "x", "y" * 40])
SIGNAL_TTL_MS = 50
OUTCOME_TTL_MS = 80
_LIMITED = ("max_remembered_signals_per_scope", "max_remembered_bytes_per_scope")


def recount(engine: Engine) -> dict[str, Any]:
    """What the engine's totals must be: recounted from everything it stores."""
    pending: Counter[str] = Counter()
    for (scope, _), op in engine._ops.items():
        pending[scope] += operation_bytes(op.spec)
    remembered: dict[str, list[int]] = {}
    for (scope, key), slot in engine.signals._slots.items():
        held = remembered.setdefault(scope, [0, 0])
        held[0] += 1
        held[1] += signal_bytes(scope, key, slot.value)
    finished = sum(finished_bytes(slot.value.spec) for slot in engine.finished._slots.values())
    return {"pending": dict(pending), "remembered": remembered, "finished": finished}


class Model:
    """Pending operations, live remembered signals and live finished operations, with times."""

    def __init__(self) -> None:
        self.pending: dict[tuple[str, str], OperationSpec] = {}
        self.remembered: dict[tuple[str, str], tuple[str | None, int]] = {}
        self.finished: dict[tuple[str, str], tuple[OperationSpec, int]] = {}

    def prune(self, now: int) -> None:
        self.remembered = {i: v for i, v in self.remembered.items() if v[1] + SIGNAL_TTL_MS > now}
        self.finished = {i: v for i, v in self.finished.items() if v[1] + OUTCOME_TTL_MS > now}

    def finish(self, outcomes: list[Outcome], now: int) -> None:
        for outcome in outcomes:
            ident = (outcome.scope, outcome.op_id)
            self.finished[ident] = (self.pending.pop(ident), now)

    def pending_bytes(self, scope: str) -> int:
        return sum(operation_bytes(s) for (sc, _), s in self.pending.items() if sc == scope)

    def awaits(self, scope: str, key: str) -> bool:
        return any(sc == scope and key in s.keys for (sc, _), s in self.pending.items())

    def recount(self) -> dict[str, Any]:
        pending: Counter[str] = Counter()
        for (scope, _), s in self.pending.items():
            pending[scope] += operation_bytes(s)
        remembered: dict[str, list[int]] = {}
        for (scope, key), (payload, _) in self.remembered.items():
            held = remembered.setdefault(scope, [0, 0])
            held[0] += 1
            held[1] += signal_bytes(scope, key, fact(payload))
        finished = sum(finished_bytes(s) for s, _ in self.finished.values())
        return {"pending": dict(pending), "remembered": remembered, "finished": finished}


class AccountingMachine(RuleBasedStateMachine):
    """An engine with small limits, beside the model; a snapshot restore at any step."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0
        self.model = Model()
        self.outcomes: list[Outcome] = []
        self.recorder = JournalRecorder()
        self.config = EngineConfig()
        self.engine = Engine()

    @initialize(cleanup=st.sampled_from(list(CleanupStrategy)), limited=st.booleans())
    def setup(self, cleanup: CleanupStrategy, limited: bool) -> None:
        limits = {
            "max_pending_bytes_per_scope": 2_500,
            "max_remembered_signals_per_scope": 2,
            "max_remembered_bytes_per_scope": 1_100,
        }
        self.config = EngineConfig(
            signal_ttl=TtlConfig(ttl_ms=SIGNAL_TTL_MS, cleanup=cleanup, cleanup_budget=1),
            outcome_ttl_ms=OUTCOME_TTL_MS,
            **(limits if limited else {}),
        )
        self.exact_cleanup = cleanup is CleanupStrategy.TIMERS
        self.engine = Engine(self.config, journal=self.recorder)

    def decided(self, outcomes: list[Outcome]) -> None:
        self.outcomes.extend(outcomes)
        self.model.finish(outcomes, self.engine.clock_ms)

    @rule(
        scope=_SCOPES,
        op_id=_OP_IDS,
        keys=st.lists(st.sampled_from(_KEYS), unique=True, max_size=3),
        payload=_PAYLOADS,
        event_time=st.booleans(),
        delay=st.integers(0, 120),
    )
    def register(
        self,
        *,
        scope: str,
        op_id: str,
        keys: list[str],
        payload: str | None,
        event_time: bool,
        delay: int,
    ) -> None:
        domain = TimeDomain.EVENT_TIME if event_time else TimeDomain.PROCESSING_TIME
        new = OperationSpec(
            op_id=op_id,
            scope=scope,
            keys=tuple(keys),
            deadline_ms=delay if event_time else self.now + delay,
            payload=payload,
            time_domain=domain,
        )
        ident = (scope, op_id)
        held = self.model.pending_bytes(scope)
        limit = self.config.max_pending_bytes_per_scope
        try:
            registration = self.engine.register(new, now_ms=self.now)
        except ConflictError:
            return
        except LimitError as exc:
            assert exc.field == "max_pending_bytes_per_scope"
            assert ident not in self.model.pending
            assert held + operation_bytes(new) > limit
            return
        status = registration.status
        if status in (RegistrationStatus.PENDING, RegistrationStatus.COMPLETED):
            assert held + operation_bytes(new) <= limit
            self.model.pending[ident] = new
            if registration.outcome is not None:
                self.decided([registration.outcome])
        elif status is RegistrationStatus.REARMED:
            self.model.pending[ident] = new

    @rule(scope=_SCOPES, key=st.sampled_from(_KEYS), payload=_PAYLOADS)
    def signal(self, scope: str, key: str, payload: str | None) -> None:
        self.model.prune(self.now)
        live = {k: v for (s, k), v in self.model.remembered.items() if s == scope}
        size = signal_bytes(scope, key, fact(payload))
        count = len(live) + (key not in live)
        held = sum(signal_bytes(scope, k, fact(v[0])) for k, v in live.items())
        grown = size - (signal_bytes(scope, key, fact(live[key][0])) if key in live else 0)
        over = (key not in live and count > self.config.max_remembered_signals_per_scope) or (
            grown > 0 and held + grown > self.config.max_remembered_bytes_per_scope
        )
        refused = over and not self.model.awaits(scope, key)
        try:
            outcomes = self.engine.signal(scope, key, now_ms=self.now, payload=payload)
        except LimitError as exc:
            assert refused, exc
            assert exc.field in _LIMITED
            return
        assert not refused
        self.model.remembered[(scope, key)] = (payload, self.now)
        self.decided(outcomes)

    @rule(scope=_SCOPES, op_id=_OP_IDS)
    def cancel(self, scope: str, op_id: str) -> None:
        outcome = self.engine.cancel(scope, op_id, now_ms=self.now)
        assert (outcome is not None) == ((scope, op_id) in self.model.pending)
        if outcome is not None:
            self.decided([outcome])

    @rule(scope=_SCOPES, watermark=st.integers(0, 150))
    def watermark(self, scope: str, watermark: int) -> None:
        self.engine.advance_watermark(scope, watermark)

    def advance(self, now: int) -> None:
        self.now = now
        while True:  # each step is bounded; catch up
            decided = self.engine.advance_clock(now)
            self.decided(decided)
            if not decided:
                break
        self.model.prune(now)
        if self.exact_cleanup:
            assert recount(self.engine) == self.model.recount()

    @rule(step=st.integers(0, 60))
    def advance_by(self, step: int) -> None:
        self.advance(self.now + step)

    @rule()
    def advance_to_the_next_boundary(self) -> None:
        # Exactly on the next deadline or expiry, where off-by-one bugs hide.
        times = [s.deadline_ms for s in self.model.pending.values()]
        times += [t + SIGNAL_TTL_MS for _, t in self.model.remembered.values()]
        times += [t + OUTCOME_TTL_MS for _, t in self.model.finished.values()]
        later = [t for t in times if t >= self.now]
        self.advance(min(later) if later else self.now)

    @rule()
    def snapshot_and_restore(self) -> None:
        old = self.engine
        self.engine = restore_engine(
            snapshot_engine(old), now_ms=old.clock_ms, config=self.config, journal=self.recorder
        )
        assert self.engine.statistics().pending_bytes == old.statistics().pending_bytes
        self.model.prune(self.now)
        assert recount(self.engine) == self.model.recount()  # a snapshot holds live state only

    @invariant()
    def totals_equal_a_recount(self) -> None:
        engine = self.engine
        found = recount(engine)
        stats = engine.statistics()
        assert engine.tally.pending_bytes_by_scope == found["pending"]
        assert engine.tally.remembered_by_scope == found["remembered"]
        assert stats.pending_bytes == sum(found["pending"].values())
        assert stats.remembered_signals == sum(c for c, _ in found["remembered"].values())
        assert stats.remembered_bytes == sum(b for _, b in found["remembered"].values())
        assert stats.finished_bytes == found["finished"]
        assert engine.memory_bytes == stats.pending_bytes + stats.remembered_bytes + (
            stats.finished_bytes
        )

    @invariant()
    def pending_is_the_model(self) -> None:
        assert {(s.scope, s.op_id): s for s in self.engine.pending()} == self.model.pending

    def teardown(self) -> None:
        # The whole journal replayed on a new engine decides the same outcomes (limits
        # included) and holds the same live state.
        replayed = Engine(self.config)
        assert replay_journal(replayed, self.recorder.entries) == self.outcomes
        assert replayed.pending() == self.engine.pending()
        now = self.engine.clock_ms
        for name in ("signals", "finished"):
            mine = getattr(self.engine, name).items(now_ms=now)
            theirs = getattr(replayed, name).items(now_ms=now)
            assert {k: e.value for k, e in mine} == {k: e.value for k, e in theirs}


TestAccounting = AccountingMachine.TestCase
TestAccounting.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)


def test_the_machine_can_be_run_directly() -> None:
    run_state_machine_as_test(
        AccountingMachine, settings=settings(max_examples=5, stateful_step_count=10)
    )
