"""The Kafka source and sink against both real brokers (Apache Kafka and Tansu) over loopback."""

from __future__ import annotations

import uuid
from collections import defaultdict
from contextlib import AbstractAsyncContextManager

import pytest
import trio

from purgatory._core import ConfigError, TransportError, UsageError
from purgatory.devtools.broker import Broker, EmbeddedBroker, free_port
from purgatory.service.kafka import clients as _kafka
from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.sink import open_kafka_sink
from purgatory.service.kafka.source import KafkaSource, open_kafka_source
from purgatory.service.kafka.transport import ConsumedRecord, OutRecord

pytestmark = pytest.mark.kafka

PARTITIONS = 3


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _config(broker: Broker) -> KafkaClientConfig:
    return KafkaClientConfig(bootstrap_servers=broker.bootstrap_servers, client_id="test")


def _all_partitions(topic: str) -> list[tuple[str, int]]:
    return [(topic, p) for p in range(PARTITIONS)]


async def _produce(broker: Broker, topic: str, count: int, keys: int = 10) -> None:
    """``count`` records; value ``key:i`` so tests can check keys and per-key order."""
    async with open_kafka_sink(_config(broker)) as sink:
        for i in range(count):
            key = f"k{i % keys}"
            await sink.send(topic, key.encode(), f"{key}:{i}".encode())
            if i % 100 == 99:
                await sink.flush()  # several produce batches, as the service writes them
        await sink.flush()
        stats = sink.statistics()
    assert (stats.sent, stats.acked, stats.failed) == (count, count, 0)


async def _read_batches(
    source: KafkaSource, count: int, timeout_s: float
) -> list[list[ConsumedRecord]]:
    """Read exactly ``count`` records (counting, not trusting end offsets), bounded in time."""
    batches: list[list[ConsumedRecord]] = []
    with trio.fail_after(timeout_s):
        while sum(map(len, batches)) < count:
            batches.append(await source.receive.receive())
    assert sum(map(len, batches)) == count, "more records than produced"
    return batches


async def _read(source: KafkaSource, count: int, timeout_s: float) -> list[ConsumedRecord]:
    return [r for batch in await _read_batches(source, count, timeout_s) for r in batch]


async def _nothing_more(source: KafkaSource, wait_s: float = 0.3) -> None:
    with trio.move_on_after(wait_s):
        extra = await source.receive.receive()
        pytest.fail(f"unexpected records: {extra}")


def test_public_names_are_sorted() -> None:
    assert _kafka.__all__ == sorted(_kafka.__all__)


async def test_round_trip_keeps_keys_and_partition_order(kafka_broker: Broker) -> None:
    topic, count = _name("round-trip"), 500
    kafka_broker.create_topics({topic: PARTITIONS})
    await _produce(kafka_broker, topic, count)
    async with open_kafka_source(
        _config(kafka_broker),
        topics=[topic],
        group_id=None,
        assignment=_all_partitions(topic),
        start="earliest",
    ) as source:
        records = await _read(source, count, timeout_s=10)
        await _nothing_more(source)
    assert sorted(int(r.value.split(b":")[1]) for r in records if r.value) == list(range(count))
    partition_of_key: dict[bytes | None, int] = {}
    offsets: dict[int, list[int]] = defaultdict(list)
    order_of_key: dict[bytes | None, list[int]] = defaultdict(list)
    for r in records:
        assert r.value is not None and r.key == r.value.split(b":")[0]
        assert partition_of_key.setdefault(r.key, r.partition) == r.partition
        offsets[r.partition].append(r.offset)
        order_of_key[r.key].append(int(r.value.split(b":")[1]))
        assert r.timestamp_ms > 0
    for partition_offsets in offsets.values():
        assert partition_offsets == list(range(len(partition_offsets)))
    for sequence in order_of_key.values():
        assert sequence == sorted(sequence)


async def test_a_batch_behind_a_slow_one_keeps_its_order_then_goes_direct(
    kafka_broker: Broker,
) -> None:
    """A batch whose topic has no metadata goes through the producer thread (``send`` blocks
    there for it); one sent after it to the same partition must not overtake it by the
    direct path, and once the thread has handed everything over the direct path resumes."""
    topic, missing = _name("order"), _name("missing")
    kafka_broker.create_topics({topic: 1})
    async with open_kafka_sink(_config(kafka_broker), metadata_timeout_ms=1_500) as sink:
        await (await sink.send_batch([OutRecord(topic, b"k", b"warm")])).results()
        slow = await sink.send_batch(
            [OutRecord(topic, b"k", b"first"), OutRecord(missing, b"k", b"nowhere")]
        )
        behind = await sink.send_batch([OutRecord(topic, b"k", b"second")])
        with trio.fail_after(30):
            slow_results, behind_results = await slow.results(), await behind.results()
        assert slow_results[0] is None and behind_results == [None]
        assert slow_results[1] is not None and slow_results[1].retriable
        assert sink._thread.queued == 0  # everything handed over: the next batch goes direct
        assert sink._thread.sends_directly([OutRecord(topic, b"k", b"third")]) is not None
        await sink.flush()
    async with open_kafka_source(
        _config(kafka_broker),
        topics=[topic],
        group_id=None,
        assignment=[(topic, 0)],
        start="earliest",
    ) as source:
        values = [r.value for r in await _read(source, 3, timeout_s=10)]
    assert values == [b"warm", b"first", b"second"]


async def test_explicit_assignment_reads_everything_and_lag_drains(
    kafka_broker: Broker,
) -> None:
    topic, count = _name("assign"), 1000
    kafka_broker.create_topics({topic: PARTITIONS})
    await _produce(kafka_broker, topic, count, keys=50)
    async with open_kafka_source(
        _config(kafka_broker),
        topics=[topic],
        group_id=_name("assign-group"),
        assignment=_all_partitions(topic),
        start="committed",  # nothing committed yet: from the start
        max_batch=64,
    ) as source:
        batches = await _read_batches(source, count, timeout_s=10)
        assert max(map(len, batches)) <= 64
        with trio.fail_after(5):  # lag comes from fetch highwater marks, published per poll
            while source.lag() != dict.fromkeys(_all_partitions(topic), 0):
                await trio.sleep(0.05)
        assert source.assignment() == frozenset(_all_partitions(topic))
        await _nothing_more(source)
    assert len({(r.partition, r.offset) for batch in batches for r in batch}) == count


async def test_commit_then_resume_has_no_loss_and_no_duplicates(
    kafka_broker: Broker,
) -> None:
    topic, group, count = _name("resume"), _name("resume-group"), 300
    kafka_broker.create_topics({topic: PARTITIONS})
    await _produce(kafka_broker, topic, count)

    def resume() -> AbstractAsyncContextManager[KafkaSource]:
        return open_kafka_source(
            _config(kafka_broker),
            topics=[topic],
            group_id=group,
            assignment=_all_partitions(topic),
            start="committed",
        )

    async with resume() as source:
        first = await _read(source, count, timeout_s=10)
        # "Apply" only the first half of each partition, then commit what was applied.
        by_partition: dict[int, list[ConsumedRecord]] = defaultdict(list)
        for r in first:
            by_partition[r.partition].append(r)
        applied = [r for rs in by_partition.values() for r in rs[: len(rs) // 2]]
        commit: dict[tuple[str, int], int] = {}
        for r in applied:
            commit[(r.topic, r.partition)] = max(
                commit.get((r.topic, r.partition), 0), r.offset + 1
            )
        await source.commit(commit)

    async with resume() as source:
        rest = await _read(source, count - len(applied), timeout_s=10)
        await _nothing_more(source)

    applied_ids = {(r.partition, r.offset) for r in applied}
    rest_ids = {(r.partition, r.offset) for r in rest}
    assert not applied_ids & rest_ids  # no duplicates
    assert applied_ids | rest_ids == {(r.partition, r.offset) for r in first}  # no loss
    assert all(r.offset >= commit[(r.topic, r.partition)] for r in rest)


async def test_group_subscription_joins_and_reads(kafka_broker: Broker) -> None:
    topic, group, count = _name("group"), _name("group-group"), 200
    kafka_broker.create_topics({topic: PARTITIONS})
    await _produce(kafka_broker, topic, count)
    async with open_kafka_source(
        _config(kafka_broker),
        topics=[topic],
        group_id=group,
        start="earliest",
        # Kafka's lowest by default (group.min.session.timeout.ms refuses less); Tansu
        # finishes a join after about half of it.
        session_timeout_ms=6000,
    ) as source:
        records = await _read(source, count, timeout_s=20)
        assert source.assignment() == frozenset(_all_partitions(topic))
        last: dict[tuple[str, int], int] = {}
        for r in records:
            last[(r.topic, r.partition)] = r.offset + 1
        # The group may still be settling (the assignor's second round, or a slow join on a
        # busy machine): the broker then refuses a commit as RebalanceInProgress, and the
        # service's committer retries it. So does this, for a bounded time.
        with trio.fail_after(20):
            while True:
                try:
                    await source.commit(last)
                    break
                except TransportError as exc:
                    if "RebalanceInProgress" not in str(exc):
                        raise
                    await trio.sleep(0.2)
    assert len({(r.partition, r.offset) for r in records}) == count


async def test_cancelling_a_source_stops_its_thread_promptly(
    kafka_broker: Broker,
) -> None:
    topic = _name("cancel")
    kafka_broker.create_topics({topic: 1})
    opened: list[KafkaSource] = []
    with trio.fail_after(5), trio.move_on_after(0.3):
        async with open_kafka_source(
            _config(kafka_broker),
            topics=[topic],
            group_id=_name("cancel-group"),
            assignment=[(topic, 0)],
        ) as source:
            opened.append(source)
            await trio.sleep_forever()
    # The context manager returned only after the consumer thread had closed the consumer.
    with pytest.raises(TransportError, match="stopped"):
        await opened[0].commit({(topic, 0): 0})


async def test_sink_flush_raises_when_the_broker_goes_away() -> None:
    # On a Tansu of its own, on one broker only: the test stops it, and once its port is
    # closed which broker it was is beside the point (Tansu starts in a second).
    with EmbeddedBroker() as broker:
        topic = _name("gone")
        broker.create_topics({topic: 1})
        config = _config(broker)
        with pytest.raises(TransportError, match=r"1 record\(s\) could not be delivered"):
            async with open_kafka_sink(config, delivery_timeout_ms=1500) as sink:
                await sink.send(topic, b"k", b"before")
                await sink.flush()
                broker.stop()  # the port is closed from now on
                await sink.send(topic, b"k", b"after")
                with trio.fail_after(10):
                    await sink.flush()
        stats = sink.statistics()
        assert (stats.sent, stats.acked, stats.failed) == (2, 1, 1)


async def test_clients_on_a_closed_port_fail_fast_with_transport_error() -> None:
    config = KafkaClientConfig(bootstrap_servers=f"127.0.0.1:{free_port()}")
    with trio.fail_after(10):
        with pytest.raises(TransportError, match="cannot reach Kafka at"):
            async with open_kafka_sink(config, connect_timeout_ms=500):
                pass
        with pytest.raises(TransportError, match="cannot reach Kafka at"):
            async with open_kafka_source(
                config, topics=["t"], group_id="g", connect_timeout_ms=500
            ):
                pass


async def test_bad_arguments_are_usage_errors_naming_them() -> None:
    config = KafkaClientConfig(bootstrap_servers=f"127.0.0.1:{free_port()}")
    with pytest.raises(UsageError, match="group_id"):
        async with open_kafka_source(config, topics=["t"], group_id=None):
            pass
    with pytest.raises(UsageError, match="committed"):
        async with open_kafka_source(config, topics=["t"], group_id=None, assignment=[("t", 0)]):
            pass
    with pytest.raises(UsageError, match="assignment"):
        async with open_kafka_source(config, topics=["t"], group_id="g", assignment=[("u", 0)]):
            pass
    with pytest.raises(UsageError, match="max_in_flight"):
        async with open_kafka_sink(config, max_in_flight=0):
            pass
    with pytest.raises(UsageError, match="batch_bytes"):
        async with open_kafka_sink(config, batch_bytes=0):
            pass


def test_client_config_validates_and_passes_only_set_security_arguments() -> None:
    plain = KafkaClientConfig(bootstrap_servers="a:9092, b:9092")
    assert plain.kafka_kwargs() == {
        "bootstrap_servers": ["a:9092", "b:9092"],
        "client_id": "purgatory",
        "security_protocol": "PLAINTEXT",
    }
    sasl = KafkaClientConfig(
        bootstrap_servers="a:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="u",
        sasl_password="secret",
        ssl_cafile="/ca.pem",
    )
    kwargs = sasl.kafka_kwargs()
    assert kwargs["sasl_plain_username"] == "u" and kwargs["ssl_cafile"] == "/ca.pem"
    assert "ssl_certfile" not in kwargs and "secret" not in repr(sasl)
    with pytest.raises(ConfigError, match="bootstrap_servers"):
        KafkaClientConfig(bootstrap_servers="")
    with pytest.raises(ConfigError, match="security_protocol"):
        KafkaClientConfig(bootstrap_servers="a:1", security_protocol="TLS")
    with pytest.raises(ConfigError, match="sasl_password"):
        KafkaClientConfig(
            bootstrap_servers="a:1",
            security_protocol="SASL_PLAINTEXT",
            sasl_mechanism="PLAIN",
            sasl_username="u",
        )
