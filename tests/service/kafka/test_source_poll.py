"""The source's consumer thread rides out a poll that fails for a retriable reason.

kafka-python 3 lets a failed coordinator lookup (a refused connection while the broker is
away) escape ``poll``; found by the broker SIGKILL test, where the service then stopped instead
of recovering by itself. A stub consumer stands in for kafka-python here; the real broker's
story is ``test_broker_restart.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from kafka.errors import KafkaConnectionError, TopicAuthorizationFailedError

from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.source import _ConsumerThread


class _Consumer:
    def __init__(self, *outcomes: Any) -> None:
        self.outcomes = list(outcomes)
        self.polls = 0

    def poll(self, *, timeout_ms: int, max_records: int) -> dict[Any, list[Any]]:
        assert timeout_ms > 0 and max_records == 10
        self.polls += 1
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return dict(outcome)


def _thread() -> _ConsumerThread:
    config = KafkaClientConfig(bootstrap_servers="kafka:9092")
    thread = _ConsumerThread(config, {}, ["t"], None, "earliest", 10)
    thread.stop()  # the wait after a failed poll returns at once
    return thread


def test_a_refused_connection_gives_an_empty_poll_and_the_next_poll_reads() -> None:
    consumer = _Consumer(KafkaConnectionError("111 ECONNREFUSED"), {"tp": ["record"]})
    thread = _thread()
    assert thread.poll(consumer) == {}
    assert thread.poll(consumer) == {"tp": ["record"]}
    assert consumer.polls == 2


def test_an_error_that_retrying_cannot_fix_still_ends_the_source() -> None:
    with pytest.raises(TopicAuthorizationFailedError):
        _thread().poll(_Consumer(TopicAuthorizationFailedError()))
