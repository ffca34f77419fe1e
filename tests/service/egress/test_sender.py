"""The sender: the backlog in chunks, one hop to the sink each, on the completion lane, in order;
an oversized callback refused behind its chunk; on the in-memory broker, in virtual time."""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing

from purgatory._codec import encode_callback
from purgatory.service.egress.acknowledger import InFlight
from purgatory.service.egress.backlog import Backlog
from purgatory.service.egress.records import Records, Ref
from purgatory.service.egress.sender import Refused, Sender
from purgatory.service.kafka.transport import OutRecord, SendFailure
from reaper import Clock, CompletionExecutor
from tests.service.egress.parts import DEAD, INPUT, broker, op_ids, outcome, records
from tests.service.fake_kafka import FakeBroker, FakeTransport


async def _run(
    backlog: Backlog, made: Records, fill: Callable[[], None], fake: FakeBroker | None = None
) -> tuple[list[InFlight], list[list[SendFailure | None]], Sender, CompletionExecutor]:
    """Run a sender over ``backlog`` until it is closed and drained: what it handed over, in
    order, and each delivery's results."""
    fake = fake if fake is not None else broker()
    executor = CompletionExecutor(Clock())
    send, receive = trio.open_memory_channel[InFlight](64)
    handed: list[InFlight] = []
    results: list[list[SendFailure | None]] = []
    async with (
        FakeTransport(fake, ack_delay_s=0.0).open_sink() as sink,
        trio.open_nursery() as nursery,
    ):
        await nursery.start(executor.run)
        sender = Sender(backlog, made, sink, executor=executor, clock=Clock(), in_flight=send)
        nursery.start_soon(sender.run)
        fill()
        backlog.close()
        async for item in receive:
            handed.append(item)
            results.append(await item[0].results())
        executor.close()
    return handed, results, sender, executor


async def test_chunks_go_in_order_one_hop_each_with_their_markers_and_barriers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    backlog = Backlog(capacity=100, chunk=2)
    letter = Ref(OutRecord(DEAD, b"s", b"{}"), None, INPUT, "invalid")
    barrier = trio.Event()
    o1, o2, o3, o4 = (outcome(i) for i in range(1, 5))
    fake = broker()

    def fill() -> None:
        backlog.put([o1, o2])
        backlog.put_commit({(INPUT, 0): 4})
        backlog.put([o3])
        backlog.put_letter(letter)
        backlog.put_barrier(barrier)
        backlog.put([o4])

    handed, results, sender, _executor = await _run(backlog, records(), fill, fake)
    assert [([r.outcome or r for r in refs], offsets, bs) for _d, refs, offsets, bs in handed] == [
        ([o1, o2], {}, []),
        ([o3, letter], {(INPUT, 0): 4}, []),
        ([o4], {}, [barrier]),
    ]
    assert results == [[None, None], [None, None], [None]]
    assert fake.log.count("send") == 3  # a hop per chunk
    assert op_ids(fake) == ["op1", "op2", "op3", "op4"] and len(fake.records(DEAD)) == 1
    assert sender.handed == 5
    assert not barrier.is_set()  # the acknowledger's to set


async def test_an_oversized_callback_follows_its_chunk_as_refused_then_the_barriers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    small, big = outcome(1), outcome(2, payload='"' + "x" * 500 + '"')
    made = records(len(encode_callback(small)) + 10)
    backlog = Backlog(capacity=100, chunk=10)
    barrier = trio.Event()
    fake = broker()

    def fill() -> None:
        backlog.put([small, big, outcome(3)])
        backlog.put_commit({(INPUT, 1): 9})
        backlog.put_barrier(barrier)

    handed, results, sender, _executor = await _run(backlog, made, fill, fake)
    [first, (refused, [ref], *rest), (last, nothing, *tail)] = handed
    _, sent, offsets, no_barriers = first
    assert [r.outcome for r in sent] == [small, outcome(3)] and offsets == {(INPUT, 1): 9}
    assert no_barriers == [] and rest == [{}, []]
    assert nothing == [] and tail == [{}, [barrier]]
    assert isinstance(refused, Refused) and isinstance(last, Refused)
    assert ref.outcome is big and ref.record.value == encode_callback(big)
    [[failure]] = results[1:2]
    assert (
        failure is not None and not failure.retriable and "over max_record_bytes" in failure.reason
    )
    assert await refused.offsets() == [None]
    assert op_ids(fake) == ["op1", "op3"]  # never sent
    assert sender.handed == 3


async def test_a_chunk_is_due_at_its_earliest_outcome_and_one_without_any_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    await trio.sleep(1)  # now 1000 ms
    backlog = Backlog(capacity=100, chunk=10)
    letter = Ref(OutRecord(DEAD, b"s", b"{}"), None, INPUT, "invalid")
    late = [outcome(1, outcome_ms=990), outcome(2, outcome_ms=950, registered_ms=940)]

    _, _, _, executor = await _run(backlog, records(), lambda: backlog.put(late))
    assert executor.statistics().max_lag_ms == 50
    backlog = Backlog(capacity=100, chunk=10)
    _, _, _, executor = await _run(backlog, records(), lambda: backlog.put_letter(letter))
    assert executor.statistics().max_lag_ms == 0
