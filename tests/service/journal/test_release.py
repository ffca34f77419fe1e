"""The release alone, in each delivery mode: nothing leaves before what caused it is durable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import trio
import trio.testing

from purgatory._core import Outcome, OutcomeKind, TimeDomain
from purgatory.service.journal.acknowledged import AcknowledgedWriter
from purgatory.service.journal.changelog import Changelog
from purgatory.service.journal.release import ImmediateRelease, JournaledRelease
from purgatory.service.kafka.transport import (
    ConsumedRecord,
    OutRecord,
    Refusal,
    SendFailure,
)
from tests.service.fake_kafka import FakeBroker, FakeTransport

CHANGELOG = "purgatory.changelog"


def outcome(sequence: int, partition: int = 0) -> Outcome:
    return Outcome(
        op_id=f"op-{sequence}",
        scope="s",
        outcome=OutcomeKind.COMPLETED,
        registered_ms=0,
        outcome_ms=1,
        deadline_ms=2,
        time_domain=TimeDomain.PROCESSING_TIME,
        sequence=sequence,
        partition=partition,
    )


class Outlet:
    """Egress, as the calls it was given."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def put(self, outcomes: Sequence[Outcome]) -> None:
        self.calls.append(("put", [o.sequence for o in outcomes]))

    def put_dead_letter(self, refusal: Refusal) -> None:
        self.calls.append(("dead_letter", refusal.reason))

    def put_commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        self.calls.append(("commit", dict(offsets)))

    def records_for(self, outcomes: Sequence[Outcome]) -> list[OutRecord]:
        return [OutRecord("callbacks", None, o.op_id.encode()) for o in outcomes]

    def settled(self, outcomes: Sequence[Outcome]) -> None:
        self.calls.append(("settled", [o.sequence for o in outcomes]))

    def letter_for(self, refusal: Refusal) -> OutRecord:
        return OutRecord("dead", None, refusal.reason.encode())

    def letter_settled(self, letter: OutRecord, *, source_topic: str, label: str) -> None:
        self.calls.append(("letter_settled", label))

    def undeliverable(self, record: OutRecord, failure: SendFailure) -> OutRecord:
        return record


REFUSAL = Refusal(ConsumedRecord("purgatory.signals", 0, 7, b"s", b"{", 0), "bad", None, "invalid")


async def test_journaled_outcomes_and_commits_wait_for_the_journal_dead_letters_keep_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker({CHANGELOG: 1})
    async with FakeTransport(broker).open_sink() as sink, trio.open_nursery() as nursery:
        changelog = Changelog(AcknowledgedWriter(sink, topic=CHANGELOG), max_record_bytes=10_000)
        await nursery.start(changelog.run)
        outlet = Outlet()
        release = JournaledRelease(changelog, outlet)
        broker.stall = trio.Event()  # the broker acknowledges nothing for now
        changelog.position(0, "purgatory.signals", 8)  # what the batch's entries reached
        release.decided([outcome(1), outcome(2)])
        release.refused(REFUSAL)
        release.consumed(0, {("purgatory.signals", 0): 8})
        await trio.sleep(30)
        assert outlet.calls == [("dead_letter", "bad")]  # nothing decided leaves meanwhile
        broker.stall.set()
        await changelog.durable()
        changelog.close()
    assert outlet.calls == [
        ("dead_letter", "bad"),
        ("put", [1, 2]),
        ("commit", {("purgatory.signals", 0): 8}),
    ]
    assert len(broker.records(CHANGELOG)) == 1


async def test_restored_outcomes_go_out_at_once_they_are_journaled_already(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker({CHANGELOG: 1})
    async with FakeTransport(broker).open_sink() as sink:
        changelog = Changelog(AcknowledgedWriter(sink, topic=CHANGELOG), max_record_bytes=10_000)
        outlet = Outlet()
        broker.stall = trio.Event()
        JournaledRelease(changelog, outlet).resent([outcome(3)])
    assert outlet.calls == [("put", [3])]


def test_without_a_journal_everything_goes_out_at_once() -> None:
    outlet = Outlet()
    release = ImmediateRelease(outlet)
    release.decided([outcome(1)])
    release.refused(REFUSAL)
    release.consumed(0, {("purgatory.requests", 0): 3})
    assert outlet.calls == [
        ("put", [1]),
        ("dead_letter", "bad"),
        ("commit", {("purgatory.requests", 0): 3}),
    ]
