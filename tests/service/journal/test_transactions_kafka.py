"""Transactional producers against the real brokers: what the fake coordinator models, on Kafka.

On Apache Kafka: a second producer of a partition fences the first before it can commit; a
``read_committed`` reader sees a committed transaction whole and an aborted one not at all; the
offsets sent with a transaction become the group's, whatever its members and generation; a
record refused for good (a topic that does not exist, a record over the producer's limit)
aborts its transaction and is named. On the embedded broker, which accepts the calls but fences
nobody, the start-time probe refuses transactional delivery with a message that says what to
do.
"""

from __future__ import annotations

import threading
import uuid

import pytest
import trio
from kafka import KafkaConsumer, TopicPartition

from purgatory._core import ConfigError
from purgatory.devtools.broker import Broker
from purgatory.devtools.kafka_broker import KafkaBroker
from purgatory.service.app import run_service
from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.reader import KafkaLogReader
from purgatory.service.kafka.transactions import KafkaTransactions, check_transactions
from purgatory.service.kafka.transport import (
    ConsumedRecord,
    OutRecord,
    ProducerFencedError,
    RecordRefusedError,
)
from tests.service.end_to_end.test_e2e import _settings
from tests.service.end_to_end.test_sigkill import _pause

pytestmark = pytest.mark.kafka


def _topics(broker: Broker) -> tuple[str, str]:
    prefix = f"x{uuid.uuid4().hex[:8]}"
    out, inputs = f"{prefix}.out", f"{prefix}.in"
    broker.create_topics({out: 1, inputs: 1})
    return out, inputs


def _producers(broker: Broker, prefix: str, group: str) -> KafkaTransactions:
    return KafkaTransactions(
        KafkaClientConfig(broker.bootstrap_servers),
        id_prefix=prefix,
        group_id=group,
        max_request_bytes=10_000,
        metadata_timeout_ms=2_000,
    )


async def _read_committed(broker: Broker, topic: str) -> list[ConsumedRecord]:
    reader = KafkaLogReader(KafkaClientConfig(broker.bootstrap_servers), read_committed=True)
    seen: list[ConsumedRecord] = []
    await reader.read(topic, 0, 0, seen.extend)
    return seen


def _committed_offset(broker: Broker, group: str, topic: str, expected: int) -> int | None:
    """The group's committed offset once it reads ``expected``, or the last value after 20 s.

    A transaction's offsets become the group's when the coordinator writes the commit marker
    to ``__consumer_offsets``, a moment after ``commit_transaction`` returns; until then an
    offset fetch answers with the previous commit.
    """
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, group_id=group)
    try:
        offset: int | None = None
        for _ in range(200):
            offset = consumer.committed(TopicPartition(topic, 0))
            if offset == expected:
                break
            _pause(0.1)
        return offset
    finally:
        consumer.close()


class _Members:
    """Members of one group, each polled by a thread of its own until :meth:`close` (a member
    that stops polling would hold up the next rebalance)."""

    def __init__(self, broker: Broker, group: str, topic: str) -> None:
        self._broker, self._group, self._topic = broker, group, topic
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def join(self) -> int:
        """One more member; the group generation it joined (within 30 s)."""
        joined: list[int] = []
        ready = threading.Event()

        def run() -> None:
            consumer = KafkaConsumer(
                self._topic,
                bootstrap_servers=self._broker.bootstrap_servers,
                group_id=self._group,
                enable_auto_commit=False,
            )
            try:
                while not self._stop.is_set():
                    consumer.poll(timeout_ms=100)
                    metadata = consumer.group_metadata()
                    if not ready.is_set() and metadata.member_id and metadata.generation_id > 0:
                        joined.append(metadata.generation_id)
                        ready.set()
            finally:
                consumer.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self._threads.append(thread)
        assert ready.wait(30), f"a member of {self._group!r} did not join within 30 s"
        return joined[0]

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


@pytest.mark.parametrize("kafka_broker", ["kafka"], indirect=True)
async def test_offsets_are_taken_whatever_the_groups_members_and_generation(
    kafka_broker: Broker,
) -> None:
    """The offsets go with the group's id alone: Kafka takes them while the group has live
    members, and again after a rebalance began a new generation (a member that joins), where
    offsets sent with the member's generation would be refused."""
    out, inputs = _topics(kafka_broker)
    prefix, group = f"p{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:8]}"
    await check_transactions(
        KafkaClientConfig(kafka_broker.bootstrap_servers), transactional_id=f"{prefix}-probe"
    )
    producers = _producers(kafka_broker, prefix, group)
    members = _Members(kafka_broker, group, inputs)
    try:
        first = await trio.to_thread.run_sync(members.join)
        await producers.open(0)
        await producers.commit(0, [OutRecord(out, b"k", b"one", partition=0)], {(inputs, 0): 5})
        assert await trio.to_thread.run_sync(members.join) > first  # a rebalance came between
        await producers.commit(0, [OutRecord(out, b"k", b"two", partition=0)], {(inputs, 0): 9})
    finally:
        await producers.aclose()
        await trio.to_thread.run_sync(members.close)
    assert [r.value for r in await _read_committed(kafka_broker, out)] == [b"one", b"two"]
    assert await trio.to_thread.run_sync(_committed_offset, kafka_broker, group, inputs, 9) == 9


@pytest.mark.parametrize("kafka_broker", ["kafka"], indirect=True)
async def test_kafka_fences_the_older_producer_and_readers_see_only_commits(
    kafka_broker: Broker,
) -> None:
    out, inputs = _topics(kafka_broker)
    prefix, group = f"p{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:8]}"
    # As the service does before it opens a partition: on a fresh broker the first
    # transactional call waits for the coordinator to load, past these producers' 2 s.
    config = KafkaClientConfig(kafka_broker.bootstrap_servers)
    await check_transactions(config, transactional_id=f"{prefix}-probe")
    older, newer = _producers(kafka_broker, prefix, group), _producers(kafka_broker, prefix, group)
    try:
        await older.open(0)
        offsets = await older.commit(
            0, [OutRecord(out, b"k", b"first", partition=0)], {(inputs, 0): 7}
        )
        assert offsets == [0]
        assert await trio.to_thread.run_sync(_committed_offset, kafka_broker, group, inputs, 7) == 7

        with pytest.raises(RecordRefusedError) as refused:
            await older.commit(
                0,
                [
                    OutRecord(out, b"k", b"kept back", partition=0),
                    OutRecord(f"{out}.missing", b"k", b"nowhere", partition=0),
                ],
                {(inputs, 0): 9},
            )
        assert refused.value.index == 1
        with pytest.raises(RecordRefusedError) as too_large:
            await older.commit(0, [OutRecord(out, b"k", b"x" * 20_000, partition=0)], {})
        assert too_large.value.index == 0

        await newer.open(0)  # takes the transactional id: the older producer is fenced
        with pytest.raises(ProducerFencedError):
            await older.commit(0, [OutRecord(out, b"k", b"zombie", partition=0)], {})
        # Never taken again behind the caller's back (that would fence the new owner and
        # commit what a stale state decided): only open() after a restore takes it again.
        with pytest.raises(ProducerFencedError):
            await older.commit(0, [OutRecord(out, b"k", b"zombie again", partition=0)], {})
        await newer.commit(0, [OutRecord(out, b"k", b"second", partition=0)], {(inputs, 0): 11})
    finally:
        await older.aclose()
        await newer.aclose()
    seen = await _read_committed(kafka_broker, out)
    assert [r.value for r in seen] == [b"first", b"second"]
    assert await trio.to_thread.run_sync(_committed_offset, kafka_broker, group, inputs, 11) == 11


async def test_the_start_probe_passes_on_kafka_and_refuses_the_embedded_broker(
    kafka_broker: Broker,
) -> None:
    config = KafkaClientConfig(kafka_broker.bootstrap_servers)
    probe_id = f"probe-{uuid.uuid4().hex[:8]}"
    if isinstance(kafka_broker, KafkaBroker):
        await check_transactions(config, transactional_id=probe_id)
        return
    # Refused at its first answer, not after waiting out a bound: the broker took a call of
    # the producer it should have fenced.
    with trio.fail_after(10), pytest.raises(ConfigError) as refused:
        await check_transactions(config, transactional_id=probe_id)
    message = str(refused.value)
    assert "PURGATORY_DELIVERY=transactional" in message
    assert "cannot do Kafka transactions" in message and "fences nobody" in message
    assert "PURGATORY_DELIVERY=acknowledged" in message


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)
async def test_a_transactional_service_does_not_start_on_the_embedded_broker(
    kafka_broker: Broker,
) -> None:
    settings = _settings(kafka_broker, delivery="transactional")
    with trio.fail_after(60), pytest.raises(ConfigError, match="cannot do Kafka transactions"):
        await run_service(settings, stop=trio.Event())
