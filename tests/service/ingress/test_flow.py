"""The flow alone: each input's decision released in order, the reaper woken for its deadline."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import trio
import trio.testing

from purgatory._codec import RegisterRequest, SignalRecord
from purgatory._core import EngineConfig, Outcome, OutcomeKind
from purgatory.service.dispatch.dispatcher import Dispatcher
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.dispatch.waiters import Waiters
from purgatory.service.ingress.flow import Flow
from purgatory.service.kafka.transport import Refusal
from reaper import Clock


class Released:
    """A release that keeps what it was given, in order."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def decided(self, outcomes: Sequence[Outcome]) -> None:
        self.outcomes.extend(outcomes)

    def refused(self, refusal: Refusal) -> None:
        raise AssertionError("the flow never refuses a record")

    def consumed(self, partition: int, offsets: Mapping[tuple[str, int], int]) -> None:
        raise AssertionError("the flow never commits")

    def resent(self, outcomes: Sequence[Outcome]) -> None:
        raise AssertionError("the flow never re-sends")


class _Roomy:
    async def wait_for_room(self) -> None:
        await trio.lowlevel.checkpoint()


def flow(clock: Clock) -> tuple[Flow, Released]:
    table = PartitionTable(EngineConfig(), partitions=1)
    table.serve(0, table.new_engine(0, start_ms=clock.now_ms()))
    dispatcher = Dispatcher(table, Waiters(), now_ms=clock.now_ms, max_deadline_ahead_ms=10**9)
    released = Released()
    return Flow(dispatcher, released, clock, egress=_Roomy()), released


async def test_inputs_release_what_they_decide_and_the_reaper_expires_on_the_millisecond(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock(offset_ms=1_700_000_000_000)
    the_flow, released = flow(clock)
    async with trio.open_nursery() as nursery:
        await nursery.start(the_flow.reaper.run)
        start = clock.now_ms()
        for op_id, timeout_ms in (("late", 3_600_000), ("soon", 1_234), ("signalled", 60_000)):
            registered = the_flow.register(
                RegisterRequest(op_id=op_id, scope="s", keys=(op_id,), timeout_ms=timeout_ms)
            )
            assert registered.outcome is None
        assert the_flow.signal(SignalRecord("s", "signalled")) == 1
        assert [o.op_id for o in released.outcomes] == ["signalled"]
        await trio.sleep(2)  # the reaper, asleep for at most its max, woke for "soon"
        nursery.cancel_scope.cancel()
    soon = released.outcomes[1]
    assert (soon.op_id, soon.outcome) == ("soon", OutcomeKind.EXPIRED)
    assert soon.outcome_ms == start + 1_234
    assert len(released.outcomes) == 2
    assert the_flow.reaper.statistics().max_lateness_ms == 0


async def test_a_stop_catches_up_every_expiration_due(
    autojump_clock: trio.testing.MockClock,
) -> None:
    clock = Clock(offset_ms=1_700_000_000_000)
    the_flow, released = flow(clock)
    for i in range(5):
        the_flow.register(RegisterRequest(op_id=f"t{i}", scope="s", keys=(), timeout_ms=10 * i + 1))
    await trio.sleep(1)  # nobody runs the reaper: they are overdue
    assert the_flow.catch_up(clock.now_ms()) == 5
    assert [o.op_id for o in released.outcomes] == [f"t{i}" for i in range(5)]
    assert the_flow.catch_up(clock.now_ms()) == 0  # nothing left due
