"""The start-time transactions probe waits out weather and stops only on a definite answer.

In virtual time, against a fake broker whose transaction coordinator (the in-memory one of
``fake_transactions``) is still loading for a while, never answers, or fences nobody: a
coordinator that is loading is waited for, each wait logged, and the probe passes once it
fences; a broker that never answers fails the start within the bound as a transport problem,
whose message does not send the operator to another delivery mode; a broker that takes a call
of a producer it should have fenced (as the embedded broker does) or answers that it cannot do
transactions is refused at once, with the error that says so.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from kafka.errors import (
    CoordinatorLoadInProgressError,
    CoordinatorNotAvailableError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    NotCoordinatorError,
    RequestTimedOutError,
    TransactionalIdAuthorizationFailedError,
    UnsupportedVersionError,
)

from purgatory._core import ConfigError, TransportError
from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.transactions import PROBE_RETRY, check_transactions
from purgatory.service.kafka.transport import ProducerFencedError
from tests.service.fake_kafka import FakeBroker
from tests.service.fake_transactions import Transactions

CONFIG = KafkaClientConfig("broker:9092")
PROBE_ID = "g-probe"
MAX_BLOCK_S = 5.0  # the client's own bound on a call: half of the probe's default attempt


class _FencesNobody(Transactions):
    """A coordinator that takes every call and never fences (the embedded broker's way)."""

    def init(self, txid: str) -> int:
        self.epochs[txid] = 0
        return 0


@dataclass
class _Broker:
    """One probe attempt against a broker whose coordinator answers from ``loading_until_s``
    (virtual time) on: before that, a call waits the client's ``max_block_ms`` and times out
    as kafka-python's does; ``errors`` are answered first, one per attempt; a ``silent``
    broker never answers at all."""

    coordinator: Transactions = field(
        default_factory=lambda: Transactions(FakeBroker({"requests": 1}))
    )
    loading_until_s: float = 0.0
    errors: list[KafkaError] = field(default_factory=list)
    silent: bool = False
    attempts: list[float] = field(default_factory=list)

    async def attempt(self, transactional_id: str) -> bool:
        self.attempts.append(trio.current_time())
        if self.silent:
            await trio.sleep_forever()
        if self.errors:
            await trio.sleep(0.01)
            raise self.errors.pop(0)
        wait_s = self.loading_until_s - trio.current_time()
        if wait_s > MAX_BLOCK_S:
            await trio.sleep(MAX_BLOCK_S)
            raise KafkaTimeoutError(
                "Timeout expired while initializing transactional state in 5000 ms."
            )
        await trio.sleep(max(wait_s, 0.0))
        older = self.coordinator.init(transactional_id)
        self.coordinator.init(transactional_id)  # the newer producer takes the id
        try:
            self.coordinator.begin(transactional_id, older)
            self.coordinator.send_offsets(transactional_id, older, {})
        except ProducerFencedError:
            return True
        return False


def _waits(logs: list[MutableMapping[str, Any]]) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == "transaction_probe_unanswered"]


async def test_a_coordinator_still_loading_is_waited_out_and_each_wait_logged(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _Broker(loading_until_s=17.0)  # three attempts time out, the fourth is answered
    with structlog.testing.capture_logs() as logs:
        await check_transactions(CONFIG, transactional_id=PROBE_ID, attempt=broker.attempt)
    pauses = [PROBE_RETRY.delay_s(n) for n in range(3)]
    assert broker.attempts == [0.0, 5.5, 11.5, 18.5]  # each after its time-out and its pause
    assert trio.current_time() == 18.5
    waits = _waits(logs)
    assert [w["attempt"] for w in waits] == [1, 2, 3]
    assert [w["retry_in_ms"] for w in waits] == [round(p * 1000) for p in pauses]
    assert all(w["error"].startswith("KafkaTimeoutError: ") for w in waits)
    assert all(w["log_level"] == "warning" for w in waits)
    assert [w["waited_ms"] for w in waits] == [5_000, 10_500, 16_500]


@pytest.mark.parametrize(
    "error",
    [
        CoordinatorLoadInProgressError(),
        CoordinatorNotAvailableError(),
        NotCoordinatorError(),
        RequestTimedOutError(),
        KafkaConnectionError("socket disconnected"),
        KafkaTimeoutError("Unable to bootstrap from broker:9092"),
    ],
    ids=lambda error: type(error).__name__,
)
async def test_a_retriable_answer_is_tried_again(
    autojump_clock: trio.testing.MockClock, error: KafkaError
) -> None:
    broker = _Broker(errors=[error, error])
    with structlog.testing.capture_logs() as logs:
        await check_transactions(CONFIG, transactional_id=PROBE_ID, attempt=broker.attempt)
    assert len(broker.attempts) == 3
    assert [type(error).__name__ in w["error"] for w in _waits(logs)] == [True, True]


async def test_a_broker_that_never_answers_fails_the_start_as_a_transport_error_in_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _Broker(silent=True)
    with structlog.testing.capture_logs() as logs, pytest.raises(TransportError) as failed:
        await check_transactions(CONFIG, transactional_id=PROBE_ID, attempt=broker.attempt)
    assert trio.current_time() == 120.0  # the default bound, not a moment more
    message = str(failed.value)
    assert "did not answer the start-time transaction probe within 120000 ms" in message
    assert "the last: no answer" in message and "check that it is running" in message
    assert "cannot do Kafka transactions" not in message
    assert "PURGATORY_DELIVERY=acknowledged" not in message
    # Each attempt waits its 10 s, then the pause doubles from 0.5 s to at most 5 s; the bound
    # ends the ninth pause.
    assert broker.attempts == [0.0, 10.5, 21.5, 33.5, 47.5, 62.5, 77.5, 92.5, 107.5]
    waits = _waits(logs)
    assert len(waits) == 9 and {w["error"] for w in waits} == {"no answer within 10000 ms"}


async def test_a_shorter_bound_is_kept(autojump_clock: trio.testing.MockClock) -> None:
    broker = _Broker(loading_until_s=3_600.0)
    with pytest.raises(TransportError, match=r"within 12000 ms \(3 attempts; the last: Kafka"):
        await check_transactions(
            CONFIG, transactional_id=PROBE_ID, wait_ms=12_000, attempt=broker.attempt
        )
    assert trio.current_time() == 12.0


async def test_a_broker_that_fences_nobody_is_refused_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _Broker(coordinator=_FencesNobody(FakeBroker({"requests": 1})))
    with structlog.testing.capture_logs() as logs, pytest.raises(ConfigError) as refused:
        await check_transactions(CONFIG, transactional_id=PROBE_ID, attempt=broker.attempt)
    message = str(refused.value)
    assert "PURGATORY_DELIVERY=transactional" in message
    assert "cannot do Kafka transactions" in message and "fences nobody" in message
    assert "PURGATORY_DELIVERY=acknowledged" in message
    assert len(broker.attempts) == 1 and _waits(logs) == []


@pytest.mark.parametrize(
    "error",
    [UnsupportedVersionError(), TransactionalIdAuthorizationFailedError()],
    ids=lambda error: type(error).__name__,
)
async def test_a_broker_that_answers_it_cannot_is_refused_at_once(
    autojump_clock: trio.testing.MockClock, error: KafkaError
) -> None:
    broker = _Broker(errors=[error])
    refused = f"cannot do Kafka transactions: .*{type(error).__name__}"
    with pytest.raises(ConfigError, match=refused):
        await check_transactions(CONFIG, transactional_id=PROBE_ID, attempt=broker.attempt)
    assert len(broker.attempts) == 1
