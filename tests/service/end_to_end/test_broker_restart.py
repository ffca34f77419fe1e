"""SIGKILL the broker under load and bring it back on the same log: the service recovers alone.

Only Apache Kafka keeps its log on disk; the embedded broker loses everything when it stops, so
this test is Kafka's alone. One ``purgatory serve`` child runs against it while HTTP
registrations and signals (the client retries a 503 or a refused connection within a long
timeout) and Kafka registrations and signals go on. The broker is SIGKILLed, stays down a few
seconds, and starts again on the same data dir and ports. Then the load stops, the remaining
barriers are signalled, and every acknowledged operation's callback is awaited.

What must hold, read from the callbacks topic from its start to its end: nothing acknowledged
is lost; every copy of an operation's callback is byte-identical and ids map one-to-one to
operations; the service process is the same one throughout (it recovered by itself) and
answers ``/readyz`` 200 again within a bound of the broker's return; SIGTERM exits 0.
"""

from __future__ import annotations

import random
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError

from purgatory.devtools.kafka_broker import KafkaBroker
from tests.service.end_to_end.test_e2e import _settings
from tests.service.end_to_end.test_sigkill import (
    READY_BOUND_S,
    Background,
    CallbackReader,
    Child,
    Load,
    _pause,
    _scopes,
    read_copies,
)

pytestmark = pytest.mark.kafka

UP_S = 3.0  # load before the kill
DOWN_S = 5.0  # the broker away
CLIENT_TIMEOUT_S = 60.0  # a write outlasts the outage by retrying 503s
RECOVERY_BOUND_S = 60.0


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_broker_sigkilled_under_load_and_restarted_loses_nothing(
    apache_kafka: KafkaBroker, tmp_path: Path
) -> None:
    broker: Any = apache_kafka  # the helpers are typed for the embedded broker; same contract
    settings = _settings(broker)
    service = Child(settings, tmp_path)
    producer = KafkaProducer(
        bootstrap_servers=apache_kafka.bootstrap_servers, acks="all", retries=1_000
    )
    load = Load(settings, producer, _scopes())
    streams: list[Background] = []
    try:
        service.start()
        service.wait_ready(timeout_s=READY_BOUND_S)
        assert service.proc is not None
        pid = service.proc.pid

        def http(seed: int) -> Background:
            def run(stop: threading.Event) -> None:
                rng = random.Random(seed)
                with service.client(timeout_s=CLIENT_TIMEOUT_S) as client:
                    while not stop.is_set():
                        ops = load.ops("http", 1)
                        load.http_one(client, ops[0])
                        if rng.random() < 0.5:
                            load.http_signal(client, load.to_signal_now(ops))

            return Background(run)

        def kafka(stop: threading.Event) -> None:
            while not stop.is_set():
                ops = load.ops("kafka", 3)
                try:  # while the broker is away a flush times out: those are not acknowledged
                    load.kafka_register(ops)
                    load.kafka_signal(load.to_signal_now(ops))
                except KafkaTimeoutError:
                    pass
                _pause(0.3)

        streams = [http(1), http(2), Background(kafka)]
        _pause(UP_S)
        acked_before = len(load.acked)
        apache_kafka.kill()
        killed_at = time.perf_counter()
        _pause(DOWN_S)
        apache_kafka.start()
        back_at = time.perf_counter()
        while not _ready(service.url):
            assert time.perf_counter() - back_at < RECOVERY_BOUND_S, service.log_tail()
            _pause(0.1)
        ready_after_s = time.perf_counter() - back_at
        _pause(UP_S)  # load on the recovered service
        for stream in streams:
            stream.stop.set()
        for stream in streams:
            stream.join(timeout_s=CLIENT_TIMEOUT_S * 2)

        load.kafka_signal(load.unsignalled())
        assert not load.unsignalled()
        reader = CallbackReader(broker, settings.topic_callbacks)
        try:
            missing = reader.wait_for(set(load.acked), timeout_s=60)
        finally:
            reader.close()
        assert not missing, (
            f"{len(missing)} acknowledged operations have no callback: {sorted(missing)[:10]}"
            f"\n{service.log_tail()}"
        )
        assert service.proc.pid == pid and service.incarnation == 0  # recovered by itself
        assert service.terminate() == 0, service.log_tail()
    finally:
        for stream in streams:
            stream.stop.set()
        service.close()
        producer.close(timeout=5)

    copies = read_copies(broker, settings.topic_callbacks)
    by_op, ids, conflicting = copies.by_op, copies.ids, copies.conflicting
    print(
        f"\nbroker-restart: {sum(load.attempts.values())} registrations tried,"
        f" {len(load.acked)} acknowledged ({acked_before} before the kill),"
        f" {load.http_failures} HTTP not acknowledged; broker down"
        f" {back_at - killed_at:.1f} s, service ready {ready_after_s:.1f} s after its return;"
        f" {copies.records} callback records for {len(by_op)} operations,"
        f" {copies.records - len(by_op)} exact duplicates, {len(conflicting)} conflicting,"
        f" {len(set(load.acked) - set(by_op))} lost"
    )
    assert not conflicting, list(conflicting.items())[:3]
    assert all(len(idents) == 1 for idents in ids.values())
    assert not set(load.acked) - set(by_op)
    assert len(load.acked) > acked_before  # the service took writes again after the return
