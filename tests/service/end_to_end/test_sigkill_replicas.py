"""SIGKILL one of two replicas under load, three times, through the real broker and real HTTP.

Two ``purgatory serve`` child processes run in ordinal mode on topics of their own (two
partitions each): replica 0 owns partition 0, replica 1 partition 1, and each knows the other's
URL. HTTP registrations (single and batched) and signals go to a replica picked at random, so
about half of them are forwarded to the owner; Kafka registrations and signals are written as
well. Replica 1 is SIGKILLed three times in the middle of that load (once after a fresh snapshot
of its partition, so its restore loads it and replays the journal after it); twice on Tansu,
the second broker, where the third kill, the first one again on a longer journal, would only
repeat what Kafka's half has shown, for 6 s more. While it is down the load goes to replica 0
alone: requests for partition 1 are answered 503 with Retry-After and retried by the client
until its timeout, and succeed if replica 1 is back by then (both are counted); those for
partition 0 must all succeed. Replica 1 is restarted while that load goes on.
After the last restart the remaining barriers are signalled, every acknowledged operation's
callback is awaited, and a SIGTERM must make both replicas exit 0.

What must hold, read from the callbacks topic from its start to its end:

* nothing acknowledged is lost: each registration answered 2xx over HTTP (by either replica),
  or acknowledged by the broker on the requests topic, has a callback;
* no conflicting outcomes: every copy of one operation's callback is byte-identical, callback
  ids map one-to-one to operations, and each partition's sequence numbers name one outcome each;
* each outcome is the one asked for, decided by the partition's owner; nothing on partition 0
  (never killed) is ``late``;
* replica 0 is the same process throughout, stays ready while replica 1 is down, and restored
  its partition once, at its start (its log, and its ``/readyz`` unchanged at the end); replica 0
  answers every request for its own partition 2xx, and every other one 2xx or 503;
* each start of replica 1 restored partition 1 and was ready (``/readyz`` 200) within 30 s.

Every wait is bounded and both children are always killed in a ``finally``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka import KafkaProducer

from purgatory._core import TransportError
from purgatory.client import ApiError, PurgatoryClient
from purgatory.devtools.broker import Broker, free_port
from purgatory.devtools.kafka_broker import KafkaBroker
from purgatory.service.ownership.owners import range_owner
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings
from tests.bounds import bound
from tests.service.end_to_end.test_e2e import PARTITIONS, _settings
from tests.service.end_to_end.test_sigkill import (
    READY_BOUND_S,
    Background,
    Callback,
    CallbackReader,
    Child,
    Load,
    _pause,
    _scopes,
    _wait_for_snapshots,
)

pytestmark = pytest.mark.kafka

REPLICAS = 2
KILLS = 3  # on Kafka; on Tansu the first two (see the module docstring)
KILLED = 1  # the ordinal that is killed; replica 0 runs throughout
UP_S = 0.8  # load through both replicas before each kill
DOWN_S = 1.5  # replica 1 down, load through replica 0 alone, before its restart
AFTER_S = 0.4  # load through replica 0 alone after replica 1 is ready again
CLIENT_TIMEOUT_S = 3.0  # a 503 (Retry-After: 1) is retried twice before it is raised
THREADS = 2  # HTTP load threads per phase


# -- the replicas --------------------------------------------------------------------------


def _owned(ordinal: int) -> tuple[int, ...]:
    return tuple(
        p
        for p in range(PARTITIONS)
        if range_owner(p, partitions=PARTITIONS, replicas=REPLICAS) == ordinal
    )


class Replica(Child):
    """One ordinal-mode replica as a child process (logs in a directory of its own)."""

    def __init__(self, settings: Settings, logs: Path, *, ordinal: int, ports: list[int]) -> None:
        logs.mkdir()
        super().__init__(dataclasses.replace(settings, http_port=ports[ordinal]), logs)
        self.ordinal = ordinal
        self.owned = _owned(ordinal)
        self._env.update(
            {
                "PURGATORY_KAFKA_STATIC_PARTITIONS": ",".join(map(str, self.owned)),
                "PURGATORY_PEER_URLS": ",".join(f"http://127.0.0.1:{port}" for port in ports),
                "PURGATORY_REPLICA_ORDINAL": str(ordinal),
            }
        )

    def readiness(self) -> dict[str, Any]:
        """The ``/readyz`` document (its status must be 200)."""
        response = httpx.get(f"{self.url}/readyz", timeout=5)
        assert response.status_code == 200, response.text
        doc: dict[str, Any] = response.json()
        return doc

    def events(self, name: str) -> list[tuple[int, dict[str, Any]]]:
        """Every ``name`` log event of every incarnation so far, with its incarnation."""
        found = []
        for incarnation in range(self.incarnation + 1):
            path = self._logs / f"service-{incarnation}.log"
            for line in path.read_text(errors="replace").splitlines():
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict) and doc.get("event") == name:
                    found.append((incarnation, doc))
        return found


# -- the HTTP load -------------------------------------------------------------------------


class Tally:
    """Counts each HTTP registration's answer by (phase, replica asked, scope's partition,
    result): ``ok`` (2xx), an error status such as ``503``, or ``raised``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[tuple[str, int, int, str]] = Counter()

    def add(self, phase: str, ordinal: int, partition: int, result: str) -> None:
        with self._lock:
            self.counts[(phase, ordinal, partition, result)] += 1

    def total(self, **match: object) -> int:
        names = ("phase", "ordinal", "partition", "result")
        with self._lock:
            return sum(
                n
                for key, n in self.counts.items()
                if all(dict(zip(names, key, strict=True))[k] == v for k, v in match.items())
            )


class CountingClient(PurgatoryClient):
    """A client of one replica that tallies every registration's answer."""

    def __init__(self, replica: Replica, tally: Tally, phase: str) -> None:
        super().__init__(replica.url, timeout_s=CLIENT_TIMEOUT_S)
        self._ordinal = replica.ordinal
        self._tally = tally
        self._phase = phase

    def _add(self, scope: str, result: str) -> None:
        self._tally.add(self._phase, self._ordinal, partition_for(scope, PARTITIONS), result)

    def register(self, **spec: Any) -> Any:
        try:
            answer = super().register(**spec)
        except ApiError as exc:
            self._add(spec["scope"], str(exc.status))
            raise
        except TransportError:
            self._add(spec["scope"], "raised")
            raise
        self._add(spec["scope"], "ok")
        return answer

    def register_many(self, bodies: Iterable[Mapping[str, Any]]) -> Any:
        listed = list(bodies)
        try:
            answer = super().register_many(listed)
        except (ApiError, TransportError):
            for body in listed:
                self._add(body["scope"], "raised")
            raise
        for body, result in zip(listed, answer["results"], strict=True):
            status = result["http_status"]
            self._add(body["scope"], "ok" if status in (200, 201) else str(status))
        return answer


def _stream(
    load: Load, targets: list[Replica], tally: Tally, phase: str, seed: int
) -> Callable[[threading.Event], None]:
    """HTTP load until stopped: each registration (one in five a batch of six) to a replica of
    ``targets`` picked at random, and half of the barriers signalled at once, each through a
    replica picked at random. A failure is recorded and the load goes on."""

    def work(stop: threading.Event) -> None:
        rng = random.Random(seed)
        clients = [CountingClient(replica, tally, phase) for replica in targets]
        try:
            while not stop.is_set():
                if rng.random() < 0.2:
                    ops = load.ops("http", 6)
                    load.http_batch(rng.choice(clients), ops)
                else:
                    ops = load.ops("http", 1)
                    load.http_one(rng.choice(clients), ops[0])
                for op in load.to_signal_now(ops):
                    load.http_signal(rng.choice(clients), [op])
        finally:
            for client in clients:
                client.close()

    return work


def _kafka_burst(load: Load, count: int) -> None:
    ops = load.ops("kafka", count)
    load.kafka_register(ops)
    load.kafka_signal(load.to_signal_now(ops))


# -- the test ------------------------------------------------------------------------------


def test_sigkill_one_replica_under_load_loses_nothing_and_leaves_the_other_alone(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    began = time.perf_counter()
    kills = KILLS if isinstance(kafka_broker, KafkaBroker) else 2
    shared = _settings(kafka_broker)
    ports = [shared.http_port, free_port()]
    while ports[1] == ports[0]:
        ports[1] = free_port()
    replicas = [
        Replica(shared, tmp_path / f"replica-{o}", ordinal=o, ports=ports) for o in range(REPLICAS)
    ]
    steady, killed = replicas[1 - KILLED], replicas[KILLED]
    assert steady.owned == (0,) and killed.owned == (1,)
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap_servers, acks="all")
    load = Load(shared, producer, _scopes())
    tally = Tally()
    streams: list[Background] = []
    starts: list[float] = []  # seconds from spawn to /readyz 200, both first starts
    restarts: list[float] = []  # the same for each restart of replica 1
    seeds = iter(range(1_000))
    reader: CallbackReader | None = None

    def spawn(targets: list[Replica], phase: str) -> list[Background]:
        started = [
            Background(_stream(load, targets, tally, phase, next(seeds))) for _ in range(THREADS)
        ]
        streams.extend(started)
        return started

    try:
        for replica in replicas:
            replica.start()
        starts = [replica.wait_ready(timeout_s=bound(READY_BOUND_S)) for replica in replicas]
        assert steady.proc is not None
        steady_pid = steady.proc.pid
        steady_ready = steady.readiness()

        for kill in range(kills):
            both = spawn(replicas, "up")
            _kafka_burst(load, 12)
            if kill == 1:
                # Each partition's snapshot since replica 1's spawn: its restore loads one, then
                # replays the journal written during UP_S more of load. (On Kafka the snapshot
                # can reach the journal's end: a kill right then would replay nothing after it.)
                _wait_for_snapshots(kafka_broker, shared.topic_snapshots, killed.spawned_ms, 20)
            _pause(UP_S)
            killed.kill()
            print(
                f"\nsigkill-replicas: kill {kill + 1} after {load.attempts} registrations tried,"
                f" {len(load.acked)} acknowledged"
            )
            for stream in both:
                stream.stop.set()  # in-flight calls end on their own: joined below
            alone = spawn([steady], "down")
            _kafka_burst(load, 8)  # partition 1's part waits in the topic for the restart
            assert steady.readiness()["ready"] is True  # a peer down leaves replica 0 ready
            _pause(DOWN_S)
            killed.start()
            restarts.append(killed.wait_ready(timeout_s=bound(READY_BOUND_S)))
            _pause(AFTER_S)
            for stream in both + alone:
                stream.join(timeout_s=15)

        # The remaining barriers: those registered over HTTP signalled in one batch through
        # replica 1 (partition 0's part forwarded), the others over Kafka.
        rest = load.unsignalled()
        with killed.client() as client:
            assert load.http_signal(client, [op for op in rest if op.via == "http"])
        load.kafka_signal([op for op in rest if op.via == "kafka"])
        assert not load.unsignalled()

        reader = CallbackReader(kafka_broker, shared.topic_callbacks)
        missing = reader.wait_for(set(load.acked), timeout_s=30)
        assert not missing, (
            f"no callback for {sorted(missing)[:10]}\n{steady.log_tail()}\n{killed.log_tail()}"
        )
        # Replica 0 was never killed: the same process, its partition restored once, at start.
        assert steady.proc.pid == steady_pid and steady.incarnation == 0
        steady_end = steady.readiness()
        assert steady_end["partitions"] == steady_ready["partitions"], (steady_ready, steady_end)
        assert steady_end["partitions"].keys() == {"0"}
        assert steady_end["partitions"]["0"]["state"] == "serving"
        steady_503 = steady.answered_503()
        codes = [replica.terminate() for replica in replicas]
        assert codes == [0, 0], f"SIGTERM exited {codes}\n{steady.log_tail()}\n{killed.log_tail()}"
    finally:
        for stream in streams:
            stream.stop.set()
        for replica in replicas:
            replica.close()
        producer.close(timeout=5)
        if reader is not None:
            reader.close()

    final = CallbackReader(kafka_broker, shared.topic_callbacks)
    try:
        final.read_to_end(timeout_s=20)
    finally:
        final.close()

    restored = {r.ordinal: r.events("partition_restoring") for r in replicas}
    serving = {r.ordinal: r.events("partition_serving") for r in replicas}
    print(
        f"\nsigkill-replicas: seconds from spawn to /readyz 200: first starts"
        f" {[round(s, 2) for s in starts]}, restarts of replica {KILLED}"
        f" {[round(s, 2) for s in restarts]}"
    )
    print(
        "sigkill-replicas: replica 1 restores (journal records, snapshot pending, seconds):"
        f" {[(d['journal_records'], d['snapshot_pending'], d['restore_s']) for _, d in serving[1]]}"
    )
    print(f"sigkill-replicas: HTTP 503 answers by replica 0 (retries included): {steady_503}")
    _check(load, tally, final.records, time.perf_counter() - began)

    # Replica 0 restored its partition once (at its start); replica 1 once per incarnation.
    assert [(n, d["partition"]) for n, d in restored[0]] == [(0, 0)], restored[0]
    assert [(n, d["partition"]) for n, d in serving[0]] == [(0, 0)], serving[0]
    assert [(n, d["partition"]) for n, d in restored[1]] == [(n, 1) for n in range(kills + 1)]
    assert [(n, d["partition"]) for n, d in serving[1]] == [(n, 1) for n in range(kills + 1)]
    # Each restart restores what the killed incarnation held: a journal tail, or a snapshot
    # that covers all of it (one taken just before the kill leaves an empty tail).
    assert all(d["journal_records"] > 0 or d["snapshot_pending"] > 0 for _, d in serving[1][1:]), (
        serving[1]
    )
    assert any(d["snapshot_pending"] > 0 for _, d in serving[1][1:]), "no restore from a snapshot"
    assert len(restarts) == kills
    assert all(seconds < READY_BOUND_S for seconds in starts + restarts), (starts, restarts)


def _check(load: Load, tally: Tally, records: list[Callback], elapsed_s: float) -> None:
    by_op: dict[tuple[str, str], list[Callback]] = {}
    ids: dict[str, set[tuple[str, str]]] = {}
    for cb in records:
        by_op.setdefault(cb.ident, []).append(cb)
        ids.setdefault(cb.doc["id"], set()).add(cb.ident)
    late = Counter(copies[0].doc["partition"] for copies in by_op.values() if copies[0].doc["late"])
    forwarded = sum(
        n
        for (_, ordinal, partition, result), n in tally.counts.items()
        if result == "ok"
        and range_owner(partition, partitions=PARTITIONS, replicas=REPLICAS) != ordinal
    )
    http_ok = tally.total(result="ok")
    down = {
        result: tally.total(phase="down", partition=1, result=result)
        for result in sorted({key[3] for key in tally.counts})
    }
    print(
        f"sigkill-replicas: {sum(load.attempts.values())} registrations tried"
        f" ({load.attempts}), {len(load.acked)} acknowledged"
        f" ({sum(op.via == 'http' for op in load.acked.values())} over HTTP, {forwarded} of"
        f" {http_ok} HTTP ones answered through the non-owner), {load.http_failures} HTTP not"
        f" acknowledged; partition 1 through replica 0 from each kill to 0.4 s after the restart:"
        f" {down}; {len(records)} callback records for {len(by_op)} operations,"
        f" {len(records) - len(by_op)} exact duplicates,"
        f" {len(set(by_op) - set(load.acked))} delivered though not acknowledged,"
        f" late by partition {dict(late)}; {elapsed_s:.1f} s in all"
    )
    counts = {"/".join(map(str, key)): n for key, n in sorted(tally.counts.items())}
    print(f"sigkill-replicas: HTTP registrations by phase/replica/partition/result: {counts}")

    # Nothing acknowledged is lost.
    lost = sorted(set(load.acked) - set(by_op))
    assert not lost, f"{len(lost)} acknowledged operations have no callback: {lost[:10]}"
    # No conflicting outcomes: duplicates are exact re-sends; ids are one-to-one.
    for ident, copies in by_op.items():
        assert len({cb.raw for cb in copies}) == 1, (ident, [cb.raw for cb in copies])
    assert all(len(idents) == 1 for idents in ids.values()), ids
    assert len(ids) == len(by_op)
    numbers = {(c[0].doc["partition"], c[0].doc["sequence"]) for c in by_op.values()}
    assert len(numbers) == len(by_op), "one partition's sequence number names two outcomes"
    # Each outcome is the one asked for, decided by the scope's partition (its owner).
    for copies in by_op.values():
        doc = copies[0].doc
        assert doc["partition"] == partition_for(doc["scope"], PARTITIONS), doc
        assert all(cb.partition == doc["partition"] for cb in copies), doc
    for ident, op in load.acked.items():
        doc = by_op[ident][0].doc
        assert doc["outcome"] == ("completed" if op.completes else "expired"), (op, doc)
        if doc["outcome"] == "expired":
            assert doc["outcome_ms"] == doc["deadline_ms"], doc
            assert all(cb.timestamp_ms >= doc["deadline_ms"] - 1 for cb in by_op[ident]), doc
        else:
            assert doc["outcome_ms"] < doc["deadline_ms"] and not doc["late"], doc
    # Partition 0's owner never stopped: nothing there is late.
    assert late[0] == 0, late
    # The load did what it was meant to: forwarded writes acknowledged, replica 0 serving its
    # own partition all along, partition 1 refused (503) while its owner was down.
    assert forwarded > 0
    assert tally.total(phase="down", partition=0, result="ok") > 0
    failed_own = {
        key: n for key, n in tally.counts.items() if key[1:3] == (0, 0) and key[3] != "ok"
    }
    assert not failed_own, f"replica 0 failed requests for its own partition: {failed_own}"
    unanswered = {
        key: n for key, n in tally.counts.items() if key[1] == 0 and key[3] not in ("ok", "503")
    }
    assert not unanswered, f"replica 0 answered neither 2xx nor 503: {unanswered}"
    assert down.get("503", 0) > 0, down
