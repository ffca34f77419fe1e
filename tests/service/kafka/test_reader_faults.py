"""The reader turns whatever kafka-python raises for a broker fault into a ``TransportError``.

The snapshot watch and the topic layout of ``purgatory serve`` retry a ``TransportError`` with
their back-off and log event; anything else they let through, and it ends the replica. Under
metadata that is momentarily empty or partial (a broker fencing itself, leaders moving)
kafka-python raises more than ``KafkaError``: its protocol and record code assert, its producer
raises ``ValueError``, a socket ``OSError``; and its ``close()`` in the reader's ``finally`` went
out unconverted too. A stub stands in for kafka-python's ``KafkaConsumer`` here, raising on cue.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import structlog
import trio
import trio.testing
from kafka import TopicPartition
from kafka.errors import KafkaConnectionError, MetadataEmptyBrokerList

from purgatory._core import TransportError
from purgatory.service.kafka import reader as reader_module
from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.reader import KafkaLogReader
from purgatory.service.snapshots.snapshot_watch import SnapshotWatch

TOPIC = "purgatory.changelog"


class _Record:
    def __init__(self, offset: int) -> None:
        self.topic, self.partition, self.offset = TOPIC, 0, offset
        self.key, self.value, self.timestamp = b"k", b"v", 1


class _Consumer:
    """kafka-python's consumer as the reader uses it: one partition holding two records. A
    method named in ``fail`` raises that exception instead (class-wide: the reader makes its
    own consumers)."""

    fail: ClassVar[dict[str, BaseException]] = {}
    closed: ClassVar[int] = 0
    waits: ClassVar[list[tuple[str, int | None]]] = []  # each offset lookup and its bound

    def __init__(self, **_options: Any) -> None:
        self._fail("__init__")
        self._position = 0

    def _fail(self, method: str) -> None:
        if method in self.fail:
            raise self.fail[method]

    def partitions_for_topic(self, topic: str) -> set[int]:
        self._fail("partitions_for_topic")
        return {0}

    def assign(self, _partitions: list[Any]) -> None:
        self._fail("assign")

    def seek(self, _tp: Any, offset: int) -> None:
        self._position = offset

    def seek_to_end(self, _tp: Any) -> None:
        self._position = 2

    def poll(self, *, timeout_ms: int) -> dict[Any, list[_Record]]:
        self._fail("poll")
        records = [_Record(offset) for offset in range(self._position, 2)]
        self._position = 2
        return {TopicPartition(TOPIC, 0): records} if records else {}

    def highwater(self, _tp: Any) -> int:
        return 2

    def position(self, _tp: Any, timeout_ms: int | None = None) -> int:
        self.waits.append(("position", timeout_ms))
        return self._position

    def end_offsets(self, tps: list[Any], timeout_ms: int | None = None) -> dict[Any, int]:
        self.waits.append(("end_offsets", timeout_ms))
        return dict.fromkeys(tps, 2)

    def close(self, *, autocommit: bool) -> None:
        type(self).closed += 1
        self._fail("close")


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> type[_Consumer]:
    monkeypatch.setattr(_Consumer, "fail", {})
    monkeypatch.setattr(_Consumer, "closed", 0)
    monkeypatch.setattr(_Consumer, "waits", [])
    monkeypatch.setattr(reader_module, "KafkaConsumer", _Consumer)
    return _Consumer


def _reader() -> KafkaLogReader:
    return KafkaLogReader(KafkaClientConfig(bootstrap_servers="kafka:9092"))


@pytest.mark.parametrize(
    ("method", "error"),
    [
        ("partitions_for_topic", AssertionError()),  # its protocol code asserts
        ("partitions_for_topic", MetadataEmptyBrokerList("no brokers")),  # a fenced broker
        ("poll", ValueError("Expected ListOffsetsResponse with one offset")),
        ("assign", OSError(104, "Connection reset by peer")),
        ("__init__", KafkaConnectionError("111 ECONNREFUSED")),
    ],
)
async def test_a_fault_of_the_client_is_a_transport_error(
    consumer: type[_Consumer], method: str, error: BaseException
) -> None:
    consumer.fail = {method: error}
    with pytest.raises(TransportError) as raised:
        await _reader().read(TOPIC, 0, 0, lambda _batch: None)
    assert raised.value.__cause__ is error
    assert type(error).__name__ in str(raised.value)
    if method in {"__init__", "partitions_for_topic"}:  # what a count calls
        with pytest.raises(TransportError):
            await _reader().partition_count(TOPIC)


@pytest.mark.parametrize("read_committed", [False, True])
async def test_every_offset_lookup_of_a_read_is_bounded(
    consumer: type[_Consumer], read_committed: bool
) -> None:
    """kafka-python retries the lookups behind ``position`` and ``end_offsets`` without a bound
    unless given one: right after a broker restart a restore could wait on them, silently."""
    reader = KafkaLogReader(
        KafkaClientConfig(bootstrap_servers="kafka:9092"), read_committed=read_committed
    )
    assert await reader.read(TOPIC, 0, 0, lambda _batch: None) == 2
    assert await reader.end_offset(TOPIC, 0) == 2
    called = {name for name, _ in consumer.waits}
    assert called == ({"position", "end_offsets"} if read_committed else {"position"})
    assert all(timeout is not None and timeout > 0 for _, timeout in consumer.waits)


async def test_a_close_that_fails_leaves_the_read_as_it_was(consumer: type[_Consumer]) -> None:
    consumer.fail = {"close": AssertionError("its selector asserts")}
    batches: list[list[Any]] = []
    with structlog.testing.capture_logs() as logs:
        assert await _reader().read(TOPIC, 0, 0, batches.append) == 2
        assert await _reader().partition_count(TOPIC) == 1
        consumer.fail["poll"] = KafkaConnectionError("gone")
        with pytest.raises(TransportError, match="gone"):  # the read's error, not close's
            await _reader().read(TOPIC, 0, 0, batches.append)
    assert [r.offset for batch in batches for r in batch] == [0, 1]
    assert consumer.closed == 3
    assert [e["event"] for e in logs] == ["kafka_reader_close_failed"] * 3


async def test_an_error_of_the_callers_handler_is_not_taken_for_the_brokers(
    consumer: type[_Consumer],
) -> None:
    def handle(_batch: list[Any]) -> None:
        raise ValueError("a bug of the replay")

    with pytest.raises(ValueError, match="a bug of the replay"):
        await _reader().read(TOPIC, 0, 0, handle)
    assert consumer.closed == 1


async def test_the_snapshot_watch_of_serve_rides_out_an_assertion_of_the_client(
    consumer: type[_Consumer], autojump_clock: trio.testing.MockClock
) -> None:
    """The watch runs beside the service in ``serve``'s nursery: an exception it lets through
    ends the process. A fault of the client is logged and looked at again."""
    watch = SnapshotWatch(
        _reader(),
        snapshots_topic="purgatory.snapshots",
        changelog_topic=TOPIC,
        partitions=None,
        now_ms=lambda: 0,
        every_s=30,
    )
    consumer.fail = {"partitions_for_topic": AssertionError()}
    with structlog.testing.capture_logs() as logs:
        await watch.look()
        consumer.fail = {}
        await watch.look()
    assert [e["event"] for e in logs] == ["snapshot_watch_failed", "snapshot_watch_recovered"]
    assert [s.partition for s in watch.statistics()] == [0]
