"""Delivery, retries and metrics through both real brokers on loopback and real HTTP.

The same stories as ``test_delivery.py`` tells against the in-memory broker, confirmed end to
end: a signal that would make a callback too large is refused alone while every other callback
is delivered; a record the producer refuses fails alone; a retried registration is a duplicate
over HTTP and Kafka; the metrics of a scripted workload move by exactly what happened; SIGTERM
with thousands of expirations due delivers them all and exits 0.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from purgatory._codec import RegisterRequest, SignalRecord, encode_request, encode_signal
from purgatory.client import ApiError
from purgatory.devtools.broker import Broker
from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.sink import open_kafka_sink
from purgatory.service.kafka.transport import OutRecord
from tests.service.end_to_end.test_e2e import _settings, consume, produce, service

pytestmark = pytest.mark.kafka


async def test_a_signal_that_would_make_a_callback_too_large_is_refused_alone(
    kafka_broker: Broker,
) -> None:
    # The user's case: twenty 60 KB signals on one operation, beside 340 small ones.
    async with service(kafka_broker) as (settings, client):
        keys = [f"part-{i}" for i in range(20)]
        await client.register(scope="big", op_id="wide", keys=keys, timeout_ms=600_000)
        small = [
            {"scope": f"s{i % 5}", "op_id": f"op{i}", "keys": ["done"], "timeout_ms": 600_000}
            for i in range(340)
        ]
        await client.register_many(small[:170])
        await client.register_many(small[170:])
        payload = "x" * 60_000
        refused = 0
        for key in keys:
            try:
                await client.signal("big", key, payload=payload)
            except ApiError as exc:  # 422 naming the payload
                assert exc.status == 422 and "max_signal_bytes_per_operation" in str(exc)
                refused += 1
        assert refused == 20 - settings.max_signal_bytes_per_operation // 60_002
        await client.signals([{"scope": f"s{i}", "key": "done"} for i in range(5)])
        callbacks = await consume(kafka_broker, settings.topic_callbacks, 340)
        assert sorted(c["op_id"] for c in callbacks) == sorted(f"op{i}" for i in range(340))
        assert (await client.get("big", "wide"))["status"] == "pending"


async def test_a_record_the_producer_refuses_fails_alone(kafka_broker: Broker) -> None:
    settings = _settings(kafka_broker)
    config = KafkaClientConfig(bootstrap_servers=kafka_broker.bootstrap_servers)
    topic = settings.topic_callbacks
    async with open_kafka_sink(config, max_request_bytes=100_000) as sink:
        records = [OutRecord(topic, b"s", b"first"), OutRecord(topic, b"s", b"x" * 200_000),
                   OutRecord(topic, b"s", b"last")]  # fmt: skip
        results = await (await sink.send_batch(records)).results()
    assert results[0] is None and results[2] is None
    assert results[1] is not None and not results[1].retriable
    assert "MessageSizeTooLarge" in results[1].reason
    found = await trio.to_thread.run_sync(lambda: _raw(kafka_broker, topic, 2))
    assert sorted(found) == [b"first", b"last"]


def _raw(broker: Broker, topic: str, count: int) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition  # noqa: PLC0415

    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers)
    try:
        parts = [TopicPartition(topic, p) for p in range(2)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        found: list[bytes] = []
        end = time.perf_counter() + 20
        while len(found) < count and time.perf_counter() < end:
            for records in consumer.poll(timeout_ms=200).values():
                found += [r.value for r in records]
        return found
    finally:
        consumer.close()


def _metrics(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def test_a_retry_is_a_duplicate_and_the_metrics_move_by_exactly_what_happened(
    kafka_broker: Broker,
) -> None:
    async with service(kafka_broker) as (settings, _client):
        url = f"http://{settings.http_host}:{settings.http_port}"
        async with httpx.AsyncClient(base_url=url) as http:
            before = _metrics((await http.get("/metrics")).text)
            body = {"scope": "s", "op_id": "j", "keys": ["a"], "timeout_ms": 3_600_000}
            first = await http.post("/v1/operations", json=body)
            await trio.sleep(0.01)
            second = await http.post("/v1/operations", json=body)
            assert (first.status_code, second.status_code) == (201, 200)
            assert second.json()["status"] == "duplicate"
            bad = await http.post("/v1/operations", json={"scope": "s", "op_id": "k"})
            assert bad.status_code == 422
            overdue = {"scope": "s", "op_id": "old", "keys": ["z"], "deadline_ms": 1}
            assert (await http.post("/v1/operations", json=overdue)).status_code == 201
            # The same registration over Kafka, sent twice, then garbage, then the signal.
            request = RegisterRequest(op_id="q", scope="s", keys=("a",), timeout_ms=3_600_000)
            record = encode_request(request)
            signal_record = encode_signal(SignalRecord("s", "a", None, None))
            await produce(
                kafka_broker,
                [
                    (settings.topic_requests, b"s", record),
                    (settings.topic_requests, b"s", record),
                    (settings.topic_requests, b"s", b"not json"),
                ],
            )
            await trio.sleep(1)
            await produce(kafka_broker, [(settings.topic_signals, b"s", signal_record)])
            callbacks = await consume(kafka_broker, settings.topic_callbacks, 3)
            assert sorted((c["op_id"], c["outcome"]) for c in callbacks) == [
                ("j", "completed"), ("old", "expired"), ("q", "completed")
            ]  # fmt: skip
            dead = await consume(kafka_broker, settings.topic_dead_letters, 1)
            assert [d["offset"] for d in dead] == [2] and "JSON" in dead[0]["reason"]
            await trio.sleep(0.5)
            after = _metrics((await http.get("/metrics")).text)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    reg = "purgatory_registrations_total"
    assert delta(reg, result="pending") == 3  # j, old, q
    assert delta(reg, result="duplicate") == 2  # j over HTTP, q over Kafka
    assert delta(reg, result="invalid") == 1  # the 422
    assert delta(reg, result="conflict") == 0
    assert delta("purgatory_registrations_overdue_total") == 1
    assert delta("purgatory_outcomes_total", outcome="completed") == 2
    assert delta("purgatory_outcomes_total", outcome="expired") == 1
    assert delta("purgatory_signals_total") == 1
    assert delta("purgatory_records_produced_total", topic=settings.topic_callbacks) == 3
    dead_name = "purgatory_records_dead_lettered_total"
    assert delta(dead_name, topic=settings.topic_requests, reason="invalid") == 1
    assert delta(dead_name, topic=settings.topic_requests, reason="refused") == 0
    assert delta("purgatory_records_consumed_total", topic=settings.topic_requests) == 3
    assert delta("purgatory_records_consumed_total", topic=settings.topic_signals) == 1
    # The overdue registration is the client's lateness: not in the reaper's histogram.
    assert delta("purgatory_reaper_lateness_seconds_count") == 0 or (
        after[("purgatory_reaper_lateness_seconds_sum", ())] < 1.0
    )
    assert after[("purgatory_executor_max_lag_seconds", ())] < 5.0
    assert after[("purgatory_outbox_unacknowledged_records", ())] == 0


async def test_a_700_kb_key_that_is_not_utf8_is_dead_lettered_within_the_record_limit(
    kafka_broker: Broker,
) -> None:
    async with service(kafka_broker) as (settings, client):
        key = (b"\xff\xfe" + bytes(range(256))) * 2_717  # 700 kB, not UTF-8
        request = RegisterRequest(op_id="big", scope="s", keys=("a",), timeout_ms=600_000)
        await produce(kafka_broker, [(settings.topic_requests, key, encode_request(request))])
        [letter] = await consume(kafka_broker, settings.topic_dead_letters, 1)
        assert letter["_key"] == b"s"  # the scope, not the key
        assert letter["field"] == "key" and letter["key_encoding"] == "base64"
        assert letter["key_bytes"] == len(key)
        assert letter["key_sha256"] == hashlib.sha256(key).hexdigest()
        assert letter["key_truncated"] is True
        assert key.startswith(base64.b64decode(letter["key"]))
        assert json.loads(letter["value"])["op_id"] == "big"
        with pytest.raises(ApiError) as caught:
            await client.get("s", "big")
        assert caught.value.status == 404


def test_sigterm_with_thousands_of_expirations_due_delivers_them_all_and_exits_0(
    kafka_broker: Broker,
) -> None:
    settings = _settings(kafka_broker)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")},
        "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "PURGATORY_KAFKA_GROUP_ID": settings.kafka_group_id,
        "PURGATORY_KAFKA_STATIC_PARTITIONS": "0,1",
        "PURGATORY_TOPIC_REQUESTS": settings.topic_requests,
        "PURGATORY_TOPIC_SIGNALS": settings.topic_signals,
        "PURGATORY_TOPIC_CALLBACKS": settings.topic_callbacks,
        "PURGATORY_TOPIC_DEAD_LETTERS": settings.topic_dead_letters,
        "PURGATORY_TOPIC_CHANGELOG": settings.topic_changelog,
        "PURGATORY_TOPIC_SNAPSHOTS": settings.topic_snapshots,
        "PURGATORY_HTTP_PORT": str(settings.http_port),
        "PURGATORY_LOG_LEVEL": "warning",
    }
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from purgatory.service import main; sys.exit(main(['serve']))",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://{settings.http_host}:{settings.http_port}"
        _wait_ready(url)
        ops = [{"scope": f"s{i % 9}", "op_id": f"t{i}", "keys": [], "timeout_ms": 1_500}
               for i in range(4_000)]  # fmt: skip
        with httpx.Client(base_url=url, timeout=30) as http:
            answer = http.post("/v1/operations:batch", json={"operations": ops[:2_000]})
            assert answer.status_code == 200
            answer = http.post("/v1/operations:batch", json={"operations": ops[2_000:]})
            assert answer.status_code == 200
            # The last ones registered have the latest deadlines: once the service's clock (the
            # wall clock) passes them, every timer is due, and few are delivered yet.
            due_ms = _latest_deadline(http, ops[-9:])
        while _wall_ms() <= due_ms:
            time.sleep(0.005)  # noqa: TID251 - a real process: waiting for its clock
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=60)
        assert child.returncode == 0, err.decode()[-2000:]
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    callbacks = trio.run(consume, kafka_broker, settings.topic_callbacks, 4_000)
    assert len(callbacks) == 4_000
    assert {c["op_id"] for c in callbacks} == {f"t{i}" for i in range(4_000)}
    assert {c["outcome"] for c in callbacks} == {"expired"}


def _latest_deadline(http: httpx.Client, ops: list[dict[str, Any]]) -> int:
    """The latest deadline among ``ops``, as the service recorded them."""
    deadlines = []
    for op in ops:
        params = {"scope": str(op["scope"]), "op_id": str(op["op_id"])}
        found = http.get("/v1/operation", params=params)
        deadlines.append(int(found.json()["deadline_ms"]))
    return max(deadlines)


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _wait_ready(url: str) -> None:
    end = time.perf_counter() + 60
    while time.perf_counter() < end:
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)  # noqa: TID251 - polling a real process
    raise AssertionError(f"{url} was not ready in 60 s")
