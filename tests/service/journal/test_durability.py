"""Durability by write-ahead journal, against the in-memory broker, in virtual time.

A crash (the cancellation of everything the service held in memory) at any step, then a restart
on the same broker: every journaled or consumed operation ends with exactly one outcome (repeats
are exact), no input is applied twice, every offset is committed; HTTP writes answered 2xx
survive; what fell overdue while the service was down expires late; a restoring partition
answers 503.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from purgatory._codec import encode_request, encode_signal
from purgatory._codec._records import CancelRequest, RegisterRequest, SignalRecord
from purgatory.service.app import Service, topics_of
from purgatory.service.journal.format import decode_journal_record
from purgatory.service.kafka.transport import ConsumedRecord, OutRecord, SendFailure
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeReader, FakeSource, FakeTransport

EPOCH_MS = 1_763_780_400_000
PARTITIONS = 2
SETTINGS = Settings.from_env({}, topic_partitions=PARTITIONS, shutdown_grace_ms=5_000)
REQUESTS, SIGNALS = SETTINGS.topic_requests, SETTINGS.topic_signals
CALLBACKS, CHANGELOG = SETTINGS.topic_callbacks, SETTINGS.topic_changelog
INPUTS = (REQUESTS, SIGNALS)

Json = dict[str, Any]


def _broker(**faults: Any) -> FakeBroker:
    return FakeBroker({t: PARTITIONS for t in topics_of(SETTINGS)}, **faults)


async def _serve(
    broker: FakeBroker, stop: trio.Event, services: list[Service], settings: Settings
) -> None:
    # Small polls: more batches, so more journal records and more crash points between them.
    fake = FakeTransport(broker, max_batch=3)
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=list(INPUTS), group_id="g", assignment=None) as source,
    ):
        service = Service(settings, Clock(offset_ms=EPOCH_MS), source, sink, reader)
        services.append(service)
        await service.run(stop, serve_http=False)


async def _run_for(
    broker: FakeBroker, seconds: float, services: list[Service], settings: Settings = SETTINGS
) -> None:
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, stop, services, settings)
        await trio.sleep(seconds)
        stop.set()


def _register(broker: FakeBroker, scope: str, op_id: str, keys: list[str], **kw: Any) -> None:
    request = RegisterRequest(op_id=op_id, scope=scope, keys=tuple(keys), **kw)
    broker.append(REQUESTS, scope.encode(), encode_request(request))


def _signal(broker: FakeBroker, scope: str, key: str, payload: str | None = None) -> None:
    broker.append(SIGNALS, scope.encode(), encode_signal(SignalRecord(scope, key, None, payload)))


# Scopes over both partitions: s0 and s4 are partition 0's, s1 and s2 partition 1's.
SCOPES = ("s0", "s1", "s2", "s4")


async def _feed(broker: FakeBroker, expected: dict[tuple[str, str], str]) -> None:
    """The producers, in three waves (so journal batches, expirations and callbacks interleave):
    barriers (some signals before their waiter, one registered twice), two timers, a cancelled
    operation and a malformed record. Fills ``expected`` with each operation's outcome."""
    for i in range(4):
        scope = SCOPES[i]
        keys = [f"k{i}a", f"k{i}b"]
        if i % 2 == 0:
            _signal(broker, scope, keys[0], payload=f'{{"early":{i}}}')
        _register(broker, scope, f"op{i}", keys, timeout_ms=3_600_000)
        expected[(scope, f"op{i}")] = "completed"
    _register(broker, "s1", "t1", [], timeout_ms=40)
    _register(broker, "s4", "t4", [], timeout_ms=90)
    expected[("s1", "t1")] = expected[("s4", "t4")] = "expired"
    _register(broker, "s2", "c2", ["never"], timeout_ms=3_600_000)
    expected[("s2", "c2")] = "cancelled"
    await trio.sleep(0.02)
    for i in range(4):
        _signal(broker, SCOPES[i], f"k{i}a", payload=f'{{"late":{i}}}')
    _register(broker, "s0", "op0", ["k0a", "k0b"], timeout_ms=3_600_000)  # a duplicate
    broker.append(REQUESTS, b"s0", b"not json")
    await trio.sleep(0.04)
    broker.append(REQUESTS, b"s2", encode_request(CancelRequest(op_id="c2", scope="s2")))
    for i in range(4):
        _signal(broker, SCOPES[i], f"k{i}b")


async def _crash_and_restart(
    broker: FakeBroker, expected: dict[tuple[str, str], str], services: list[Service]
) -> tuple[trio.CancelScope, int, int]:
    """Feed the workload while a service runs for 1 s, crashing at ``broker.crash_at``; then
    (fed completely) a new service on the same broker runs for 1 s and stops.

    Returns:
        The crash's scope, the steps and the callbacks on the broker before the restart.
    """
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_feed, broker, expected)
        with trio.CancelScope() as crash:
            broker.crash_scope = crash
            await _run_for(broker, 1, [])
    steps, sent = broker.steps, len(broker.records(CALLBACKS))
    broker.crash_at = None
    await _run_for(broker, 1, services)
    return crash, steps, sent


def _callbacks(broker: FakeBroker) -> list[tuple[bytes, Json]]:
    return [(r.value or b"", json.loads(r.value or b"")) for r in broker.records(CALLBACKS)]


def _journal(broker: FakeBroker, partition: int) -> list[Json]:
    docs = []
    for record in broker.topics[CHANGELOG][partition]:
        doc = decode_journal_record(record.value or b"")
        if doc is not None:
            docs.append(doc)
    return docs


def _check_outcomes_once(broker: FakeBroker) -> dict[tuple[str, str], Json]:
    """Exactly one outcome per operation (repeats byte-identical), one id per operation and
    one operation per id, and per partition the sequences 1..N; returns the outcomes."""
    copies: dict[tuple[str, str], set[bytes]] = defaultdict(set)
    outcomes: dict[tuple[str, str], Json] = {}
    for raw, doc in _callbacks(broker):
        ident = (doc["scope"], doc["op_id"])
        copies[ident].add(raw)
        outcomes[ident] = doc
    for ident, values in copies.items():
        assert len(values) == 1, (ident, values)
    ids = Counter(doc["id"] for doc in outcomes.values())
    assert all(n == 1 for n in ids.values()), ids
    for (scope, _op_id), doc in outcomes.items():
        assert doc["partition"] == partition_for(scope, PARTITIONS)
        assert doc["id"].startswith(f"{doc['partition']}-{doc['sequence']}-")
    for p in range(PARTITIONS):
        sequences = sorted(d["sequence"] for d in outcomes.values() if d["partition"] == p)
        assert sequences == list(range(1, len(sequences) + 1)), (p, sequences)
    return outcomes


def _check_journal_applies_each_input_once(broker: FakeBroker) -> None:
    """The journal's positions never go backwards, and it holds each consumed input once."""
    registered: Counter[tuple[str, str]] = Counter()
    signalled: Counter[tuple[str, str]] = Counter()
    for p in range(PARTITIONS):
        reached: dict[str, int] = {}
        for doc in _journal(broker, p):
            assert doc["partition"] == p
            for topic, offset in doc["positions"].items():
                assert offset >= reached.get(topic, 0), (p, topic, offset, reached)
                reached[topic] = offset
            for entry in doc["entries"]:
                if entry[0] == "register":
                    registered[(entry[2][1], entry[2][0])] += 1
                elif entry[0] == "signal":
                    signalled[(entry[2], entry[3])] += 1
        for topic in INPUTS:
            assert reached.get(topic, 0) <= len(broker.topics[topic][p])
    consumed_registrations: Counter[tuple[str, str]] = Counter()
    consumed_signals: Counter[tuple[str, str]] = Counter()
    for record in broker.records(REQUESTS):
        try:
            doc = json.loads(record.value or b"")
        except ValueError:
            continue
        if doc["type"] == "register":
            consumed_registrations[(doc["scope"], doc["op_id"])] += 1
    for record in broker.records(SIGNALS):
        doc = json.loads(record.value or b"")
        consumed_signals[(doc["scope"], doc["key"])] += 1
    assert registered == consumed_registrations
    assert signalled == consumed_signals


def _journaled_registrations(broker: FakeBroker) -> set[tuple[str, str]]:
    return {
        (entry[2][1], entry[2][0])
        for p in range(PARTITIONS)
        for doc in _journal(broker, p)
        for entry in doc["entries"]
        if entry[0] == "register"
    }


def _check_committed(broker: FakeBroker) -> None:
    for topic in INPUTS:
        for p, log in enumerate(broker.topics[topic]):
            assert broker.committed.get((topic, p), 0) == len(log), (topic, p, broker.committed)


def _total_steps() -> int:
    steps: list[int] = []

    async def main() -> None:
        _crash, total, _sent = await _crash_and_restart(_broker(), {}, [])
        steps.append(total)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return steps[0]


TOTAL_STEPS = _total_steps()


async def test_without_a_crash_each_outcome_is_sent_once_in_sequence_and_all_is_committed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    expected: dict[tuple[str, str], str] = {}
    services: list[Service] = []
    crash, steps, sent = await _crash_and_restart(broker, expected, services)
    assert not crash.cancelled_caught
    assert steps == TOTAL_STEPS
    assert sent == len(expected)  # the first run sends each callback once
    # A clean stop writes the delivered marks last: the restart re-sends nothing.
    assert len(broker.records(CALLBACKS)) == sent
    outcomes = _check_outcomes_once(broker)
    assert {ident: doc["outcome"] for ident, doc in outcomes.items()} == expected
    _check_journal_applies_each_input_once(broker)
    _check_committed(broker)
    assert {"send", "ack", "read", "poll", "commit"} <= set(broker.log[:steps])


@pytest.mark.parametrize("crash_at", range(1, TOTAL_STEPS + 1))
async def test_a_crash_at_any_step_then_a_restart_ends_with_each_outcome_once_and_all_committed(
    autojump_clock: trio.testing.MockClock, crash_at: int
) -> None:
    broker = _broker(crash_at=crash_at)
    expected: dict[tuple[str, str], str] = {}
    services: list[Service] = []
    crash, _steps, _sent = await _crash_and_restart(broker, expected, services)
    assert crash.cancelled_caught
    outcomes = _check_outcomes_once(broker)
    assert {ident: doc["outcome"] for ident, doc in outcomes.items()} == expected
    assert _journaled_registrations(broker) <= set(outcomes)
    [service] = services
    stats = service.table.engine_statistics()
    assert stats.pending == 0
    assert stats.completed + stats.expired + stats.cancelled == len(expected)
    assert sum(engine.statistics().sequence for engine in service.table.engines()) == len(expected)
    _check_journal_applies_each_input_once(broker)
    _check_committed(broker)


# A record of at most 1024 bytes: a consumed batch's journal entries are cut into two records.
SMALL_RECORDS = Settings.from_env(
    {},
    topic_partitions=PARTITIONS,
    shutdown_grace_ms=5_000,
    max_record_bytes=1_024,
    max_payload_bytes=600,
    max_signal_bytes_per_operation=600,
)


async def test_a_crash_between_two_records_of_one_consumed_batch_applies_no_input_twice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    payload = json.dumps("x" * 300)  # two such registrations do not fit in one record
    _register(broker, "s0", "X", [], timeout_ms=3_600_000, payload=payload)
    broker.append(REQUESTS, b"s0", encode_request(CancelRequest(op_id="X", scope="s0")))
    _register(broker, "s0", "Y", [], timeout_ms=3_600_000, payload=payload)

    def crash_once_the_first_registration_is_journaled(record: OutRecord) -> SendFailure | None:
        if record.topic == CHANGELOG and b'"register"' in record.value and broker.crash_at is None:
            broker.crash_at = broker.steps + 1  # this record's "ack" step: it is kept
        return None

    broker.refuse = crash_once_the_first_registration_is_journaled
    with trio.CancelScope() as crash:
        broker.crash_scope = crash
        await _run_for(broker, 1, [], SMALL_RECORDS)
    assert crash.cancelled_caught
    assert not broker.records(CALLBACKS)
    broker.refuse = lambda _record: None
    broker.crash_at = None
    await _run_for(broker, 1, [], SMALL_RECORDS)
    ids = [doc["id"] for _raw, doc in _callbacks(broker) if doc["op_id"] == "X"]
    assert len(set(ids)) == 1, ids  # seen: 0-1-… (replayed) and 0-2-… (X registered again)
    _check_journal_applies_each_input_once(broker)


async def test_a_journal_record_of_a_large_poll_stays_within_max_record_bytes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # A burst read in one large poll: each signal's entry comes with its "inputs" marker, which
    # takes as many bytes again; the markers count against the record's limit, or the broker
    # refuses the record (MessageSizeTooLarge) and the journal, then the service, stops.
    limit = 4_096
    settings = Settings.from_env(
        {},
        topic_partitions=PARTITIONS,
        max_record_bytes=limit,
        max_payload_bytes=1_024,
        max_signal_bytes_per_operation=1_024,
    )
    broker = _broker()
    for i in range(600):
        _signal(broker, "s0", f"k{i}")
    stop = trio.Event()
    async with trio.open_nursery() as nursery:

        async def serve() -> None:
            fake = FakeTransport(broker, max_batch=1_000)  # the whole burst in one poll
            async with (
                fake.open_sink() as sink,
                fake.open_reader() as reader,
                fake.open_source(topics=list(INPUTS), group_id="g", assignment=None) as source,
            ):
                service = Service(settings, Clock(offset_ms=EPOCH_MS), source, sink, reader)
                await service.run(stop, serve_http=False)

        nursery.start_soon(serve)
        await trio.sleep(2)
        stop.set()
    records = [r for r in broker.records(CHANGELOG) if r.partition == 0]
    sizes = [len(r.value or b"") for r in records]
    signals = sum(
        1 for doc in _journal(broker, 0) for entry in doc["entries"] if entry[0] == "signal"
    )
    assert signals == 600  # every one journaled (none refused, the journal did not fail)
    assert max(sizes) <= limit, sorted(sizes)[-5:]
    assert len(records) >= 600 * 80 // limit  # cut into several records, markers counted
    _check_journal_applies_each_input_once(broker)


# -- HTTP over the fake broker ----------------------------------------------------------------

HTTP_SETTINGS = Settings.from_env(
    {},
    topic_partitions=PARTITIONS,
    max_wait_ms=120_000,
    max_deadline_ahead_ms=86_400_000,
    shutdown_grace_ms=5_000,
)


class SlowReader(FakeReader):
    """Reads the changelog only once ``release`` is set, for the partitions in ``slow``."""

    def __init__(self, broker: FakeBroker, release: trio.Event, slow: frozenset[int]) -> None:
        super().__init__(broker)
        self.release = release
        self.slow = slow
        self.started: set[int] = set()

    async def read(
        self,
        topic: str,
        partition: int,
        start: int,
        handle: Callable[[list[ConsumedRecord]], None],
    ) -> int:
        self.started.add(partition)
        if partition in self.slow:
            await self.release.wait()
        return await super().read(topic, partition, start, handle)


Act = Callable[[Service, httpx.AsyncClient], Awaitable[None]]


async def _with_http(
    broker: FakeBroker, act: Act, *, reader: FakeReader | None = None, wait_serving: bool = True
) -> Service:
    """Run the service's parts (no Kafka intake) over ``broker`` with HTTP through ASGI, call
    ``act``, then cancel everything: a crash, nothing is flushed or drained."""
    fake = FakeTransport(broker)
    services: list[Service] = []
    with trio.CancelScope() as crash:
        async with (
            fake.open_sink() as sink,
            fake.open_source(topics=list(INPUTS), group_id="g", assignment=None) as source,
        ):
            reader = reader if reader is not None else FakeReader(broker)
            service = Service(HTTP_SETTINGS, Clock(offset_ms=EPOCH_MS), source, sink, reader)
            services.append(service)
            service.status.started = True
            async with trio.open_nursery() as nursery:
                await nursery.start(service.executor.run)
                await nursery.start(service.outbox.run)
                assert service.changelog is not None
                await nursery.start(service.changelog.run)
                await nursery.start(service.reaper.run)
                nursery.start_soon(service.follower.run)
                if wait_serving:
                    while service.table.serving() != frozenset(range(PARTITIONS)):
                        await trio.sleep(0.01)
                transport = httpx.ASGITransport(app=service.app)
                async with httpx.AsyncClient(base_url="http://api", transport=transport) as http:
                    await act(service, http)
                crash.cancel()
                await trio.lowlevel.checkpoint()
    return services[0]


def _query(scope: str, op_id: str) -> dict[str, str]:
    return {"scope": scope, "op_id": op_id}


def _op(i: int) -> Json:
    return {
        "scope": SCOPES[i % len(SCOPES)],
        "op_id": f"h{i}",
        "keys": [f"a{i}", f"b{i}"],
        "timeout_ms": 3_600_000,
        "payload": {"i": i},
    }


def _a_signal(i: int) -> Json:
    return {"scope": SCOPES[i % len(SCOPES)], "key": f"a{i}", "payload": {"a": i}}


# Three clients writing at once: registrations (one by one, or in a batch), then the first key
# of each of their operations (one signals request). Each write: (path, body, ops it registers).
Lane = tuple[tuple[str, Json, tuple[int, ...]], ...]
LANES: tuple[Lane, ...] = (
    (
        *(("/v1/operations", _op(i), (i,)) for i in range(4)),
        ("/v1/signals", {"signals": [_a_signal(i) for i in range(4)]}, ()),
    ),
    (
        *(("/v1/operations", _op(i), (i,)) for i in range(4, 8)),
        ("/v1/signals", {"signals": [_a_signal(i) for i in range(4, 8)]}, ()),
    ),
    (
        ("/v1/operations:batch", {"operations": [_op(i) for i in range(8, 11)]}, (8, 9, 10)),
        ("/v1/signals", {"signals": [_a_signal(i) for i in range(8, 11)]}, ()),
    ),
)
WRITES = sum(len(lane) for lane in LANES)
OPS = 11


def _crash_at_journal_ack(broker: FakeBroker, n: int) -> None:
    """Crash at the broker's step acknowledging its ``n``-th changelog record: the record is
    kept, the writes it journaled are never answered."""
    seen = 0

    def count(record: OutRecord) -> SendFailure | None:
        nonlocal seen
        if record.topic == CHANGELOG:
            seen += 1
            if seen == n:
                broker.crash_at = broker.steps + 1  # this record's "ack" step
        return None

    broker.refuse = count


@pytest.mark.parametrize(
    ("mode", "n"),
    [("answers", n) for n in (0, 1, 3, 6, 9, WRITES)]
    + [("stall", n) for n in (0, 2, 5, 10)]
    + [("journal_ack", n) for n in (1, 3, 4, 5)],
)
async def test_http_writes_answered_before_a_crash_are_known_after_a_restart_and_complete(
    autojump_clock: trio.testing.MockClock, mode: str, n: int
) -> None:
    # Crash after n answered writes; or stall the broker after n answered writes, then crash;
    # or crash as the broker acknowledges its n-th changelog record.
    broker = _broker()
    answered: set[int] = set()  # the operations whose registration got a 2xx
    count = 0

    async def write(http: httpx.AsyncClient, path: str, body: Json, ops: tuple[int, ...]) -> None:
        nonlocal count
        response = await http.post(path, json=body)
        assert response.status_code in (200, 201), response.text
        if path == "/v1/operations:batch":
            assert [r["http_status"] for r in response.json()["results"]] == [201] * len(ops)
        answered.update(ops)
        count += 1
        if count == n and mode == "stall":
            broker.stall = trio.Event()  # nothing is acknowledged any more
        elif count == n and mode == "answers":
            crash.cancel()

    async def lane(http: httpx.AsyncClient, writes: Lane) -> None:
        for path, body, ops in writes:
            await write(http, path, body, ops)

    async def before(service: Service, http: httpx.AsyncClient) -> None:
        if mode == "stall" and n == 0:
            broker.stall = trio.Event()
        with trio.move_on_after(1):  # then a crash, with writes still unanswered if stalled
            async with trio.open_nursery() as nursery:
                for writes in LANES:
                    nursery.start_soon(lane, http, writes)
                if mode == "answers" and n == 0:
                    await trio.sleep(0.001)  # applied, not yet acknowledged by the broker
                    crash.cancel()

    if mode == "journal_ack":
        _crash_at_journal_ack(broker, n)
    with trio.CancelScope() as crash:
        broker.crash_scope = crash
        await _with_http(broker, before)
    if mode == "journal_ack":
        assert count < WRITES
    else:  # writes journaled with the n-th answered one are answered with it
        assert count >= n
    if mode == "stall":
        assert count < WRITES
    broker.stall.set()
    broker.crash_at = None
    known: set[int] = set()

    async def after(service: Service, http: httpx.AsyncClient) -> None:
        for i in range(OPS):
            op = _op(i)
            response = await http.get("/v1/operation", params=_query(op["scope"], op["op_id"]))
            if i in answered:
                assert response.status_code == 200, (i, response.text)
            elif mode == "stall" or (mode == "answers" and n == 0):
                assert response.status_code == 404, (i, response.text)  # never acknowledged
            if response.status_code == 200:
                got = response.json()  # never half: the whole registration
                assert got["keys"] == op["keys"] and got["status"] == "pending", got
                assert got["deadline_ms"] > EPOCH_MS + 3_600_000 - 1, got
                known.add(i)
            else:
                assert response.status_code == 404, response.text
        signals = [_a_signal(i) for i in range(OPS)]
        signals += [{"scope": SCOPES[i % len(SCOPES)], "key": f"b{i}"} for i in range(OPS)]
        response = await http.post("/v1/signals", json={"signals": signals})
        assert response.status_code == 200, response.text
        assert response.json()["completed"] == len(known)
        for i in sorted(known):
            op = _op(i)
            params = {**_query(op["scope"], op["op_id"]), "timeout_ms": "5000"}
            waited = (await http.get("/v1/operation/wait", params=params)).json()
            assert waited["status"] == "completed", waited
            outcome = waited["outcome"]
            assert outcome["payload"] == {"i": i}
            assert outcome["signals"] == {f"a{i}": {"a": i}, f"b{i}": None}

    await _with_http(broker, after)
    assert answered <= known
    outcomes = _check_outcomes_once(broker)
    assert {int(op_id[1:]) for _scope, op_id in outcomes} == known


def _now_ms() -> int:
    return Clock(offset_ms=EPOCH_MS).now_ms()


async def _wait_for(
    http: httpx.AsyncClient, scope: str, op_id: str, timeout_ms: int = 30_000
) -> Json:
    params = {**_query(scope, op_id), "timeout_ms": str(timeout_ms)}
    response = await http.get("/v1/operation/wait", params=params)
    assert response.status_code == 200, response.text
    answer: Json = response.json()
    return answer


async def _register_http(http: httpx.AsyncClient, body: Json) -> None:
    response = await http.post("/v1/operations", json=body)
    assert response.status_code == 201, response.text


OVERDUE: tuple[tuple[str, str, list[str]], ...] = (
    ("s0", "t0", []),
    ("s1", "t1", []),
    ("s2", "b2", ["x", "y"]),
    ("s4", "b4", ["x"]),
)


async def test_operations_overdue_while_down_expire_late_after_a_restart_and_stay_identical(
    autojump_clock: trio.testing.MockClock,
) -> None:
    deadlines: dict[str, int] = {}

    async def before(service: Service, http: httpx.AsyncClient) -> None:
        await _register_http(http, {"scope": "s1", "op_id": "early", "keys": [], "timeout_ms": 500})
        for scope, op_id, keys in OVERDUE:
            await _register_http(
                http, {"scope": scope, "op_id": op_id, "keys": keys, "timeout_ms": 5_000}
            )
        far = {"scope": "s2", "op_id": "far", "keys": ["z"], "timeout_ms": 3_600_000}
        await _register_http(http, far)
        response = await http.post("/v1/signals", json={"signals": [{"scope": "s2", "key": "x"}]})
        assert response.status_code == 200 and response.json()["completed"] == 0
        early = await _wait_for(http, "s1", "early")
        assert early["status"] == "expired" and early["outcome"]["late"] is False
        for scope, op_id, _keys in OVERDUE:
            got = (await http.get("/v1/operation", params=_query(scope, op_id))).json()
            assert got["status"] == "pending"
            deadlines[op_id] = got["deadline_ms"]
        await trio.sleep(1)  # then a crash, 4 s before the deadlines

    await _with_http(broker := _broker(), before)
    crashed_ms = _now_ms()
    assert all(deadline > crashed_ms for deadline in deadlines.values())
    assert {d["op_id"] for _raw, d in _callbacks(broker)} == {"early"}
    await trio.sleep(20)  # down, past every deadline
    restarted_ms = _now_ms()
    first: dict[str, Json] = {}

    async def after(service: Service, http: httpx.AsyncClient) -> None:
        for scope, op_id, _keys in OVERDUE:
            waited = await _wait_for(http, scope, op_id)
            assert waited["status"] == "expired", waited
            outcome = first[op_id] = waited["outcome"]
            assert outcome["late"] is True
            # An expiry happens at the deadline (outcome_ms), delivered after the restart.
            assert outcome["outcome_ms"] == outcome["deadline_ms"] == deadlines[op_id]
            assert _now_ms() >= restarted_ms > deadlines[op_id]
        partial = first["b2"]
        assert partial["missing"] == ["y"] and list(partial["signals"]) == ["x"]
        far = (await http.get("/v1/operation", params=_query("s2", "far"))).json()
        assert far["status"] == "pending"
        assert service.table.engine_statistics().late == len(OVERDUE)

    await _with_http(broker, after)
    _check_outcomes_once(broker)
    sent = {raw for raw, _doc in _callbacks(broker)}
    await trio.sleep(5)  # down again

    async def again(service: Service, http: httpx.AsyncClient) -> None:
        for scope, op_id, _keys in OVERDUE:
            waited = await _wait_for(http, scope, op_id)
            assert waited["outcome"] == first[op_id]
        far = (await http.get("/v1/operation", params=_query("s2", "far"))).json()
        assert far["status"] == "pending"
        await trio.sleep(1)  # room for the re-sends

    await _with_http(broker, again)
    outcomes = _check_outcomes_once(broker)  # re-sent, if at all, byte for byte
    assert {raw for raw, _doc in _callbacks(broker)} == sent
    assert {op_id for _scope, op_id in outcomes} == {"early"} | {o for _s, o, _k in OVERDUE}
    assert all(outcomes[(s, o)]["late"] is True for s, o, _k in OVERDUE)
    assert outcomes[("s1", "early")]["late"] is False


@pytest.mark.parametrize("slow", [frozenset({1}), frozenset({0}), frozenset({0, 1})])
async def test_a_restoring_partition_answers_503_with_retry_after_and_readyz_waits_for_it(
    autojump_clock: trio.testing.MockClock, slow: frozenset[int]
) -> None:
    async def before(service: Service, http: httpx.AsyncClient) -> None:
        for scope in ("s0", "s1"):
            await _register_http(
                http, {"scope": scope, "op_id": "o", "keys": ["k"], "timeout_ms": 60_000}
            )

    await _with_http(broker := _broker(), before)
    release = trio.Event()
    reader = SlowReader(broker, release, slow)
    restoring: frozenset[int] = frozenset()

    async def during(service: Service, http: httpx.AsyncClient) -> None:
        nonlocal restoring
        while not slow <= reader.started:
            await trio.sleep(0.01)
        await trio.sleep(5)  # a slow restore: still not done
        restoring = service.table.restoring_now()
        assert slow <= restoring  # (the others may wait for them, or be served already)
        assert service.table.serving() == frozenset({0, 1}) - restoring
        ready = await http.get("/readyz")
        assert ready.status_code == 503 and ready.json()["ready"] is False
        for p, status in ready.json().get("partitions", {}).items():
            assert status["state"] == ("restoring" if int(p) in restoring else "serving")
        for scope, p in (("s0", 0), ("s1", 1)):
            op = {"scope": scope, "op_id": "n", "keys": ["k"], "timeout_ms": 1_000}
            signals = {"signals": [{"scope": scope, "key": "other"}]}
            calls: list[tuple[str, str, Any, Any]] = [
                ("GET", "/v1/operation", _query(scope, "o"), None),
                ("GET", "/v1/operations", {"scope": scope}, None),
                ("POST", "/v1/operations", None, op),
                ("POST", "/v1/signals", None, signals),
                ("DELETE", "/v1/operation", _query(scope, "o"), None),
            ]
            for method, path, params, body in calls:
                response = await http.request(method, path, params=params, json=body)
                if p in restoring:
                    assert response.status_code == 503, response.text
                    assert response.headers["Retry-After"] == "1"
                    assert "being restored" in response.json()["error"]["message"]
                else:
                    assert response.status_code < 300, response.text
        release.set()
        while service.table.serving() != frozenset({0, 1}):
            await trio.sleep(0.01)
        ready = await http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        for scope, p in (("s0", 0), ("s1", 1)):
            got = await http.get("/v1/operation", params=_query(scope, "o"))
            assert got.status_code == 200
            assert got.json()["status"] == ("pending" if p in restoring else "cancelled")

    await _with_http(broker, during, reader=reader, wait_serving=False)


async def test_a_long_poll_on_a_restoring_partition_answers_503_with_retry_after(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def before(service: Service, http: httpx.AsyncClient) -> None:
        await _register_http(
            http, {"scope": "s1", "op_id": "o", "keys": ["k"], "timeout_ms": 60_000}
        )

    await _with_http(broker := _broker(), before)
    release = trio.Event()
    reader = SlowReader(broker, release, frozenset({1}))
    statuses: list[int] = []

    async def during(service: Service, http: httpx.AsyncClient) -> None:
        while 1 not in reader.started:
            await trio.sleep(0.01)
        params = {**_query("s1", "o"), "timeout_ms": "1000"}
        response = await http.get("/v1/operation/wait", params=params)
        statuses.append(response.status_code)
        release.set()
        assert response.status_code == 503, response.text  # not 404: the operation exists
        assert response.headers["Retry-After"] == "1"

    await _with_http(broker, during, reader=reader, wait_serving=False)
    assert statuses == [503]


@asynccontextmanager
async def _running(broker: FakeBroker) -> AsyncIterator[tuple[Service, FakeSource]]:
    """A service over ``broker`` (Kafka inputs only) while the body runs, then stopped."""
    fake = FakeTransport(broker)
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=[REQUESTS, SIGNALS], group_id="g", assignment=None) as source,
    ):
        service = Service(SETTINGS, Clock(offset_ms=EPOCH_MS), source, sink, reader)
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: service.run(stop, serve_http=False))
            while not service.table.serving():
                await trio.sleep(0.01)
            yield service, source
            stop.set()


async def test_a_partition_taken_away_is_handed_over_durable_and_no_longer_applied(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    scope = next(
        f"h{i}" for i in range(100) if broker.partition_for(REQUESTS, f"h{i}".encode()) == 1
    )
    async with _running(broker) as (service, source), trio.open_nursery() as nursery:
        while 1 not in service.table.serving():
            await trio.sleep(0.01)
        broker.stall = trio.Event()  # the journal's acknowledgement is held back
        for i in range(5):
            _register(broker, scope, f"op{i}", ["k"], timeout_ms=600_000)
        await trio.sleep(0.1)  # applied, journaled, not yet acknowledged
        assert service.changelog is not None
        assert service.changelog.statistics().pending_entries > 0
        handed = trio.Event()

        async def rebalance() -> None:
            await source.revoke({(REQUESTS, 1), (SIGNALS, 1)})
            handed.set()

        nursery.start_soon(rebalance)
        await trio.sleep(1)
        assert not handed.is_set()  # the hand-over waits for the journal
        assert 1 not in service.table.serving()  # and applies nothing more meanwhile
        broker.stall.set()
        await handed.wait()
        assert service.changelog.statistics().pending_entries == 0
        _register(broker, scope, "after", ["k"], timeout_ms=600_000)  # not ours any more
        await trio.sleep(0.5)
    journaled = {
        entry[2][0]
        for doc in _journal(broker, 1)
        for entry in doc["entries"]
        if entry[0] == "register"
    }
    assert journaled == {f"op{i}" for i in range(5)}  # all of them, and not "after"


async def test_a_partition_another_writer_wrote_to_is_fenced_and_restored_from_the_log(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    scope = next(
        f"f{i}" for i in range(100) if broker.partition_for(REQUESTS, f"f{i}".encode()) == 0
    )
    async with _running(broker) as (service, _source):
        _register(broker, scope, "X", ["k"], timeout_ms=600_000)
        await trio.sleep(0.5)  # registered and journaled
        # Another writer (a zombie, or a new owner seen by one) cancels X in the journal.
        foreign = {
            "v": 1,
            "type": "journal",
            "partition": 0,
            "entries": [["cancel", EPOCH_MS + 400, scope, "X"]],
            "positions": {},
            "delivered": 0,
        }
        broker.append(CHANGELOG, b"journal", json.dumps(foreign).encode(), partition=0)
        _signal(broker, scope, "k")  # this replica completes X, in memory only
        await trio.sleep(1)
        assert service.changelog is not None and service.changelog.fenced == 1
        assert 0 in service.table.serving()  # restored again, from the log
        found = service.reads.lookup(scope, "X")
        assert found is not None and found[1] is not None
        assert found[1].outcome.value == "cancelled"  # the log's order decided
    outcomes = {
        json.loads(r.value or b"")["outcome"]
        for r in broker.records(CALLBACKS)
        if json.loads(r.value or b"")["op_id"] == "X"
    }
    assert outcomes == {"cancelled"}  # the completion decided on a stale state never left
