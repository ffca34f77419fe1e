"""A patient wait on one operation: long polls in a row, riding out restarts, on either loop.

Each scenario runs once under asyncio and once under trio, the same coroutine, with a scripted
service (httpx's mock transport) and a virtual clock: no real sleep.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import httpx
import pytest
import trio

from purgatory.client import AsyncPurgatoryClient
from purgatory.client._await import MAX_PAUSE_S, await_outcome

EXPIRED = {"op_id": "o", "scope": "s", "outcome": "expired", "missing": ["b"]}


def _error(status: int, field: str, message: str) -> httpx.Response:
    return httpx.Response(
        status, json={"error": {"status": status, "field": field, "message": message}}
    )


def _pending(_request: httpx.Request) -> httpx.Response:
    return httpx.Response(200, json={"scope": "s", "op_id": "o", "status": "pending"})


def _expired(_request: httpx.Request) -> httpx.Response:
    return httpx.Response(
        200, json={"scope": "s", "op_id": "o", "status": "expired", "outcome": EXPIRED}
    )


def _down(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("connection refused", request=request)


def _unknown(_request: httpx.Request) -> httpx.Response:
    return _error(404, "op_id", "op_id 'o' is not known in scope 's'")


def _no_retry_after(_request: httpx.Request) -> httpx.Response:
    return _error(503, "scope", "partition 1 is being restored")  # the client's retries spent


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class _Service:
    """Answers in the order given, the last one forever; records each poll's timeout_ms.

    A long poll that ends pending took its whole length of the virtual clock."""

    def __init__(self, clock: _Clock, *answers: Callable[[httpx.Request], httpx.Response]):
        self.clock = clock
        self.answers = list(answers)
        self.polls: list[int] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        timeout_ms = int(request.url.params["timeout_ms"])
        self.polls.append(timeout_ms)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if answer is _pending:
            self.clock.now += timeout_ms / 1000
        return answer(request)


Run = Callable[[Callable[[], Coroutine[Any, Any, dict[str, Any]]]], dict[str, Any]]


def _on_asyncio(main: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> dict[str, Any]:
    return asyncio.run(main())


def _on_trio(main: Callable[[], Coroutine[Any, Any, dict[str, Any]]]) -> dict[str, Any]:
    return trio.run(main)


@pytest.fixture(params=[_on_asyncio, _on_trio], ids=["asyncio", "trio"])
def run(request: pytest.FixtureRequest) -> Run:
    loop: Run = request.param
    return loop


def _wait(run: Run, service: _Service, **options: Any) -> dict[str, Any]:
    clock = service.clock

    async def main() -> dict[str, Any]:
        transport = httpx.MockTransport(service)
        async with AsyncPurgatoryClient("http://api", timeout_s=5, transport=transport) as client:
            return await await_outcome(
                client, "s", "o", clock=clock.time, sleep=clock.sleep, **options
            )

    return run(main)


def test_long_polls_follow_each_other_until_the_outcome_with_no_pause(run: Run) -> None:
    clock = _Clock()
    service = _Service(clock, _pending, _pending, _expired)
    event = _wait(run, service, limit_s=600, poll_ms=20_000)
    assert event == {
        "status": "expired", "scope": "s", "op_id": "o", "outcome": EXPIRED, "message": None
    }  # fmt: skip
    assert service.polls == [20_000] * 3
    assert clock.slept == [] and clock.now == 40.0  # a poll that ends pending is followed at once


def test_a_restarting_service_is_waited_out_with_pauses_that_double(run: Run) -> None:
    clock = _Clock()
    service = _Service(clock, *[_down] * 8, _no_retry_after, _expired)
    event = _wait(run, service, limit_s=600)
    assert event["status"] == "expired"
    assert clock.slept == [0.5, 1.0, 2.0, 4.0, 8.0, MAX_PAUSE_S, MAX_PAUSE_S, MAX_PAUSE_S, 10.0]


def test_the_limit_ends_the_wait_and_the_last_poll_fits_it(run: Run) -> None:
    clock = _Clock()
    service = _Service(clock, _down, _pending)
    event = _wait(run, service, limit_s=0.75, poll_ms=30_000)
    assert event == {
        "status": "timeout", "scope": "s", "op_id": "o", "outcome": None,
        "message": "no outcome within 0.75 s",
    }  # fmt: skip
    assert service.polls == [750, 250]  # each poll fits what is left of the limit
    assert clock.slept == [0.5] and clock.now == 0.75


def test_an_unknown_operation_is_an_error_unless_told_to_wait_for_its_registration(
    run: Run,
) -> None:
    event = _wait(run, _Service(_Clock(), _unknown), limit_s=600)
    assert event["status"] == "error"
    assert event["message"] == "404 op_id: op_id 'o' is not known in scope 's'"
    clock = _Clock()
    service = _Service(clock, _unknown, _unknown, _pending, _expired)
    event = _wait(run, service, limit_s=600, wait_for_registration=True)
    assert event["status"] == "expired" and clock.slept == [0.5, 1.0]


def test_a_refused_request_ends_the_wait_with_the_services_reason(run: Run) -> None:
    def bad(_request: httpx.Request) -> httpx.Response:
        return _error(401, "authorization", "a bearer token is required")

    event = _wait(run, _Service(_Clock(), bad), limit_s=600)
    assert event["status"] == "error"
    assert event["message"] == "401 authorization: a bearer token is required"
