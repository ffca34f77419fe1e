"""Transactional delivery against the in-memory broker and its transaction coordinator.

The same workload as the durability tests, with ``PURGATORY_DELIVERY=transactional``: a crash
at any step (every transactional call is one: init, begin, each send, the offsets, the commit),
then a restart, and a ``read_committed`` reader of the callbacks sees **exactly one** record per
operation: no repeat at all, not even an identical one. The journal it restores from holds each
input once, the group's committed offsets cover every input, a retriable failure aborts and
retries a whole transaction, a record refused for good is dead-lettered in it, and an owner
whose transactional id was taken over is fenced: nothing it decided since is visible.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest
import trio
import trio.testing

from purgatory._core import ConfigError
from purgatory.service.app import Service
from purgatory.service.journal.format import decode_journal_record
from purgatory.service.kafka.transport import OutRecord, SendFailure
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport
from tests.service.fake_transactions import Transactions
from tests.service.journal.test_durability import (
    CALLBACKS,
    CHANGELOG,
    EPOCH_MS,
    INPUTS,
    PARTITIONS,
    REQUESTS,
    SIGNALS,
    _broker,
    _feed,
    _register,
    _signal,
)

SETTINGS = Settings.from_env(
    {}, topic_partitions=PARTITIONS, shutdown_grace_ms=5_000, delivery="transactional"
)
DEAD_LETTERS = SETTINGS.topic_dead_letters

Json = dict[str, Any]


async def _serve(
    broker: FakeBroker,
    coordinator: Transactions,
    stop: trio.Event,
    services: list[Service],
    settings: Settings = SETTINGS,
    *,
    ack_delay_s: float = 0.002,
    seed: int | None = None,
) -> None:
    """One transactional service on the fakes until ``stop``; ``seed`` makes its fence
    back-off the same every run."""
    fake = FakeTransport(broker, ack_delay_s=ack_delay_s, max_batch=3, transactions=coordinator)
    async with (
        fake.open_sink() as sink,
        fake.open_reader(read_committed=True) as reader,
        fake.open_source(topics=list(INPUTS), group_id="g", assignment=None) as source,
        fake.open_transactions(id_prefix="g", group_id="g") as txns,
    ):
        service = Service(
            settings,
            Clock(offset_ms=EPOCH_MS),
            source,
            sink,
            reader,
            transactions=txns,
            jitter=random.Random(seed),
        )
        services.append(service)
        await service.run(stop, serve_http=False)


async def _run_for(
    broker: FakeBroker,
    coordinator: Transactions,
    seconds: float,
    services: list[Service],
    settings: Settings = SETTINGS,
) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, coordinator, stop, services, settings)
        await trio.sleep(seconds)
        stop.set()


async def _crash_and_restart(
    broker: FakeBroker, coordinator: Transactions, expected: dict[tuple[str, str], str]
) -> tuple[trio.CancelScope, int, list[Service]]:
    """Feed the workload while a service runs, crashing at ``broker.crash_at``; then a new
    service on the same broker runs for 1 s and stops. Returns the crash's scope, the steps
    before the restart and the restarted service."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_feed, broker, expected)
        with trio.CancelScope() as crash:
            broker.crash_scope = crash
            await _run_for(broker, coordinator, 1, [])
    steps = broker.steps
    broker.crash_at = None
    services: list[Service] = []
    await _run_for(broker, coordinator, 1, services)
    return crash, steps, services


def _committed_records(coordinator: Transactions, topic: str) -> list[Json]:
    return [
        json.loads(r.value or b"") for p in range(PARTITIONS) for r in coordinator.visible(topic, p)
    ]


def _check_exactly_once(coordinator: Transactions) -> dict[tuple[str, str], Json]:
    """One committed callback per operation, not one more; per partition the sequences
    1..N; returns the outcomes."""
    callbacks = _committed_records(coordinator, CALLBACKS)
    copies = Counter((doc["scope"], doc["op_id"]) for doc in callbacks)
    assert all(n == 1 for n in copies.values()), copies
    outcomes = {(doc["scope"], doc["op_id"]): doc for doc in callbacks}
    for (scope, _op_id), doc in outcomes.items():
        assert doc["partition"] == partition_for(scope, PARTITIONS)
    for p in range(PARTITIONS):
        sequences = sorted(d["sequence"] for d in outcomes.values() if d["partition"] == p)
        assert sequences == list(range(1, len(sequences) + 1)), (p, sequences)
    return outcomes


def _check_committed_journal_applies_each_input_once(
    broker: FakeBroker, coordinator: Transactions
) -> None:
    registered: Counter[tuple[str, str]] = Counter()
    signalled: Counter[tuple[str, str]] = Counter()
    for p in range(PARTITIONS):
        for record in coordinator.visible(CHANGELOG, p):
            doc = decode_journal_record(record.value or b"")
            assert doc is not None
            for entry in doc["entries"]:
                if entry[0] == "register":
                    registered[(entry[2][1], entry[2][0])] += 1
                elif entry[0] == "signal":
                    signalled[(entry[2], entry[3])] += 1
    consumed_registrations = Counter(
        (doc["scope"], doc["op_id"])
        for doc in (_json_or_none(r.value) for r in broker.records(REQUESTS))
        if doc is not None and doc["type"] == "register"
    )
    consumed_signals = Counter(
        (doc["scope"], doc["key"])
        for doc in (json.loads(r.value or b"") for r in broker.records(SIGNALS))
    )
    assert registered == consumed_registrations
    assert signalled == consumed_signals


def _json_or_none(value: bytes | None) -> Json | None:
    try:
        doc: Json = json.loads(value or b"")
    except ValueError:
        return None
    return doc


def _check_offsets_committed(broker: FakeBroker) -> None:
    for topic in INPUTS:
        for p, log in enumerate(broker.topics[topic]):
            assert broker.committed.get((topic, p), 0) == len(log), (topic, p, broker.committed)


def _total_steps() -> int:
    steps: list[int] = []

    async def main() -> None:
        broker = _broker()
        _crash, total, _services = await _crash_and_restart(broker, Transactions(broker), {})
        steps.append(total)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return steps[0]


TOTAL_STEPS = _total_steps()


async def test_without_a_crash_each_operation_has_one_committed_callback_and_all_is_committed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    coordinator = Transactions(broker)
    expected: dict[tuple[str, str], str] = {}
    crash, steps, _services = await _crash_and_restart(broker, coordinator, expected)
    assert not crash.cancelled_caught
    assert steps == TOTAL_STEPS
    outcomes = _check_exactly_once(coordinator)
    assert {ident: doc["outcome"] for ident, doc in outcomes.items()} == expected
    _check_committed_journal_applies_each_input_once(broker, coordinator)
    _check_offsets_committed(broker)
    # Every write went through a transaction: the plain sink wrote nothing.
    assert not any(step in {"send", "ack", "commit"} for step in broker.log)
    assert {"txn-init", "txn-begin", "txn-send", "txn-offsets", "txn-commit"} <= set(broker.log)
    [dead] = _committed_records(coordinator, DEAD_LETTERS)  # the malformed record's
    assert dead["topic"] == REQUESTS


@pytest.mark.parametrize("crash_at", range(1, TOTAL_STEPS + 1))
async def test_a_crash_at_any_step_then_a_restart_leaves_exactly_one_callback_per_operation(
    autojump_clock: trio.testing.MockClock, crash_at: int
) -> None:
    broker = _broker(crash_at=crash_at)
    coordinator = Transactions(broker)
    expected: dict[tuple[str, str], str] = {}
    crash, _steps, [service] = await _crash_and_restart(broker, coordinator, expected)
    assert crash.cancelled_caught
    outcomes = _check_exactly_once(coordinator)
    assert {ident: doc["outcome"] for ident, doc in outcomes.items()} == expected
    stats = service.table.engine_statistics()
    assert stats.pending == 0
    _check_committed_journal_applies_each_input_once(broker, coordinator)
    _check_offsets_committed(broker)
    assert len(_committed_records(coordinator, DEAD_LETTERS)) == 1


async def test_an_aborted_transaction_is_tried_again_whole_and_nothing_repeats(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    coordinator = Transactions(broker)
    refusals = [3]

    def refuse_a_few_callbacks(record: OutRecord) -> SendFailure | None:
        if record.topic == CALLBACKS and refusals[0] > 0:
            refusals[0] -= 1
            return SendFailure("NotLeaderForPartitionError", retriable=True)
        return None

    broker.refuse = refuse_a_few_callbacks
    expected: dict[tuple[str, str], str] = {}
    crash, _steps, [service] = await _crash_and_restart(broker, coordinator, expected)
    assert not crash.cancelled_caught
    assert refusals == [0]
    outcomes = _check_exactly_once(coordinator)
    assert {ident: doc["outcome"] for ident, doc in outcomes.items()} == expected
    assert service.changelog is not None
    _check_offsets_committed(broker)
    # The aborted transactions' journal records are in the log; no read_committed reader
    # sees them.
    visible = sum(len(coordinator.visible(CHANGELOG, p)) for p in range(PARTITIONS))
    assert len(broker.records(CHANGELOG)) == visible + 3


async def test_a_callback_refused_for_good_is_dead_lettered_in_its_transaction(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = Settings.from_env(
        {},
        topic_partitions=PARTITIONS,
        shutdown_grace_ms=5_000,
        delivery="transactional",
        reply_to_topics="missing.topic",
    )
    broker = FakeBroker(
        {
            t: PARTITIONS
            for t in (*INPUTS, CALLBACKS, DEAD_LETTERS, CHANGELOG, settings.topic_snapshots)
        }
    )
    coordinator = Transactions(broker)
    broker.refuse = lambda record: (
        SendFailure("UnknownTopicOrPartitionError", retriable=False)
        if record.topic == "missing.topic"
        else None
    )
    _register(broker, "s0", "a", ["k"], timeout_ms=60_000, reply_to="missing.topic")
    _register(broker, "s0", "b", ["k"], timeout_ms=60_000)
    _signal(broker, "s0", "k")
    await _run_for(broker, coordinator, 1, [], settings)
    [callback] = _committed_records(coordinator, CALLBACKS)
    assert callback["op_id"] == "b"
    [letter] = _committed_records(coordinator, DEAD_LETTERS)
    assert "missing.topic" in letter["reason"]
    _check_offsets_committed(broker)


async def test_an_owner_whose_transactional_id_was_taken_releases_nothing_more(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    coordinator = Transactions(broker)
    services: list[Service] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, coordinator, stop, services)
        await trio.sleep(0.5)
        [owner] = services
        _register(broker, "s0", "before", ["k"], timeout_ms=60_000)
        _signal(broker, "s0", "k")
        await trio.sleep(0.5)
        # Another owner takes partition 0's transactional id (init_transactions).
        coordinator.init("g-0")
        _register(broker, "s0", "after", ["k2"], timeout_ms=60_000)
        _signal(broker, "s0", "k2")
        await trio.sleep(0.05)
        assert 0 not in owner.table.serving()  # fenced: dropped at its next commit
        assert owner.follower.fences().get(0, 0) >= 1
        stop.set()
    committed = {doc["op_id"] for doc in _committed_records(coordinator, CALLBACKS)}
    assert "before" in committed
    assert "after" not in committed  # decided by the fenced owner: never visible
    committed_journal = [
        decode_journal_record(r.value or b"") for r in coordinator.visible(CHANGELOG, 0)
    ]
    assert not any("after" in json.dumps(doc) for doc in committed_journal)


def test_transactional_delivery_needs_the_journal() -> None:
    with pytest.raises(ConfigError, match="PURGATORY_DELIVERY"):
        Settings.from_env({}, delivery="transactional", journal=False)
