"""Client quotas, byte limits and the memory budget, through the state machine.

A client spread over scopes and partitions holds its own quota; 60 KB operations are counted in
bytes; remembered signals are capped per scope; the replica's memory budget refuses what would
grow it while a signal that an operation awaits still goes through.
"""

from __future__ import annotations

import pytest

from purgatory._codec import CancelRequest, RegisterRequest, SignalRecord
from purgatory._core import Engine, EngineConfig, LimitError, RegistrationStatus, TtlConfig
from purgatory._core._errors import UsageError
from purgatory._core.durability.snapshot import restore_engine, snapshot_engine
from purgatory._core.engine.footprint import operation_bytes, signal_bytes
from purgatory._core.engine.model import SignalFact
from purgatory.service.dispatch.admission import MEMORY_BASE_BYTES, OWNER_BYTES, RESTORED_CLIENT
from purgatory.service.dispatch.dispatcher import Dispatcher
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.dispatch.waiters import Waiters

DAY_MS = 86_400_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


def serving(
    config: EngineConfig | None = None,
    *,
    max_pending_per_client: int = 0,
    max_pending_bytes_per_client: int = 0,
    max_memory_bytes: int = 0,
) -> tuple[Dispatcher, Clock]:
    clock = Clock()
    table = PartitionTable(
        config if config is not None else EngineConfig(),
        partitions=2,
        max_pending_per_client=max_pending_per_client,
        max_pending_bytes_per_client=max_pending_bytes_per_client,
        max_memory_bytes=max_memory_bytes,
    )
    for partition in range(2):
        table.serve(partition, table.new_engine(partition, start_ms=0))
    return Dispatcher(table, Waiters(), now_ms=clock, max_deadline_ahead_ms=DAY_MS), clock


def two_scopes(state: Dispatcher) -> tuple[str, str]:
    """Two scopes of different partitions."""
    scopes = {state.table.partition_of(f"run-{i}"): f"run-{i}" for i in range(20)}
    return scopes[0], scopes[1]


def register(
    state: Dispatcher, scope: str, op_id: str, *, client: str | None, **kw: object
) -> RegistrationStatus:
    keys = kw.pop("keys", (f"{op_id}-done",))
    request = RegisterRequest(op_id=op_id, scope=scope, keys=keys, timeout_ms=60_000, **kw)  # type: ignore[arg-type]
    return state.register(request, client=client).result.status


# -- per client ----------------------------------------------------------------------------------


def test_one_client_over_two_scopes_hits_its_own_limit_and_the_others_go_on() -> None:
    state, _ = serving(max_pending_per_client=3)
    one, two = two_scopes(state)
    assert register(state, one, "a1", client="A") is RegistrationStatus.PENDING
    assert register(state, two, "a2", client="A") is RegistrationStatus.PENDING
    assert register(state, two, "a3", client="A") is RegistrationStatus.PENDING
    for scope in (one, two):
        with pytest.raises(LimitError, match=r"max_pending_per_client .* client 'A'") as caught:
            register(state, scope, "a4", client="A")
        assert caught.value.field == "max_pending_per_client"
    # B is not locked out by A, in either scope.
    assert register(state, one, "b1", client="B") is RegistrationStatus.PENDING
    assert register(state, two, "b2", client="B") is RegistrationStatus.PENDING
    # A retry of a pending operation adds nothing: it is not refused.
    assert register(state, one, "a1", client="A") is RegistrationStatus.DUPLICATE
    assert state.table.admission.usage("A")[0] == 3
    # Outcomes give the quota back: a completion, a cancel, an expiry.
    assert state.signal(SignalRecord(one, "a1-done"), client="B").result == 1
    assert register(state, one, "a4", client="A") is RegistrationStatus.PENDING
    state.cancel(CancelRequest(op_id="a2", scope=two))
    assert register(state, one, "a5", client="A") is RegistrationStatus.PENDING
    with pytest.raises(LimitError):
        register(state, one, "a6", client="A")


def test_an_expiry_gives_the_quota_back() -> None:
    state, clock = serving(max_pending_per_client=1)
    scope, _ = two_scopes(state)
    register(state, scope, "first", client="A")
    with pytest.raises(LimitError):
        register(state, scope, "second", client="A")
    clock.now += 60_000
    [decision] = state.advance_clock(clock.now)
    [expired] = decision.outcomes
    assert expired.op_id == "first"
    assert state.table.admission.usage("A") == (0, 0)
    register(state, scope, "second", client="A")


def test_no_client_named_is_the_anonymous_client() -> None:
    state, _ = serving(max_pending_per_client=1)
    scope, _ = two_scopes(state)
    register(state, scope, "x", client=None)
    with pytest.raises(LimitError, match="'anonymous'"):
        register(state, scope, "y", client="anonymous")


def test_600_operations_of_60_kb_are_refused_by_bytes_where_a_count_let_them_pass() -> None:
    payload = '"' + "p" * 60_000 + '"'
    budget = 16 << 20
    state, _ = serving(max_pending_per_client=1_000, max_pending_bytes_per_client=budget)
    scope, _ = two_scopes(state)
    accepted = refused = 0
    for i in range(600):
        try:
            register(state, scope, f"op-{i:03d}", client="A", payload=payload)
            accepted += 1
        except LimitError as exc:
            assert exc.field == "max_pending_bytes_per_client"
            refused += 1
    size = operation_bytes(state.table.engine_of(scope).pending(scope)[0])
    assert size > 60_000
    assert accepted == budget // size < 600
    assert refused == 600 - accepted
    count, held = state.table.admission.usage("A")
    assert count == accepted and held == accepted * size <= budget
    assert state.table.engine_statistics().pending_bytes == held
    # Another client still registers.
    register(state, scope, "small", client="B")


def test_the_engines_limit_in_bytes_per_scope_answers_through_the_state() -> None:
    payload = '"' + "p" * 60_000 + '"'
    state, _ = serving(EngineConfig(max_pending_bytes_per_scope=1 << 20))
    scope, other = two_scopes(state)
    accepted = 0
    with pytest.raises(LimitError, match="max_pending_bytes_per_scope") as caught:
        for i in range(600):
            register(state, scope, f"op-{i:03d}", client="A", payload=payload)
            accepted += 1
    assert caught.value.field == "max_pending_bytes_per_scope"
    assert 0 < accepted < 20
    register(state, other, "op-000", client="A", payload=payload)  # another scope's own


def test_restored_operations_are_held_by_the_client_restored() -> None:
    state, _ = serving(max_pending_per_client=2)
    scope, _ = two_scopes(state)
    register(state, scope, "a1", client="A")
    register(state, scope, "a2", client="A")
    partition = state.table.partition_of(scope)
    engine = state.table.engine_of(scope)
    restored = restore_engine(snapshot_engine(engine), now_ms=engine.clock_ms)
    state.table.drop(partition)
    assert state.table.admission.usage("A") == (0, 0)
    state.table.serve(partition, restored)
    count, held = state.table.admission.usage(RESTORED_CLIENT)
    assert count == 2 and held == restored.statistics().pending_bytes
    register(state, scope, "a3", client="A")  # A's quota starts empty
    assert state.signal(SignalRecord(scope, "a1-done")).result == 1
    assert state.table.admission.usage(RESTORED_CLIENT)[0] == 1


# -- remembered signals ------------------------------------------------------------------------


def test_remembered_signals_are_capped_per_scope_by_count_and_bytes() -> None:
    config = EngineConfig(
        max_remembered_signals_per_scope=100, max_remembered_bytes_per_scope=1 << 30
    )
    state, _ = serving(config)
    scope, other = two_scopes(state)
    for i in range(100):
        state.signal(SignalRecord(scope, f"fact-{i}"), client="kafka")
    with pytest.raises(LimitError, match="max_remembered_signals_per_scope") as caught:
        state.signal(SignalRecord(scope, "fact-100"), client="kafka")
    assert caught.value.field == "max_remembered_signals_per_scope"
    state.signal(SignalRecord(other, "fact-100"))  # another scope
    register(state, scope, "waiting", client="A", keys=("awaited",))
    assert state.signal(SignalRecord(scope, "awaited")).result == 1  # awaited: taken beyond the cap

    payload = '"' + "k" * 1_000 + '"'
    config = EngineConfig(max_remembered_bytes_per_scope=48 * 1_600)
    state, _ = serving(config)
    scope, _ = two_scopes(state)
    taken = 0
    with pytest.raises(LimitError) as caught:
        for i in range(48_000):
            state.signal(SignalRecord(scope, f"fact-{i}", payload=payload))
            taken += 1
    assert caught.value.field == "max_remembered_bytes_per_scope"
    stats = state.table.engine_statistics()
    assert stats.remembered_signals == taken
    refused = signal_bytes(scope, f"fact-{taken}", SignalFact(0, None, payload))
    assert stats.remembered_bytes <= 48 * 1_600 < stats.remembered_bytes + refused
    assert 1_500 < refused < 1_600  # a 1 KB signal holds about 1.5 KB


# -- the memory budget -------------------------------------------------------------------------


def test_the_budget_must_be_above_the_base() -> None:
    with pytest.raises(UsageError, match="max_memory_bytes"):
        serving(max_memory_bytes=MEMORY_BASE_BYTES)


def test_the_budget_refuses_growth_but_takes_the_signals_that_operations_await() -> None:
    config = EngineConfig(outcome_ttl_ms=10_000, signal_ttl=TtlConfig(ttl_ms=10_000))
    room = 20_000
    state, clock = serving(config, max_memory_bytes=MEMORY_BASE_BYTES + room)
    scope, other = two_scopes(state)
    accepted = 0
    with pytest.raises(LimitError, match="max_memory_bytes") as caught:
        for i in range(100):
            register(state, scope if i % 2 else other, f"op-{i}", client=f"c{i % 3}")
            accepted += 1
    assert caught.value.field == "max_memory_bytes"
    assert 5 < accepted < 40  # about 620 estimated bytes each
    assert state.table.admission.memory_bytes() <= MEMORY_BASE_BYTES + room
    with pytest.raises(LimitError) as caught:
        state.signal(SignalRecord(scope, "nobody-awaits-it"))
    assert caught.value.field == "max_memory_bytes"
    # The signals that pending operations await are taken, and complete them.
    for i in range(accepted):
        assert state.signal(SignalRecord(scope if i % 2 else other, f"op-{i}-done")).result == 1
    assert state.table.engine_statistics().pending == 0
    # Their outcomes are kept for idempotent retries until outcome_ttl_ms: memory comes back
    # then, not at once.
    clock.now += 10_000
    state.advance_clock(clock.now)
    assert state.table.engine_statistics().finished_bytes == 0
    assert register(state, scope, "after", client="c0") is RegistrationStatus.PENDING


def test_without_client_quotas_nothing_is_kept_per_operation() -> None:
    state, _ = serving(max_memory_bytes=MEMORY_BASE_BYTES + 1_000_000)
    scope, _ = two_scopes(state)
    register(state, scope, "x", client="A")
    engines = sum(engine.memory_bytes for engine in state.table.engines())
    assert state.table.admission.memory_bytes() == MEMORY_BASE_BYTES + engines
    state, _ = serving(max_pending_per_client=5)
    register(state, scope, "x", client="A")
    engines = sum(engine.memory_bytes for engine in state.table.engines())
    assert state.table.admission.memory_bytes() == MEMORY_BASE_BYTES + engines + OWNER_BYTES


def test_an_engine_alone_reports_its_estimate() -> None:
    assert Engine().memory_bytes == 0
