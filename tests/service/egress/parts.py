"""What the egress stages' unit tests share: outcomes, topics, and the in-memory broker's ends.

Each stage is tested alone on :class:`~tests.service.fake_kafka.FakeBroker` under trio's
``autojump_clock``: its sink (:meth:`FakeTransport.open_sink`, acknowledging after
``ack_delay_s``) and its group's commits (:func:`commits_to`).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import trio

from purgatory._core import Outcome, OutcomeKind, TimeDomain
from purgatory.service.egress.records import Records
from purgatory.service.kafka.transport import OutRecord, SendFailure
from tests.service.fake_kafka import FakeBroker, FakeSource

__all__ = [
    "CALLBACKS",
    "DEAD",
    "INPUT",
    "REPLY",
    "TIMEOUT",
    "TOO_LARGE",
    "broker",
    "commits_to",
    "letters",
    "op_ids",
    "outcome",
    "records",
]

CALLBACKS, DEAD, INPUT, REPLY = "cb", "dead", "in", "reply.x"
TOO_LARGE = SendFailure("MessageSizeTooLargeError: too large", retriable=False)
TIMEOUT = SendFailure("KafkaTimeoutError: no leader", retriable=True)


def outcome(
    i: int,
    *,
    scope: str = "s",
    kind: OutcomeKind = OutcomeKind.COMPLETED,
    reply_to: str | None = None,
    payload: str | None = None,
    registered_ms: int = 0,
    outcome_ms: int = 0,
    late: bool = False,
    time_domain: TimeDomain = TimeDomain.PROCESSING_TIME,
) -> Outcome:
    """Operation ``op<i>``'s outcome (sequence ``i``)."""
    return Outcome(
        op_id=f"op{i}",
        scope=scope,
        outcome=kind,
        registered_ms=registered_ms,
        outcome_ms=outcome_ms,
        deadline_ms=outcome_ms,
        time_domain=time_domain,
        sequence=i,
        payload=payload,
        reply_to=reply_to,
        late=late,
    )


def records(max_record_bytes: int = 1_000_000) -> Records:
    return Records(
        callbacks_topic=CALLBACKS, dead_letters_topic=DEAD, max_record_bytes=max_record_bytes
    )


def broker(
    refuse: Callable[[OutRecord], SendFailure | None] | None = None, **faults: Any
) -> FakeBroker:
    """A broker holding the egress topics (one partition each) and a two-partition input."""
    topics = {CALLBACKS: 1, DEAD: 1, REPLY: 1, INPUT: 2}
    if refuse is None:
        return FakeBroker(topics, **faults)
    return FakeBroker(topics, refuse=refuse, **faults)


def commits_to(
    broker: FakeBroker, calls: list[tuple[int, dict[tuple[str, int], int]]]
) -> Callable[[Mapping[tuple[str, int], int]], Awaitable[None]]:
    """The group's commit on ``broker`` (a round trip of 1 ms; ``fail_commits`` refuses), each
    call noted in ``calls`` as (trio time in ms, offsets) when it starts."""
    _send, receive = trio.open_memory_channel[Any](0)
    source = FakeSource(broker, receive, assigned=[])

    async def commit(offsets: Mapping[tuple[str, int], int]) -> None:
        calls.append((round(trio.current_time() * 1000), dict(offsets)))
        await source.commit(offsets)

    return commit


def op_ids(broker: FakeBroker, topic: str = CALLBACKS) -> list[str]:
    """The operations of the callbacks on ``topic``, in the order the broker took them."""
    return [json.loads(r.value or b"")["op_id"] for r in broker.records(topic)]


def letters(broker: FakeBroker) -> list[dict[str, Any]]:
    """The dead letters the broker took, decoded."""
    return [json.loads(r.value or b"") for r in broker.records(DEAD)]
