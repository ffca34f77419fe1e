"""The intake's rules for a record's key and partition, and its back-pressure, against the
in-memory broker.

A scope lives in one partition's engine (murmur2 of the scope) and each input partition journals
the positions of its own records, so a record is applied only if its key is its scope and it
sits on its scope's partition. A record without a key, or one a producer put on another
partition, is dead-lettered naming ``key`` or ``partition`` and has no effect, now or after a
restart from the journal.

While the broker does not acknowledge the journal, the intake stops consuming once the journal
holds its capacity of unacknowledged entries: the records wait in their topics, uncommitted,
and are all applied once, and committed, when the broker acknowledges again.
"""

from __future__ import annotations

import json
from typing import Any

import trio
import trio.testing

from purgatory._codec import encode_request, encode_signal
from purgatory._codec._records import RegisterRequest, SignalRecord
from purgatory.service.app import Service, topics_of
from purgatory.service.journal.format import decode_journal_record
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport

EPOCH_MS = 1_763_780_400_000
PARTITIONS = 2
SETTINGS = Settings.from_env({}, topic_partitions=PARTITIONS, shutdown_grace_ms=5_000)
REQUESTS, SIGNALS = SETTINGS.topic_requests, SETTINGS.topic_signals
CALLBACKS, DEAD = SETTINGS.topic_callbacks, SETTINGS.topic_dead_letters
CHANGELOG = SETTINGS.topic_changelog

SCOPE = "s"
HOME = partition_for(SCOPE, PARTITIONS)  # the scope's partition
AWAY = 1 - HOME  # the other one


async def _run_for(broker: FakeBroker, seconds: float, services: list[Service]) -> None:
    fake = FakeTransport(broker, max_batch=3)
    stop = trio.Event()

    async def serve() -> None:
        async with (
            fake.open_sink() as sink,
            fake.open_reader() as reader,
            fake.open_source(topics=[REQUESTS, SIGNALS], group_id="g", assignment=None) as source,
        ):
            service = Service(SETTINGS, Clock(offset_ms=EPOCH_MS), source, sink, reader)
            services.append(service)
            await service.run(stop, serve_http=False)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.sleep(seconds)
        stop.set()


def _register(op_id: str, keys: list[str], **kw: Any) -> bytes:
    return encode_request(RegisterRequest(op_id=op_id, scope=SCOPE, keys=tuple(keys), **kw))


def _signal(key: str) -> bytes:
    return encode_signal(SignalRecord(SCOPE, key, None, None))


def _feed(broker: FakeBroker) -> None:
    """Four records that must not take effect, then one that must (and that any of the four
    would change): it waits for ``a`` and ``b``, which only the refused signals give."""
    broker.append(REQUESTS, None, _register("no-key", [], timeout_ms=10), partition=HOME)
    broker.append(SIGNALS, None, _signal("a"), partition=HOME)
    broker.append(REQUESTS, SCOPE.encode(), _register("away", [], timeout_ms=10), partition=AWAY)
    broker.append(SIGNALS, SCOPE.encode(), _signal("b"), partition=AWAY)
    broker.append(REQUESTS, SCOPE.encode(), _register("good", ["a", "b"], timeout_ms=3_600_000))


def _journaled(broker: FakeBroker) -> list[tuple[str, str]]:
    """The registrations (op_id) and signals (key) the journal holds, in order."""
    docs = [decode_journal_record(r.value or b"") for r in broker.records(CHANGELOG)]
    entries = [entry for doc in docs if doc is not None for entry in doc["entries"]]
    return [
        (e[0], e[2][0] if e[0] == "register" else e[3])
        for e in entries
        if e[0] in ("register", "signal")
    ]


async def test_a_record_without_a_key_or_off_its_scopes_partition_is_dead_lettered_unapplied(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker({t: PARTITIONS for t in topics_of(SETTINGS)})
    _feed(broker)
    services: list[Service] = []
    await _run_for(broker, 1, services)

    letters = sorted(
        (json.loads(r.value or b"") for r in broker.records(DEAD)),
        key=lambda d: (d["topic"], d["partition"]),
    )
    assert [(d["topic"], d["partition"], d["offset"], d["field"]) for d in letters] == sorted(
        [
            (REQUESTS, HOME, 0, "key"),
            (SIGNALS, HOME, 0, "key"),
            (REQUESTS, AWAY, 0, "partition"),
            (SIGNALS, AWAY, 0, "partition"),
        ],
        key=lambda t: (t[0], t[1]),
    )
    for letter in letters:
        if letter["field"] == "key":
            assert letter["key"] is None
            assert letter["reason"].startswith("key: ") and "null" in letter["reason"]
        else:
            assert letter["key"] == SCOPE
            assert letter["reason"] == (
                f"partition: the record is on partition {AWAY}, but its scope {SCOPE!r} belongs"
                f" on partition {HOME} (Kafka's default partitioner of the key)"
            )
    # No effect: no callback (the two timers would have expired), nothing journaled but the
    # good registration, which still waits for both of its keys.
    assert broker.records(CALLBACKS) == []
    assert _journaled(broker) == [("register", "good")]
    [service] = services
    for op_id in ("no-key", "away"):
        assert service.reads.lookup(SCOPE, op_id) is None
    found = service.reads.lookup(SCOPE, "good")
    assert found is not None and found[1] is None  # pending
    for topic in (REQUESTS, SIGNALS):
        for p, log in enumerate(broker.topics[topic]):
            assert broker.committed.get((topic, p), 0) == len(log)

    # A restart restores from the journal: still no effect, and nothing is dead-lettered twice.
    again: list[Service] = []
    await _run_for(broker, 1, again)
    assert broker.records(CALLBACKS) == []
    assert len(broker.records(DEAD)) == 4
    found = again[0].reads.lookup(SCOPE, "good")
    assert found is not None and found[1] is None
    assert again[0].reads.lookup(SCOPE, "no-key") is None


async def test_consumed_records_wait_in_their_topics_while_the_journal_is_not_acknowledged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker({t: PARTITIONS for t in topics_of(SETTINGS)})
    fake = FakeTransport(broker, max_batch=10)
    stop = trio.Event()
    services: list[Service] = []

    async def serve() -> None:
        async with (
            fake.open_sink() as sink,
            fake.open_reader() as reader,
            fake.open_source(topics=[REQUESTS, SIGNALS], group_id="g", assignment=None) as source,
        ):
            service = Service(SETTINGS, Clock(offset_ms=EPOCH_MS), source, sink, reader)
            assert service.changelog is not None
            service.changelog.capacity = 20  # unacknowledged entries before the intake waits
            services.append(service)
            await service.run(stop, serve_http=False)

    ops = 100
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        await trio.sleep(1)
        [service] = services
        assert service.changelog is not None
        broker.stall = trio.Event()  # the broker stops acknowledging
        for i in range(ops):
            broker.append(
                REQUESTS, SCOPE.encode(), _register(f"w{i}", [f"x{i}"], timeout_ms=3_600_000)
            )
            broker.append(SIGNALS, SCOPE.encode(), _signal(f"x{i}"))
        await trio.sleep(60)
        pending = service.changelog.statistics().pending_entries
        # The intake stopped at the bound (one poll of 10 records past it), far before 200.
        assert 20 < pending <= 40, pending
        assert not any(broker.committed.values())
        assert broker.records(CALLBACKS) == []
        broker.stall.set()
        await trio.sleep(5)
        assert service.changelog.statistics().pending_entries == 0
        stop.set()
    # Every record applied once, every operation completed once, every offset committed.
    journaled = _journaled(broker)
    assert sorted(journaled) == sorted(
        [("register", f"w{i}") for i in range(ops)] + [("signal", f"x{i}") for i in range(ops)]
    )
    outcomes = [json.loads(r.value or b"") for r in broker.records(CALLBACKS)]
    assert sorted(o["op_id"] for o in outcomes) == sorted(f"w{i}" for i in range(ops))
    assert {o["outcome"] for o in outcomes} == {"completed"}
    for topic in (REQUESTS, SIGNALS):
        for p, log in enumerate(broker.topics[topic]):
            assert broker.committed.get((topic, p), 0) == len(log), (topic, p)
