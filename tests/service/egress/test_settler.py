"""The settler: a refused record retried with back-off while that can help, a ``reply_to``
callback given up at its timeout, dead letters and their bare twins; on the in-memory broker,
in virtual time."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager

import pytest
import structlog
import trio
import trio.testing

from purgatory._core._backoff import Backoff
from purgatory.service.egress.records import Ref
from purgatory.service.egress.settler import Settler
from purgatory.service.kafka.transport import ConsumedRecord, OutRecord, Refusal, SendFailure
from purgatory.service.telemetry.logging import configure_logging
from purgatory.service.telemetry.metrics import Metrics
from reaper import Clock
from tests.service.egress.parts import (
    CALLBACKS,
    DEAD,
    INPUT,
    REPLY,
    TIMEOUT,
    TOO_LARGE,
    broker,
    letters,
    op_ids,
    outcome,
    records,
)
from tests.service.fake_kafka import FakeBroker, FakeTransport

BACKOFF = Backoff(first_s=0.1, max_s=5.0)
Refuse = Callable[[OutRecord], SendFailure | None]


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    yield
    configure_logging("info", "json")
    structlog.reset_defaults()


class Sends:
    """Refuses each record as ``decide`` says, noting when (ms) and to which topic."""

    def __init__(self, decide: Refuse) -> None:
        self.decide = decide
        self.at: list[tuple[int, str]] = []

    def __call__(self, record: OutRecord) -> SendFailure | None:
        self.at.append((round(trio.current_time() * 1000), record.topic))
        return self.decide(record)


@asynccontextmanager
async def _settler(
    sends: Sends, *, reply_to_timeout_ms: int = 1_000, metrics: Metrics | None = None
) -> AsyncIterator[tuple[Settler, FakeBroker]]:
    fake = broker(sends)
    async with FakeTransport(fake, ack_delay_s=0.0).open_sink() as sink:
        settler = Settler(
            sink,
            Clock(),
            records(),
            backoff=BACKOFF,
            reply_to_timeout_ms=reply_to_timeout_ms,
            metrics=metrics,
        )
        yield settler, fake


def _callback(i: int, reply_to: str | None = None) -> Ref:
    done = outcome(i, reply_to=reply_to)
    return Ref(records().callback(done), done)


def _letter(fallback: bool = True) -> Ref:
    refused = ConsumedRecord(INPUT, 0, 5, b"k", b"v" * 3_000, 1_000)
    full, bare = records().input_letters(Refusal(refused, "bad", None, "invalid", "s"))
    return Ref(full, None, INPUT, "invalid", bare if fallback else None)


async def test_a_callback_to_the_callbacks_topic_is_retried_until_taken(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refusals = {"left": 6}

    def flaky(_record: OutRecord) -> SendFailure | None:
        if refusals["left"]:
            refusals["left"] -= 1
            return TIMEOUT
        return None

    sends = Sends(flaky)
    async with _settler(sends) as (settler, fake):
        ref = _callback(1)
        assert await settler.settle(ref, TIMEOUT) == [ref]
    # 0.1 s doubling, at most 5 s: never given up, the configured topic exists
    assert [ms for ms, _ in sends.at] == [100, 300, 700, 1_500, 3_100, 6_300, 11_300]
    assert settler.retries == 7 and op_ids(fake) == ["op1"]


async def test_the_worked_example_a_reply_to_callback_is_dead_lettered_past_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sends = Sends(lambda r: TIMEOUT if r.topic == REPLY else None)
    metrics = Metrics()
    async with _settler(sends, metrics=metrics) as (settler, fake):
        ref = _callback(1, reply_to=REPLY)
        settled = await settler.settle(ref, TIMEOUT)
    assert sends.at == [(100, REPLY), (300, REPLY), (700, REPLY), (1_500, REPLY), (1_500, DEAD)]
    [dead, given_up] = settled
    assert given_up == ref.outcome
    assert isinstance(dead, Ref) and dead.outcome is None
    assert (dead.record.topic, dead.source_topic, dead.reason) == (DEAD, REPLY, "undeliverable")
    [letter] = letters(fake)
    assert letter["reason"] == f"callback not delivered to topic {REPLY!r}: {TIMEOUT.reason}"
    assert json.loads(letter["value"])["op_id"] == "op1"
    assert settler.retries == 4
    assert metrics.registry.get_sample_value("purgatory_callback_errors_total") == 1


@pytest.mark.parametrize(("timeout_ms", "retries"), [(699, 3), (700, 3), (701, 4)])
async def test_the_reply_to_timeout_is_checked_before_each_retry_on_its_boundary(
    autojump_clock: trio.testing.MockClock, timeout_ms: int, retries: int
) -> None:
    sends = Sends(lambda r: TIMEOUT if r.topic == REPLY else None)
    async with _settler(sends, reply_to_timeout_ms=timeout_ms) as (settler, fake):
        await settler.settle(_callback(1, reply_to=REPLY), TIMEOUT)
    assert settler.retries == retries  # at 700 ms: given up when the timeout is 700 or less
    assert len(letters(fake)) == 1


async def test_a_callback_refused_for_good_is_dead_lettered_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    sends = Sends(lambda _r: None)
    async with _settler(sends) as (settler, fake):
        ref = _callback(1)
        settled = await settler.settle(ref, TOO_LARGE)
    assert sends.at == [(0, DEAD)] and settler.retries == 0
    assert settled[-1] == ref.outcome and len(letters(fake)) == 1
    [line] = [json.loads(line) for line in out.getvalue().splitlines()]
    assert (line["event"], line["op_id"], line["topic"]) == (
        "callback_dead_lettered",
        "op1",
        CALLBACKS,
    )


async def test_a_letter_refused_as_too_large_goes_again_bare(
    autojump_clock: trio.testing.MockClock,
) -> None:
    sends = Sends(lambda _r: None)
    async with _settler(sends) as (settler, fake):
        letter = _letter()
        [taken] = await settler.settle(letter, TOO_LARGE)
    assert isinstance(taken, Ref) and taken.record is letter.fallback
    assert (taken.source_topic, taken.reason) == (INPUT, "invalid")
    assert settler.retries == 1 and sends.at == [(0, DEAD)]
    [kept] = letters(fake)
    assert kept["value"] == "" and kept["value_bytes"] == 3_000


async def test_a_bare_letter_refused_for_good_is_lost_loudly(
    autojump_clock: trio.testing.MockClock,
) -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    sends = Sends(lambda _r: TOO_LARGE)
    async with _settler(sends) as (settler, fake):
        assert await settler.settle(_letter(), TOO_LARGE) == []
        assert await settler.settle(_letter(fallback=False), TOO_LARGE) == []
    assert letters(fake) == [] and len(sends.at) == 1  # the bare twin, once
    events = [json.loads(line)["event"] for line in out.getvalue().splitlines()]
    assert events == ["dead_letter_lost", "dead_letter_lost"]


async def test_the_letter_of_an_undeliverable_callback_falls_back_and_retries_as_any_letter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    refusals = {"left": 2}

    def decide(record: OutRecord) -> SendFailure | None:
        if record.topic == DEAD and json.loads(record.value)["value"]:
            return TOO_LARGE  # the full letter: too large for this broker
        if record.topic == DEAD and refusals["left"]:
            refusals["left"] -= 1
            return TIMEOUT  # the bare one: retried, the dead letters topic is configured
        return None

    sends = Sends(decide)
    async with _settler(sends) as (settler, fake):
        ref = _callback(1)
        [dead, given_up] = await settler.settle(ref, TOO_LARGE)
    assert given_up == ref.outcome
    assert isinstance(dead, Ref) and dead.record is dead.fallback
    assert [ms for ms, _ in sends.at] == [0, 0, 100, 300]
    assert settler.retries == 3 and len(letters(fake)) == 1
