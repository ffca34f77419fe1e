"""The HTTP API over the state machine, the reaper and the executor, in virtual time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from purgatory.client import ApiError, AsyncPurgatoryClient
from purgatory.service.app import Service, topics_of
from purgatory.service.ingress.http.app import build_app
from purgatory.service.ingress.http.auth import Authenticator
from purgatory.service.ingress.http.openapi import build_openapi, load_openapi
from purgatory.service.ingress.http.routes import ROUTES
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport

EPOCH_MS = 1_763_780_400_000  # 2025-11-22T03:00:00Z
SCOPE = "ingest@2026-11-22"


class Harness:
    def __init__(
        self,
        client: AsyncPurgatoryClient,
        http: httpx.AsyncClient,
        service: Service,
        broker: FakeBroker,
    ) -> None:
        self.client = client
        self.http = http
        self.service = service
        self.table = service.table
        self.reads = service.reads
        self.clock = service.clock
        self.broker = broker

    @property
    def delivered(self) -> list[str]:
        """The op_ids of the callbacks the broker acknowledged, in order."""
        return [json.loads(r.value or b"")["op_id"] for r in self.broker.records(CALLBACKS)]


CALLBACKS = "purgatory.callbacks"


@asynccontextmanager
async def running(
    *, token: str | None = None, max_pending_per_scope: int = 1_000, max_request_bytes: int = 20_000
) -> AsyncIterator[Harness]:
    """The service's parts over the in-memory broker, HTTP through ASGI, in virtual time."""
    settings = Settings.from_env(
        {},
        max_pending_per_scope=max_pending_per_scope,
        max_request_bytes=max_request_bytes,
        max_keys_per_operation=5,
        max_batch=10,
        max_wait_ms=120_000,
        max_deadline_ahead_ms=86_400_000,
        topic_partitions=1,
    )
    async with serving(settings, Clock(offset_ms=EPOCH_MS)) as (service, broker):
        if token is not None:
            config = replace(service.http_config, authenticator=Authenticator({"default": token}))
            service.app = build_app(service, config)
        transport = httpx.ASGITransport(app=service.app)
        async with (
            AsyncPurgatoryClient("http://api", token=token, transport=transport) as client,
            httpx.AsyncClient(base_url="http://api", transport=transport) as http,
        ):
            yield Harness(client, http, service, broker)


@asynccontextmanager
async def serving(settings: Settings, clock: Clock) -> AsyncIterator[tuple[Service, FakeBroker]]:
    """A ready service over a new in-memory broker, its loops running (cancelled at exit)."""
    broker = FakeBroker({t: 1 for t in topics_of(settings)})
    fake = FakeTransport(broker)
    topics = [settings.topic_requests, settings.topic_signals]
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=topics, group_id="g", assignment=None) as source,
    ):
        service = Service(settings, clock, source, sink, reader)
        service.status.started = True
        async with trio.open_nursery() as nursery:
            await nursery.start(service.executor.run)
            await nursery.start(service.outbox.run)
            assert service.changelog is not None
            await nursery.start(service.changelog.run)
            await nursery.start(service.reaper.run)
            nursery.start_soon(service.follower.run)
            while not service.table.serving():
                await trio.sleep(0.01)
            yield service, broker
            nursery.cancel_scope.cancel()


async def test_barrier_completes_through_http_and_wait_returns_the_outcome(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        created = await h.client.register(
            scope=SCOPE,
            op_id="nightly",
            keys=["orders", "users"],
            timeout_ms=60_000,
            payload={"job": "report"},
        )
        assert created["status"] == "pending"
        await trio.sleep(1)
        await h.client.signal(SCOPE, "orders", payload={"rows": 10})
        answer = await h.client.signals([{"scope": SCOPE, "key": "users"}])
        assert answer == {"accepted": 1, "completed": 1}
        waited = await h.client.wait(SCOPE, "nightly", timeout_ms=5_000)
        assert waited["status"] == "completed"
        assert waited["outcome"]["keys"] == ["orders", "users"]
        assert waited["outcome"]["signals"] == {"orders": {"rows": 10}, "users": None}
        assert waited["outcome"]["payload"] == {"job": "report"}
        await trio.testing.wait_all_tasks_blocked()
        assert h.delivered == ["nightly"]  # and delivered once


async def test_long_poll_returns_the_expiry_exactly_at_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        start = h.clock.now_ms()
        await h.client.register(scope=SCOPE, op_id="late", keys=["never"], timeout_ms=30_000)
        assert h.clock.now_ms() == start + 2  # answered once the journal has it
        waited = await h.client.wait(SCOPE, "late", timeout_ms=60_000)
        assert waited["status"] == "expired"
        assert waited["outcome"]["missing"] == ["never"]
        assert waited["outcome"]["outcome_ms"] == start + 30_000
        # Woken by the broker's acknowledgements (the journal's advance, then the callback:
        # 2 ms each after the deadline), not by a poll tick.
        assert h.clock.now_ms() == start + 30_000 + 2 + 2


async def test_wait_times_out_as_pending_and_cancel_is_terminal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        await h.client.register(scope=SCOPE, op_id="op", keys=["k"], timeout_ms=600_000)
        assert (await h.client.wait(SCOPE, "op", timeout_ms=1_000))["status"] == "pending"
        cancelled = await h.client.cancel(SCOPE, "op")
        assert cancelled["outcome"]["outcome"] == "cancelled"
        with pytest.raises(ApiError) as info:
            await h.client.cancel(SCOPE, "op")
        assert info.value.status == 409
        assert (await h.client.get(SCOPE, "op"))["status"] == "cancelled"


async def test_event_time_expiry_follows_watermarks(autojump_clock: trio.testing.MockClock) -> None:
    async with running() as h:
        await h.client.register(
            scope="clicks",
            op_id="hour-10",
            keys=["rollup"],
            deadline_ms=36_000_000,
            time_domain="event_time",
        )
        await h.client.watermark("clicks", 35_999_999)
        assert (await h.client.wait("clicks", "hour-10", timeout_ms=1_000))["status"] == "pending"
        await h.client.watermark("clicks", 36_000_000)
        assert (await h.client.wait("clicks", "hour-10", timeout_ms=1_000))["status"] == "expired"


async def test_batch_registration_reports_each_item(autojump_clock: trio.testing.MockClock) -> None:
    async with running(max_pending_per_scope=2) as h:
        answer = await h.client.register_many(
            [
                {"scope": "s", "op_id": "a", "keys": ["k"], "timeout_ms": 1_000},
                {"scope": "s", "op_id": "a", "keys": ["k"], "timeout_ms": 1_000},
                {"scope": "s", "op_id": "a", "keys": ["other"], "timeout_ms": 1_000},
                {"scope": "s", "op_id": "b", "keys": ["k"], "timeout_ms": 1_000},
                {"scope": "s", "op_id": "c", "keys": ["k"], "timeout_ms": 1_000},
            ]
        )
        statuses = [(r["op_id"], r["http_status"], r.get("status")) for r in answer["results"]]
        assert statuses == [
            ("a", 201, "pending"),
            ("a", 200, "duplicate"),
            ("a", 409, None),
            ("b", 201, "pending"),
            ("c", 429, None),
        ]
        listed = await h.client.pending("s")
        assert [o["op_id"] for o in listed["operations"]] == ["a", "b"]
        # The client pages with the server's cursor until it is null.
        first = await h.client.pending("s", limit=1)
        assert [o["op_id"] for o in first["operations"]] == ["a"]
        second = await h.client.pending("s", limit=1, cursor=first["next_cursor"])
        assert [o["op_id"] for o in second["operations"]] == ["b"]
        assert second["next_cursor"] is None


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "field"),
    [
        ("POST", "/v1/operations", b"{not json", 400, "(body)"),
        ("POST", "/v1/operations", b"[]", 422, ""),
        (
            "POST",
            "/v1/operations",
            {"scope": "s", "op_id": "o", "keys": ["a", ""], "timeout_ms": 5},
            422,
            "keys[1]",
        ),
        (
            "POST",
            "/v1/operations",
            {"scope": "s", "op_id": "o", "keys": ["a"], "timeout_ms": 5, "colour": 1},
            422,
            "colour",
        ),
        ("POST", "/v1/operations", {"scope": "s", "op_id": "o", "keys": ["a"]}, 422, None),
        (
            "POST",
            "/v1/operations",
            {"scope": "s", "op_id": "o", "keys": list("abcdef"), "timeout_ms": 5},
            422,
            "keys",
        ),
        (
            "POST",
            "/v1/operations",
            {"scope": "s", "op_id": "o", "keys": ["a"], "deadline_ms": 10**18},
            422,
            "deadline_ms",
        ),
        (
            "POST",
            "/v1/operations",
            {"scope": "s", "op_id": "o", "keys": ["a"], "timeout_ms": 10**11},
            429,
            None,
        ),
        ("POST", "/v1/operations", {"type": "cancel", "scope": "s", "op_id": "o"}, 422, "type"),
        (
            "POST",
            "/v1/signals",
            {"signals": [{"scope": "s", "key": "k"}, {"scope": "s"}]},
            422,
            "signals[1].key",
        ),
        ("POST", "/v1/signals", {"signals": [{"scope": "s", "key": "k"}] * 11}, 413, "signals"),
        ("POST", "/v1/signals", {"signal": []}, 422, "signals"),
        (
            "POST",
            "/v1/watermarks",
            {"watermarks": [{"scope": "s", "watermark_ms": -1}]},
            422,
            "watermarks[0].watermark_ms",
        ),
        ("GET", "/v1/operation?scope=s", None, 422, "op_id"),
        ("GET", "/v1/operation?scope=s&op_id=missing", None, 404, "op_id"),
        ("GET", "/v1/operation/wait?scope=s&op_id=o&timeout_ms=999999999", None, 422, "timeout_ms"),
        ("POST", "/v1/signals", b"x" * 30_000, 413, None),
    ],
)
async def test_bad_requests_get_a_4xx_naming_the_field(
    autojump_clock: trio.testing.MockClock,
    *,
    method: str,
    path: str,
    body: Any,
    status: int,
    field: str | None,
) -> None:
    async with running() as h:
        content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        response = await h.http.request(method, path, content=content)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["status"] == status
        if field is not None:
            assert error["field"] is not None and error["field"].startswith(field), error
        assert error["message"]
        assert h.table.engine_statistics().pending == 0  # nothing half-applied


async def test_writes_need_the_token_when_one_is_set(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(token="s3cret") as h:
        response = await h.http.post("/v1/signals", json={"signals": []})
        assert response.status_code == 401
        assert response.json()["error"]["field"] == "Authorization"
        assert (await h.client.signals([]))["accepted"] == 0  # the client sends the token
        assert (await h.http.get("/healthz")).status_code == 200  # probes stay open


async def test_probes_metrics_and_the_served_openapi_document(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        assert (await h.http.get("/healthz")).json() == {"status": "ok"}
        ready = (await h.http.get("/readyz")).json()
        assert ready["ready"] is True
        assert ready["partitions"]["0"]["state"] == "serving"
        metrics = (await h.http.get("/metrics")).text
        assert "purgatory_ready 1.0" in metrics
        assert 'purgatory_partition_serving{partition="0"} 1.0' in metrics
        assert "purgatory_journal_entries_total" in metrics
        assert (await h.http.get("/openapi.json")).json() == load_openapi()


def test_the_openapi_document_in_the_repository_is_up_to_date() -> None:
    assert load_openapi() == build_openapi(), (
        "regenerate: python -m purgatory.service.ingress.http.openapi"
        " > purgatory/service/ingress/http/openapi.json"
    )


def test_every_route_is_documented() -> None:
    documented = {
        (path, method.upper()) for path, item in load_openapi()["paths"].items() for method in item
    }
    assert documented == {(route.path, route.method) for route in ROUTES}  # one table for both
    routes = {
        "/v1/operations",
        "/v1/operations:batch",
        "/v1/operation",
        "/v1/operation/wait",
        "/v1/signals",
        "/v1/watermarks",
        "/v1/overview",
        "/ui",
        "/healthz",
        "/readyz",
        "/metrics",
        "/openapi.json",
    }
    assert routes == {path for path, _ in documented}
