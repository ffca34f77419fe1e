"""The whole service end to end through both real brokers on loopback and real HTTP.

Each test runs the service with topics of its own (a unique prefix) on the session's broker,
static partition assignment (Tansu's group joins take seconds), and reads callbacks and dead
letters with an independent kafka-python consumer. Every wait is bounded.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from purgatory._codec import (
    CancelRequest,
    RegisterRequest,
    SignalRecord,
    WatermarkRecord,
    encode_request,
    encode_signal,
)
from purgatory._core import Condition, TimeDomain
from purgatory.client import ApiError, AsyncPurgatoryClient, PurgatoryClient
from purgatory.devtools.broker import Broker, free_port
from purgatory.service.app import run_service
from purgatory.service.settings import Settings, env_name

pytestmark = pytest.mark.kafka

PARTITIONS = 2


def _settings(broker: Broker, **overrides: Any) -> Settings:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env(
        {},
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_group_id=f"{prefix}-group",
        kafka_static_partitions=tuple(range(PARTITIONS)),
        topic_requests=f"{prefix}.requests",
        topic_signals=f"{prefix}.signals",
        topic_callbacks=f"{prefix}.callbacks",
        topic_dead_letters=f"{prefix}.dead-letters",
        topic_changelog=f"{prefix}.changelog",
        topic_snapshots=f"{prefix}.snapshots",
        topic_partitions=PARTITIONS,
        http_port=free_port(),
        **overrides,
    )
    broker.create_topics(
        {
            t: PARTITIONS
            for t in (
                settings.topic_requests,
                settings.topic_signals,
                settings.topic_callbacks,
                settings.topic_dead_letters,
                settings.topic_changelog,
                settings.topic_snapshots,
            )
        }
    )
    return settings


@asynccontextmanager
async def service(
    broker: Broker, **overrides: Any
) -> AsyncIterator[tuple[Settings, AsyncPurgatoryClient]]:
    settings = _settings(broker, **overrides)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(
                lambda task_status: run_service(settings, stop=stop, task_status=task_status)
            )
        url = f"http://{settings.http_host}:{settings.http_port}"
        async with AsyncPurgatoryClient(url, timeout_s=10) as client:
            yield settings, client
        stop.set()


def _produce(broker: Broker, records: list[tuple[str, bytes | None, bytes]]) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0)
    try:
        for topic, key, value in records:
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=10)
    finally:
        producer.close(timeout=5)


def _consume(
    broker: Broker, topic: str, count: int, *, timeout_s: float = 20
) -> list[dict[str, Any]]:
    """Read ``count`` JSON records from the start of ``topic`` (bounded by ``timeout_s``)."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        found: list[dict[str, Any]] = []
        deadline = Deadline(timeout_s)
        while len(found) < count and not deadline.passed():
            for records in consumer.poll(timeout_ms=200).values():
                found.extend(json.loads(r.value) | {"_key": r.key} for r in records)
        return found
    finally:
        consumer.close()


class Deadline:
    """A deadline for loops in worker threads and plain tests (trio's clock is not there)."""

    def __init__(self, seconds: float) -> None:
        self._end = time.perf_counter() + seconds

    def passed(self) -> bool:
        return time.perf_counter() >= self._end


async def consume(broker: Broker, topic: str, count: int) -> list[dict[str, Any]]:
    return await trio.to_thread.run_sync(lambda: _consume(broker, topic, count))


async def produce(broker: Broker, records: list[tuple[str, bytes | None, bytes]]) -> None:
    await trio.to_thread.run_sync(lambda: _produce(broker, records))


def register(op_id: str, scope: str, keys: tuple[str, ...], **kw: Any) -> bytes:
    fields: dict[str, Any] = {
        "op_id": op_id,
        "scope": scope,
        "keys": keys,
        "condition": Condition.ALL,
        "count": None,
        "deadline_ms": None,
        "timeout_ms": None,
        "time_domain": TimeDomain.PROCESSING_TIME,
        "payload": None,
        "reply_to": None,
    }
    fields.update(kw)
    return encode_request(RegisterRequest(**fields))


async def test_http_registration_completed_by_kafka_signals(kafka_broker: Broker) -> None:
    async with service(kafka_broker) as (settings, client):
        await client.register(
            scope="night",
            op_id="report",
            keys=["orders", "users", "stock"],
            timeout_ms=60_000,
            payload={"job": 1},
        )
        await produce(
            kafka_broker,
            [
                (
                    settings.topic_signals,
                    b"night",
                    encode_signal(SignalRecord("night", key, None, '{"n":1}')),
                )
                for key in ("orders", "users", "stock")
            ],
        )
        waited = await client.wait("night", "report", timeout_ms=10_000)
        assert waited["status"] == "completed"
        [callback] = await consume(kafka_broker, settings.topic_callbacks, 1)
        url = f"http://{settings.http_host}:{settings.http_port}"
        async with httpx.AsyncClient(base_url=url) as http:
            metrics = (await http.get("/metrics")).text
            ready = (await http.get("/readyz")).json()
            assert ready["ready"] is True
            assert {p: v["state"] for p, v in ready["partitions"].items()} == {
                str(p): "serving" for p in range(PARTITIONS)
            }
    samples = dict(
        line.rsplit(" ", 1) for line in metrics.splitlines() if line and not line.startswith("#")
    )
    assert float(samples['purgatory_outcomes_total{outcome="completed"}']) == 1
    assert float(samples["purgatory_signals_total"]) == 3
    assert float(samples['purgatory_registrations_total{result="pending"}']) == 1
    assert (
        float(samples[f'purgatory_records_consumed_total{{topic="{settings.topic_signals}"}}']) == 3
    )
    assert float(samples["purgatory_pending_operations"]) == 0
    assert float(samples["purgatory_ready"]) == 1
    assert callback["op_id"] == "report" and callback["outcome"] == "completed"
    assert callback["_key"] == b"night"
    assert callback["keys"] == ["orders", "users", "stock"]
    assert callback["signals"] == {"orders": {"n": 1}, "users": {"n": 1}, "stock": {"n": 1}}
    assert callback["payload"] == {"job": 1}


async def test_kafka_requests_any_count_expiry_cancel_idempotency_and_early_signals(
    kafka_broker: Broker,
) -> None:
    async with service(kafka_broker) as (settings, client):
        req, sig = settings.topic_requests, settings.topic_signals
        await produce(
            kafka_broker,
            [
                (
                    sig,
                    b"s",
                    encode_signal(SignalRecord("s", "early", None, None)),
                ),  # before its waiter
                (req, b"s", register("early-bird", "s", ("early",), timeout_ms=60_000)),
                (
                    req,
                    b"s",
                    register("any", "s", ("a", "b"), condition=Condition.ANY, timeout_ms=60_000),
                ),
                (
                    req,
                    b"s",
                    register(
                        "two",
                        "s",
                        ("a", "b", "c"),
                        condition=Condition.COUNT,
                        count=2,
                        timeout_ms=60_000,
                    ),
                ),
                (
                    req,
                    b"s",
                    register(
                        "two",
                        "s",
                        ("a", "b", "c"),
                        condition=Condition.COUNT,
                        count=2,
                        timeout_ms=60_000,
                    ),
                ),
                (req, b"s", register("expires", "s", ("never",), timeout_ms=300)),
                (req, b"s", register("cancelled", "s", ("never",), timeout_ms=60_000)),
                (req, b"s", encode_request(CancelRequest("cancelled", "s"))),
                (sig, b"s", encode_signal(SignalRecord("s", "a", None, None))),
                (sig, b"s", encode_signal(SignalRecord("s", "c", None, None))),
            ],
        )
        callbacks = await consume(kafka_broker, settings.topic_callbacks, 5)
        assert (await client.get("s", "two"))["status"] == "completed"
    outcomes = {c["op_id"]: c["outcome"] for c in callbacks}
    assert outcomes == {
        "early-bird": "completed",
        "any": "completed",
        "two": "completed",
        "expires": "expired",
        "cancelled": "cancelled",
    }
    assert len(callbacks) == 5  # the duplicate registration made no second callback
    expired = next(c for c in callbacks if c["op_id"] == "expires")
    assert expired["missing"] == ["never"]
    assert expired["outcome_ms"] - expired["registered_ms"] == 300
    assert sorted(c["sequence"] for c in callbacks) == [1, 2, 3, 4, 5]


async def test_event_time_expiry_and_timer_rearm_over_kafka(kafka_broker: Broker) -> None:
    async with service(kafka_broker) as (settings, client):
        req, sig = settings.topic_requests, settings.topic_signals
        await produce(
            kafka_broker,
            [
                (
                    req,
                    b"clicks",
                    register(
                        "hour-10",
                        "clicks",
                        ("rollup",),
                        deadline_ms=36_000_000,
                        time_domain=TimeDomain.EVENT_TIME,
                    ),
                ),
                (req, b"clicks", register("session-1", "clicks", (), timeout_ms=400)),
                (
                    req,
                    b"clicks",
                    register("session-1", "clicks", (), timeout_ms=800),
                ),  # re-armed later
                (sig, b"clicks", encode_signal(WatermarkRecord("clicks", 35_000_000))),
                (sig, b"clicks", encode_signal(WatermarkRecord("clicks", 36_000_000))),
            ],
        )
        callbacks = await consume(kafka_broker, settings.topic_callbacks, 2)
        assert (await client.get("clicks", "session-1"))["status"] == "expired"
    by_id = {c["op_id"]: c for c in callbacks}
    assert (
        by_id["hour-10"]["outcome"] == "expired" and by_id["hour-10"]["time_domain"] == "event_time"
    )
    session = by_id["session-1"]
    assert session["outcome"] == "expired"
    assert session["deadline_ms"] - session["registered_ms"] >= 800  # the re-arm moved it


async def test_an_in_band_watermark_follows_the_re_arms_before_it(
    kafka_broker: Broker,
) -> None:
    """On the requests topic, a watermark applies after the registrations written before it."""

    def timer(op_id: str, deadline_ms: int) -> bytes:
        return register(
            op_id, "inband", (), deadline_ms=deadline_ms, time_domain=TimeDomain.EVENT_TIME
        )

    async with service(kafka_broker) as (settings, client):
        req = settings.topic_requests
        await produce(
            kafka_broker,
            [
                (req, b"inband", timer("session/a", 1_000)),
                (req, b"inband", timer("session/b", 1_000)),
                (req, b"inband", timer("session/a", 5_000)),  # a was active again: re-armed
                (req, b"inband", encode_signal(WatermarkRecord("inband", 2_000))),
            ],
        )
        callbacks = await consume(kafka_broker, settings.topic_callbacks, 1)
        assert (await client.get("inband", "session/a"))["status"] == "pending"
    assert [(c["op_id"], c["outcome"], c["deadline_ms"]) for c in callbacks] == [
        ("session/b", "expired", 1_000)
    ]


async def test_garbage_goes_to_dead_letters_and_the_consumer_goes_on(
    kafka_broker: Broker,
) -> None:
    async with service(kafka_broker) as (settings, client):
        req, sig = settings.topic_requests, settings.topic_signals
        await client.register(scope="g", op_id="waits", keys=["k"], timeout_ms=60_000)
        await produce(
            kafka_broker,
            [
                (sig, b"g", b"\xff\xfe not json"),
                (sig, b"g", json.dumps({"v": 1, "type": "signal", "scope": "g"}).encode()),
                (req, b"g", json.dumps({"v": 9, "type": "register"}).encode()),
                (
                    sig,
                    b"other",
                    encode_signal(SignalRecord("g", "k", None, None)),
                ),  # key is not the scope
                (sig, b"g", encode_signal(SignalRecord("g", "k", None, None))),
            ],
        )
        waited = await client.wait("g", "waits", timeout_ms=10_000)
        assert waited["status"] == "completed"
        letters = await consume(kafka_broker, settings.topic_dead_letters, 4)
    reasons = sorted((letter["field"] or "(record)", letter["topic"]) for letter in letters)
    assert reasons == sorted([("(record)", sig), ("key", sig), ("key", sig), ("v", req)]), letters
    assert all(isinstance(letter["offset"], int) and letter["reason"] for letter in letters)


async def test_bad_http_requests_are_4xx_and_limits_are_429(kafka_broker: Broker) -> None:
    async with service(kafka_broker, max_pending_per_scope=1, max_keys_per_operation=3) as (
        _,
        client,
    ):
        await client.register(scope="l", op_id="one", keys=["k"], timeout_ms=60_000)
        with pytest.raises(ApiError) as limited:
            await client.register(scope="l", op_id="two", keys=["k"], timeout_ms=60_000)
        assert limited.value.status == 429
        with pytest.raises(ApiError) as too_many:
            await client.register(
                scope="m", op_id="x", keys=["a", "b", "c", "d"], timeout_ms=60_000
            )
        assert (too_many.value.status, too_many.value.field) == (422, "keys")
        with pytest.raises(ApiError) as conflict:
            await client.register(scope="l", op_id="one", keys=["other"], timeout_ms=60_000)
        assert conflict.value.status == 409


def _wait_until_listening(proc: subprocess.Popen[bytes], port: int) -> None:
    deadline = Deadline(30)
    while not deadline.passed():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.2)  # the pause, and it notices an early exit
            assert proc.returncode is None, "the service exited before listening"
    raise AssertionError(f"the service did not listen on {port} within 30 s")


def test_sigterm_drains_and_flushes_every_accepted_outcome(
    kafka_broker: Broker, tmp_path: Any
) -> None:
    settings = _settings(kafka_broker)
    env = {
        **os.environ,
        "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap_servers,
        "PURGATORY_KAFKA_STATIC_PARTITIONS": ",".join(str(p) for p in range(PARTITIONS)),
        "PURGATORY_HTTP_PORT": str(settings.http_port),
        **{
            env_name(name): getattr(settings, name)
            for name in (
                "topic_requests",
                "topic_signals",
                "topic_callbacks",
                "topic_dead_letters",
                "topic_changelog",
                "topic_snapshots",
                "kafka_group_id",
            )
        },
    }
    log = (tmp_path / "service.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "purgatory.service.cli", "serve"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        url = f"http://127.0.0.1:{settings.http_port}"
        with PurgatoryClient(url, timeout_s=5) as client:
            _wait_until_listening(proc, settings.http_port)
            client.register(scope="z", op_id="op0", keys=["k"], timeout_ms=600_000)
            for i in range(1, 50):
                client.register(scope="z", op_id=f"op{i}", keys=["k"], timeout_ms=600_000)
            assert client.signal("z", "k")["completed"] == 50
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
    callbacks = _consume(kafka_broker, settings.topic_callbacks, 50)
    assert sorted(c["op_id"] for c in callbacks) == sorted(f"op{i}" for i in range(50))
    assert {c["outcome"] for c in callbacks} == {"completed"}
