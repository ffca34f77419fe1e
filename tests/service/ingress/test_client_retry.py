"""The clients retry a 503 with Retry-After (a partition restoring) within their timeout."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import trio
import trio.testing

from purgatory.client import AsyncPurgatoryClient, PurgatoryClient
from purgatory.client._requests import ApiError, retry_after_s
from purgatory.service import cli

RESTORING = {"error": {"status": 503, "field": "scope", "message": "partition 1 is being restored"}}


def _service(refusals: int, calls: list[str], retry_after: str = "1") -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) <= refusals:
            return httpx.Response(503, json=RESTORING, headers={"Retry-After": retry_after})
        return httpx.Response(201, json={"status": "pending"})

    return httpx.MockTransport(handle)


def test_the_pause_is_the_services_bounded_and_fits_the_time_left() -> None:
    assert retry_after_s(503, {"retry-after": "1"}, 10.0) == 1.0
    assert retry_after_s(503, {"retry-after": "0"}, 10.0) == 0.05  # never a busy loop
    assert retry_after_s(503, {"retry-after": "120"}, 10.0) == 2.0  # at most MAX_RETRY_PAUSE_S
    assert retry_after_s(503, {"retry-after": "1"}, 0.5) is None  # no time left: final
    assert retry_after_s(503, {}, 10.0) is None  # a 503 without Retry-After is final
    assert retry_after_s(503, {"retry-after": "Wed, 21 Oct 2026"}, 10.0) is None
    assert retry_after_s(429, {"retry-after": "1"}, 10.0) is None


class _VirtualTime:
    """The blocking client's clock and sleep, without sleeping."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _blocking(
    transport: httpx.MockTransport, timeout_s: float
) -> tuple[PurgatoryClient, _VirtualTime]:
    client = PurgatoryClient("http://api", timeout_s=timeout_s, transport=transport)
    time = _VirtualTime()
    client._clock, client._sleep = time.clock, time.sleep
    return client, time


def test_the_blocking_client_retries_until_the_partition_is_restored() -> None:
    calls: list[str] = []
    client, time = _blocking(_service(2, calls), timeout_s=30)
    with client:
        answer = client.register(scope="s", op_id="o", keys=["k"], timeout_ms=1_000)
    assert answer == {"status": "pending"}
    assert calls == ["/v1/operations"] * 3
    assert time.slept == [1.0, 1.0]


def test_the_blocking_client_gives_up_with_the_503_when_its_timeout_is_spent() -> None:
    calls: list[str] = []
    client, time = _blocking(_service(99, calls), timeout_s=2.5)
    with client, pytest.raises(ApiError) as info:
        client.get("s", "o")
    assert info.value.status == 503 and info.value.field == "scope"
    assert len(calls) == 3 and time.slept == [1.0, 1.0]  # a third pause would pass 2.5 s


async def test_the_trio_client_retries_in_virtual_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[str] = []
    start = trio.current_time()
    async with AsyncPurgatoryClient(
        "http://api", timeout_s=10, transport=_service(3, calls)
    ) as client:
        assert await client.register(scope="s", op_id="o", timeout_ms=1_000) == {
            "status": "pending"
        }
    assert len(calls) == 4
    assert trio.current_time() - start == pytest.approx(3.0)  # three pauses of Retry-After: 1


def _answers(statuses: list[dict[str, str] | None], marks: list[str | None]) -> httpx.MockTransport:
    """503s with the given extra headers (None: the final 201), recording each try's mark."""

    def handle(request: httpx.Request) -> httpx.Response:
        marks.append(request.headers.get("Purgatory-Retry"))
        extra = statuses[len(marks) - 1]
        if extra is None:
            return httpx.Response(201, json={"status": "pending"})
        return httpx.Response(503, json=RESTORING, headers={"Retry-After": "1", **extra})

    return httpx.MockTransport(handle)


def test_a_try_after_an_answer_that_may_have_applied_it_is_marked_as_a_retry() -> None:
    maybe = {"Purgatory-Applied": "maybe"}
    marks: list[str | None] = []
    # restoring (refused before anything changed), then maybe applied, then restoring again
    client, _time = _blocking(_answers([{}, maybe, {}, None], marks), timeout_s=30)
    with client:
        client.register(scope="s", op_id="t", timeout_ms=1_000)
    # The first try and the one after a clean refusal are fresh; once a try may have been
    # applied, every later one says so (the clean refusal after it does not undo that).
    assert marks == [None, None, "1", "1"]


async def test_the_trio_client_marks_its_retries_the_same_way(
    autojump_clock: trio.testing.MockClock,
) -> None:
    marks: list[str | None] = []
    transport = _answers([{"Purgatory-Applied": "maybe"}, None], marks)
    async with AsyncPurgatoryClient("http://api", timeout_s=10, transport=transport) as client:
        await client.cancel("s", "o")
    assert marks == [None, "1"]


class _AsyncVirtualTime(_VirtualTime):
    async def pause(self, seconds: float) -> None:
        self.sleep(seconds)
        await asyncio.sleep(0)  # still a checkpoint of the loop


def test_the_async_client_retries_under_asyncio_too() -> None:
    """The triggerer of Airflow runs asyncio: the same client, the same retries and marks."""
    calls: list[str] = []
    marks: list[str | None] = []
    time = _AsyncVirtualTime()

    async def main() -> tuple[object, object]:
        client = AsyncPurgatoryClient("http://api", timeout_s=10, transport=_service(3, calls))
        client._clock, client._sleep = time.clock, time.pause
        async with client:
            first = await client.register(scope="s", op_id="o", timeout_ms=1_000)
        transport = _answers([{"Purgatory-Applied": "maybe"}, None], marks)
        async with AsyncPurgatoryClient("http://api", timeout_s=10, transport=transport) as other:
            other._clock, other._sleep = time.clock, time.pause
            second = await other.cancel("s", "o")
        return first, second

    assert asyncio.run(main()) == ({"status": "pending"}, {"status": "pending"})
    assert len(calls) == 4 and time.slept == [1.0, 1.0, 1.0, 1.0]
    assert marks == [None, "1"]


def test_the_async_client_gives_up_under_asyncio_when_its_timeout_is_spent() -> None:
    calls: list[str] = []
    time = _AsyncVirtualTime()

    async def main() -> None:
        client = AsyncPurgatoryClient("http://api", timeout_s=2.5, transport=_service(99, calls))
        client._clock, client._sleep = time.clock, time.pause
        async with client:
            await client.get("s", "o")

    with pytest.raises(ApiError) as info:
        asyncio.run(main())
    assert info.value.status == 503 and len(calls) == 3 and time.slept == [1.0, 1.0]


def test_the_cli_retries_for_as_long_as_its_timeout_says(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A broker that restarts under ``purgatory dev --broker kafka`` takes 8 s on a quiet
    machine and a minute on a loaded one: the CLI's budget for the 503s is the user's to set."""
    calls: list[str] = []
    budgets: list[float] = []

    def client(url: str, *, token: str | None, timeout_s: float) -> PurgatoryClient:
        budgets.append(timeout_s)
        made, _time = _blocking(_service(60, calls), timeout_s)  # 503s for a minute
        return made

    monkeypatch.setattr(cli, "PurgatoryClient", client)
    assert cli.main(["signal", "--scope", "s", "--key", "k"]) == 1  # 30 s by default
    assert "purgatory: 503 scope: partition 1 is being restored" in capsys.readouterr().err
    assert budgets == [30.0] and len(calls) == 31
    calls.clear()
    assert cli.main(["signal", "--scope", "s", "--key", "k", "--timeout-s", "90"]) == 0
    assert json.loads(capsys.readouterr().out) == {"status": "pending"}
    assert budgets == [30.0, 90.0] and len(calls) == 61
    with pytest.raises(SystemExit) as refused:
        cli.main(["op", "get", "--scope", "s", "--id", "o", "--timeout-s", "0"])
    assert refused.value.code == 2
    assert "--timeout-s: must be between 0.1 and 3600, got 0.0" in capsys.readouterr().err
