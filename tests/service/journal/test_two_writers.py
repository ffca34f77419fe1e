"""Two replicas configured onto the same partitions, through the real broker and real HTTP.

A copy-paste mistake (two pods with the same ordinal, or the same static partitions) is the
same path a zombie owner or an ordinal resize takes: two ``purgatory serve`` processes consume
the same inputs and append to the same changelog partitions. For a few seconds both take HTTP
registrations and signals (each request to one of them at random, retried on 503 within the
client's timeout) while Kafka registrations and signals arrive too; then the second is
SIGKILLed, the remaining barriers are signalled, and the first delivers the rest alone.

What must hold, read from the callbacks topic from its start to its end:

* no conflicting outcomes: every copy of an operation's callback is byte-identical, and ids map
  one-to-one to operations;
* nothing acknowledged is lost: each registration answered 2xx (by either replica) or
  acknowledged by the broker on the requests topic has its callback;
* the misconfiguration is named: the replicas logged ``partition_fenced`` saying another writer
  appended to the changelog, and the first one's ``purgatory_partition_fenced_total`` counts
  every fence it logged.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
from pathlib import Path

import httpx
import pytest
from kafka import KafkaProducer
from prometheus_client.parser import text_string_to_metric_families

from purgatory.devtools.broker import Broker, free_port
from tests.bounds import bound
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

BOTH_S = 6.0  # both writers under load
CLIENT_TIMEOUT_S = 8.0  # long enough to outwait a fenced partition's restore


def _fences_logged(logs: Path) -> list[dict[str, object]]:
    found = []
    for path in sorted(logs.glob("service-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if isinstance(doc, dict) and doc.get("event") == "partition_fenced":
                found.append(doc)
    return found


def _fences_counted(url: str) -> int:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return sum(
        int(sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "purgatory_partition_fenced_total"
    )


def test_two_replicas_on_the_same_partitions_never_release_conflicting_outcomes(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    settings = _settings(kafka_broker)
    second_port = free_port()
    while second_port == settings.http_port:
        second_port = free_port()
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    first = Child(settings, tmp_path / "first")
    second = Child(dataclasses.replace(settings, http_port=second_port), tmp_path / "second")
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, acks="all")
    load = Load(settings, producer, _scopes())
    streams: list[Background] = []
    try:
        first.start()
        first.wait_ready(timeout_s=bound(READY_BOUND_S))
        second.start()
        second.wait_ready(timeout_s=bound(READY_BOUND_S))

        def work(seed: int) -> Background:
            def run(stop: threading.Event) -> None:
                rng = random.Random(seed)
                clients = [c.client(timeout_s=CLIENT_TIMEOUT_S) for c in (first, second)]
                try:
                    while not stop.is_set():
                        ops = load.ops("http", 1)
                        load.http_one(rng.choice(clients), ops[0])
                        for op in load.to_signal_now(ops):
                            load.http_signal(rng.choice(clients), [op])
                finally:
                    for client in clients:
                        client.close()

            return Background(run)

        streams = [work(seed) for seed in range(2)]
        for _ in range(int(BOTH_S / 0.5)):
            ops = load.ops("kafka", 4)
            load.kafka_register(ops)
            load.kafka_signal(load.to_signal_now(ops))
            _pause(0.5)
        for stream in streams:
            stream.stop.set()
        for stream in streams:
            stream.join(timeout_s=CLIENT_TIMEOUT_S * 3)
        second.kill()  # the second writer goes away: the first must finish everything

        rest = load.unsignalled()
        load.kafka_signal(rest)
        assert not load.unsignalled()
        reader = CallbackReader(kafka_broker, settings.topic_callbacks)
        try:
            missing = reader.wait_for(set(load.acked), timeout_s=60)
        finally:
            reader.close()
        assert not missing, (
            f"{len(missing)} acknowledged operations have no callback: {sorted(missing)[:10]}"
            f"\n{first.log_tail()}"
        )
        counted = _fences_counted(first.url)
        assert first.terminate() == 0, first.log_tail()
    finally:
        for stream in streams:
            stream.stop.set()
        first.close()
        second.close()
        producer.close(timeout=5)

    copies = read_copies(kafka_broker, settings.topic_callbacks)
    by_op, ids, conflicting = copies.by_op, copies.ids, copies.conflicting
    fences = {
        "first": _fences_logged(tmp_path / "first"),
        "second": _fences_logged(tmp_path / "second"),
    }
    print(
        f"\ntwo-writers: {sum(load.attempts.values())} registrations tried, {len(load.acked)}"
        f" acknowledged, {load.http_failures} HTTP not acknowledged; {copies.records}"
        f" callback records for {len(by_op)} operations, {len(conflicting)} conflicting;"
        f" fences logged: first {len(fences['first'])}, second {len(fences['second'])}"
    )
    assert not conflicting, list(conflicting.items())[:3]
    assert all(len(idents) == 1 for idents in ids.values())
    assert not set(load.acked) - set(by_op)
    assert fences["first"] or fences["second"], "the two writers never met on the changelog"
    for doc in fences["first"] + fences["second"]:
        assert "another writer" in str(doc["detail"])
    assert counted == len(fences["first"])
