"""Warm standbys and a graceful stop that leaves warm: against the in-memory broker, in
virtual time.

A partition the group asks this replica to warm is rebuilt and kept current from the journal
while its owner serves it; once given here, its restore replays only the journal after the
standby's last replay, and finds every write the old owner acknowledged. A replica that stops
gracefully serves its partitions until the group has moved them (or nobody is left to take
them, or ``hand_over_ms`` has passed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
import trio.testing

from purgatory._codec import RegisterRequest
from purgatory.service.app import Service
from purgatory.service.dispatch.follow import Follower
from purgatory.service.settings import Settings
from tests.service.dispatch.test_hand_over import MOVED, SETTINGS, TAKEN, _member
from tests.service.fake_kafka import FakeSource, FakeTransport
from tests.service.journal.test_durability import REQUESTS, _broker


def _scope(broker: object, partition: int) -> str:
    return next(
        f"r{i}"
        for i in range(200)
        if broker.partition_for(REQUESTS, f"r{i}".encode()) == partition  # type: ignore[attr-defined]
    )


async def _register(service: object, scope: str, op_ids: range) -> None:
    for n in op_ids:
        service.flow.register(  # type: ignore[attr-defined]
            RegisterRequest(op_id=f"op{n}", scope=scope, keys=(f"k{n}",), timeout_ms=600_000)
        )
    await service.gate.durable([MOVED], bounded=True)  # type: ignore[attr-defined]


async def _until(check: object, *, within_s: float = 30.0) -> None:
    with trio.fail_after(within_s):
        while not check():  # type: ignore[operator]
            await trio.sleep(0.05)


@asynccontextmanager
async def _owner_and_next(
    ops: int,
) -> AsyncIterator[tuple[str, Service, FakeSource, Service, FakeSource]]:
    """The partition's owner with ``ops`` registrations journaled in it, and a member that
    serves partition 0 only and is asked to warm ``MOVED``, once it keeps it warm: the scope,
    then each one's service and source."""
    broker = _broker()
    scope = _scope(broker, MOVED)
    async with _member(broker, [0, MOVED], seed=0, fake=FakeTransport(broker)) as (old, source):
        await _register(old, scope, range(ops))
        async with _member(broker, [0], seed=1, fake=FakeTransport(broker)) as (new, taker):
            assert new.follower.standbys.warm() == frozenset()
            taker.warm_asked = {MOVED}  # the group asks the next owner to warm it
            await _until(lambda: MOVED in new.follower.standbys.warm())
            assert taker.warm_reported[-1] == frozenset({MOVED})
            yield scope, old, source, new, taker


async def test_a_partition_given_warm_replays_only_the_journal_after_its_standby(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _owner_and_next(300) as (scope, old, source, new, taker):
        follower: Follower = new.follower
        await _register(old, scope, range(300, 310))  # the owner goes on meanwhile
        await source.revoke(TAKEN)  # round one: the old owner hands it over
        taker.give(TAKEN)  # round two: given to the warm next owner
        await _until(lambda: MOVED in new.table.serving())
        replayed = follower.progress[MOVED].entries
        # Only what the owner appended after the standby's last replay (the 10 last
        # registrations), never the whole journal's 310; and every write the old owner
        # acknowledged is there.
        assert replayed == 10, replayed
        assert all(new.reads.lookup(scope, f"op{n}") is not None for n in range(310))
        assert follower.standbys.warm() == frozenset()  # taken over, no standby left


async def test_a_standby_the_group_no_longer_asks_for_is_dropped(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _owner_and_next(50) as (_, _old, _source, new, taker):
        taker.warm_asked = set()  # the partition stays where it is
        await _until(lambda: new.follower.standbys.warm() == frozenset())
        assert taker.warm_reported[-1] == frozenset()
        assert new.table.serving() == {0}


async def test_a_graceful_stop_serves_until_the_group_has_moved_its_partitions(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    scope = _scope(broker, MOVED)
    stopped = trio.Event()
    async with _member(broker, [0, MOVED], seed=0, fake=FakeTransport(broker)) as (old, source):
        source.alone = False  # another replica is there to take over
        await _register(old, scope, range(10))
        stop_began = trio.current_time()

        async def stop() -> None:
            # What _member's exit does, and SIGTERM: the service's own stop event.
            await old.follower.leave(within_s=SETTINGS.hand_over_ms / 1000)
            stopped.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(stop)
            await trio.sleep(3)
            assert source.leaving
            assert not stopped.is_set()
            assert old.table.serving() == {0, MOVED}  # still served: writes still land
            await _register(old, scope, range(10, 20))
            await source.revoke(TAKEN | {(t, 0) for t, _ in TAKEN})  # the group moved both
            await stopped.wait()
        assert trio.current_time() - stop_began < SETTINGS.hand_over_ms / 1000


async def test_a_graceful_stop_waits_no_longer_than_hand_over_ms(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker()
    settings: Settings = dataclasses.replace(SETTINGS, hand_over_ms=4_000)
    async with _member(
        broker, [0, MOVED], seed=0, fake=FakeTransport(broker), settings=settings
    ) as (old, source):
        source.alone = False  # nobody ever warms its partitions
        began = trio.current_time()
        await old.follower.leave(within_s=settings.hand_over_ms / 1000)
        assert 4.0 <= trio.current_time() - began < 4.2
        assert old.table.serving() == {0, MOVED}  # the stop goes on from here, as before
