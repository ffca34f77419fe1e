"""Broker timeouts are weather, not death: against the in-memory broker, in virtual time.

A restore whose changelog read times out, or whose ``init_transactions`` does (a transaction
coordinator still loading, a slow link), leaves its partition ``taken`` with the error as its
reason in ``/readyz``, tries again after a back-off, and serves once the broker answers: the
service never exits, and the operations journaled before come back.
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import structlog
import trio
import trio.testing

from purgatory.service.app import Service
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport
from tests.service.fake_transactions import Transactions
from tests.service.journal.test_durability import (
    CALLBACKS,
    EPOCH_MS,
    INPUTS,
    SETTINGS,
    _broker,
    _register,
)
from tests.service.journal.test_transactions import SETTINGS as TRANSACTIONAL


async def _restart_with(
    broker: FakeBroker,
    *,
    coordinator: Transactions | None = None,
    fail_reads: int = 0,
    fail_opens: int = 0,
) -> tuple[list[dict[str, object]], list[MutableMapping[str, Any]]]:
    """Journal two operations with one service, then start another while the broker's
    answers time out (``fail_reads`` reads, ``fail_opens`` transactional opens); returns the
    second's ``/readyz`` partitions that said why they waited, and its logs."""
    settings = SETTINGS if coordinator is None else TRANSACTIONAL
    fake = FakeTransport(broker, transactions=coordinator)
    waited: list[dict[str, object]] = []

    async def serve(stop: trio.Event, *, watch: bool) -> None:
        async with (
            fake.open_sink() as sink,
            fake.open_reader(read_committed=coordinator is not None) as reader,
            fake.open_source(topics=list(INPUTS), group_id="g", assignment=None) as source,
            fake.open_transactions(id_prefix="g", group_id="g")
            if coordinator is not None
            else _nothing() as txns,
        ):
            service = Service(
                settings, Clock(offset_ms=EPOCH_MS), source, sink, reader, transactions=txns
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: service.run(stop, serve_http=False))
                while watch and not service.status.is_ready():
                    partitions = service.status.readiness()["partitions"]
                    assert isinstance(partitions, dict)
                    waited.extend(p for p in partitions.values() if p.get("reason"))
                    await trio.sleep(0.05)

    first = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: serve(first, watch=False))
        _register(broker, "s0", "a", ["k"], timeout_ms=600_000)
        _register(broker, "s1", "b", [], timeout_ms=3_000)
        await trio.sleep(1)
        first.set()
    broker.fail_reads, broker.fail_opens = fail_reads, fail_opens
    with structlog.testing.capture_logs() as logged:
        second = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: serve(second, watch=True))
            await trio.sleep(60)
            second.set()
    return waited, logged


class _nothing:  # noqa: N801 - a context manager that gives None
    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, *_exc: object) -> None:
        return None


def _outcomes(broker: FakeBroker) -> set[tuple[str, str]]:
    return {
        (doc["op_id"], doc["outcome"])
        for doc in (json.loads(r.value or b"") for r in broker.records(CALLBACKS))
    }


async def test_restore_reads_that_time_out_are_tried_again_and_the_replica_stays_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    broker_fail = 5  # both partitions' first reads, and then some
    waited, logged = await _restart_with(broker, fail_reads=broker_fail)
    assert waited, "/readyz never said why a partition waited"
    assert {p["state"] for p in waited} <= {"taken", "restoring"}  # waiting, or trying again
    assert any("RequestTimedOutError" in str(p["reason"]) for p in waited)
    failures = [doc for doc in logged if doc["event"] == "partition_restore_failed"]
    assert len(failures) == broker_fail
    assert all(doc["retry_in_s"] > 0 for doc in failures)
    assert {"partition_serving"} <= {doc["event"] for doc in logged}
    assert ("b", "expired") in _outcomes(broker)  # the journaled timer came back and fired


async def test_init_transactions_that_time_out_are_tried_again_and_the_replica_stays_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    coordinator = Transactions(broker)
    waited, logged = await _restart_with(broker, coordinator=coordinator, fail_opens=3)
    assert any("KafkaTimeoutError" in str(p["reason"]) for p in waited)
    failures = [doc for doc in logged if doc["event"] == "partition_restore_failed"]
    assert len(failures) == 3
    assert ("b", "expired") in _outcomes(broker)
