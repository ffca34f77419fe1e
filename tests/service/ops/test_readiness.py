"""Readiness: not ready until the first partitions are restored, then ready through rebalances.

The service over the in-memory broker, in virtual time: a fence makes a partition restore
again while the replica serves; ``/readyz`` stays 200 and names the partition restoring. And
with stand-ins for the follower, the rule itself: a member given no partition is ready, a
member not yet given its partitions is not, a stop or stopped inputs make it unready at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import trio
import trio.testing

from purgatory.service.dispatch.follow import Follower
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.ops.readiness import Readiness
from purgatory.service.ownership.layout import TopicLayout
from tests.service.journal.test_durability import SlowReader, _broker, _with_http


@dataclass
class _Follower:
    joined_now: bool = False
    caught_up_now: bool = False

    def joined(self) -> bool:
        return self.joined_now

    def caught_up(self) -> bool:
        return self.caught_up_now


@dataclass
class _Table:
    inputs_stopped: str | None = None


def _readiness(follower: _Follower, table: _Table) -> Readiness:
    status = Readiness(
        cast("Follower", follower), cast("PartitionTable", table), cast("TopicLayout", None), None
    )
    status.started = True
    return status


def test_ready_once_its_first_partitions_are_restored_and_then_through_every_move() -> None:
    follower, table = _Follower(), _Table()
    status = _readiness(follower, table)
    follower.caught_up_now = True  # nothing held yet: the group has not answered
    assert not status.is_ready()
    follower.joined_now, follower.caught_up_now = True, False  # given partitions, restoring
    assert not status.is_ready()
    follower.caught_up_now = True
    assert status.is_ready()
    follower.caught_up_now = False  # a rebalance: a partition moves here and restores
    assert status.is_ready()
    table.inputs_stopped = "the topics' partition counts changed"
    assert not status.is_ready()
    table.inputs_stopped = None
    status.started = False  # the stop began
    assert not status.is_ready()


def test_a_member_given_no_partition_is_ready() -> None:
    status = _readiness(_Follower(joined_now=True, caught_up_now=True), _Table())
    assert status.is_ready()


async def test_readyz_stays_200_while_a_served_partition_restores_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    release = trio.Event()
    reader = SlowReader(broker, release, frozenset({1}))
    release.set()  # the first restores are quick

    async def during(service: Any, http: Any) -> None:
        while service.table.serving() != frozenset({0, 1}):
            await trio.sleep(0.01)
        assert (await http.get("/readyz")).status_code == 200
        reader.release = trio.Event()  # the next restore of partition 1 waits
        reader.started.clear()
        service.follower.fenced(1)  # another writer appended: partition 1 restores again
        while 1 not in reader.started:
            await trio.sleep(0.01)
        ready = await http.get("/readyz")
        assert ready.status_code == 200 and ready.json()["ready"] is True
        assert ready.json()["partitions"]["1"]["state"] != "serving"
        assert ready.json()["partitions"]["0"]["state"] == "serving"
        reader.release.set()
        while service.table.serving() != frozenset({0, 1}):
            await trio.sleep(0.01)

    await _with_http(broker, during, reader=reader)
