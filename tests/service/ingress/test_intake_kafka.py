"""The intake's key and partition rules through both real brokers on loopback.

What ``test_intake.py`` checks on the in-memory broker, with records a kafka-python producer
writes as a careless one would: with a null key (its partitioner picks any partition), and with
the right key on a partition it chose itself. Each is dead-lettered naming ``key`` or
``partition`` and has no effect.
"""

from __future__ import annotations

import pytest
import trio

from purgatory._codec import RegisterRequest, SignalRecord, encode_request, encode_signal
from purgatory.client import ApiError
from purgatory.devtools.broker import Broker
from purgatory.service.ownership.partitioning import partition_for
from tests.service.end_to_end.test_e2e import PARTITIONS, _consume, consume, service

pytestmark = pytest.mark.kafka

SCOPE = "s"
HOME = partition_for(SCOPE, PARTITIONS)
AWAY = 1 - HOME


def _send(broker: Broker, records: list[tuple[str, bytes | None, bytes, int | None]]) -> None:
    from kafka import KafkaProducer  # noqa: PLC0415

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0)
    try:
        for topic, key, value, partition in records:
            producer.send(topic, key=key, value=value, partition=partition)
        producer.flush(timeout=10)
    finally:
        producer.close(timeout=5)


def _register(op_id: str, keys: tuple[str, ...], timeout_ms: int) -> bytes:
    return encode_request(
        RegisterRequest(op_id=op_id, scope=SCOPE, keys=keys, timeout_ms=timeout_ms)
    )


async def test_null_keys_and_chosen_partitions_are_dead_lettered_and_change_nothing(
    kafka_broker: Broker,
) -> None:
    async with service(kafka_broker) as (settings, client):
        requests, signals = settings.topic_requests, settings.topic_signals
        key = SCOPE.encode()
        await client.register(scope=SCOPE, op_id="good", keys=["a", "b"], timeout_ms=600_000)
        await trio.to_thread.run_sync(
            lambda: _send(
                kafka_broker,
                [
                    (requests, None, _register("no-key", (), 10), None),
                    (signals, None, encode_signal(SignalRecord(SCOPE, "a", None, None)), None),
                    (requests, key, _register("away", (), 10), AWAY),
                    (signals, key, encode_signal(SignalRecord(SCOPE, "b", None, None)), AWAY),
                    (requests, key, _register("marker", (), 10), None),
                ],
            )
        )
        letters = await consume(kafka_broker, settings.topic_dead_letters, 4)
        assert sorted((d["topic"], d["field"]) for d in letters) == sorted(
            [(requests, "key"), (signals, "key"), (requests, "partition"), (signals, "partition")]
        )
        for letter in letters:
            if letter["field"] == "key":
                assert letter["key"] is None and letter["reason"].startswith("key: ")
                assert "null" in letter["reason"]
            else:
                assert letter["partition"] == AWAY and letter["key"] == SCOPE
                assert f"on partition {AWAY}," in letter["reason"]
                assert f"belongs on partition {HOME}" in letter["reason"]
        # Only the marker's timer expired: the other two were never registered.
        callbacks = await trio.to_thread.run_sync(
            lambda: _consume(kafka_broker, settings.topic_callbacks, 2, timeout_s=3)
        )
        assert [c["op_id"] for c in callbacks] == ["marker"]
        for op_id in ("no-key", "away"):
            with pytest.raises(ApiError) as caught:
                await client.get(SCOPE, op_id)
            assert caught.value.status == 404
        assert (await client.get(SCOPE, "good"))["status"] == "pending"  # a and b never came
