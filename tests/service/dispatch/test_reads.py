"""The read model alone: a long poll answers once the callback is acknowledged, not before."""

from __future__ import annotations

import trio
import trio.testing

from purgatory._codec import RegisterRequest, SignalRecord
from purgatory._core import EngineConfig, OutcomeKind
from purgatory.service.dispatch.dispatcher import Dispatcher
from purgatory.service.dispatch.reads import Reads
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.dispatch.waiters import Waiters


def parts() -> tuple[Dispatcher, Reads]:
    table = PartitionTable(EngineConfig(), partitions=1)
    table.serve(0, table.new_engine(0, start_ms=0))
    waiters = Waiters()
    dispatcher = Dispatcher(table, waiters, now_ms=lambda: 10, max_deadline_ahead_ms=10**9)
    return dispatcher, Reads(table, waiters)


async def test_a_long_poll_waits_for_the_acknowledgement_of_a_decided_outcome(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dispatcher, reads = parts()
    dispatcher.register(RegisterRequest(op_id="a", scope="s", keys=("k",), timeout_ms=60_000))
    [outcome] = dispatcher.signal(SignalRecord("s", "k")).outcomes
    found = reads.lookup("s", "a")
    assert found is not None and found[1] == outcome  # decided: the engine says so
    answers: list[object] = []

    async def poll() -> None:
        answers.append(await reads.wait("s", "a", timeout_ms=30_000))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(poll)
        await trio.sleep(5)
        assert answers == []  # decided, not yet delivered: the poll still waits
        reads.delivered(outcome)
    assert answers == [outcome]
    assert reads.table.acked(0) == outcome.sequence
    assert await reads.wait("s", "a", timeout_ms=0) == outcome  # delivered: at once


async def test_a_long_poll_on_a_pending_operation_times_out_with_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    dispatcher, reads = parts()
    dispatcher.register(RegisterRequest(op_id="a", scope="s", keys=("k",), timeout_ms=60_000))
    start = trio.current_time()
    assert await reads.wait("s", "a", timeout_ms=2_000) is None
    assert trio.current_time() - start == 2.0
    pending = reads.pending("s")
    assert [spec.op_id for spec in pending] == ["a"]
    expired = dispatcher.advance_clock(60_010)
    assert [o.outcome for d in expired for o in d.outcomes] == [OutcomeKind.EXPIRED]
    assert reads.pending("s") == []
