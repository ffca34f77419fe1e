"""Delivery by acknowledgement, against the in-memory broker, in virtual time.

The at-least-once story, checked at every crash point of a workload: an input offset is
committed only after every outcome and dead letter it caused is acknowledged, so for any crash,
an operation whose registration and signals are all committed has its callback on the broker,
and a committed malformed record has its dead letter there.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
from typing import Any

import pytest
import trio
import trio.testing

from purgatory._codec import encode_request, encode_signal
from purgatory._codec._records import RegisterRequest, SignalRecord
from purgatory._core import TransportError
from purgatory.service.app import Service, topics_of
from purgatory.service.kafka.transport import OutRecord, SendFailure
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport

EPOCH_MS = 1_763_780_400_000
SETTINGS = Settings.from_env({}, topic_partitions=2, shutdown_grace_ms=5_000)
REQUESTS, SIGNALS = SETTINGS.topic_requests, SETTINGS.topic_signals
CALLBACKS, DEAD = SETTINGS.topic_callbacks, SETTINGS.topic_dead_letters


def _broker(**faults: Any) -> FakeBroker:
    return FakeBroker({t: 2 for t in topics_of(SETTINGS)}, **faults)


async def _serve(
    broker: FakeBroker,
    stop: trio.Event,
    *,
    settings: Settings = SETTINGS,
    services: list[Service] | None = None,
) -> None:
    # Small polls: more batches, so more commits and more crash points between them.
    fake = FakeTransport(broker, max_batch=4)
    topics = [settings.topic_requests, settings.topic_signals]
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=topics, group_id="g", assignment=None) as source,
    ):
        service = Service(settings, Clock(offset_ms=EPOCH_MS), source, sink, reader)
        if services is not None:
            services.append(service)
        await service.run(stop, serve_http=False)


def _register(broker: FakeBroker, scope: str, op_id: str, keys: list[str], **kw: Any) -> None:
    request = RegisterRequest(op_id=op_id, scope=scope, keys=tuple(keys), **kw)
    broker.append(REQUESTS, scope.encode(), encode_request(request))


def _signal(broker: FakeBroker, scope: str, key: str, payload: str | None = None) -> None:
    broker.append(SIGNALS, scope.encode(), encode_signal(SignalRecord(scope, key, None, payload)))


def _workload(broker: FakeBroker) -> dict[tuple[str, str], tuple[list[str], list[int]]]:
    """Ten barriers over two partitions (some signals before their waiter), two malformed
    records; returns, per operation, its keys and the offsets of its inputs."""
    ops: dict[tuple[str, str], tuple[list[str], list[int]]] = {}
    for i in range(10):
        scope = f"run-{i % 4}"
        keys = [f"k{i}a", f"k{i}b"]
        if i % 3 == 0:
            _signal(broker, scope, keys[0])
        _register(broker, scope, f"op{i}", keys, timeout_ms=3_600_000)
        ops[(scope, f"op{i}")] = (keys, [])
    broker.append(REQUESTS, b"run-0", b"not json")
    broker.append(SIGNALS, b"run-1", b'{"v":1,"type":"signal","scope":"run-1"}')
    for i in range(10):
        scope = f"run-{i % 4}"
        _signal(broker, scope, f"k{i}a")
        _signal(broker, scope, f"k{i}b")
    return ops


def _committed(broker: FakeBroker, record: Any) -> bool:
    return bool(record.offset < broker.committed.get((record.topic, record.partition), 0))


def _check_at_least_once(broker: FakeBroker) -> tuple[int, int]:
    """Every operation whose inputs are all committed has its callback; every committed bad
    record has its dead letter. Returns (operations covered, dead letters covered)."""
    callbacks = {
        (json.loads(r.value or b"")["scope"], json.loads(r.value or b"")["op_id"])
        for r in broker.records(CALLBACKS)
    }
    registered: dict[tuple[str, str], bool] = {}
    signalled: dict[tuple[str, str], bool] = {}
    bad: list[Any] = []
    for record in broker.records(REQUESTS) + broker.records(SIGNALS):
        try:
            body = json.loads(record.value or b"")
            ident = (body["scope"], body["op_id"] if record.topic == REQUESTS else body["key"])
        except (ValueError, KeyError):
            bad.append(record)
            continue
        table = registered if record.topic == REQUESTS else signalled
        # A key signalled twice counts once either delivery is committed.
        table[ident] = table.get(ident, False) or _committed(broker, record)
    covered = 0
    for (scope, op_id), done in registered.items():
        keys = [f"k{op_id[2:]}a", f"k{op_id[2:]}b"]
        if done and all(signalled.get((scope, k), False) for k in keys):
            assert (scope, op_id) in callbacks, (scope, op_id, broker.committed)
            covered += 1
    letters = {
        (json.loads(r.value or b"")["topic"], json.loads(r.value or b"")["offset"])
        for r in broker.records(DEAD)
    }
    dead = 0
    for record in bad:
        if _committed(broker, record):
            assert (record.topic, record.offset) in letters
            dead += 1
    return covered, dead


async def test_without_a_crash_every_outcome_is_delivered_once_and_every_offset_committed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    ops = _workload(broker)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, stop)
        await trio.sleep(1)
        stop.set()
    callbacks = [json.loads(r.value or b"") for r in broker.records(CALLBACKS)]
    assert sorted((c["scope"], c["op_id"]) for c in callbacks) == sorted(ops)
    assert {c["outcome"] for c in callbacks} == {"completed"}
    assert len(broker.records(DEAD)) == 2
    for topic in (REQUESTS, SIGNALS):
        for p, log in enumerate(broker.topics[topic]):
            assert broker.committed.get((topic, p), 0) == len(log)
    assert _check_at_least_once(broker) == (10, 2)


def _total_steps() -> int:
    broker = _broker()
    _workload(broker)

    async def main() -> None:
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, broker, stop)
            await trio.sleep(1)
            stop.set()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return broker.steps


TOTAL_STEPS = _total_steps()


@pytest.mark.parametrize("crash_at", range(1, TOTAL_STEPS + 1))
async def test_a_crash_at_any_step_loses_no_acknowledged_outcome_and_commits_nothing_early(
    autojump_clock: trio.testing.MockClock, crash_at: int
) -> None:
    broker = _broker(crash_at=crash_at)
    _workload(broker)
    stop = trio.Event()
    with trio.CancelScope() as crash:
        broker.crash_scope = crash
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, broker, stop)
            await trio.sleep(1)
            stop.set()
    assert broker.steps >= crash_at
    _check_at_least_once(broker)
    # A restarted replica reads again what was not committed: nothing is left behind.
    broker.crash_at = None
    again = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, again)
        await trio.sleep(1)
        again.set()
    for topic in (REQUESTS, SIGNALS):
        for p, log in enumerate(broker.topics[topic]):
            assert broker.committed.get((topic, p), 0) == len(log)


async def test_one_refused_callback_is_dead_lettered_alone_and_the_rest_are_delivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def refuse(record: OutRecord) -> SendFailure | None:
        if record.topic == CALLBACKS and b'"op_id":"op3"' in record.value:
            return SendFailure("MessageSizeTooLargeError: too large", retriable=False)
        return None

    broker = _broker(refuse=refuse)
    _workload(broker)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, stop)
        await trio.sleep(1)
        stop.set()
    delivered = {json.loads(r.value or b"")["op_id"] for r in broker.records(CALLBACKS)}
    assert delivered == {f"op{i}" for i in range(10)} - {"op3"}
    letters = [json.loads(r.value or b"") for r in broker.records(DEAD)]
    [refused] = [d for d in letters if d["topic"] == CALLBACKS]
    assert refused["partition"] == refused["offset"] == -1
    assert "MessageSizeTooLargeError" in refused["reason"]
    assert json.loads(refused["value"])["op_id"] == "op3"


async def test_retriable_failures_and_failed_commits_are_retried_until_they_succeed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    failures = {"left": 5}

    def flaky(record: OutRecord) -> SendFailure | None:
        if record.topic == CALLBACKS and failures["left"]:
            failures["left"] -= 1
            return SendFailure("KafkaTimeoutError: no leader", retriable=True)
        return None

    broker = _broker(refuse=flaky, fail_commits=3)
    ops = _workload(broker)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, stop)
        await trio.sleep(30)
        stop.set()
    assert len({r.value for r in broker.records(CALLBACKS)}) == len(ops)
    assert all(json.loads(r.value or b"")["topic"] != CALLBACKS for r in broker.records(DEAD))
    assert _check_at_least_once(broker) == (10, 2)


async def test_a_callback_to_a_reply_to_topic_that_never_takes_it_is_dead_lettered_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def no_such_topic(record: OutRecord) -> SendFailure | None:
        if record.topic == "purgatory.reply.nowhere":
            return SendFailure("KafkaTimeoutError: no metadata for 'nowhere'", retriable=True)
        return None

    broker = _broker(refuse=no_such_topic)
    _register(broker, "s", "lost", [], timeout_ms=10, reply_to="purgatory.reply.nowhere")
    _register(broker, "s", "fine", [], timeout_ms=20)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, stop)
        await trio.sleep(SETTINGS.reply_to_timeout_ms / 1000 + 10)
        stop.set()
    assert [json.loads(r.value or b"")["op_id"] for r in broker.records(CALLBACKS)] == ["fine"]
    [letter] = [json.loads(r.value or b"") for r in broker.records(DEAD)]
    assert (
        letter["topic"] == "purgatory.reply.nowhere"
        and json.loads(letter["value"])["op_id"] == "lost"
    )


async def test_sigterm_delivers_every_expiration_decided_before_the_stop(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    for i in range(4_000):
        _register(broker, f"s{i % 7}", f"t{i}", [], timeout_ms=1_000 + i % 50)
    stop = trio.Event()
    services: list[Service] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(_serve, broker, stop, services=services))
        await trio.sleep(1.025)  # half are due, the reaper is mid-way
        stop.set()
    [service] = services
    expired = [json.loads(r.value or b"") for r in broker.records(CALLBACKS)]
    decided = service.table.engine_statistics()
    assert len(expired) == decided.expired == 4_000 - decided.pending
    assert len({e["op_id"] for e in expired}) == len(expired)
    assert 1_000 < len(expired) < 4_000
    stopped_ms = EPOCH_MS + 1_025
    assert max(e["deadline_ms"] for e in expired) <= stopped_ms  # nothing expired early
    pending = [spec for engine in service.table.engines() for spec in engine.pending()]
    assert min(spec.deadline_ms for spec in pending) > stopped_ms  # every due one delivered


async def test_a_stalled_broker_at_shutdown_fails_loudly_naming_what_was_not_delivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    _workload(broker)
    stop = trio.Event()
    with pytest.raises(ExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_serve, broker, stop)
            await trio.sleep(0.0005)
            broker.stall = trio.Event()  # nothing is acknowledged any more
            await trio.sleep(1)
            stop.set()
    [error] = _leaves(caught.value)
    assert isinstance(error, TransportError)
    # Nothing is acknowledged, the journal's records included: the stop ends in its flush,
    # and says so, with the phases that did end.
    assert str(error) == (
        "shutdown: the journal was not flushed within shutdown_grace_ms (5000 ms);"
        " phases ended at {'http_s': 0.0, 'inputs_s': 0.0}"
    )
    assert _check_at_least_once(broker)[0] < 10


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    found: list[BaseException] = []
    for exc in group.exceptions:
        found += _leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc]
    return found


async def test_commits_are_coalesced_to_one_per_interval_and_shutdown_commits_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    _workload(broker)  # 36 records, 4 a poll: nine batches within a few milliseconds
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, stop)
        await trio.sleep(0.05)  # within the first 100 ms interval
        stop.set()
    polls, commits = broker.log.count("poll"), broker.log.count("commit")
    assert polls >= 8
    assert commits <= 2  # the first batch's, then the rest together at shutdown
    for topic in (REQUESTS, SIGNALS):
        for p, log in enumerate(broker.topics[topic]):
            assert broker.committed.get((topic, p), 0) == len(log)


async def test_a_register_with_a_700_kb_key_not_utf8_is_dead_lettered_within_the_limit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    limit = SETTINGS.max_record_bytes

    def too_large(record: OutRecord) -> SendFailure | None:
        size = len(record.key or b"") + len(record.value)
        if size > limit + 4_096:  # the producer's max_request_size (see _app)
            return SendFailure(f"MessageSizeTooLargeError: {size} bytes", retriable=False)
        return None

    broker = _broker(refuse=too_large)
    key = (b"\xff\xfe" + bytes(range(256))) * 2_717  # 700 kB, not UTF-8
    request = encode_request(RegisterRequest(op_id="big", scope="s", keys=("a",), timeout_ms=10))
    home = partition_for("s", 2)
    broker.append(REQUESTS, key, request, partition=home)
    _register(broker, "s", "after", [], timeout_ms=10)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, stop)
        await trio.sleep(1)
        stop.set()
    [record] = broker.records(DEAD)
    assert record.value is not None and len(record.key or b"") + len(record.value) <= limit
    assert record.key == b"s"  # the scope: the letter shares the scope's partition
    letter = json.loads(record.value)
    assert (letter["topic"], letter["partition"], letter["offset"]) == (REQUESTS, home, 0)
    assert letter["field"] == "key" and letter["key_encoding"] == "base64"
    assert (letter["key_bytes"], letter["key_sha256"]) == (
        len(key),
        hashlib.sha256(key).hexdigest(),
    )
    assert letter["key_truncated"] is True and key.startswith(base64.b64decode(letter["key"]))
    assert json.loads(letter["value"])["op_id"] == "big"
    # The service went on: the next record was applied, and every offset is committed.
    assert [json.loads(r.value or b"")["op_id"] for r in broker.records(CALLBACKS)] == ["after"]
    for topic in (REQUESTS, SIGNALS):
        for p, log in enumerate(broker.topics[topic]):
            assert broker.committed.get((topic, p), 0) == len(log)


async def test_a_letter_a_broker_with_a_lower_limit_refuses_is_sent_again_without_prefixes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    def small_topic(record: OutRecord) -> SendFailure | None:
        if record.topic == DEAD and len(record.value) > 2_000:
            return SendFailure("MessageSizeTooLargeError: over the topic's limit", retriable=False)
        return None

    broker = _broker(refuse=small_topic)
    value = b'{"v":1,"type":"register","scope":"s","junk":"' + b"x" * 50_000 + b'"}'
    broker.append(REQUESTS, b"s", value)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_serve, broker, stop)
        await trio.sleep(1)
        stop.set()
    [record] = broker.records(DEAD)
    letter = json.loads(record.value or b"")
    assert record.key == b"s" and letter["reason"].startswith("junk: ")
    assert (letter["value"], letter["truncated"], letter["value_bytes"]) == ("", True, len(value))
    assert letter["value_sha256"] == hashlib.sha256(value).hexdigest()
    assert (letter["key"], letter["key_bytes"], letter["key_truncated"]) == ("", 1, True)
