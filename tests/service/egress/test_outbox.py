"""The outbox, its parts composed: the module's worked example, offsets committed only after
everything before them is acknowledged (against a model of the puts), back-pressure, shutdown,
and the records of transactional delivery; on the in-memory broker, in virtual time."""

from __future__ import annotations

import inspect
import io
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory._codec import encode_callback
from purgatory._core import Outcome
from purgatory.service.egress.outbox import Outbox
from purgatory.service.kafka.transport import ConsumedRecord, OutRecord, Refusal, SendFailure
from purgatory.service.telemetry.logging import configure_logging
from purgatory.service.telemetry.metrics import Metrics
from reaper import Clock, CompletionExecutor
from tests.service.egress.parts import (
    CALLBACKS,
    DEAD,
    INPUT,
    REPLY,
    TIMEOUT,
    broker,
    commits_to,
    letters,
    op_ids,
    outcome,
)
from tests.service.fake_kafka import FakeBroker, FakeTransport

# What the release, the transactional changelog, the follower and the app call: kept as is.
PUBLIC = {
    "__init__": "(self, sink: 'RecordSink', executor: 'CompletionExecutor', clock: 'Clock', *,"
    " callbacks_topic: 'str', dead_letters_topic: 'str', max_record_bytes: 'int',"
    " commit: 'Callable[[Mapping[tuple[str, int], int]], Awaitable[None]] | None' = None,"
    " on_delivered: 'Callable[[Outcome], None]' = <lambda>,"
    " on_dead_lettered: 'Callable[[OutRecord], None]' = <lambda>,"
    " metrics: 'Metrics | None' = None, capacity: 'int' = 10000, chunk: 'int' = 1000,"
    " reply_to_timeout_ms: 'int' = 30000, commit_interval_ms: 'int' = 100) -> 'None'",
    "acknowledged": "(self) -> 'None'",
    "close": "(self) -> 'None'",
    "closed": "property",
    "letter_for": "(self, refusal: 'Refusal') -> 'OutRecord'",
    "letter_settled": "(self, letter: 'OutRecord', *, source_topic: 'str', label: 'str') -> 'None'",
    "put": "(self, outcomes: 'Sequence[Outcome]') -> 'None'",
    "put_commit": "(self, offsets: 'Mapping[tuple[str, int], int]') -> 'None'",
    "put_dead_letter": "(self, refusal: 'Refusal') -> 'None'",
    "records_for": "(self, outcomes: 'Sequence[Outcome]') -> 'list[OutRecord]'",
    "run": "(self, *, task_status: 'trio.TaskStatus[None]' = TASK_STATUS_IGNORED) -> 'None'",
    "settled": "(self, outcomes: 'Sequence[Outcome]') -> 'None'",
    "statistics": "(self) -> 'OutboxStatistics'",
    "undeliverable": "(self, record: 'OutRecord', failure: 'SendFailure') -> 'OutRecord'",
    "wait_for_room": "(self) -> 'None'",
}


def test_the_public_methods_and_their_signatures_are_the_pinned_ones() -> None:
    found = {}
    for name, value in vars(Outbox).items():
        if name.startswith("_") and name != "__init__":
            continue
        found[name] = (
            "property"
            if isinstance(value, property)
            else re.sub(r"<function \S+ at 0x[0-9a-f]+>", "<lambda>", str(inspect.signature(value)))
        )
    assert found == PUBLIC


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    yield
    configure_logging("info", "json")
    structlog.reset_defaults()


@dataclass
class Rig:
    """A running outbox, its broker, and what it committed and told."""

    outbox: Outbox
    fake: FakeBroker
    commits: list[tuple[int, dict[tuple[str, int], int]]]
    delivered: list[Outcome] = field(default_factory=list)
    dead_lettered: list[OutRecord] = field(default_factory=list)


@asynccontextmanager
async def _outbox(
    fake: FakeBroker,
    ack_delay_s: float = 0.002,
    commit: Callable[[Mapping[tuple[str, int], int]], Awaitable[None]] | None = None,
    **options: Any,
) -> AsyncIterator[Rig]:
    """A running outbox over ``fake``; on the way out, closed and drained."""
    clock = Clock()
    executor = CompletionExecutor(clock)
    commits: list[tuple[int, dict[tuple[str, int], int]]] = []
    delivered: list[Outcome] = []
    dead_lettered: list[OutRecord] = []
    async with FakeTransport(fake, ack_delay_s=ack_delay_s).open_sink() as sink:
        outbox = Outbox(
            sink,
            executor,
            clock,
            callbacks_topic=CALLBACKS,
            dead_letters_topic=DEAD,
            commit=commit if commit is not None else commits_to(fake, commits),
            on_delivered=delivered.append,
            on_dead_lettered=dead_lettered.append,
            **{"max_record_bytes": 1_000_000, **options},
        )

        async def serve(*, task_status: trio.TaskStatus[None]) -> None:
            await outbox.run(task_status=task_status)
            executor.close()  # after the sender's last work

        async with trio.open_nursery() as nursery:
            await nursery.start(executor.run)
            await nursery.start(serve)
            yield Rig(outbox, fake, commits, delivered, dead_lettered)
            outbox.close()


def _input(offset: int, value: bytes = b"not json", partition: int = 0) -> ConsumedRecord:
    return ConsumedRecord(INPUT, partition, offset, b"s", value, 1_000)


async def test_the_worked_example_of_the_module_docstring(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def refuse(record: OutRecord) -> SendFailure | None:
        if record.topic == CALLBACKS:
            return SendFailure("MessageSizeTooLargeError: over the broker's limit", False)
        return None

    fake = broker(refuse)
    async with _outbox(fake) as rig:
        rig.outbox.put([outcome(1)])  # callback(A)
        rig.outbox.put_dead_letter(Refusal(_input(11), "bad", None, "invalid"))
        rig.outbox.put_commit({(INPUT, 0): 12})
        await trio.sleep(1)
    assert op_ids(fake) == []
    [r, a] = letters(fake)  # R's first: in the batch; A's after, alone
    assert (r["topic"], r["offset"]) == (INPUT, 11)
    assert a["topic"] == CALLBACKS and "MessageSizeTooLargeError" in a["reason"]
    assert json.loads(a["value"])["op_id"] == "op1"
    assert fake.log.index("commit") > max(i for i, step in enumerate(fake.log) if step == "ack")
    assert fake.committed == {(INPUT, 0): 12}
    assert rig.delivered == [outcome(1)]  # settled: its waiters are told
    stats = rig.outbox.statistics()
    assert (stats.delivered, stats.dead_lettered, stats.commits) == (0, 2, 1)


# One step of a workload: outcomes (each refused as retriable that many times first; some to a
# reply_to topic), the dead letter of an input record, a commit marker, a pause, or a barrier.
_STEP = st.one_of(
    st.tuples(
        st.just("outcomes"), st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=4)
    ),
    st.tuples(st.just("letter"), st.none()),
    st.tuples(st.just("commit"), st.integers(0, 1)),
    st.tuples(st.just("sleep"), st.sampled_from([0, 1, 2, 100])),
    st.tuples(st.just("barrier"), st.none()),
)


@settings(max_examples=100)
@given(
    st.lists(_STEP, max_size=14), st.sampled_from([1, 2, 3, 1_000]), st.sampled_from([0.001, 0.003])
)
def test_offsets_are_committed_only_once_everything_before_them_is_acknowledged(
    script: list[tuple[str, Any]], chunk: int, ack_delay_s: float
) -> None:
    """The model: the puts in order. At every commit, each offset's marker has every record
    put before it on the broker; a barrier returns once everything before it is there; at the
    end each record is on the broker once and the latest markers are committed."""
    failures: dict[bytes, int] = {}  # a record's value -> refusals left

    def refuse(record: OutRecord) -> SendFailure | None:
        left = failures.get(record.value, 0)
        if left:
            failures[record.value] = left - 1
            return TIMEOUT
        return None

    fake = broker(refuse)
    before_marker: dict[tuple[tuple[str, int], int], list[tuple[str, Any]]] = {}
    puts: list[tuple[str, Any]] = []  # ("op", op_id) or ("letter", input offset)
    refused: list[int] = []
    seen: set[tuple[str, Any]] = set()

    def on_broker() -> set[tuple[str, Any]]:
        found = {("op", op) for topic in (CALLBACKS, REPLY) for op in op_ids(fake, topic)}
        return found | {("letter", letter["offset"]) for letter in letters(fake)}

    commit = commits_to(fake, [])

    async def checked(done: Mapping[tuple[str, int], int]) -> None:
        there = on_broker()
        for tp, offset in done.items():
            assert set(before_marker[(tp, offset)]) <= there, (tp, offset)
        await commit(done)

    async def main() -> None:
        sequence, offsets = 0, {0: 0, 1: 0}
        async with _outbox(fake, ack_delay_s=ack_delay_s, commit=checked, chunk=chunk) as rig:
            for kind, arg in script:
                if kind == "outcomes":
                    batch = []
                    for refusals, reply in arg:
                        sequence += 1
                        done = outcome(sequence, reply_to=REPLY if reply else None)
                        failures[encode_callback(done)] = refusals
                        refused.append(refusals)
                        batch.append(done)
                        puts.append(("op", done.op_id))
                    rig.outbox.put(batch)
                elif kind == "letter":
                    sequence += 1
                    rig.outbox.put_dead_letter(Refusal(_input(sequence), "bad", None, "invalid"))
                    puts.append(("letter", sequence))
                elif kind == "commit":
                    offsets[arg] += 1
                    tp = (INPUT, arg)
                    before_marker[(tp, offsets[arg])] = list(puts)
                    rig.outbox.put_commit({tp: offsets[arg]})
                elif kind == "sleep":
                    await trio.sleep(arg / 1000)
                else:
                    await rig.outbox.acknowledged()
                    assert set(puts) <= on_broker()
            await rig.outbox.acknowledged()
            seen.update(on_broker())
            stats = rig.outbox.statistics()
            assert (stats.queued, stats.in_flight) == (0, 0)
            assert stats.delivered == sum(kind == "op" for kind, _ in puts)
            assert stats.dead_lettered == sum(kind == "letter" for kind, _ in puts)
            assert stats.retries == sum(refused)  # each refusal retried, none given up
        assert fake.committed == {(INPUT, p): o for p, o in offsets.items() if o}

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert seen == set(puts)
    callbacks = [op for topic in (CALLBACKS, REPLY) for op in op_ids(fake, topic)]
    assert len(callbacks) == len(set(callbacks))  # each once


async def test_producers_wait_for_room_until_the_sender_takes_the_backlog(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = broker()
    executor = CompletionExecutor(Clock())
    async with FakeTransport(fake).open_sink() as sink, trio.open_nursery() as nursery:
        outbox = Outbox(
            sink,
            executor,
            Clock(),
            callbacks_topic=CALLBACKS,
            dead_letters_topic=DEAD,
            max_record_bytes=1_000_000,
            capacity=2,
            chunk=1,
        )
        outbox.put([outcome(1), outcome(2), outcome(3)])
        went_on: list[int] = []

        async def producer() -> None:
            await outbox.wait_for_room()
            went_on.append(outbox.statistics().queued)  # at most capacity

        async def serve() -> None:
            await outbox.run()
            executor.close()

        nursery.start_soon(producer)
        await trio.sleep(1)
        assert went_on == [] and outbox.statistics().queued == 3
        await nursery.start(executor.run)
        nursery.start_soon(serve)
        await outbox.acknowledged()
        outbox.close()
    assert len(went_on) == 1 and went_on[0] <= 2
    assert op_ids(fake) == ["op1", "op2", "op3"]


async def test_close_refuses_puts_and_run_returns_once_everything_is_acknowledged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = broker()
    executor = CompletionExecutor(Clock())
    async with FakeTransport(fake, ack_delay_s=0.5).open_sink() as sink:
        outbox = Outbox(
            sink,
            executor,
            Clock(),
            callbacks_topic=CALLBACKS,
            dead_letters_topic=DEAD,
            max_record_bytes=1_000_000,
            commit=commits_to(fake, []),
        )
        async with trio.open_nursery() as nursery:
            await nursery.start(executor.run)
            outbox.put([outcome(1)])
            outbox.put_commit({(INPUT, 0): 1})
            outbox.close()
            assert outbox.closed
            puts: list[Callable[[], None]] = [
                lambda: outbox.put([outcome(2)]),
                lambda: outbox.put_commit({(INPUT, 0): 2}),
                lambda: outbox.put_dead_letter(Refusal(_input(0), "r", None, "x")),
            ]
            for put in puts:
                with pytest.raises(trio.ClosedResourceError):
                    put()
            with pytest.raises(trio.ClosedResourceError):
                await outbox.acknowledged()
            await outbox.run()  # drains: the callback acknowledged, the offset committed
            assert op_ids(fake) == ["op1"] and fake.committed == {(INPUT, 0): 1}
            stats = outbox.statistics()
            assert (stats.queued, stats.in_flight, stats.delivered, stats.commits) == (0, 0, 1, 1)
            executor.close()


async def test_the_records_of_a_transaction_follow_the_outboxs_policy_and_count_once_settled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    metrics = Metrics()
    delivered: list[Outcome] = []
    dead: list[OutRecord] = []
    small, big = outcome(1, reply_to=REPLY), outcome(2, payload='"' + "x" * 1_000 + '"')
    fake = broker()
    async with FakeTransport(fake).open_sink() as sink:
        outbox = Outbox(
            sink,
            CompletionExecutor(Clock()),
            Clock(),
            callbacks_topic=CALLBACKS,
            dead_letters_topic=DEAD,
            max_record_bytes=1_024,
            on_delivered=delivered.append,
            on_dead_lettered=dead.append,
            metrics=metrics,
        )
        first, second = outbox.records_for([small, big])
        assert first == OutRecord(REPLY, b"s", encode_callback(small))
        letter = json.loads(second.value)
        assert second.topic == DEAD and second.key == b"s"
        assert letter["reason"].startswith(f"callback not delivered to topic {CALLBACKS!r}: ")
        assert "over max_record_bytes" in letter["reason"] and letter["timestamp_ms"] is None
        [line] = [json.loads(line) for line in out.getvalue().splitlines()]
        assert (line["event"], line["op_id"]) == ("callback_dead_lettered", "op2")
        assert metrics.registry.get_sample_value("purgatory_callback_errors_total") == 1

        outbox.settled([small])
        input_letter = outbox.letter_for(Refusal(_input(4), "bad", "keys", "invalid", "s"))
        assert json.loads(input_letter.value)["offset"] == 4 and input_letter.topic == DEAD
        outbox.letter_settled(input_letter, source_topic=INPUT, label="invalid")
    assert delivered == [small] and dead == [input_letter]
    stats = outbox.statistics()
    assert (stats.delivered, stats.dead_lettered, stats.in_flight) == (1, 1, 0)
    produced = metrics.registry.get_sample_value(
        "purgatory_records_produced_total", {"topic": REPLY}
    )
    assert produced == 1
    assert fake.log == []  # written elsewhere: nothing went through this sink
