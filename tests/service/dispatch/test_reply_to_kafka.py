"""The reply_to allow-list and topic creation through both real brokers on loopback.

Both create a topic when a metadata request names it and allows it: the test Kafka runs with
``auto.create.topics.enable`` on (Kafka's default, as on many clusters), and Tansu behaves so
too. So these tests would leave topics behind if any client of the service asked for that.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest
import trio
from kafka import KafkaAdminClient, KafkaProducer

from purgatory._core import TransportError
from purgatory.client import ApiError
from purgatory.devtools.broker import Broker
from purgatory.service.kafka.config import KafkaClientConfig, no_topic_creation
from purgatory.service.kafka.reader import open_kafka_reader
from purgatory.service.kafka.sink import open_kafka_sink
from purgatory.service.kafka.transport import OutRecord
from tests.service.end_to_end.test_e2e import consume, service

pytestmark = pytest.mark.kafka


def _topics(broker: Broker) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap_servers)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()


async def test_a_callback_to_an_allowed_reply_to_that_does_not_exist_is_dead_lettered(
    kafka_broker: Broker,
) -> None:
    missing = f"purgatory.reply.missing-{uuid.uuid4().hex[:8]}"
    async with service(kafka_broker, reply_to_timeout_ms=1_000) as (settings, client):
        started = time.perf_counter()
        await client.register(scope="s", op_id="lost", keys=[], timeout_ms=10, reply_to=missing)
        await client.register(scope="s", op_id="fine", keys=[], timeout_ms=10)
        callbacks = await consume(kafka_broker, settings.topic_callbacks, 1)
        [letter] = await consume(kafka_broker, settings.topic_dead_letters, 1)
        took_s = time.perf_counter() - started
    assert [c["op_id"] for c in callbacks] == ["fine"]
    assert letter["topic"] == missing and json.loads(letter["value"])["op_id"] == "lost"
    assert letter["reason"].startswith(f"callback not delivered to topic {missing!r}")
    assert took_s < 20, took_s  # a missing topic holds the producer for a bounded time
    assert missing not in await trio.to_thread.run_sync(_topics, kafka_broker)


async def test_a_refused_reply_to_creates_nothing_and_is_named(
    kafka_broker: Broker,
) -> None:
    async with service(kafka_broker) as (settings, client):
        for topic in ("__consumer_offsets", "_schemas", settings.topic_requests, "elsewhere"):
            with pytest.raises(ApiError) as caught:
                await client.register(
                    scope="s", op_id="x", keys=["k"], timeout_ms=60_000, reply_to=topic
                )
            assert caught.value.status == 422 and "reply_to" in str(caught.value)
    assert "elsewhere" not in await trio.to_thread.run_sync(_topics, kafka_broker)


async def test_no_client_of_the_service_creates_a_topic(kafka_broker: Broker) -> None:
    config = KafkaClientConfig(bootstrap_servers=kafka_broker.bootstrap_servers)
    by_sink = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    by_reader = f"no-such-topic-{uuid.uuid4().hex[:8]}"
    async with open_kafka_sink(config, delivery_timeout_ms=1_000) as sink:
        [failure] = await (await sink.send_batch([OutRecord(by_sink, b"k", b"v")])).results()
    assert failure is not None and failure.retriable
    async with open_kafka_reader(config) as reader:
        with pytest.raises(TransportError, match="does not exist"):
            await reader.partition_count(by_reader)
    topics = await trio.to_thread.run_sync(_topics, kafka_broker)
    assert by_sink not in topics and by_reader not in topics


def test_kafka_python_ignores_allow_auto_create_topics_without_the_factory(
    kafka_broker: Broker,
) -> None:
    # Why no_topic_creation() carries a kafka_client factory: the documented argument alone does
    # not reach the metadata requests (kafka-python 3.0.12). If this starts failing, the
    # library honours it and the factory may go.
    created = f"auto-created-{uuid.uuid4().hex[:8]}"
    kept_out = f"kept-out-{uuid.uuid4().hex[:8]}"
    for topic, extra in ((created, {"allow_auto_create_topics": False}), (kept_out, {})):
        kwargs = {"bootstrap_servers": kafka_broker.bootstrap_servers, "max_block_ms": 2_000}
        if topic == kept_out:
            kwargs |= no_topic_creation()
        producer = KafkaProducer(**kwargs, **extra)
        try:
            producer.send(topic, b"x").get(timeout=5)
        except Exception:
            pass
        finally:
            producer.close(timeout=1)
    topics = _topics(kafka_broker)
    assert created in topics
    assert kept_out not in topics
