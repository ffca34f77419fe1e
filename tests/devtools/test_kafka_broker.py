"""Apache Kafka as a development broker: serves on loopback, honours transactions, keeps its log
across a SIGKILL and a stop, and leaves nothing behind, not even when its owner is SIGKILLed.

kafka-python talks to it directly (no service here). The brokers these tests start themselves
are real processes, so the waits for them are real, in bounded loops.
"""

from __future__ import annotations

import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from purgatory._core import TransportError, UsageError
from purgatory.devtools.broker import Broker, EmbeddedBroker
from purgatory.devtools.kafka_broker import KafkaBroker
from purgatory.service.kafka.config import no_topic_creation
from tests.devtools.test_broker import (
    _cleanup,
    _dead,
    _kill_owner_and_check,
    _poll,
    _port_refuses,
    _run_owner,
)

pytestmark = pytest.mark.kafka

# Both brokers offer what a test needs of one (mypy checks the structure).
BROKERS: tuple[type[Broker], ...] = (EmbeddedBroker, KafkaBroker)

Record = tuple[bytes | None, bytes | None]


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def _produce(servers: str, topic: str, records: list[Record]) -> None:
    producer = KafkaProducer(bootstrap_servers=servers, acks="all", **no_topic_creation())
    try:
        for key, value in records:
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=30)
    finally:
        producer.close()


def _read(
    servers: str,
    topic: str,
    partitions: int,
    count: int,
    isolation_level: str = "read_uncommitted",
) -> list[Record]:
    """Read ``count`` records from the start of every partition; at most 20 s of polls."""
    consumer = KafkaConsumer(
        bootstrap_servers=servers,
        isolation_level=isolation_level,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **no_topic_creation(),
    )
    records: list[Record] = []
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        for _ in range(40):
            for batch in consumer.poll(timeout_ms=500).values():
                records += [(r.key, r.value) for r in batch]
            if len(records) >= count:
                break
    finally:
        consumer.close()
    return records


def _records(prefix: str, count: int) -> list[Record]:
    return [(f"k{i % 3}".encode(), f"{prefix}{i}".encode()) for i in range(count)]


def test_serves_on_loopback_and_records_go_round(apache_kafka: KafkaBroker) -> None:
    servers, pid, log_path = apache_kafka.bootstrap_servers, apache_kafka.pid, apache_kafka.log_path
    assert servers.startswith("127.0.0.1:") and pid is not None and not _dead(pid)
    assert log_path is not None and b"Kafka Server started" in log_path.read_bytes()
    topic = _name("round")
    apache_kafka.create_topics({topic: 2})
    sent = _records("v", 10)
    _produce(servers, topic, sent)
    assert sorted(_read(servers, topic, 2, len(sent))) == sorted(sent)


def test_create_topics_is_idempotent(apache_kafka: KafkaBroker) -> None:
    first, second = _name("idem"), _name("idem")
    apache_kafka.create_topics({first: 3})
    apache_kafka.create_topics({first: 5, second: 2})  # existing topics are left as they are
    consumer = KafkaConsumer(bootstrap_servers=apache_kafka.bootstrap_servers)
    try:
        assert consumer.partitions_for_topic(first) == {0, 1, 2}
        assert consumer.partitions_for_topic(second) == {0, 1}
    finally:
        consumer.close()
    with pytest.raises(UsageError, match="partitions"):
        apache_kafka.create_topics({"bad": 0})


def test_read_committed_sees_committed_transactions_only(apache_kafka: KafkaBroker) -> None:
    servers, topic = apache_kafka.bootstrap_servers, _name("txn")
    apache_kafka.create_topics({topic: 1})
    producer = KafkaProducer(
        bootstrap_servers=servers, transactional_id=_name("txn-id"), **no_topic_creation()
    )
    try:
        producer.init_transactions()
        for prefix, count, commit in (("c", 3, True), ("a", 2, False), ("d", 1, True)):
            producer.begin_transaction()
            for key, value in _records(prefix, count):
                producer.send(topic, key=key, value=value)
            if commit:
                producer.commit_transaction()
            else:
                producer.flush()  # on the broker, so that the abort has something to hide
                producer.abort_transaction()
    finally:
        producer.close()
    committed = [v for _, v in _read(servers, topic, 1, 4, "read_committed")]
    assert committed == [b"c0", b"c1", b"c2", b"d0"]  # the aborted ones come before d0
    everything = [v for _, v in _read(servers, topic, 1, 6)]
    assert everything == [b"c0", b"c1", b"c2", b"a0", b"a1", b"d0"]  # they were written


def test_restarts_on_its_data_dir_after_sigkill_and_after_stop(tmp_path: Path) -> None:
    broker = KafkaBroker(data_dir=tmp_path / "kafka")
    topic = _name("durable")
    try:
        broker.start()
        servers = broker.bootstrap_servers
        broker.create_topics({topic: 2})
        first = _records("a", 5)
        _produce(servers, topic, first)
        pid = broker.pid
        assert pid is not None
        broker.kill()  # a crash: no controlled shutdown
        assert _dead(pid) and broker.pid is None
        broker.start()
        assert broker.bootstrap_servers == servers  # the same address for reconnecting clients
        assert sorted(_read(servers, topic, 2, 5)) == sorted(first)
        second = _records("b", 3)
        _produce(servers, topic, second)
        pid = broker.pid
        assert pid is not None
        broker.stop()
        assert _dead(pid) and broker.pid is None and _port_refuses(servers)
        broker.stop()  # idempotent
        with pytest.raises(UsageError, match="not running"):
            _ = broker.bootstrap_servers
        broker.start()
        assert sorted(_read(servers, topic, 2, 8)) == sorted(first + second)
    finally:
        broker.close()
    assert (tmp_path / "kafka" / "kafka-logs").is_dir()  # a data dir it was given stays


def test_close_removes_the_data_dir_it_created() -> None:
    broker = KafkaBroker(java="/bin/false")  # fails its first step, once the data dir exists
    with pytest.raises(TransportError, match="formatting"):
        broker.start()
    data_dir = broker.data_dir
    assert data_dir is not None and (data_dir / "server.properties").is_file()
    broker.close()
    assert not data_dir.exists() and broker.data_dir is None
    broker.close()  # idempotent


def test_missing_jars_name_make_kafka(tmp_path: Path) -> None:
    broker = KafkaBroker(libs=tmp_path)
    with pytest.raises(TransportError, match="make kafka"):
        broker.start()
    assert broker.data_dir is None  # nothing was created


def test_missing_java_is_a_transport_error_naming_it() -> None:
    with pytest.raises(TransportError, match="/nonexistent/java"):
        KafkaBroker(java="/nonexistent/java").start()


def test_die_with_parent_off_the_main_thread_is_a_usage_error() -> None:
    broker = KafkaBroker(die_with_parent=True)
    with ThreadPoolExecutor(1) as pool, pytest.raises(UsageError, match="main thread"):
        pool.submit(broker.start).result()
    assert broker.pid is None and broker.data_dir is None  # nothing was started or created


_OWNER = """\
import signal, sys
from pathlib import Path
from purgatory.devtools.kafka_broker import KafkaBroker
broker = KafkaBroker(data_dir=Path(sys.argv[1]), die_with_parent=True)
broker.start()
print("broker pid", broker.pid, flush=True)
signal.pause()  # until killed
"""


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_sigkill_of_its_owner_takes_the_broker_down(tmp_path: Path) -> None:
    out = tmp_path / "owner.log"
    owner = _run_owner([sys.executable, "-c", _OWNER, str(tmp_path / "kafka")], out)
    brokers: list[int] = []
    try:
        started = _poll(lambda: b"broker pid" in out.read_bytes(), 60.0)
        assert started and owner.poll() is None, out.read_text(errors="replace")
        brokers = [int(out.read_text().split("broker pid", 1)[1].split()[0])]
        assert not _dead(brokers[0])
        _kill_owner_and_check(owner, brokers)  # gone within 10 s
    finally:
        _cleanup(owner, brokers)


def test_the_two_brokers_offer_the_same_attributes() -> None:
    names = ("bootstrap_servers", "pid", "log_path", "start", "stop", "create_topics")
    for cls in BROKERS:
        assert all(hasattr(cls, name) for name in (*names, "__enter__", "__exit__")), cls
