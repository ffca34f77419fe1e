"""The backlog: decision order kept, chunks of at most ``chunk`` records, back-pressure at
``capacity``, against a list as the model; and its waits, under the autojump clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from purgatory.service.egress.backlog import Backlog
from purgatory.service.egress.records import Entry, Ref
from purgatory.service.kafka.transport import OutRecord
from tests.service.egress.parts import DEAD, INPUT, outcome


def _letter() -> Ref:
    return Ref(OutRecord(DEAD, None, b"{}"), None, INPUT, "invalid")


def _is_record(entry: Entry) -> bool:
    return not isinstance(entry, dict | trio.Event)


class BacklogMachine(RuleBasedStateMachine):
    """The model: the entries in order, and whether the backlog is closed."""

    def __init__(self) -> None:
        super().__init__()
        self.backlog = Backlog(capacity=1, chunk=1)
        self.model: list[Entry] = []
        self.closed = False
        self.capacity = self.chunk = 1
        self.sequence = 0

    @initialize(capacity=st.integers(0, 6), chunk=st.integers(1, 4))
    def start(self, capacity: int, chunk: int) -> None:
        self.backlog = Backlog(capacity=capacity, chunk=chunk)
        self.capacity, self.chunk = capacity, chunk

    def _put(self, entries: list[Entry], put: object) -> None:
        assert callable(put)
        if self.closed and entries:
            with pytest.raises(trio.ClosedResourceError):
                put()
            return
        put()
        self.model += entries

    @rule(count=st.integers(0, 4))
    def put(self, count: int) -> None:
        outcomes = [outcome(self.sequence + i) for i in range(count)]
        self.sequence += count
        self._put(list(outcomes), lambda: self.backlog.put(outcomes))

    @rule()
    def put_letter(self) -> None:
        letter = _letter()
        self._put([letter], lambda: self.backlog.put_letter(letter))

    @rule(offsets=st.dictionaries(st.tuples(st.just(INPUT), st.integers(0, 1)), st.integers(0, 9)))
    def put_commit(self, offsets: dict[tuple[str, int], int]) -> None:
        self._put([offsets] if offsets else [], lambda: self.backlog.put_commit(offsets))

    @rule()
    def put_barrier(self) -> None:
        barrier = trio.Event()
        self._put([barrier], lambda: self.backlog.put_barrier(barrier))

    @rule()
    def fill_to_capacity(self) -> None:
        """Exactly ``capacity`` records queued: the last count with room (the boundary)."""
        missing = self.capacity - self.backlog.queued
        if missing > 0 and not self.closed:
            self.put(missing)
            assert self.backlog.queued == self.capacity and self.backlog.has_room

    @rule()
    def take(self) -> None:
        taken = self.backlog.take()
        expected: list[Entry] = []
        records = 0
        while self.model and records < self.chunk:
            entry = self.model.pop(0)
            expected.append(entry)
            records += _is_record(entry)
        assert len(taken) == len(expected)
        for got, want in zip(taken, expected, strict=True):
            assert got == want if isinstance(want, dict) else got is want

    @rule()
    def close(self) -> None:
        self.backlog.close()
        self.closed = True

    @invariant()
    def counts_records_only(self) -> None:
        queued = sum(map(_is_record, self.model))
        assert self.backlog.queued == queued
        assert self.backlog.has_room == (queued <= self.capacity or self.closed)
        assert self.backlog.closed == self.closed


TestBacklog = BacklogMachine.TestCase
TestBacklog.settings = settings(max_examples=100, stateful_step_count=30)


async def test_a_producer_waits_while_over_capacity_and_goes_on_at_exactly_capacity(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backlog = Backlog(capacity=2, chunk=1)
    backlog.put([outcome(1), outcome(2), outcome(3)])
    went_on: list[float] = []

    async def producer() -> None:
        await backlog.wait_for_room()
        went_on.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(producer)
        await trio.sleep(1)
        assert went_on == []  # 3 > 2
        backlog.put_commit({(INPUT, 0): 1})  # markers take no room, nor give any
        backlog.put_barrier(trio.Event())
        await trio.sleep(1)
        assert went_on == []
        [first] = backlog.take()
        assert first == outcome(1) and backlog.queued == 2
    assert went_on == [1.0 + 1.0]


async def test_close_lets_waiting_producers_go_and_refuses_all_but_empty_puts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backlog = Backlog(capacity=0, chunk=10)
    backlog.put([outcome(1)])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(backlog.wait_for_room)
        await trio.sleep(1)
        backlog.close()
    with pytest.raises(trio.ClosedResourceError, match="the outbox is closed"):
        backlog.put([outcome(2)])
    with pytest.raises(trio.ClosedResourceError):
        backlog.put_letter(_letter())
    with pytest.raises(trio.ClosedResourceError):
        backlog.put_commit({(INPUT, 0): 1})
    with pytest.raises(trio.ClosedResourceError):
        backlog.put_barrier(trio.Event())
    backlog.put([])
    backlog.put_commit({})
    await backlog.wait_for_room()  # closed: at once, over capacity or not
    assert backlog.queued == 1


async def test_ready_waits_for_a_put_and_says_false_once_closed_and_drained(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backlog = Backlog(capacity=10, chunk=10)
    answers: list[tuple[float, bool]] = []

    async def sender() -> None:
        while True:
            ready = await backlog.ready()
            answers.append((trio.current_time(), ready))
            if not ready:
                return
            backlog.take()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.sleep(1)
        backlog.put([outcome(1)])
        await trio.sleep(1)
        backlog.put([outcome(2)])
        backlog.close()  # what is queued is still taken
    assert answers == [(1.0, True), (2.0, True), (2.0, False)]
