"""The dispatcher alone: each input returns what it decided, and nothing is called back."""

from __future__ import annotations

import pytest

from purgatory._codec import CancelRequest, RegisterRequest, SignalRecord, WatermarkRecord
from purgatory._core import (
    ConflictError,
    EngineConfig,
    JournalEntry,
    OutcomeKind,
    RegistrationStatus,
    TimeDomain,
)
from purgatory.service.dispatch.dispatcher import Dispatcher
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.dispatch.waiters import Waiters
from purgatory.service.errors import NotServingError

START_MS = 1_000_000


class Journals:
    """Each partition's journal, as the entries its engine reported."""

    def __init__(self) -> None:
        self.entries: dict[int, list[JournalEntry]] = {}

    def __call__(self, partition: int) -> object:
        return self.entries.setdefault(partition, []).append


def dispatcher(*, serve: tuple[int, ...] = (0, 1)) -> tuple[Dispatcher, list[int], Journals]:
    """A dispatcher over two partitions (those in ``serve`` served), its clock and journals."""
    now = [START_MS]
    journals = Journals()
    table = PartitionTable(EngineConfig(), partitions=2, journals=journals)  # type: ignore[arg-type]
    for partition in serve:
        table.serve(partition, table.new_engine(partition, start_ms=START_MS))
    return (
        Dispatcher(table, Waiters(), now_ms=lambda: now[0], max_deadline_ahead_ms=10**9),
        now,
        journals,
    )


def scope_of(d: Dispatcher, partition: int) -> str:
    return next(f"s{i}" for i in range(100) if d.table.partition_of(f"s{i}") == partition)


def test_a_registration_returns_its_deadline_to_wake_for_and_decides_nothing() -> None:
    d, _now, _ = dispatcher()
    scope = scope_of(d, 0)
    decision = d.register(RegisterRequest(op_id="a", scope=scope, keys=("k",), timeout_ms=5_000))
    assert decision.result.status is RegistrationStatus.PENDING
    assert decision.outcomes == ()
    assert decision.wake_ms == START_MS + 5_000
    assert decision.wake_now is False


def test_an_event_time_registration_asks_the_reaper_to_look_now() -> None:
    d, _now, _ = dispatcher()
    scope = scope_of(d, 0)
    request = RegisterRequest(
        op_id="a", scope=scope, keys=("k",), deadline_ms=5_000, time_domain=TimeDomain.EVENT_TIME
    )
    decision = d.register(request)
    assert decision.wake_now is True
    assert decision.wake_ms is None


def test_a_signal_returns_the_outcomes_it_decided_in_order_undelivered() -> None:
    d, now, _ = dispatcher()
    scope = scope_of(d, 1)
    for op_id in ("b", "a", "c"):
        d.register(RegisterRequest(op_id=op_id, scope=scope, keys=("k",), timeout_ms=60_000))
    now[0] += 7
    decision = d.signal(SignalRecord(scope, "k"))
    assert decision.result == 3
    assert [o.op_id for o in decision.outcomes] == ["b", "a", "c"]
    assert [o.sequence for o in decision.outcomes] == [1, 2, 3]
    assert {o.outcome for o in decision.outcomes} == {OutcomeKind.COMPLETED}
    assert all(o.outcome_ms == START_MS + 7 for o in decision.outcomes)
    assert all(d.waiters.undelivered((scope, op_id)) for op_id in "abc")
    assert d.statistics().undelivered == 3


def test_a_registration_already_satisfied_returns_its_outcome() -> None:
    d, _now, _ = dispatcher()
    scope = scope_of(d, 0)
    assert not d.signal(SignalRecord(scope, "k")).outcomes
    decision = d.register(RegisterRequest(op_id="a", scope=scope, keys=("k",), timeout_ms=1_000))
    assert decision.result.status is RegistrationStatus.COMPLETED
    assert [o.op_id for o in decision.outcomes] == ["a"]


def test_a_cancel_returns_its_outcome_or_nothing() -> None:
    d, _now, _ = dispatcher()
    scope = scope_of(d, 0)
    d.register(RegisterRequest(op_id="a", scope=scope, keys=("k",), timeout_ms=1_000))
    cancelled = d.cancel(CancelRequest(op_id="a", scope=scope))
    assert cancelled.result is not None and cancelled.result.outcome is OutcomeKind.CANCELLED
    assert list(cancelled.outcomes) == [cancelled.result]
    again = d.cancel(CancelRequest(op_id="a", scope=scope))
    assert again.result is None and again.outcomes == ()


def test_a_watermark_wakes_the_reaper_only_when_it_moves() -> None:
    d, _now, _ = dispatcher()
    scope = scope_of(d, 0)
    moved = d.watermark(WatermarkRecord(scope, 500))
    assert moved.result is True and moved.wake_now is True
    back = d.watermark(WatermarkRecord(scope, 400))
    assert back.result is False and back.wake_now is False


def test_the_clock_decides_per_engine_and_leaves_an_engine_with_nothing_due_alone() -> None:
    d, now, journals = dispatcher()
    due, idle = scope_of(d, 0), scope_of(d, 1)
    d.register(RegisterRequest(op_id="x", scope=due, keys=("k",), timeout_ms=10))
    d.register(RegisterRequest(op_id="y", scope=idle, keys=("k",), timeout_ms=60_000))
    idle_entries = len(journals.entries[1])
    assert d.next_expiration_ms() == START_MS + 10
    now[0] += 10
    [decision] = d.advance_clock(now[0])
    assert [(o.op_id, o.outcome, o.outcome_ms) for o in decision.outcomes] == [
        ("x", OutcomeKind.EXPIRED, START_MS + 10)
    ]
    assert len(journals.entries[1]) == idle_entries  # not advanced: its journal stays quiet
    assert d.advance_clock(now[0]) == []


def test_an_input_for_a_partition_not_served_is_refused_before_anything_is_journaled() -> None:
    d, _now, journals = dispatcher(serve=(0,))
    scope = scope_of(d, 1)
    with pytest.raises(NotServingError):
        d.signal(SignalRecord(scope, "k"))
    assert 1 not in journals.entries


def test_an_input_the_engine_refuses_is_journaled_all_the_same() -> None:
    # Why the entries travel through the journal at the call, not in the decision: the
    # refused registration moved the engine's clock, and a replay must refuse it again.
    d, _now, journals = dispatcher()
    scope = scope_of(d, 0)
    d.register(RegisterRequest(op_id="a", scope=scope, keys=("k",), timeout_ms=1_000))
    before = len(journals.entries[0])
    with pytest.raises(ConflictError):
        d.register(RegisterRequest(op_id="a", scope=scope, keys=("other",), timeout_ms=1_000))
    assert len(journals.entries[0]) == before + 1
    assert d.statistics().registrations == 1


def test_stopped_inputs_refuse_every_write_naming_why() -> None:
    d, _now, _ = dispatcher()
    d.table.stop_inputs("the requests topic has 3 partitions now")
    with pytest.raises(NotServingError, match="3 partitions now"):
        d.signal(SignalRecord(scope_of(d, 0), "k"))
