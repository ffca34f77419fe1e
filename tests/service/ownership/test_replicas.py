"""Two replicas on the real broker, ordinal mode: any replica answers for any scope."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio

from purgatory._codec import CancelRequest, SignalRecord, encode_request, encode_signal
from purgatory.client import AsyncPurgatoryClient
from purgatory.devtools.broker import Broker, free_port
from purgatory.service.app import run_service
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings
from tests.service.end_to_end.test_e2e import PARTITIONS, _consume, _settings, produce, register

pytestmark = pytest.mark.kafka


@asynccontextmanager
async def two_replicas(
    broker: Broker,
) -> AsyncIterator[tuple[Settings, list[AsyncPurgatoryClient]]]:
    """Replica 0 owns partition 0, replica 1 partition 1; each knows the other's URL."""
    shared = _settings(broker)
    ports = [free_port(), free_port()]
    peers = tuple(f"http://127.0.0.1:{port}" for port in ports)
    replicas: list[Settings] = [
        dataclasses.replace(
            shared,
            http_port=ports[ordinal],
            peer_urls=peers,
            replica_ordinal=ordinal,
            kafka_static_partitions=(ordinal,),
        )
        for ordinal in range(2)
    ]
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for settings in replicas:
            with trio.fail_after(30):
                await nursery.start(
                    lambda task_status, s=settings: run_service(
                        s, stop=stop, task_status=task_status
                    )
                )
        async with (
            AsyncPurgatoryClient(peers[0], timeout_s=10) as first,
            AsyncPurgatoryClient(peers[1], timeout_s=10) as second,
        ):
            yield shared, [first, second]
        stop.set()


async def test_any_replica_reads_and_writes_any_scope_and_each_gets_one_outcome(
    kafka_broker: Broker,
) -> None:
    scopes = [f"run-{i}" for i in range(40)]
    assert {partition_for(s, PARTITIONS) for s in scopes} == {0, 1}
    async with two_replicas(kafka_broker) as (settings, clients):
        for i, scope in enumerate(scopes):
            writer, reader = clients[i % 2], clients[(i + 1) % 2]
            created = await writer.register(
                scope=scope, op_id="barrier", keys=["a", "b"], timeout_ms=600_000
            )
            assert created["status"] == "pending"
            found = await reader.get(scope, "barrier")  # the other replica knows it too
            assert found["status"] == "pending" and found["keys"] == ["a", "b"]
        # One batch per replica, each naming scopes of both partitions.
        for client, key in zip(clients, ("a", "b"), strict=True):
            answer = await client.signals([{"scope": s, "key": key} for s in scopes])
            assert answer["accepted"] == len(scopes)
        assert answer["completed"] == len(scopes)  # the second key completes every barrier
        for i, scope in enumerate(scopes):
            waited = await clients[i % 2].wait(scope, "barrier", timeout_ms=10_000)
            assert waited["status"] == "completed"
            listed = await clients[(i + 1) % 2].pending(scope)
            assert listed["operations"] == []
    # Read one more than expected: a second outcome for any scope would show.
    callbacks = await trio.to_thread.run_sync(
        lambda: _consume(kafka_broker, settings.topic_callbacks, 41, timeout_s=3)
    )
    assert sorted(c["scope"] for c in callbacks) == sorted(scopes)  # exactly one each
    assert all(c["partition"] == partition_for(c["scope"], PARTITIONS) for c in callbacks)


async def _run_workload(broker: Broker, replicas: int) -> list[tuple[Any, ...]]:
    """The same Kafka workload through ``replicas`` service replicas (ordinal mode); the
    outcomes as (scope, op_id, outcome, keys, partition, sequence), sorted."""
    shared = _settings(broker)
    ports = [free_port() for _ in range(replicas)]
    peers = tuple(f"http://127.0.0.1:{port}" for port in ports)
    owned = [
        tuple(p for p in range(PARTITIONS) if p * replicas // PARTITIONS == ordinal)
        for ordinal in range(replicas)
    ]
    scopes = [f"w{i}" for i in range(30)]
    inputs: list[tuple[str, bytes | None, bytes]] = []
    for i, scope in enumerate(scopes):
        keys = ("a", "b") if i % 3 else ("a",)
        inputs.append(
            (shared.topic_requests, scope.encode(), register("op", scope, keys, timeout_ms=600_000))
        )
        inputs.append(
            (
                shared.topic_requests,
                scope.encode(),
                register("spare", scope, ("z",), timeout_ms=600_000),
            )
        )
    for scope in scopes:
        inputs.append(
            (shared.topic_signals, scope.encode(), encode_signal(SignalRecord(scope, "a")))
        )
    for scope in scopes[::2]:
        inputs.append(
            (shared.topic_signals, scope.encode(), encode_signal(SignalRecord(scope, "b")))
        )
        inputs.append(
            (shared.topic_requests, scope.encode(), encode_request(CancelRequest("spare", scope)))
        )
    expected = len(scopes) - len([i for i in range(1, 30, 2) if i % 3]) + len(scopes[::2])
    await produce(broker, inputs)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for ordinal in range(replicas):
            settings = dataclasses.replace(
                shared,
                http_port=ports[ordinal],
                peer_urls=peers if replicas > 1 else None,
                replica_ordinal=ordinal if replicas > 1 else None,
                kafka_static_partitions=owned[ordinal],
            )
            with trio.fail_after(30):
                await nursery.start(
                    lambda task_status, s=settings: run_service(
                        s, stop=stop, task_status=task_status
                    )
                )
        await trio.to_thread.run_sync(
            lambda: _consume(broker, shared.topic_callbacks, expected, timeout_s=30)
        )
        stop.set()
    callbacks = await trio.to_thread.run_sync(
        lambda: _consume(broker, shared.topic_callbacks, expected + 1, timeout_s=2)
    )
    assert len(callbacks) == expected
    return sorted(
        (c["scope"], c["op_id"], c["outcome"], tuple(c["keys"]), c["partition"], c["sequence"])
        for c in callbacks
    )


async def test_the_same_workload_decides_the_same_outcomes_with_one_and_two_replicas(
    kafka_broker: Broker,
) -> None:
    one = await _run_workload(kafka_broker, 1)
    two = await _run_workload(kafka_broker, 2)
    assert one == two  # the same outcomes, each partition's sequence included
    assert {o[2] for o in one} == {"completed", "cancelled"}
