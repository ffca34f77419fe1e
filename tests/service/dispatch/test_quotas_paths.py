"""Limits on the two input paths, in virtual time over the in-memory broker: a Kafka record the
quotas or the memory budget refuse is dead-lettered with the limit named (and its offset still
committed: nothing is lost), and an HTTP registration gets 429 naming it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import trio
import trio.testing

from purgatory._codec import encode_request, encode_signal
from purgatory._codec._records import RegisterRequest, SignalRecord
from purgatory.service.app import Service, topics_of
from purgatory.service.dispatch.admission import MEMORY_BASE_BYTES
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport
from tests.service.ingress.test_http import serving

EPOCH_MS = 1_763_780_400_000
SCOPE = "ingest@2026-11-22"


def _settings(**overrides: Any) -> Settings:
    return Settings.from_env({}, topic_partitions=1, shutdown_grace_ms=5_000, **overrides)


async def _serve(broker: FakeBroker, settings: Settings, stop: trio.Event) -> None:
    fake = FakeTransport(broker, max_batch=4)
    topics = [settings.topic_requests, settings.topic_signals]
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=topics, group_id="g", assignment=None) as source,
    ):
        service = Service(settings, Clock(offset_ms=EPOCH_MS), source, sink, reader)
        await service.run(stop, serve_http=False)


def _register(broker: FakeBroker, settings: Settings, op_id: str, keys: list[str]) -> None:
    request = RegisterRequest(op_id=op_id, scope=SCOPE, keys=tuple(keys), timeout_ms=3_600_000)
    broker.append(settings.topic_requests, SCOPE.encode(), encode_request(request))


def _signal(broker: FakeBroker, settings: Settings, key: str) -> None:
    record = encode_signal(SignalRecord(SCOPE, key, None, None))
    broker.append(settings.topic_signals, SCOPE.encode(), record)


async def _run_once(broker: FakeBroker, settings: Settings) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, settings, stop)
        await trio.sleep(1)
        stop.set()


def _letters(broker: FakeBroker, settings: Settings) -> list[dict[str, Any]]:
    return [json.loads(r.value or b"") for r in broker.records(settings.topic_dead_letters)]


def _all_committed(broker: FakeBroker, settings: Settings) -> bool:
    return all(
        broker.committed.get((topic, p), 0) == len(log)
        for topic in (settings.topic_requests, settings.topic_signals)
        for p, log in enumerate(broker.topics[topic])
    )


async def test_kafka_registrations_over_the_memory_budget_are_dead_lettered_naming_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = _settings(max_memory_bytes=MEMORY_BASE_BYTES + 10_000)
    broker = FakeBroker({t: 1 for t in topics_of(settings)})
    for i in range(30):
        _register(broker, settings, f"op-{i:02d}", [f"k{i}"])
    _signal(broker, settings, "nobody-awaits-it")
    _signal(broker, settings, "k0")  # awaited: taken, whatever the budget
    await _run_once(broker, settings)
    letters = _letters(broker, settings)
    assert 10 < len(letters) < 30
    for letter in letters:
        assert letter["field"] == "max_memory_bytes"
        assert letter["reason"].startswith("max_memory_bytes (")
    refused = {json.loads(letter["value"]).get("op_id") for letter in letters}
    assert None in refused  # the signal nobody awaits
    callbacks = [json.loads(r.value or b"") for r in broker.records(settings.topic_callbacks)]
    assert [(c["op_id"], c["outcome"]) for c in callbacks] == [("op-00", "completed")]
    assert _all_committed(broker, settings)  # nothing left behind: refused ones are letters


async def test_kafka_is_one_client_for_the_quotas(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = _settings(max_pending_per_client=2)
    broker = FakeBroker({t: 1 for t in topics_of(settings)})
    for i in range(3):
        _register(broker, settings, f"op-{i}", [f"k{i}"])
    await _run_once(broker, settings)
    [letter] = _letters(broker, settings)
    assert letter["field"] == "max_pending_per_client"
    assert "client 'kafka'" in letter["reason"]
    assert json.loads(letter["value"])["op_id"] == "op-2"
    assert _all_committed(broker, settings)


@asynccontextmanager
async def _http(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(settings, Clock(offset_ms=EPOCH_MS)) as (service, _):
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(base_url="http://api", transport=transport) as http:
            yield http


ALICE, BOB = "a" * 24, "b" * 24


async def test_over_http_one_client_over_two_scopes_gets_429_and_another_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = _settings(max_pending_per_client=2, api_tokens=f"alice={ALICE},bob={BOB}")

    async def register(token: str, scope: str, op_id: str) -> httpx.Response:
        body = {"scope": scope, "op_id": op_id, "keys": ["k"], "timeout_ms": 60_000}
        headers = {"Authorization": f"Bearer {token}"}
        return await http.post("/v1/operations", json=body, headers=headers)

    async with _http(settings) as http:
        assert (await register(ALICE, "scope-1", "op-1")).status_code == 201
        assert (await register(ALICE, "scope-2", "op-2")).status_code == 201
        refused = await register(ALICE, "scope-3", "op-3")
        assert refused.status_code == 429
        assert "max_pending_per_client" in refused.text
        assert "client 'alice'" in refused.text
        assert refused.headers["Retry-After"]
        assert (await register(BOB, "scope-1", "op-4")).status_code == 201
