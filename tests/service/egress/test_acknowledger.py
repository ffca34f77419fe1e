"""The acknowledger: deliveries awaited strictly in order, acknowledged runs reported before a
refused record is settled, offsets and barriers only after their chunk; on the in-memory
broker, in virtual time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.testing

from purgatory._core import Outcome
from purgatory._core._backoff import Backoff
from purgatory.service.egress.acknowledger import Acknowledger, InFlight
from purgatory.service.egress.committer import Committer
from purgatory.service.egress.receipts import Receipts
from purgatory.service.egress.records import Ref
from purgatory.service.egress.sender import Refused
from purgatory.service.egress.settler import Settler
from purgatory.service.kafka.transport import OutRecord, RecordSink
from reaper import Clock
from tests.service.egress.parts import (
    DEAD,
    INPUT,
    TIMEOUT,
    TOO_LARGE,
    broker,
    commits_to,
    outcome,
    records,
)
from tests.service.fake_kafka import FakeBroker, FakeTransport

BACKOFF = Backoff(first_s=0.1, max_s=5.0)


@dataclass
class Rig:
    """An acknowledger over the broker, and everything it told, in order."""

    acknowledger: Acknowledger
    handed: trio.MemorySendChannel[InFlight]
    sink: RecordSink
    fake: FakeBroker
    told: list[tuple[str, Any]] = field(default_factory=list)


@asynccontextmanager
async def _rig() -> AsyncIterator[Rig]:
    fake = broker()
    told: list[tuple[str, Any]] = []
    calls: list[tuple[int, dict[tuple[str, int], int]]] = []
    commit = commits_to(fake, calls)

    async def noted(offsets: Mapping[tuple[str, int], int]) -> None:
        told.append(("commit", dict(offsets)))
        await commit(offsets)

    def delivered(done: Outcome) -> None:
        told.append(("outcome", done.op_id))

    def dead_lettered(letter: OutRecord) -> None:
        told.append(("letter", json.loads(letter.value)["topic"]))

    async with FakeTransport(fake, ack_delay_s=0.001).open_sink() as sink:
        made = records()
        settler = Settler(
            sink, Clock(), made, backoff=BACKOFF, reply_to_timeout_ms=1_000, metrics=None
        )
        receipts = Receipts(
            Clock(), on_delivered=delivered, on_dead_lettered=dead_lettered, metrics=None
        )
        committer = Committer(noted, Clock(), interval_ms=100, backoff=BACKOFF)
        send, receive = trio.open_memory_channel[InFlight](64)
        acknowledger = Acknowledger(receive, settler, receipts, committer)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(acknowledger.run)
            nursery.start_soon(committer.run)
            yield Rig(acknowledger, send, sink, fake, told)
            await send.aclose()  # run returns, and finishes the committer


def _callback(i: int) -> Ref:
    done = outcome(i)
    return Ref(records().callback(done), done)


def _letter(source_topic: str = INPUT) -> Ref:
    record = OutRecord(DEAD, b"s", json.dumps({"topic": source_topic}).encode())
    return Ref(record, None, source_topic, "invalid")


async def test_a_chunk_reports_its_runs_in_order_settles_each_refusal_then_commits(
    autojump_clock: trio.testing.MockClock,
) -> None:
    barrier = trio.Event()
    async with _rig() as rig:
        refs = [_callback(1), _callback(2), _callback(3), _letter(), _callback(4)]
        delivery = Refused([None, TOO_LARGE, None, None, None])
        await rig.handed.send((delivery, refs, {(INPUT, 0): 7}, [barrier]))
        await barrier.wait()
        assert rig.acknowledger.settled == 5
    assert rig.told == [
        ("outcome", "op1"),
        ("letter", "cb"),  # op2's callback, dead-lettered alone
        ("outcome", "op2"),  # ... then its waiters told
        ("outcome", "op3"),
        ("letter", INPUT),
        ("outcome", "op4"),
        ("commit", {(INPUT, 0): 7}),
    ]


async def test_a_later_chunk_waits_for_an_earlier_one_even_if_it_is_decided_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _rig() as rig:
        rig.fake.stall = trio.Event()  # the broker acknowledges nothing for now
        first = _callback(1)
        delivery = await rig.sink.send_batch([first.record])
        await rig.handed.send((delivery, [first], {(INPUT, 0): 1}, []))
        second = trio.Event()
        await rig.handed.send((Refused([None]), [_callback(2)], {(INPUT, 0): 2}, [second]))
        await trio.sleep(5)
        assert rig.told == [] and not second.is_set()
        assert rig.acknowledger.settled == 0
        rig.fake.stall.set()
        await second.wait()
    outcomes = [what for what in rig.told if what[0] == "outcome"]
    assert outcomes == [("outcome", "op1"), ("outcome", "op2")]
    for offset, after in ((1, "op1"), (2, "op2")):  # each marker after its chunk's callbacks
        assert rig.told.index(("commit", {(INPUT, 0): offset})) > rig.told.index(("outcome", after))


async def test_a_retried_record_holds_back_its_chunks_offsets_and_barriers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    barrier = trio.Event()
    async with _rig() as rig:
        refs = [_callback(1), _callback(2)]
        await rig.handed.send((Refused([TIMEOUT, None]), refs, {(INPUT, 1): 3}, [barrier]))
        await trio.sleep(0.05)
        assert rig.told == [] and rig.acknowledger.settled == 0  # op2 waits behind op1
        await barrier.wait()
        # retried after 100 ms, acknowledged 1 ms later
        assert round(trio.current_time() * 1000) == 101
    assert rig.told == [("outcome", "op1"), ("outcome", "op2"), ("commit", {(INPUT, 1): 3})]
    assert rig.fake.log.count("send") == 1  # op1 again; op2 was taken the first time
