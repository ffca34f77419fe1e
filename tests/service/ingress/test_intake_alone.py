"""The intake alone: each record journaled where it comes from, decoded, applied or refused,
in order, and each partition's offsets handed on once per batch."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import trio
import trio.testing

from purgatory._codec import Limits, RegisterRequest, SignalRecord, encode_request, encode_signal
from purgatory._core import EngineConfig, Outcome
from purgatory.service.dispatch.dispatcher import Dispatcher
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.dispatch.waiters import Waiters
from purgatory.service.ingress.flow import Flow
from purgatory.service.ingress.intake import Intake
from purgatory.service.kafka.transport import ConsumedRecord, Refusal
from reaper import Clock

REQUESTS, SIGNALS = "requests", "signals"


class Recorded:
    """The journal's gate and the release, as the calls they were given, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def consuming(self, partition: int, topic: str, offset: int) -> None:
        self.calls.append(("consuming", topic, partition, offset))

    def position(self, partition: int, topic: str, offset: int) -> None:
        self.calls.append(("position", topic, partition, offset))

    def after(self, release: Callable[[], None], *, partition: int | None = None) -> None:
        release()

    async def durable(self, partitions: Iterable[int] = (), *, bounded: bool = False) -> None:
        await trio.lowlevel.checkpoint()

    async def wait_for_room(self) -> None:
        await trio.lowlevel.checkpoint()

    def decided(self, outcomes: Sequence[Outcome]) -> None:
        self.calls.append(("decided", *[o.op_id for o in outcomes]))

    def refused(self, refusal: Refusal) -> None:
        self.calls.append(("refused", refusal.record.offset, refusal.field, refusal.label))

    def consumed(self, partition: int, offsets: Mapping[tuple[str, int], int]) -> None:
        self.calls.append(("consumed", partition, dict(offsets)))

    def resent(self, outcomes: Sequence[Outcome]) -> None:
        raise AssertionError("the intake never re-sends")


@dataclass
class Source:
    receive: trio.MemoryReceiveChannel[list[ConsumedRecord]]


def record(
    topic: str, partition: int, offset: int, key: bytes | None, value: bytes
) -> ConsumedRecord:
    return ConsumedRecord(topic, partition, offset, key, value, 0)


async def test_a_batch_is_applied_record_by_record_and_committed_per_partition(
    autojump_clock: trio.testing.MockClock,
) -> None:
    table = PartitionTable(EngineConfig(), partitions=2)
    home = table.partition_of("s")
    for partition in (0, 1):
        table.serve(partition, table.new_engine(partition, start_ms=0))
    table.reached(SIGNALS, home, 5)  # the journal had applied this partition's signals up to 5
    recorded = Recorded()
    clock = Clock()
    flow = Flow(
        Dispatcher(table, Waiters(), now_ms=clock.now_ms, max_deadline_ahead_ms=10**9),
        recorded,
        clock,
        egress=recorded,
    )
    send, receive = trio.open_memory_channel[list[ConsumedRecord]](1)
    intake = Intake(
        Source(receive),  # type: ignore[arg-type]
        flow,
        recorded,
        recorded,
        requests_topic=REQUESTS,
        signals_topic=SIGNALS,
        limits=Limits(),
        egress=recorded,
    )
    register = encode_request(RegisterRequest(op_id="a", scope="s", keys=("k",), timeout_ms=9_000))
    signal = encode_signal(SignalRecord("s", "k"))
    batch = [
        record(REQUESTS, home, 0, b"s", register),
        record(SIGNALS, home, 4, b"s", signal),  # before the position reached: skipped
        record(REQUESTS, home, 1, None, register),  # no key
        record(REQUESTS, 1 - home, 0, b"s", register),  # not its scope's partition
        record(REQUESTS, home, 2, b"s", b"{not json"),
        record(SIGNALS, home, 5, b"s", signal),
    ]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(intake.run)
        await send.send(batch)
        await send.aclose()
    assert recorded.calls[:14] == [
        ("consuming", REQUESTS, home, 0),
        ("position", REQUESTS, home, 1),
        ("consuming", REQUESTS, home, 1),
        ("refused", 1, "key", "invalid"),
        ("position", REQUESTS, home, 2),
        ("consuming", REQUESTS, 1 - home, 0),
        ("refused", 0, "partition", "invalid"),
        ("position", REQUESTS, 1 - home, 1),
        ("consuming", REQUESTS, home, 2),
        ("refused", 2, None, "invalid"),
        ("position", REQUESTS, home, 3),
        ("consuming", SIGNALS, home, 5),
        ("decided", "a"),
        ("position", SIGNALS, home, 6),
    ]
    # After the batch, one commit per partition, in partition order.
    assert [c[:2] for c in recorded.calls[14:]] == [("consumed", 0), ("consumed", 1)]
    consumed = {call[1]: call[2] for call in recorded.calls if call[0] == "consumed"}
    assert consumed == {
        home: {(REQUESTS, home): 3, (SIGNALS, home): 6},
        1 - home: {(REQUESTS, 1 - home): 1},
    }
    assert not table.expects(SIGNALS, home, 5)  # applied: a redelivery is skipped
