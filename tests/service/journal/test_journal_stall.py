"""A broker that stops acknowledging the journal, on the in-memory broker, in virtual time.

The broker's acknowledgements are held back (``broker.stall``); everything else runs as in
production: HTTP (through ASGI), the Kafka intake, the reaper, the outbox. What must hold:

* an HTTP write answers 503 with ``Retry-After`` once ``PURGATORY_JOURNAL_WAIT_MS`` has passed,
  saying the journal is not acknowledging, instead of hanging; the write stays applied;
* ``/readyz`` stays 200 and says ``journal: stalled`` with the seconds, and so do
  ``purgatory_journal_stalled`` and ``purgatory_journal_unacknowledged_seconds``;
* nothing decided leaves meanwhile (consumed records wait in their topics: see
  ``test_intake.py``);
* once the broker acknowledges again, everything recorded is durable and delivered once, a
  retried registration is a duplicate, and a restart on the same broker knows it all;
* the Python client retries the 503 within its timeout, and gives up with it after; the 503
  says ``Purgatory-Applied: maybe`` and the client marks its retries, so a timer sent with a
  relative timeout that fired meanwhile is a duplicate, not a second round.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from purgatory.client import ApiError, AsyncPurgatoryClient
from purgatory.service.app import Service, topics_of
from purgatory.service.journal.format import decode_journal_record
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport

EPOCH_MS = 1_763_780_400_000
PARTITIONS = 2
SETTINGS = Settings.from_env(
    {}, topic_partitions=PARTITIONS, shutdown_grace_ms=5_000, max_wait_ms=120_000
)
WAIT_S = SETTINGS.journal_wait_ms / 1000
REQUESTS, SIGNALS = SETTINGS.topic_requests, SETTINGS.topic_signals
CALLBACKS, CHANGELOG = SETTINGS.topic_callbacks, SETTINGS.topic_changelog
HOUR_MS = 3_600_000
MARKED = {"Purgatory-Retry": "1"}  # what a client sends after a 503 that may have applied

Json = dict[str, Any]


def test_the_default_bound_is_at_most_five_seconds() -> None:
    assert 0 < SETTINGS.journal_wait_ms <= 5_000


def _broker() -> FakeBroker:
    return FakeBroker({t: PARTITIONS for t in topics_of(SETTINGS)})


@asynccontextmanager
async def _serving(broker: FakeBroker) -> AsyncIterator[tuple[Service, httpx.AsyncClient]]:
    """The whole service over ``broker`` (Kafka intake included), HTTP through ASGI, until
    the body ends; then a clean stop."""
    fake = FakeTransport(broker)
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=[REQUESTS, SIGNALS], group_id="g", assignment=None) as source,
    ):
        service = Service(SETTINGS, Clock(offset_ms=EPOCH_MS), source, sink, reader)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: service.run(stop, serve_http=False))
            while not service.status.started:
                await trio.sleep(0.01)
            transport = httpx.ASGITransport(app=service.app)
            async with httpx.AsyncClient(base_url="http://api", transport=transport) as http:
                yield service, http
            stop.set()


def _op(scope: str, op_id: str, keys: list[str]) -> Json:
    return {"scope": scope, "op_id": op_id, "keys": keys, "timeout_ms": HOUR_MS}


async def _timed(request: Any) -> tuple[httpx.Response, float]:
    """The answer and how long it took (virtual seconds); a write may not hang past the bound."""
    start = trio.current_time()
    with trio.fail_after(WAIT_S + 1):
        response = await request
    return response, trio.current_time() - start


def _metric(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                return float(sample.value)
    raise AssertionError(f"{name} is not served")


async def _come_back(broker: FakeBroker, seconds: float) -> None:
    """The stalled broker acknowledges again after ``seconds``."""
    await trio.sleep(seconds)
    broker.stall.set()


def _callbacks(broker: FakeBroker) -> list[Json]:
    return [json.loads(r.value or b"") for r in broker.records(CALLBACKS)]


def _journaled(broker: FakeBroker, kind: str) -> list[Any]:
    found = []
    for record in broker.records(CHANGELOG):
        doc = decode_journal_record(record.value or b"")
        if doc is not None:
            found += [entry for entry in doc["entries"] if entry[0] == kind]
    return found


async def test_writes_answer_503_within_the_bound_and_become_durable_once_acknowledged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    async with _serving(broker) as (_service, http):
        # Before the stall: a barrier to complete and an operation to cancel, acknowledged.
        for body in (_op("s0", "A", ["a"]), _op("s1", "C", ["never"])):
            assert (await http.post("/v1/operations", json=body)).status_code == 201
        broker.stall = trio.Event()  # the broker stops acknowledging

        writes = {
            "register": http.post("/v1/operations", json=_op("s2", "B", ["b"])),
            "signal": http.post("/v1/signals", json={"signals": [{"scope": "s0", "key": "a"}]}),
            "watermark": http.post(
                "/v1/watermarks", json={"watermarks": [{"scope": "s4", "watermark_ms": 7}]}
            ),
            "cancel": http.delete("/v1/operation", params={"scope": "s1", "op_id": "C"}),
            "batch": http.post(
                "/v1/operations:batch", json={"operations": [_op("s4", "D", ["d"])]}
            ),
        }
        latencies = {}
        for name, request in writes.items():
            response, latencies[name] = await _timed(request)
            assert response.status_code == 503, (name, response.text)
            assert response.headers["Retry-After"] == "1", name
            assert response.headers["Purgatory-Applied"] == "maybe", name  # a retry is marked
            error = response.json()["error"]
            assert error["status"] == 503 and error["field"] is None, (name, error)
            assert error["message"].startswith("the journal is not acknowledging"), error
            assert "stays recorded" in error["message"] and "duplicate" in error["message"]
            assert latencies[name] == pytest.approx(WAIT_S, abs=0.05), name
        shown = {name: round(seconds, 3) for name, seconds in latencies.items()}
        print(f"\njournal stalled: each write answered 503 after (s) {shown}")

        # The replica stays ready and says the journal is stalled, with the seconds.
        ready = await http.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["ready"] is True
        journal = ready.json()["journal"]
        assert journal["state"] == "stalled", journal
        assert journal["unacknowledged_seconds"] >= 5 * WAIT_S - 0.1, journal
        metrics = (await http.get("/metrics")).text
        assert _metric(metrics, "purgatory_journal_stalled") == 1
        assert _metric(metrics, "purgatory_journal_unacknowledged_seconds") >= 5 * WAIT_S - 0.1
        assert _metric(metrics, "purgatory_ready") == 1

        # The writes are applied (reads see them), and nothing they decided left.
        got = await http.get("/v1/operation", params={"scope": "s2", "op_id": "B"})
        assert got.status_code == 200 and got.json()["status"] == "pending", got.text
        assert not _callbacks(broker)
        assert not _journaled(broker, "cancel")

        broker.stall.set()  # the broker is back
        await trio.sleep(1)
        ready = await http.get("/readyz")
        assert ready.json()["journal"] == {"state": "ok", "unacknowledged_seconds": 0.0}
        metrics = (await http.get("/metrics")).text
        assert _metric(metrics, "purgatory_journal_stalled") == 0
        assert _metric(metrics, "purgatory_journal_pending_entries") == 0

        # Every write of the stall is durable and what it decided is delivered, once.
        outcomes = {(cb["op_id"], cb["outcome"]) for cb in _callbacks(broker)}
        assert outcomes == {("A", "completed"), ("C", "cancelled")}
        assert len(_callbacks(broker)) == 2
        registered = {entry[2][0] for entry in _journaled(broker, "register")}
        assert registered == {"A", "C", "B", "D"}

        # Retries: a registration is a duplicate; a signal completes nothing more; a watermark
        # does not move again; a cancel finds the operation cancelled.
        again = await http.post("/v1/operations", json=_op("s2", "B", ["b"]))
        assert again.status_code == 200 and again.json()["status"] == "duplicate", again.text
        batch = await http.post(
            "/v1/operations:batch", json={"operations": [_op("s4", "D", ["d"])]}
        )
        assert batch.json()["results"][0]["http_status"] == 200, batch.text
        assert batch.json()["results"][0]["status"] == "duplicate"
        signal = await http.post("/v1/signals", json={"signals": [{"scope": "s0", "key": "a"}]})
        assert signal.json() == {"accepted": 1, "completed": 0}
        mark = await http.post(
            "/v1/watermarks", json={"watermarks": [{"scope": "s4", "watermark_ms": 7}]}
        )
        assert mark.json() == {"accepted": 1, "moved": 0}
        cancel = await http.delete("/v1/operation", params={"scope": "s1", "op_id": "C"})
        assert cancel.status_code == 409, cancel.text  # unmarked: the caller did not know
        cancel = await http.delete(
            "/v1/operation", params={"scope": "s1", "op_id": "C"}, headers=MARKED
        )
        assert cancel.status_code == 200, cancel.text  # a marked retry finds its own outcome
        assert cancel.json()["status"] == "cancelled"
        assert cancel.json()["outcome"]["op_id"] == "C"
        await trio.sleep(1)
        assert len(_callbacks(broker)) == 2  # no retry decided anything twice

    # A restart on the same broker knows every write of the stall.
    async with _serving(broker) as (_service, http):
        for scope, op_id, status in (
            ("s2", "B", "pending"),
            ("s4", "D", "pending"),
            ("s0", "A", "completed"),
            ("s1", "C", "cancelled"),
        ):
            got = await http.get("/v1/operation", params={"scope": scope, "op_id": op_id})
            assert got.status_code == 200 and got.json()["status"] == status, (op_id, got.text)
    assert len(_callbacks(broker)) == 2  # and re-sends nothing


async def test_the_client_retries_the_503_until_the_broker_is_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    async with _serving(broker) as (service, http):
        transport = httpx.ASGITransport(app=service.app)
        broker.stall = trio.Event()
        start = trio.current_time()
        async with (
            AsyncPurgatoryClient("http://api", timeout_s=60, transport=transport) as client,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(_come_back, broker, 30)
            answer = await client.register(scope="s0", op_id="R", keys=["k"], timeout_ms=HOUR_MS)
        took = trio.current_time() - start
        print(f"\nclient: registered after {took:.1f} s (broker away 30 s)")
        # Its first try was applied and made durable when the broker came back: the retry
        # that got through found it.
        assert answer["status"] == "duplicate", answer
        assert 30 <= took < 30 + WAIT_S + 2
        metrics = (await http.get("/metrics")).text
        refused = sum(
            sample.value
            for family in text_string_to_metric_families(metrics)
            for sample in family.samples
            if sample.name == "purgatory_http_requests_total" and sample.labels["status"] == "503"
        )
        assert refused >= 4, refused  # one 503 per WAIT_S + Retry-After for 30 s
        assert [e[2][0] for e in _journaled(broker, "register")].count("R") >= 1


async def test_the_client_gives_up_with_the_503_when_its_timeout_is_spent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    async with _serving(broker) as (service, _http):
        transport = httpx.ASGITransport(app=service.app)
        broker.stall = trio.Event()
        async with AsyncPurgatoryClient("http://api", timeout_s=8, transport=transport) as client:
            with pytest.raises(ApiError) as info, trio.fail_after(3 * WAIT_S):
                await client.signal("s0", "k")
        assert info.value.status == 503 and info.value.field is None
        assert info.value.message.startswith("the journal is not acknowledging")
        broker.stall.set()


async def test_a_retried_timer_that_fired_during_the_stall_is_a_duplicate_not_a_second_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    async with _serving(broker) as (service, _http):
        transport = httpx.ASGITransport(app=service.app)
        broker.stall = trio.Event()
        async with (
            AsyncPurgatoryClient("http://api", timeout_s=60, transport=transport) as client,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(_come_back, broker, 20)  # the 2 s timer is due long before
            answer = await client.register(scope="s0", op_id="T", timeout_ms=2_000)
        # The first try armed it; it expired during the stall and was delivered once the
        # broker came back; the marked retry that got through found that outcome.
        assert answer["status"] == "duplicate", answer
        assert answer["outcome"]["outcome"] == "expired", answer
        await trio.sleep(5)
    timers = [cb for cb in _callbacks(broker) if cb["op_id"] == "T"]
    assert len(timers) == 1, timers  # one round, one callback
    marked = [e for e in _journaled(broker, "register") if e[2][0] == "T" and len(e) == 4]
    assert marked, "the retries were journaled as retries"


async def test_an_unmarked_timer_sent_again_after_it_fired_starts_a_new_round(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The counterpart: without the mark, a timer sent again is re-armed (an inactivity timer
    # pushed back), and once fired, starts again. This is what the mark guards retries from.
    broker = _broker()
    async with _serving(broker) as (_service, http):
        body = {"scope": "s0", "op_id": "T", "keys": [], "timeout_ms": 2_000}
        assert (await http.post("/v1/operations", json=body)).status_code == 201
        await trio.sleep(3)
        again = await http.post("/v1/operations", json=body)
        assert again.status_code == 201 and again.json()["status"] == "pending", again.text
        await trio.sleep(3)
    assert [cb["op_id"] for cb in _callbacks(broker)].count("T") == 2
