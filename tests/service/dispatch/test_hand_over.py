"""A partition's hand-over is over before the rebalance goes on, whoever saw the revocation
first: against the in-memory broker, in virtual time.

kafka-python's I/O thread changes the consumer's assignment, then calls the rebalance
listener, which hands the revoked partitions over; meanwhile the consumer thread publishes the
new assignment after each poll, and the follower, which looks at it every 50 ms, may see a
partition gone before the listener runs, and begin its hand-over itself. The listener must
still wait for that hand-over: once it returns, the member rejoins, the group gives the
partition to its next owner, and that owner restores it from the changelog. A listener that
returned at once let the next owner restore a changelog without a write still in flight,
which the old owner then answered 2xx: read your writes broken, a 2xx then a 404 (seen once in
``test_group_restore.py::test_any_member_of_a_group_answers_for_any_scope`` on a loaded
machine).
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from purgatory._codec import RegisterRequest, encode_request
from purgatory.service.app import Service
from purgatory.service.errors import JournalStalledError, NotServingError
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeSource, FakeTransport
from tests.service.journal.test_durability import EPOCH_MS, INPUTS, REQUESTS, _broker, _journal

SETTINGS = Settings.from_env({}, topic_partitions=2, shutdown_grace_ms=5_000)
MOVED = 1  # the partition that changes owner
TAKEN = {(topic, MOVED) for topic in INPUTS}


@asynccontextmanager
async def _member(
    broker: FakeBroker,
    partitions: list[int],
    *,
    seed: int,
    fake: FakeTransport,
    settings: Settings | None = None,
) -> AsyncIterator[tuple[Service, FakeSource]]:
    """A service given ``partitions`` of the inputs over ``fake`` while the body runs, once it
    serves them."""
    assignment = [(topic, p) for topic in INPUTS for p in partitions]
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=list(INPUTS), group_id="g", assignment=assignment) as source,
    ):
        service = Service(
            settings or SETTINGS,
            Clock(offset_ms=EPOCH_MS),
            source,
            sink,
            reader,
            jitter=random.Random(seed),
        )
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: service.run(stop, serve_http=False))
            while service.table.serving() != set(partitions):
                await trio.sleep(0.01)
            yield service, source
            stop.set()


@pytest.mark.parametrize("listener_after_s", [0.0, 0.2], ids=["listener-first", "look-first"])
async def test_the_next_owner_restores_every_write_the_old_owner_acknowledged(
    listener_after_s: float, autojump_clock: trio.testing.MockClock
) -> None:
    broker = _broker()
    scope = next(
        f"r{i}" for i in range(100) if broker.partition_for(REQUESTS, f"r{i}".encode()) == MOVED
    )
    answers: list[str] = []
    known_to_next_owner: list[bool] = []
    old_link = FakeTransport(broker).link
    # The next owner's first journal record (its restore's) is acknowledged late, as on a
    # loaded machine: until then nothing tells it that another writer appended meanwhile.
    slow = FakeTransport(broker, ack_delay_s=3.0)
    async with (
        _member(broker, [0, MOVED], seed=0, fake=FakeTransport(broker, link=old_link)) as (
            old,
            source,
        ),
        trio.open_nursery() as n,
    ):
        old_link.cut()  # the old owner's journal record waits for its link

        async def write() -> None:
            # POST /v1/operations at the old owner: applied, then answered once journaled.
            old.flow.register(
                RegisterRequest(op_id="op", scope=scope, keys=("k",), timeout_ms=600_000)
            )
            try:
                await old.gate.durable([MOVED], bounded=True)
                answers.append("2xx")
            except (JournalStalledError, NotServingError) as exc:
                answers.append(type(exc).__name__)

        async def rebalance() -> None:
            # The group takes the partition away; once the listener returns, the member
            # rejoins and the second round gives the partition to its next owner, which
            # restores it and answers GET /v1/operation for its scopes.
            await source.revoke(TAKEN, listener_after_s=listener_after_s)
            async with _member(broker, [MOVED], seed=1, fake=slow) as (new, _source):
                while not answers:
                    await trio.sleep(0.01)
                known_to_next_owner.append(new.reads.lookup(scope, "op") is not None)

        n.start_soon(write)
        await trio.sleep(0.1)  # applied, its journal record not yet acknowledged
        n.start_soon(rebalance)
        await trio.sleep(1)
        assert MOVED not in old.table.serving()  # the old owner applies nothing more
        old_link.heal()  # its record lands: the old owner answers the write

    assert answers == ["2xx"]
    assert known_to_next_owner == [True]  # a 2xx, then found wherever it is asked for


# A grace shorter than the journal's wait: a write can outlast the hand-over that drops it.
SHORT_GRACE = Settings.from_env(
    {}, topic_partitions=2, shutdown_grace_ms=1_000, journal_wait_ms=5_000
)


async def test_a_write_a_hand_over_withdrew_after_its_grace_is_never_answered_2xx(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    scope = next(
        f"w{i}" for i in range(100) if broker.partition_for(REQUESTS, f"w{i}".encode()) == MOVED
    )
    answers: dict[str, str] = {}
    link = FakeTransport(broker).link
    fake = FakeTransport(broker, link=link)
    async with (
        _member(broker, [0, MOVED], seed=0, fake=fake, settings=SHORT_GRACE) as (
            old,
            source,
        ),
        trio.open_nursery() as nursery,
    ):
        link.cut()  # the first write's record is in flight, the second's waits behind it

        async def write(op_id: str) -> None:
            old.flow.register(
                RegisterRequest(op_id=op_id, scope=scope, keys=("k",), timeout_ms=600_000)
            )
            try:
                await old.gate.durable([MOVED], bounded=True)
                answers[op_id] = "2xx"
            except (JournalStalledError, NotServingError) as exc:
                answers[op_id] = type(exc).__name__

        nursery.start_soon(write, "first")
        await trio.sleep(0.1)
        nursery.start_soon(write, "second")
        await trio.sleep(0.1)
        # The hand-over runs out of its grace with the second write's entry unwritten: it is
        # withdrawn (the next owner must not find a record of a writer that let it go).
        await source.revoke(TAKEN)
        link.heal()  # the first record lands where this writer expected it
        # A write to the partition it keeps goes in the batch the second write waits for.
        kept = next(
            f"k{i}" for i in range(100) if broker.partition_for(REQUESTS, f"k{i}".encode()) == 0
        )
        old.flow.register(RegisterRequest(op_id="kept", scope=kept, keys=(), timeout_ms=600_000))
        await old.gate.durable([0], bounded=True)
    journaled = {
        entry[2][0]
        for doc in _journal(broker, MOVED)
        for entry in doc["entries"]
        if entry[0] == "register"
    }
    assert journaled == {"first"}
    # A 2xx only for what is in the log. The withdrawn one answers 503 (its client retries it
    # at the next owner); so may the first, "maybe applied", which its retry finds there.
    assert answers["second"] == "NotServingError"
    assert {op for op, answer in answers.items() if answer == "2xx"} <= journaled


@pytest.mark.parametrize("revoked_after_s", [0.0, 0.001, 0.01, 0.05, 0.2])
async def test_a_rebalance_during_a_graceful_stop_lets_the_stop_finish_in_time(
    revoked_after_s: float, autojump_clock: trio.testing.MockClock
) -> None:
    # A rollout: this replica was sent SIGTERM, and while it delivers and commits what it
    # decided, another member joins or leaves and the group takes a partition away. The
    # rebalance listener runs inside the consumer thread's poll, so no commit is served until
    # it returns (the fake does the same): the listener must not wait for the stop, nor the
    # stop for the listener, or both wait out their grace and the replica exits 1 without its
    # delivered marks.
    broker = _broker()
    scopes = {
        p: next(
            f"s{i}" for i in range(100) if broker.partition_for(REQUESTS, f"s{i}".encode()) == p
        )
        for p in (0, MOVED)
    }
    for scope in scopes.values():
        for i in range(5):  # timers due at the stop: decided by it, delivered, committed
            request = RegisterRequest(op_id=f"t{i}", scope=scope, keys=(), timeout_ms=1_000)
            broker.append(REQUESTS, scope.encode(), encode_request(request))
    fake = FakeTransport(broker)
    assignment = [(topic, p) for topic in INPUTS for p in (0, MOVED)]
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=list(INPUTS), group_id="g", assignment=assignment) as source,
    ):
        service = Service(SETTINGS, Clock(offset_ms=EPOCH_MS), source, sink, reader)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:

            async def rebalance() -> None:
                await stop.wait()
                await trio.sleep(revoked_after_s)
                await source.revoke(TAKEN)

            nursery.start_soon(rebalance)
            await nursery.start(
                lambda task_status: service.run(stop, serve_http=False, task_status=task_status)
            )
            while len(broker.committed) < 1:  # every request read
                await trio.sleep(0.01)
            await trio.sleep(0.999)  # the timers are due now
            began = trio.current_time()
            stop.set()
        stopped_in_s = trio.current_time() - began
    assert stopped_in_s < SETTINGS.shutdown_grace_ms / 1000 / 2
    outcomes = {
        (doc["scope"], doc["op_id"])
        for record in broker.records(SETTINGS.topic_callbacks)
        for doc in [json.loads(record.value or b"{}")]
    }
    assert outcomes == {(s, f"t{i}") for s in scopes.values() for i in range(5)}
    for partition in (0, MOVED):  # the next owner re-sends nothing
        assert _journal(broker, partition)[-1]["delivered"] == 5
    assert broker.committed[(REQUESTS, 0)] == 5
