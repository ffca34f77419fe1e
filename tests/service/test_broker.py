"""The embedded broker: starts on loopback, serves, creates topics idempotently, leaves nothing."""

from __future__ import annotations

import os
import socket
import uuid

import pytest
from kafka import KafkaAdminClient

from purgatory._core import TransportError, UsageError
from purgatory.service._broker import EmbeddedBroker

pytestmark = pytest.mark.kafka


def _partitions(bootstrap_servers: str, topic: str) -> int:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap_servers)
    try:
        (described,) = admin.describe_topics([topic])
        return len(described["partitions"])
    finally:
        admin.close()


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _port_refuses(bootstrap_servers: str) -> bool:
    host, port = bootstrap_servers.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return False
    except OSError:
        return True


def test_start_serves_on_loopback_and_stop_leaves_no_process() -> None:
    broker = EmbeddedBroker()
    broker.start()
    pid, servers, log_path = broker.pid, broker.bootstrap_servers, broker.log_path
    assert pid is not None and log_path is not None
    assert servers.startswith("127.0.0.1:")
    assert not _process_gone(pid)
    assert b"listening on" in log_path.read_bytes()  # output went to the log, not the terminal
    broker.stop()
    assert _process_gone(pid)  # terminated and reaped
    assert _port_refuses(servers)
    assert not log_path.exists()
    broker.stop()  # idempotent
    with pytest.raises(UsageError, match="not running"):
        _ = broker.bootstrap_servers


def test_context_manager_stops_the_broker_on_error() -> None:
    pid = None
    with pytest.raises(RuntimeError, match="boom"), EmbeddedBroker() as broker:
        pid = broker.pid
        raise RuntimeError("boom")
    assert pid is not None and _process_gone(pid)


def test_missing_binary_is_a_transport_error_naming_it() -> None:
    with pytest.raises(TransportError, match="/nonexistent/tansu"):
        EmbeddedBroker(binary="/nonexistent/tansu").start()


def test_create_topics_is_idempotent(kafka_broker: EmbeddedBroker) -> None:
    first, second = f"idem-{uuid.uuid4().hex}", f"idem-{uuid.uuid4().hex}"
    kafka_broker.create_topics({first: 3})
    kafka_broker.create_topics({first: 3})
    kafka_broker.create_topics({first: 5, second: 2})  # existing topics are left as they are
    assert _partitions(kafka_broker.bootstrap_servers, first) == 3
    assert _partitions(kafka_broker.bootstrap_servers, second) == 2


def test_create_topics_rejects_bad_arguments(kafka_broker: EmbeddedBroker) -> None:
    with pytest.raises(UsageError, match="partitions"):
        kafka_broker.create_topics({"bad": 0})
