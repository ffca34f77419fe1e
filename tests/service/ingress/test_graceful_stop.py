"""A graceful stop answers the HTTP requests it has, and takes no new one.

The service over the in-memory broker, its API served by hypercorn on loopback (the real
server: what a stop does to its connections is the point). A write in flight when the stop
comes waits for its journal record and is answered 201, not cut; a long poll is answered at
once with what it would get at its timeout; a new connection is refused; a connection with half a
request head does not hold the stop; and the stop is over well within its grace.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import trio

from purgatory.devtools.broker import free_port
from purgatory.service.app import Service, topics_of
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport

EPOCH_MS = 1_763_780_400_000
#: Bounds on real waits (loopback, in-memory broker: each takes milliseconds).
WAIT_S = 10.0


async def _until(condition: Callable[[], bool]) -> None:
    with trio.fail_after(WAIT_S):
        while not condition():
            await trio.sleep(0.001)


def _operation(op_id: str) -> dict[str, object]:
    return {"scope": "s", "op_id": op_id, "keys": ["k"], "timeout_ms": 600_000}


async def test_a_stop_answers_the_requests_in_flight_and_takes_no_new_one() -> None:
    port = free_port()
    settings = Settings.from_env(
        {}, topic_partitions=1, http_host="127.0.0.1", http_port=port, shutdown_grace_ms=5_000
    )
    broker = FakeBroker({t: 1 for t in topics_of(settings)})
    fake = FakeTransport(broker)
    topics = [settings.topic_requests, settings.topic_signals]
    answers: dict[str, httpx.Response] = {}
    base = f"http://127.0.0.1:{port}"
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=topics, group_id="g", assignment=None) as source,
        httpx.AsyncClient(base_url=base, timeout=WAIT_S) as http,
    ):
        service = Service(settings, Clock.from_wall_clock(), source, sink, reader)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            await nursery.start(lambda task_status: service.run(stop, task_status=task_status))
            assert (await http.post("/v1/operations", json=_operation("polled"))).status_code == 201

            async def ask(name: str, method: str, path: str, options: dict[str, Any]) -> None:
                answers[name] = await http.request(method, path, **options)

            params = {"scope": "s", "op_id": "polled", "timeout_ms": "60000"}
            nursery.start_soon(ask, "poll", "GET", "/v1/operation/wait", {"params": params})
            # A client that began a request and stopped halfway through its head: nothing of it
            # reached the application, so the stop does not wait for it (hypercorn alone would,
            # for its whole graceful timeout).
            halfway = await trio.open_tcp_stream("127.0.0.1", port)
            await halfway.send_all(b"POST /v1/operations HTTP/1.1\r\nHost: x\r\n")
            fake.link.cut()  # the next write's journal record waits for the link
            nursery.start_soon(ask, "write", "POST", "/v1/operations", {"json": _operation("w")})
            await _until(lambda: service.reads.lookup("s", "w") is not None)
            stopped_at = trio.current_time()
            stop.set()
            await _until(lambda: "poll" in answers)
            assert trio.current_time() - stopped_at < 1  # not its 60 s
            assert answers["poll"].status_code == 200
            assert answers["poll"].json()["status"] == "pending"
            assert "write" not in answers  # still waiting for its journal record
            try:
                async with httpx.AsyncClient(base_url=base, timeout=1) as late:
                    refused = await late.get("/healthz")
            except httpx.ConnectError:
                pass
            else:
                raise AssertionError(f"a new connection was served: {refused.status_code}")
            fake.link.heal()
            await _until(lambda: "write" in answers)
        stop_s = trio.current_time() - stopped_at
        await halfway.aclose()
    assert answers["write"].status_code == 201, answers["write"].text  # answered, not cut
    assert stop_s < 1, stop_s  # the grace is 5 s
