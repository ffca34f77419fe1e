"""Tests of DelayedOperation and DelayedOperationPurgatory: contract, races, a model."""

from __future__ import annotations

import itertools
from collections.abc import Hashable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from purgatory import DelayedOperation, DelayedOperationPurgatory, Timer, UsageError


class Barrier(DelayedOperation):
    """Completes when every key it needs has been signalled; records its outcomes."""

    def __init__(self, deadline_ms: int, needs: set[Hashable], signalled: set[Hashable]) -> None:
        super().__init__(deadline_ms=deadline_ms)
        self.needs = needs
        self.signalled = signalled
        self.outcomes: list[str] = []

    def try_complete(self) -> bool:
        if self.needs <= self.signalled:
            return self.force_complete()
        return False

    def on_complete(self) -> None:
        self.outcomes.append("complete")

    def on_expiration(self) -> None:
        self.outcomes.append("expired")


def test_worked_example_from_the_module_docstring() -> None:
    signalled: set[Hashable] = set()
    purgatory = DelayedOperationPurgatory("example")
    a = Barrier(100, {"x", "y"}, signalled)
    b = Barrier(50, {"y"}, signalled)
    assert purgatory.try_complete_else_watch(a, ["x", "y"]) is False
    assert (purgatory.watched(), purgatory.num_delayed()) == (2, 1)
    assert purgatory.try_complete_else_watch(b, ["y"]) is False
    assert (purgatory.watched(), purgatory.num_delayed()) == (3, 2)
    signalled.add("x")
    assert purgatory.check_and_complete("x") == 0
    signalled.add("y")
    assert purgatory.check_and_complete("y") == 2
    assert purgatory.watch_keys() == ["x"]
    assert (purgatory.watched(), purgatory.num_delayed()) == (1, 0)
    assert purgatory.advance_clock(100) == []
    assert a.outcomes == ["complete"]
    assert b.outcomes == ["complete"]


def test_operation_that_can_complete_at_once_is_never_watched() -> None:
    purgatory = DelayedOperationPurgatory("p")
    op = Barrier(100, {"k"}, {"k"})
    assert purgatory.try_complete_else_watch(op, ["k"]) is True
    assert (purgatory.watched(), purgatory.num_delayed()) == (0, 0)


class RacyBarrier(Barrier):
    """The condition turns true between the first check and the watch (a signal race)."""

    def try_complete(self) -> bool:
        if not self.outcomes and not self.signalled:
            self.signalled.add("late")  # the first check fails, then the signal lands
            return False
        return super().try_complete()


def test_check_watch_check_catches_a_signal_between_check_and_watch() -> None:
    purgatory = DelayedOperationPurgatory("p")
    op = RacyBarrier(100, {"late"}, set())
    assert purgatory.try_complete_else_watch(op, ["late"]) is True
    assert op.outcomes == ["complete"]
    assert purgatory.num_delayed() == 0


def test_expiry_runs_on_expiration_after_on_complete_exactly_once() -> None:
    purgatory = DelayedOperationPurgatory("p")
    op = Barrier(30_000, {"never"}, set())
    purgatory.try_complete_else_watch(op, ["never"])
    assert purgatory.advance_clock(29_999) == []
    expired = purgatory.advance_clock(30_000)
    assert expired == [op]
    for task in expired:
        task.run()
        task.run()
    assert op.outcomes == ["complete", "expired"]


@pytest.mark.parametrize(
    "order", list(itertools.permutations(["signal", "expire", "cancel", "force"]))
)
def test_exactly_one_outcome_under_every_interleaving(order: tuple[str, ...]) -> None:
    signalled: set[Hashable] = set()
    purgatory = DelayedOperationPurgatory("p")
    op = Barrier(10, {"k"}, signalled)
    purgatory.try_complete_else_watch(op, ["k", "other"])
    expired: list[DelayedOperation] = []
    for step in order:
        if step == "signal":
            signalled.add("k")
            purgatory.check_and_complete("k")
        elif step == "expire":
            expired.extend(
                t for t in purgatory.advance_clock(10) if isinstance(t, DelayedOperation)
            )
            for task in expired:
                task.run()
        elif step == "cancel":
            purgatory.cancel_for_key("other")
        else:
            op.force_complete()
    first = order[0]
    if first == "cancel":
        assert op.is_cancelled and not op.is_completed
        assert op.outcomes == []
    else:
        assert op.is_completed and not op.is_cancelled
        assert op.outcomes == (["complete", "expired"] if first == "expire" else ["complete"])
    assert purgatory.num_delayed() == 0


def test_cancel_for_key_cancels_timers_without_completing() -> None:
    purgatory = DelayedOperationPurgatory("p")
    op = Barrier(10, {"k"}, set())
    purgatory.try_complete_else_watch(op, ["k"])
    assert purgatory.cancel_for_key("k") == [op]
    assert purgatory.cancel_for_key("k") == []
    assert not op.is_completed
    assert op.is_cancelled
    assert op.outcomes == []
    assert (purgatory.watched(), purgatory.num_delayed()) == (0, 0)
    assert purgatory.advance_clock(100) == []


def test_cancelled_operation_never_completes_through_another_key() -> None:
    signalled: set[Hashable] = {"a"}
    purgatory = DelayedOperationPurgatory("p", purge_interval=0)
    op = Barrier(10, {"a", "c"}, signalled)
    purgatory.try_complete_else_watch(op, ["a", "c"])
    assert purgatory.cancel_for_key("a") == [op]
    signalled.add("c")
    assert purgatory.check_and_complete("c") == 0
    assert op.force_complete() is False
    assert op.outcomes == []
    purgatory.try_complete_else_watch(Barrier(5, {"z"}, signalled), ["z"])
    purgatory.cancel_for_key("z")
    purgatory.advance_clock(1)  # purges the cancelled operations' lingering entries
    assert purgatory.watched() == 0


def test_completed_operations_are_purged_from_every_watch_list() -> None:
    purgatory = DelayedOperationPurgatory("p", purge_interval=10)
    signalled: set[Hashable] = set()
    ops = [Barrier(1_000, {f"done{i}"}, signalled) for i in range(50)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [f"done{i}", "shared", f"side{i % 3}"])
    assert purgatory.watched() == 150
    for i in range(len(ops)):
        signalled.add(f"done{i}")
        assert purgatory.check_and_complete(f"done{i}") == 1
    assert purgatory.watched() == 100  # the shared and side lists still hold them
    purgatory.advance_clock(1)
    assert purgatory.watched() == 0
    assert purgatory.watch_keys() == []
    stats = purgatory.statistics()
    assert (stats.purged, stats.purges, stats.completed) == (100, 1, 50)


def test_bad_arguments_name_the_argument() -> None:
    purgatory = DelayedOperationPurgatory("p")
    op = Barrier(10, {"k"}, set())
    with pytest.raises(UsageError, match="keys"):
        purgatory.try_complete_else_watch(op, [])
    with pytest.raises(UsageError, match="keys"):
        purgatory.try_complete_else_watch(op, [["unhashable"]])  # type: ignore[list-item]
    with pytest.raises(UsageError, match="keys"):
        purgatory.try_complete_else_watch(op, [""])
    with pytest.raises(UsageError, match="purge_interval"):
        DelayedOperationPurgatory("p", purge_interval=-1)
    with pytest.raises(UsageError, match="name"):
        DelayedOperationPurgatory("")
    assert purgatory.num_delayed() == 0


class PurgatoryMachine(RuleBasedStateMachine):
    """The purgatory against a model of operations with explicit outcomes."""

    KEYS = ("a", "b", "c", "d")

    @initialize(size=st.sampled_from([2, 20]), purge=st.sampled_from([0, 3, 1000]))
    def setup(self, size: int, purge: int) -> None:
        self.purgatory = DelayedOperationPurgatory(
            "m", timer=Timer(wheel_size=size), purge_interval=purge
        )
        self.now = 0
        self.signalled: set[Hashable] = set()
        self.ops: list[Barrier] = []
        self.expected: dict[Barrier, str | None] = {}  # None while pending
        self.cancelled: set[Barrier] = set()
        self.live_keys: dict[Barrier, set[str]] = {}

    @rule(
        needs=st.sets(st.sampled_from(KEYS), min_size=1, max_size=3),
        timeout=st.integers(0, 500),
    )
    def register(self, needs: set[str], timeout: int) -> None:
        op = Barrier(self.now + timeout, set(needs), self.signalled)
        done = self.purgatory.try_complete_else_watch(op, sorted(needs))
        assert done == (needs <= self.signalled)
        self.ops.append(op)
        self.expected[op] = "complete" if done else None
        self.live_keys[op] = set() if done else set(needs)

    @rule(key=st.sampled_from(KEYS))
    def signal(self, key: str) -> None:
        self.signalled.add(key)
        completed = self.purgatory.check_and_complete(key)
        newly = [
            op
            for op, outcome in self.expected.items()
            if outcome is None
            and op not in self.cancelled
            and key in op.needs
            and op.needs <= self.signalled
        ]
        assert completed == len(newly)
        for op in newly:
            self.expected[op] = "complete"

    @rule(key=st.sampled_from(KEYS))
    def cancel_key(self, key: str) -> None:
        cancelled = self.purgatory.cancel_for_key(key)
        for keys in self.live_keys.values():
            keys.discard(key)
        for op in cancelled:
            assert isinstance(op, Barrier)
            assert self.expected[op] is None
            self.cancelled.add(op)

    def _advance(self, now: int) -> None:
        for task in self.purgatory.advance_clock(now):
            assert isinstance(task, Barrier)
            assert task.deadline_ms <= now
            assert self.expected[task] is None
            task.run()
            self.expected[task] = "expired"
        self.now = now
        for op, outcome in self.expected.items():
            if outcome is None and op not in self.cancelled:
                assert op.deadline_ms > now, "an operation was not expired at its deadline"

    @rule(step=st.integers(0, 300))
    def advance(self, step: int) -> None:
        self._advance(self.now + step)

    @precondition(lambda self: self.purgatory.num_delayed() > 0)
    @rule()
    def advance_exactly_to_next_deadline(self) -> None:
        pending = [op for op, o in self.expected.items() if o is None and op not in self.cancelled]
        earliest = min(op.deadline_ms for op in pending)
        if earliest > self.now:
            self._advance(earliest - 1)
        self._advance(earliest)

    @invariant()
    def exactly_one_outcome_and_counts_match(self) -> None:
        pending = [o for o, v in self.expected.items() if v is None and o not in self.cancelled]
        assert self.purgatory.num_delayed() == len(pending)
        # watched() may over-count completed operations, never under-count live watches.
        live = sum(len(self.live_keys[op]) for op in pending)
        assert self.purgatory.watched() >= live
        for op, outcome in self.expected.items():
            if outcome == "complete":
                assert op.outcomes == ["complete"]
            elif outcome == "expired":
                assert op.outcomes == ["complete", "expired"]
            else:
                assert op.outcomes == []


PurgatoryMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=50, deadline=None
)
test_purgatory_against_model = PurgatoryMachine.TestCase


def test_purge_waits_until_lingering_operations_outnumber_pending_ones() -> None:
    purgatory = DelayedOperationPurgatory("p", purge_interval=5)
    signalled: set[Hashable] = set()
    ops = [Barrier(1_000, {f"done{i}"}, signalled) for i in range(40)]
    for i, op in enumerate(ops):
        purgatory.try_complete_else_watch(op, [f"done{i}", "shared"])
    for i in range(15):  # 15 lingering in "shared" > purge_interval, but < 25 pending
        signalled.add(f"done{i}")
        purgatory.check_and_complete(f"done{i}")
    purgatory.advance_clock(1)
    assert purgatory.statistics().purges == 0
    assert purgatory.watched() == 40 + 25
    for i in range(15, 21):  # now 21 lingering > 19 pending
        signalled.add(f"done{i}")
        purgatory.check_and_complete(f"done{i}")
    purgatory.advance_clock(2)
    assert purgatory.statistics().purges == 1
    assert purgatory.watched() == 19 * 2


def test_a_single_string_is_not_taken_for_a_list_of_keys() -> None:
    purgatory = DelayedOperationPurgatory("p")
    with pytest.raises(UsageError, match="keys"):
        purgatory.try_complete_else_watch(Barrier(10, {"k"}, set()), "abc")
    with pytest.raises(UsageError, match="keys"):
        purgatory.try_complete_else_watch(Barrier(10, {"k"}, set()), [None])
