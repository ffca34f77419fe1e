"""Group mode on the real broker: partitions the group assigns are restored before they are
served, and a restarted replica finds the operations it held."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import trio

from purgatory.client import AsyncPurgatoryClient
from purgatory.service._app import run_service
from purgatory.service._broker import EmbeddedBroker
from purgatory.service._partitioning import partition_for
from purgatory.service._settings import Settings
from tests.service.test_e2e import PARTITIONS, _settings

pytestmark = pytest.mark.kafka


async def _serving(settings: Settings, body: Any) -> None:
    """Run the service while ``body(client)`` runs, then stop it gracefully."""
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            await nursery.start(
                lambda task_status: run_service(settings, stop=stop, task_status=task_status)
            )
        url = f"http://{settings.http_host}:{settings.http_port}"
        # A group joins in seconds: until the partitions are assigned and restored, the
        # service answers 503 with Retry-After, which the client retries within its timeout.
        async with AsyncPurgatoryClient(url, timeout_s=30) as client:
            await body(client)
        stop.set()


async def test_a_restarted_group_member_restores_its_partitions_before_serving_them(
    kafka_broker: EmbeddedBroker,
) -> None:
    settings = dataclasses.replace(_settings(kafka_broker), kafka_static_partitions=None)
    scopes = [f"g{i}" for i in range(8)]  # both partitions

    async def register(client: AsyncPurgatoryClient) -> None:
        for scope in scopes:
            created = await client.register(
                scope=scope, op_id="barrier", keys=["a", "b"], timeout_ms=600_000
            )
            assert created["status"] == "pending"
            await client.signal(scope, "a")

    async def complete(client: AsyncPurgatoryClient) -> None:
        for scope in scopes:
            found = await client.get(scope, "barrier")
            assert found["status"] == "pending", found
        answer = await client.signals([{"scope": s, "key": "b"} for s in scopes])
        assert answer == {"accepted": len(scopes), "completed": len(scopes)}
        for scope in scopes:
            waited = await client.wait(scope, "barrier", timeout_ms=10_000)
            assert waited["status"] == "completed"
            assert waited["outcome"]["keys"] == ["a", "b"]  # "a" was remembered across

    assert {partition_for(s, PARTITIONS) for s in scopes} == set(range(PARTITIONS))
    await _serving(settings, register)
    await _serving(settings, complete)
