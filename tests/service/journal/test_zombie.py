"""A zombie owner on Apache Kafka, in transactional delivery: fenced before it can write.

Two ``purgatory serve`` processes share one consumer group (no static partitions). Replica A
holds a partition with barriers and timers pending in it when it is frozen (SIGSTOP); the
group evicts it after its session timeout and gives the partition to replica B, whose
``init_transactions`` on the partition's transactional id fences A. While A is frozen some of
its timers pass their deadlines. On SIGCONT, A's reaper expires them at once and its next
transaction is refused (``ProducerFencedError``, or the group's refusal of its offsets: the
group moved on without it): A logs ``partition_fenced``, releases nothing, drops the partition
and rejoins the group.

What must hold, read by a ``read_committed`` consumer of the callbacks topic from its start to
its end: exactly one callback per operation (not even an identical repeat), and each the
outcome asked for. Every wait is bounded; both children are killed in a ``finally``.
"""

from __future__ import annotations

import dataclasses
import json
import signal
from collections import Counter
from pathlib import Path

from kafka import KafkaProducer

from purgatory._codec import RegisterRequest, SignalRecord, encode_request, encode_signal
from purgatory.devtools.broker import Broker, free_port
from purgatory.service.ownership.partitioning import partition_for
from tests.service.end_to_end.test_e2e import PARTITIONS, _settings
from tests.service.end_to_end.test_sigkill import CallbackReader, Child, _pause, _wall_ms

BARRIERS = 24
TIMERS = 24
SESSION_EVICTION_S = 16.0  # the consumer's 10 s session timeout, the rebalance, the restore


def _member(child: Child) -> Child:
    """``child`` as a group member: the group assigns its partitions."""
    del child._env["PURGATORY_KAFKA_STATIC_PARTITIONS"]
    return child


def test_a_frozen_owner_is_fenced_when_it_wakes_and_nothing_is_decided_twice(
    apache_kafka: Broker, tmp_path: Path
) -> None:
    shared = dataclasses.replace(_settings(apache_kafka), kafka_static_partitions=None)
    a = _member(
        Child(
            dataclasses.replace(shared, http_port=free_port()), tmp_path / "a", transactional=True
        )
    )
    b = _member(
        Child(
            dataclasses.replace(shared, http_port=free_port()), tmp_path / "b", transactional=True
        )
    )
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    producer = KafkaProducer(bootstrap_servers=apache_kafka.bootstrap_servers, acks="all")
    scopes = [f"z{i}" for i in range(8)]
    assert {partition_for(s, PARTITIONS) for s in scopes} == set(range(PARTITIONS))

    def send(topic: str, scope: str, value: bytes) -> None:
        producer.send(topic, value, key=scope.encode())

    expected: dict[tuple[str, str], str] = {}
    try:
        a.start()
        a.wait_ready()
        now_ms = _wall_ms()
        for i in range(BARRIERS):
            scope = scopes[i % len(scopes)]
            register = RegisterRequest(
                op_id=f"barrier{i}", scope=scope, keys=("a", f"b{i}"), timeout_ms=300_000
            )
            send(shared.topic_requests, scope, encode_request(register))
            expected[(scope, f"barrier{i}")] = "completed"
        for i in range(TIMERS):  # due while A is frozen, spread over the freeze
            scope = scopes[i % len(scopes)]
            deadline_ms = now_ms + 6_000 + i * 400
            timer = RegisterRequest(
                op_id=f"timer{i}", scope=scope, keys=(), deadline_ms=deadline_ms
            )
            send(shared.topic_requests, scope, encode_request(timer))
            expected[(scope, f"timer{i}")] = "expired"
        for scope in scopes:
            send(shared.topic_signals, scope, encode_signal(SignalRecord(scope, "a")))
        producer.flush(timeout=10)
        b.start()
        b.wait_ready()
        _pause(2)  # the group settles: A and B hold a partition each

        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)
        for i in range(0, BARRIERS, 2):  # half the barriers complete while A is frozen
            scope = scopes[i % len(scopes)]
            send(shared.topic_signals, scope, encode_signal(SignalRecord(scope, f"b{i}")))
        producer.flush(timeout=10)
        _pause(SESSION_EVICTION_S)
        a.proc.send_signal(signal.SIGCONT)
        _pause(4)  # A wakes, expires its overdue timers, is fenced, rejoins
        for i in range(1, BARRIERS, 2):
            scope = scopes[i % len(scopes)]
            send(shared.topic_signals, scope, encode_signal(SignalRecord(scope, f"b{i}")))
        producer.flush(timeout=10)

        reader = CallbackReader(apache_kafka, shared.topic_callbacks, read_committed=True)
        try:
            missing = reader.wait_for(set(expected), timeout_s=60)
        finally:
            reader.close()
        assert not missing, f"no callback for {sorted(missing)[:5]}\n{a.log_tail()}\n{b.log_tail()}"
        assert a.terminate() == 0, a.log_tail()
        assert b.terminate() == 0, b.log_tail()
    finally:
        a.close()
        b.close()
        producer.close(timeout=5)

    final = CallbackReader(apache_kafka, shared.topic_callbacks, read_committed=True)
    try:
        final.read_to_end(timeout_s=20)
    finally:
        final.close()
    copies = Counter(cb.ident for cb in final.records)
    assert all(n == 1 for n in copies.values()), copies.most_common(5)
    outcomes = {cb.ident: cb.doc["outcome"] for cb in final.records}
    assert outcomes == expected
    a_log = "".join(p.read_text(errors="replace") for p in (tmp_path / "a").glob("*.log"))
    fenced = [json.loads(line) for line in a_log.splitlines() if '"partition_fenced"' in line]
    assert fenced, f"A was never fenced\n{a.log_tail()}"
    # By its producer's epoch (ProducerFencedError), or by its offsets' group generation
    # (KIP-447: the group moved on without it), whichever the broker checked first.
    # A partition already fenced has no producer left: a later commit of it is refused as
    # fenced too ("no open transactional producer"), which must follow a fence of its own.
    reasons = [event.get("reason", "") for event in fenced]
    for i, event in enumerate(fenced):
        reason = event.get("reason", "")
        if "has no open transactional producer" in reason:
            earlier = [
                e.get("reason", "") for e in fenced[:i] if e["partition"] == event["partition"]
            ]
            assert any("Fenced" in r or "moved on" in r for r in earlier), reasons
        else:
            assert "Fenced" in reason or "moved on without this member" in reason, reasons
    print(
        f"\nzombie: {len(final.records)} committed callbacks for {len(expected)} operations;"
        f" A fenced {len(fenced)} time(s): {fenced[0].get('reason')}"
    )
