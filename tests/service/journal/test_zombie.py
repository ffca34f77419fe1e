"""A zombie owner on Apache Kafka, in transactional delivery: fenced before it can write.

Two ``purgatory serve`` processes share one consumer group (no static partitions). Replica A
holds a partition with barriers and timers pending in it when it is frozen (SIGSTOP); the
group evicts it after its session timeout and gives the partition to replica B, whose
``init_transactions`` on the partition's transactional id fences A. While A is frozen some of
its timers pass their deadlines. On SIGCONT, A's reaper expires them at once and its next
transaction is refused (``ProducerFencedError``; ``InvalidProducerEpochError`` when A froze with
a transaction open, which B's ``init_transactions`` aborted; or the group's refusal of its
offsets: the group moved on without it): A logs ``partition_fenced``, releases nothing, drops
the partition and rejoins the group. Until its consumer hears that the group moved on, A still
holds the partition, so after its fence back-off it may take it again (its
``init_transactions`` fences B in turn, and the two take turns, as two writers on one
partition do: ``docs/replicas.md``); such a second round of A's ends in a fence too.

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
from tests.freeze import freeze
from tests.service.end_to_end.test_e2e import PARTITIONS, _settings
from tests.service.end_to_end.test_sigkill import (
    Callback,
    CallbackReader,
    Child,
    _pause,
    _wall_ms,
)

BARRIERS = 24
TIMERS = 24
SESSION_EVICTION_S = 16.0  # the consumer's 10 s session timeout, the rebalance, the restore
#: What a fence by the broker says: the producer's epoch is not the transactional id's.
_BY_THE_BROKER = ("ProducerFencedError", "InvalidProducerEpochError")
#: A's events that tell its partitions' lives after the wake, shown whole when a check fails.
_LIFE_EVENTS = (
    "partition_fenced",
    "partition_restore_deferred",
    "partition_restoring",
    "partition_serving",
    "partition_taken_while_restoring",
    "partition_restore_failed",
    "partition_dropped",
    "partitions_handed_over",
    "transaction_retry",
)


def _member(child: Child) -> Child:
    """``child`` as a group member: the group assigns its partitions."""
    del child._env["PURGATORY_KAFKA_STATIC_PARTITIONS"]
    return child


def _events(logs: Path, names: tuple[str, ...]) -> list[dict[str, object]]:
    """The JSON log events of the child that logs to ``logs`` named in ``names``, in order."""
    events: list[dict[str, object]] = []
    for path in sorted(logs.glob("*.log")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") in names:
                events.append(event)
    return events


def _story(
    a: Child,
    b: Child,
    logs: Path,
    records: list[Callback],
    expected: dict[tuple[str, str], str],
) -> str:
    """What a failed check shows: the callbacks read against those expected, A's partitions'
    lives (every event, not just the tail) and both children's log tails."""
    copies = Counter(cb.ident for cb in records)
    repeated = {ident: n for ident, n in copies.items() if n > 1}
    wrong = {
        cb.ident: (cb.doc.get("outcome"), expected.get(cb.ident))
        for cb in records
        if expected.get(cb.ident) != cb.doc.get("outcome")
    }
    missing = sorted(set(expected) - set(copies))
    callbacks = "\n".join(
        f"  p{cb.partition}@{cb.offset} {cb.ident} {cb.doc.get('outcome')}"
        f" seq={cb.doc.get('sequence')}"
        for cb in sorted(records, key=lambda cb: (cb.partition, cb.offset))
    )
    lives = "\n".join(f"  {json.dumps(e)}" for e in _events(logs / "a", _LIFE_EVENTS))
    return (
        f"\n{len(records)} committed callbacks for {len(expected)} operations;"
        f" repeated: {repeated}; wrong outcomes: {wrong}; missing: {missing}\n"
        f"callbacks read:\n{callbacks}\n"
        f"A's partitions' lives:\n{lives}\n"
        f"{a.log_tail(8000)}\n{b.log_tail(8000)}"
    )


def _check_fence(before: list[dict[str, object]], fence: dict[str, object], story: str) -> None:
    """A's ``fence`` is the broker's, after ``before`` (A's fences and restores so far).

    By its producer's epoch (``ProducerFencedError``; ``InvalidProducerEpochError`` for a
    transaction A left open when it froze, whose records the partition's leader refuses once
    B's ``init_transactions`` aborted it: transactions.py counts both as fenced). A partition
    already fenced has no producer left: a later commit of it is refused as fenced too ("no
    open transactional producer"), which must follow a fence of its own. Any other fence of a
    partition fenced before comes from a second round of A's: A took the partition again (a
    restore of it since that fence), since its consumer had not yet heard that the group moved
    on; never a second commit of the engine fenced first.
    """
    partition, reason = fence["partition"], str(fence.get("reason", ""))
    mine = [event for event in before if event["partition"] == partition]
    if "has no open transactional producer" in reason:
        assert any(event["event"] == "partition_fenced" for event in mine), story
        return
    assert any(name in reason for name in _BY_THE_BROKER), story
    since = max(
        (i for i, event in enumerate(mine) if event["event"] == "partition_fenced"), default=None
    )
    if since is not None:  # fenced before: taken again since, or it could not commit
        assert any(event["event"] == "partition_restoring" for event in mine[since:]), story


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
        freeze(a.proc.pid)
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
        assert not missing, f"no callback for {sorted(missing)[:5]}" + _story(
            a, b, tmp_path, reader.records, expected
        )
        assert a.terminate() == 0, _story(a, b, tmp_path, reader.records, expected)
        assert b.terminate() == 0, _story(a, b, tmp_path, reader.records, expected)
    finally:
        a.close()
        b.close()
        producer.close(timeout=5)

    final = CallbackReader(apache_kafka, shared.topic_callbacks, read_committed=True)
    try:
        final.read_to_end(timeout_s=20)
    finally:
        final.close()
    story = _story(a, b, tmp_path, final.records, expected)
    copies = Counter(cb.ident for cb in final.records)
    assert all(n == 1 for n in copies.values()), story
    outcomes = {cb.ident: cb.doc["outcome"] for cb in final.records}
    assert outcomes == expected, story
    events = _events(tmp_path / "a", ("partition_fenced", "partition_restoring"))
    fenced = [event for event in events if event["event"] == "partition_fenced"]
    assert fenced, f"A was never fenced{story}"
    reasons = [str(event.get("reason", "")) for event in fenced]
    for i, event in enumerate(events):
        if event["event"] == "partition_fenced":
            _check_fence(events[:i], event, f"{reasons}{story}")
    print(
        f"\nzombie: {len(final.records)} committed callbacks for {len(expected)} operations;"
        f" A fenced {len(fenced)} time(s): {reasons}"
    )
