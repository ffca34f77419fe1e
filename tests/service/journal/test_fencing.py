"""Two writers on one partition, against the in-memory broker, in virtual time.

A second service that owns the same partitions as the first (a zombie that kept running, an
ordinal resize, or two replicas configured with the same ordinal) consumes the same inputs and
appends to the same changelog. Whatever the interleaving of their batches, what reaches the
callbacks topic is exactly what a replay of the changelog decides: never two different outcomes
for one operation, and once the second writer is gone, every operation journaled gets its one
outcome.
"""

from __future__ import annotations

import functools
import json
import random
from collections import defaultdict
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from purgatory._codec import encode_callback
from purgatory._core import Engine, replay_journal
from purgatory.service.app import Service
from purgatory.service.journal.format import counts, decode_journal_record, fresh_entries, reach
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport
from tests.service.journal.test_durability import (
    CALLBACKS,
    CHANGELOG,
    EPOCH_MS,
    INPUTS,
    PARTITIONS,
    SCOPES,
    SETTINGS,
    _broker,
    _check_outcomes_once,
    _journaled_registrations,
    _register,
    _signal,
)


async def _serve(
    broker: FakeBroker,
    stop: trio.Event,
    services: list[Service],
    *,
    ack_delay_s: float = 0.002,
    settings: Settings = SETTINGS,
    seed: int = 0,
) -> None:
    fake = FakeTransport(broker, ack_delay_s=ack_delay_s, max_batch=3)
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=list(INPUTS), group_id="g", assignment=None) as source,
    ):
        service = Service(
            settings,
            Clock(offset_ms=EPOCH_MS),
            source,
            sink,
            reader,
            jitter=random.Random(seed),  # deterministic: the same run every time
        )
        services.append(service)
        await service.run(stop, serve_http=False)


async def _feed(broker: FakeBroker, ops: set[tuple[str, str]], rounds: int = 30) -> None:
    """Barriers completed by signals (some signals first), timers that expire while both
    writers run, and cancels, spread over about 1.5 s."""
    for n in range(rounds):
        scope = SCOPES[n % len(SCOPES)]
        keys = [f"k{n}a", f"k{n}b"]
        if n % 3 == 0:
            _signal(broker, scope, keys[0])
        _register(broker, scope, f"op{n}", keys, timeout_ms=3_600_000)
        _register(broker, scope, f"t{n}", [], timeout_ms=20 + 7 * (n % 5))
        ops.update({(scope, f"op{n}"), (scope, f"t{n}")})
        await trio.sleep(0.02)
        _signal(broker, scope, keys[0], payload=f'{{"n":{n}}}')
        _signal(broker, scope, keys[1])
        await trio.sleep(0.03)


def _replayed(broker: FakeBroker) -> dict[tuple[str, str], bytes]:
    """What a replay of each partition's whole changelog decides, as callbacks (a record that
    landed where its writer did not expect it is void, and a consumed record journaled by
    both writers is applied once, as a restore does)."""
    decided: dict[tuple[str, str], bytes] = {}
    for partition in range(PARTITIONS):
        engine = Engine(SETTINGS.to_engine_config(), partition=partition)
        positions: dict[str, int] = {}
        for record in broker.topics[CHANGELOG][partition]:
            doc = decode_journal_record(record.value or b"")
            if doc is None or not counts(doc, record.offset):
                continue
            entries = fresh_entries(doc, positions)
            reach(positions, doc["positions"])
            for outcome in replay_journal(engine, entries):
                ident = (outcome.scope, outcome.op_id)
                assert ident not in decided, ident  # one outcome per operation in the log
                decided[ident] = encode_callback(outcome)
    return decided


def _check_released_is_the_log(broker: FakeBroker, ops: set[tuple[str, str]]) -> None:
    """Every callback is the log's outcome, byte for byte; each operation has one."""
    replayed = _replayed(broker)
    sent: dict[tuple[str, str], set[bytes]] = defaultdict(set)
    for record in broker.records(CALLBACKS):
        doc = json.loads(record.value or b"")
        sent[(doc["scope"], doc["op_id"])].add(record.value or b"")
    conflicting = {ident: values for ident, values in sent.items() if len(values) > 1}
    assert not conflicting
    for ident, values in sent.items():
        assert values == {replayed[ident]}, ident
    assert _journaled_registrations(broker) == ops  # every input was journaled
    assert set(sent) == set(replayed) == ops  # and every operation has its outcome
    _check_outcomes_once(broker)


def _steps_of_one_writer() -> int:
    steps: list[int] = []

    async def main() -> None:
        broker = _broker()
        ops: set[tuple[str, str]] = set()
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, broker, stop, [])
            await _feed(broker, ops)
            await trio.sleep(0.5)
            stop.set()
        steps.append(broker.steps)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return steps[0]


ONE_WRITER_STEPS = _steps_of_one_writer()


async def _two_writers(
    broker: FakeBroker,
    ops: set[tuple[str, str]],
    *,
    second_at: int,
    second_for_s: float,
    second_ack_delay_s: float = 0.002,
) -> tuple[list[Service], list[Service]]:
    """The first writer runs throughout; the second starts at step ``second_at`` and is
    killed (cancelled, as SIGKILL would) after ``second_for_s``; then the first runs alone
    until everything is delivered, and stops."""
    first: list[Service] = []
    second: list[Service] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, stop, first)
        nursery.start_soon(_feed, broker, ops)
        while broker.steps < second_at:
            await trio.sleep(0.0005)
        with trio.move_on_after(second_for_s):
            await _serve(broker, trio.Event(), second, ack_delay_s=second_ack_delay_s, seed=1)
        await trio.sleep(70)  # the first writer alone: its back-off, its restore, delivery
        stop.set()
    return first, second


@pytest.mark.parametrize("second_at", range(0, ONE_WRITER_STEPS, max(1, ONE_WRITER_STEPS // 16)))
async def test_two_writers_interleaved_at_any_step_release_only_what_the_log_decides(
    second_at: int, autojump_clock: trio.testing.MockClock
) -> None:
    broker = _broker()
    ops: set[tuple[str, str]] = set()
    await _two_writers(broker, ops, second_at=second_at, second_for_s=1.0)
    _check_released_is_the_log(broker, ops)


@pytest.mark.parametrize("second_ack_delay_s", [0.0005, 0.002, 0.007])
async def test_two_writers_for_the_whole_load_fence_each_other_and_never_conflict(
    second_ack_delay_s: float, autojump_clock: trio.testing.MockClock
) -> None:
    broker = _broker()
    ops: set[tuple[str, str]] = set()
    first, second = await _two_writers(
        broker, ops, second_at=0, second_for_s=3.0, second_ack_delay_s=second_ack_delay_s
    )
    fences = sum(first[0].follower.fences().values()) + sum(second[0].follower.fences().values())
    assert fences > 0  # they did meet on the changelog
    _check_released_is_the_log(broker, ops)


async def test_a_fenced_partition_is_named_in_the_log_metrics_and_readyz(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    ops: set[tuple[str, str]] = set()
    first: list[Service] = []
    seen: list[dict[str, Any]] = []
    stop = trio.Event()
    with structlog.testing.capture_logs() as logged:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, broker, stop, first)
            nursery.start_soon(_feed, broker, ops)
            with trio.move_on_after(1.0):
                async with trio.open_nursery() as inner:
                    inner.start_soon(functools.partial(_serve, broker, trio.Event(), [], seed=1))
                    while True:  # the first writer's /readyz while both write
                        await trio.sleep(0.01)
                        if first:
                            partitions = first[0].status.readiness()["partitions"]
                            assert isinstance(partitions, dict)
                            seen += [p for p in partitions.values() if p["state"] == "fenced"]
            await trio.sleep(70)
            stop.set()
    service = first[0]
    assert service.follower.fences(), "the first writer was never fenced"
    assert seen and all(p["fenced"] >= 1 for p in seen)
    body = service.metrics.render()[0].decode()
    for partition, count in service.follower.fences().items():
        assert f'purgatory_partition_fenced_total{{partition="{partition}"}} {count}.0' in body
    events = {doc.get("event") for doc in logged}
    assert {"partition_fenced", "partition_restore_deferred"} <= events
    fenced = next(doc for doc in logged if doc.get("event") == "partition_fenced")
    assert "another writer" in fenced["detail"]
    _check_released_is_the_log(broker, ops)
