"""Driver helpers over a scripted HTTP boundary (the client is tested against the service)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from purgatory.client import ApiError, PurgatoryClient
from spark_bridge._driver import BarrierTimeoutError, Driver


def scripted(answers: list[tuple[int, Any]], seen: list[httpx.Request]) -> Driver:
    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        status, body = answers.pop(0)
        return httpx.Response(status, json=body)

    client = PurgatoryClient("http://svc", transport=httpx.MockTransport(handle))
    return Driver(client=client)


def test_wait_for_long_polls_until_the_outcome() -> None:
    outcome = {"op_id": "report", "outcome": "expired", "missing": ["ingest/stock"]}
    seen: list[httpx.Request] = []
    answers = [
        (200, {"status": "pending"}),
        (200, {"status": "pending"}),
        (200, {"status": "expired", "outcome": outcome}),
    ]
    with scripted(answers, seen) as driver:
        assert driver.wait_for("night", "report", timeout_s=600) == outcome
    assert [r.url.params["op_id"] for r in seen] == ["report"] * 3
    assert all(0 < int(r.url.params["timeout_ms"]) <= 55_000 for r in seen)


def test_wait_for_gives_up_at_its_own_timeout_naming_the_operation() -> None:
    seen: list[httpx.Request] = []
    with (
        scripted([(200, {"status": "pending"})], seen) as driver,
        pytest.raises(BarrierTimeoutError, match="'report' in scope 'night'"),
    ):
        driver.wait_for("night", "report", timeout_s=0)
    assert seen[0].url.params["timeout_ms"] == "0"


def test_an_unknown_operation_is_an_api_error_naming_the_field() -> None:
    error = {"error": {"status": 404, "field": "op_id", "message": "op_id 'x' is not known"}}
    with scripted([(404, error)], []) as driver, pytest.raises(ApiError) as info:
        driver.wait_for("night", "x", timeout_s=5)
    assert (info.value.status, info.value.field) == (404, "op_id")


def test_register_and_signal_send_the_documented_bodies() -> None:
    seen: list[httpx.Request] = []
    answers = [(201, {"status": "pending"}), (200, {"accepted": 1, "completed": 0})]
    with scripted(answers, seen) as driver:
        driver.register(scope="night", op_id="report", keys=["a", "b"], timeout_ms=1_000)
        driver.signal("night", "a", payload={"rows": 3})
    assert json.loads(seen[0].content) == {
        "scope": "night",
        "op_id": "report",
        "keys": ["a", "b"],
        "condition": "all",
        "timeout_ms": 1_000,
    }
    assert json.loads(seen[1].content) == {
        "signals": [{"scope": "night", "key": "a", "payload": {"rows": 3}}]
    }
