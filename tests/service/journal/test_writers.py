"""The journal's two writers alone, on the in-memory broker: what each says is void."""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from purgatory._core import UsageError
from purgatory.service.journal.acknowledged import AcknowledgedWriter
from purgatory.service.journal.batch import Batch, Part, Stall
from purgatory.service.journal.modes import (
    Acknowledged,
    Over,
    Transactional,
    Unjournaled,
    delivery_mode,
)
from purgatory.service.journal.transactional import TransactionalWriter
from purgatory.service.kafka.transport import OutRecord, SendFailure
from purgatory.service.settings import Settings
from tests.service.fake_kafka import FakeBroker, FakeTransport
from tests.service.fake_transactions import Transactions

CHANGELOG = "purgatory.changelog"


def batch(*partitions: int) -> Batch:
    return Batch(parts={p: Part(entries=['["advance",1]']) for p in partitions})


async def test_the_acknowledged_writer_voids_a_record_that_lands_after_another_writers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker({CHANGELOG: 2})
    async with FakeTransport(broker).open_sink() as sink:
        writer = AcknowledgedWriter(sink, topic=CHANGELOG, delivered=lambda p: 10 + p)
        writer.expect(0, 0)
        stall = Stall(5_000, lambda: 0)
        assert await writer.write(batch(0, 1), set(), stall) == {}  # 1 is not taken over
        broker.append(CHANGELOG, b"journal", b"{}", partition=0)  # another writer, meanwhile
        assert await writer.write(batch(0), set(), stall) == {0: True}
        assert await writer.write(batch(0), set(), stall) == {}  # forgotten: unchecked
    first = json.loads(broker.topics[CHANGELOG][0][0].value or b"")
    second = json.loads(broker.topics[CHANGELOG][0][2].value or b"")
    assert (first["at"], second["at"]) == (0, 1)  # where each had to land
    assert first["delivered"] == 10
    assert (writer.batches, writer.records) == (3, 4)


async def test_the_transactional_writer_voids_what_a_newer_owner_fenced(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = FakeBroker({CHANGELOG: 1, "purgatory.callbacks": 1})
    coordinator = Transactions(broker)
    old, new = (
        FakeTransport(broker, transactions=coordinator),
        FakeTransport(broker, transactions=coordinator),
    )

    def undeliverable(record: OutRecord, failure: SendFailure) -> OutRecord:
        raise AssertionError("nothing is refused here")

    async with (
        old.open_transactions(id_prefix="g", group_id="g") as mine,
        new.open_transactions(id_prefix="g", group_id="g") as theirs,
    ):
        writer = TransactionalWriter(
            mine, topic=CHANGELOG, undeliverable=undeliverable, own_topics=(CHANGELOG,)
        )
        await writer.open_partition(0)
        part = Part(entries=['["advance",1]'])
        part.outbound.append(OutRecord("purgatory.callbacks", b"s", b"callback"))
        assert await writer.write(Batch(parts={0: part}), set(), None) == {}
        assert len(coordinator.visible("purgatory.callbacks", 0)) == 1
        await theirs.open(0)  # the next owner takes the transactional id
        assert await writer.write(batch(0), set(), None) == {0: True}
    assert len(coordinator.visible(CHANGELOG, 0)) == 1  # the fenced one is not visible


def test_one_factory_names_the_modes() -> None:
    assert isinstance(delivery_mode(Settings.from_env({})), Acknowledged)
    assert isinstance(delivery_mode(Settings.from_env({"PURGATORY_JOURNAL": "false"})), Unjournaled)
    transactional = delivery_mode(Settings.from_env({"PURGATORY_DELIVERY": "transactional"}))
    assert isinstance(transactional, Transactional)
    assert transactional.read_committed is True


def test_a_transactional_journal_needs_its_producers() -> None:
    mode = delivery_mode(Settings.from_env({"PURGATORY_DELIVERY": "transactional"}))
    with pytest.raises(UsageError, match="transactional producers"):
        mode.journal(Over(None, None, None, lambda _p: 0, lambda _p: None))  # type: ignore[arg-type]
