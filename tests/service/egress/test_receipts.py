"""The receipts: an acknowledgement counted once, its metrics, its listeners, its log lines."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest
import structlog
import trio
import trio.testing

from purgatory._core import Outcome, OutcomeKind, TimeDomain
from purgatory.service.egress.receipts import Receipts
from purgatory.service.egress.records import Ref
from purgatory.service.kafka.transport import OutRecord
from purgatory.service.telemetry.logging import configure_logging
from purgatory.service.telemetry.metrics import Metrics
from reaper import Clock
from tests.service.egress.parts import CALLBACKS, DEAD, INPUT, REPLY, outcome


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    yield
    configure_logging("info", "json")  # the level back to the default
    structlog.reset_defaults()


class Heard:
    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []
        self.letters: list[OutRecord] = []


def _receipts(metrics: Metrics | None = None) -> tuple[Receipts, Heard]:
    heard = Heard()
    receipts = Receipts(
        Clock(),
        on_delivered=heard.outcomes.append,
        on_dead_lettered=heard.letters.append,
        metrics=metrics,
    )
    return receipts, heard


def _ref(done: Outcome) -> Ref:
    return Ref(OutRecord(done.reply_to or CALLBACKS, b"s", b"{}"), done)


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


async def test_a_run_of_callbacks_is_counted_once_and_told_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metrics = Metrics()
    receipts, heard = _receipts(metrics)
    await trio.sleep(0.5)  # now 500 ms
    expired = outcome(2, kind=OutcomeKind.EXPIRED, registered_ms=0, outcome_ms=200)
    event_time = outcome(4, kind=OutcomeKind.EXPIRED, time_domain=TimeDomain.EVENT_TIME)
    done = [outcome(1), expired, outcome(3, reply_to=REPLY), event_time]
    receipts.delivered([_ref(o) for o in done])
    assert heard.outcomes == done and heard.letters == []
    assert receipts.delivered_count == 4 and receipts.dead_lettered_count == 0
    produced = "purgatory_records_produced_total"
    assert _sample(metrics, produced, topic=CALLBACKS) == 3
    assert _sample(metrics, produced, topic=REPLY) == 1
    assert _sample(metrics, "purgatory_outcomes_total", outcome="expired") == 2
    # Lateness: processing-time expirations only, from when they were due (200 ms).
    assert _sample(metrics, "purgatory_reaper_lateness_seconds_count") == 1
    assert _sample(metrics, "purgatory_reaper_lateness_seconds_sum") == pytest.approx(0.3)


def test_an_empty_run_counts_nothing() -> None:
    metrics = Metrics()
    receipts, heard = _receipts(metrics)
    receipts.delivered([])
    assert heard.outcomes == [] and receipts.delivered_count == 0


async def test_a_dead_letter_is_counted_by_its_input_topic_and_reason_and_handed_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    metrics = Metrics()
    receipts, heard = _receipts(metrics)
    letter = Ref(OutRecord(DEAD, b"s", b"{}"), None, INPUT, "invalid")
    receipts.acknowledged(letter)
    receipts.acknowledged(_ref(outcome(1)))  # a callback alone: as a run of one
    assert heard.letters == [letter.record] and heard.outcomes == [outcome(1)]
    assert (receipts.dead_lettered_count, receipts.delivered_count) == (1, 1)
    dead = "purgatory_records_dead_lettered_total"
    assert _sample(metrics, dead, topic=INPUT, reason="invalid") == 1


def test_a_callback_dead_lettered_instead_is_told_but_not_counted_as_delivered() -> None:
    metrics = Metrics()
    receipts, heard = _receipts(metrics)
    receipts.undelivered(outcome(1))
    assert heard.outcomes == [outcome(1)] and receipts.delivered_count == 0
    assert _sample(metrics, "purgatory_outcomes_total", outcome="completed") == 0


async def test_without_metrics_only_the_counts_and_the_listeners(
    autojump_clock: trio.testing.MockClock,
) -> None:
    receipts, heard = _receipts()
    receipts.delivered([_ref(outcome(1))])
    receipts.acknowledged(Ref(OutRecord(DEAD, None, b"{}"), None, INPUT, "refused"))
    assert (receipts.delivered_count, receipts.dead_lettered_count) == (1, 1)
    assert len(heard.outcomes) == len(heard.letters) == 1


async def test_at_debug_each_delivery_is_logged_and_a_late_expiration_twice(
    autojump_clock: trio.testing.MockClock,
) -> None:
    out = io.StringIO()
    configure_logging("debug", "json", out)
    receipts, _heard = _receipts()
    late = outcome(2, kind=OutcomeKind.EXPIRED, late=True)
    receipts.delivered([_ref(outcome(1)), _ref(late)])
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(line["event"], line["op_id"]) for line in lines] == [
        ("operation_completed", "op1"),
        ("operation_expired", "op2"),
        ("operation_expired_late", "op2"),
    ]
    assert lines[1]["late"] is True and lines[0]["sequence"] == 1
    out.truncate(0)
    configure_logging("info", "json", out)
    receipts.delivered([_ref(outcome(3))])
    assert out.getvalue() == ""
