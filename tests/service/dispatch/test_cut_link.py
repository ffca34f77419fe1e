"""A replica cut from the broker while its partitions move, against the in-memory broker.

The story of a cut link, in virtual time: replica A owns every partition; its link to the
broker is cut with a journal record in flight (a signal it applied, completing an operation
in its memory); the group gives the partitions to replica B, which restores them from the
changelog (without A's record), serves them, and decides the same operation otherwise (it
expires). Then A's link heals: its record lands *after* B's. A must release nothing that
record caused: the record is void for every replay (it did not land where A expected it), A
logs ``partition_fenced``, writes no delivered mark for the partition, and whatever it learns
first (its link healed, or the group's revocation) the callbacks topic holds exactly what a
replay of the changelog decides, one outcome per operation.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import structlog
import trio
import trio.testing

from purgatory._codec import SignalRecord
from purgatory.service.app import Service
from purgatory.service.errors import JournalStalledError, NotServingError
from purgatory.service.journal.format import counts, decode_journal_record
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeSource, FakeTransport
from tests.service.journal.test_durability import (
    CALLBACKS,
    CHANGELOG,
    EPOCH_MS,
    INPUTS,
    REQUESTS,
    _broker,
    _check_outcomes_once,
    _register,
)
from tests.service.journal.test_fencing import _replayed

# A short grace, so a hand-over that waits for a cut link gives up within the test's time.
CUT_SETTINGS = Settings.from_env({}, topic_partitions=2, shutdown_grace_ms=2_000)


@asynccontextmanager
async def _replica(
    broker: FakeBroker, transport: FakeTransport, *, seed: int
) -> AsyncIterator[tuple[Service, FakeSource]]:
    """A service over ``transport`` (Kafka inputs, every partition) while the body runs."""
    async with (
        transport.open_sink() as sink,
        transport.open_reader() as reader,
        transport.open_source(topics=list(INPUTS), group_id="g", assignment=None) as source,
    ):
        service = Service(
            CUT_SETTINGS,
            Clock(offset_ms=EPOCH_MS),
            source,
            sink,
            reader,
            jitter=random.Random(seed),
        )
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: service.run(stop, serve_http=False))
            while len(service.table.serving()) < 2:
                await trio.sleep(0.01)
            yield service, source
            stop.set()


def _scope_on(broker: FakeBroker, partition: int) -> str:
    return next(
        f"c{i}" for i in range(100) if broker.partition_for(REQUESTS, f"c{i}".encode()) == partition
    )


@pytest.mark.parametrize("revoked_first", [False, True], ids=["heal-first", "revoke-first"])
async def test_a_record_in_flight_behind_a_cut_link_that_lands_after_the_new_owner_is_void(
    revoked_first: bool, autojump_clock: trio.testing.MockClock
) -> None:
    broker = _broker()
    scope = _scope_on(broker, 0)
    link_a = FakeTransport(broker).link
    stale_answer: list[str] = []
    with structlog.testing.capture_logs() as logged:
        async with _replica(broker, FakeTransport(broker, link=link_a), seed=0) as (a, source_a):
            # Pending in A: "b" waits for key k until its deadline; "t" is a plain timer.
            _register(broker, scope, "b", ["k"], timeout_ms=3_000)
            _register(broker, scope, "other", ["j"], timeout_ms=600_000)
            await trio.sleep(0.5)
            assert a.reads.lookup(scope, "b") is not None

            link_a.cut()  # A is cut from the broker, with nothing in flight yet

            async def write_in_a() -> None:
                # A client's signal reaches A over HTTP: applied, journaled, not acknowledged.
                a.flow.signal(SignalRecord(scope=scope, key="k"))
                try:
                    await a.gate.durable([0], bounded=True)
                    stale_answer.append("ok")
                except (JournalStalledError, NotServingError) as exc:
                    stale_answer.append(type(exc).__name__)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(write_in_a)
                await trio.sleep(0.1)
                found = a.reads.lookup(scope, "b")
                assert found is not None and found[1] is not None  # completed in A's memory
                assert found[1].outcome.value == "completed"

                # The group gives the partitions to B, which restores them and serves them.
                async with _replica(broker, FakeTransport(broker), seed=1) as (b, _source_b):
                    await trio.sleep(4)  # "b" expires in B: its deadline passes, no signal
                    _register(broker, scope, "after", ["j"], timeout_ms=600_000)
                    await trio.sleep(0.5)
                    if revoked_first:
                        nursery.start_soon(
                            source_a.revoke, {(t, p) for t in INPUTS for p in (0, 1)}
                        )
                        await trio.sleep(0.5)
                    link_a.heal()  # healed: A's record lands after B's
                    await trio.sleep(0.5)
                    if not revoked_first:
                        await source_a.revoke({(t, p) for t in INPUTS for p in (0, 1)})
                    await trio.sleep(3)
                    assert b.changelog is not None
                    b_serves = b.table.serving()
                assert b_serves == {0, 1}
            a_fenced = a.changelog.fenced if a.changelog is not None else 0

    # A's write was never acknowledged to its client: 503 (stalled, or fenced), never 2xx.
    assert len(stale_answer) == 1
    assert stale_answer[0] in {"JournalStalledError", "NotServingError"}
    # Only what the log decides left: "b" expired, never completed; one outcome each.
    outcomes = {
        (doc["op_id"], doc["outcome"])
        for doc in (json.loads(r.value or b"") for r in broker.records(CALLBACKS))
    }
    assert ("b", "expired") in outcomes and ("b", "completed") not in outcomes
    replayed = _replayed(broker)
    for record in broker.records(CALLBACKS):
        doc = json.loads(record.value or b"")
        assert record.value == replayed[(doc["scope"], doc["op_id"])]
    _check_outcomes_once(broker)
    events = [doc["event"] for doc in logged]
    assert "partition_fenced" in events and a_fenced >= 1
    # A's record landed after B's records, where A did not expect it: void.
    void = []
    for record in broker.topics[CHANGELOG][0]:
        doc = decode_journal_record(record.value or b"")
        if doc is not None and not counts(doc, record.offset):
            void.append(doc)
    [stale] = [doc for doc in void if ["signal", "k"] in [[e[0], e[3]] for e in doc["entries"]]]
    # A wrote no delivered mark after it: it would carry the next offset A expected. (B's
    # records that landed after A's void one are void too: B is fenced and restores again.)
    assert not [doc for doc in void if doc["at"] == stale["at"] + 1]
