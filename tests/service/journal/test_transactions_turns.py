"""A fenced transactional owner that takes its partitions again: the two take turns, in virtual
time, against the in-memory broker and its transaction coordinator.

What the zombie test on Apache Kafka (``test_zombie.py``) meets when the frozen owner wakes: its
first transaction is fenced, and its consumer has not yet heard that the group moved on, so it
still holds the partition and, after its fence back-off, restores it again, and its
``init_transactions`` fences the group's owner in turn. Here two services hold the same
partitions for a while (each fence makes the fenced one wait, restore and fence the other),
then one goes and the other runs alone. Whatever the interleaving of their transactions, a
``read_committed`` reader sees exactly one callback per operation, each the outcome asked for:
every commit was decided on the committed log as its writer's ``init_transactions`` left it.
"""

from __future__ import annotations

import functools

import pytest
import trio
import trio.testing

from purgatory.service.app import Service
from tests.service.fake_kafka import FakeBroker
from tests.service.fake_transactions import Transactions
from tests.service.journal.test_durability import SCOPES, _broker
from tests.service.journal.test_durability import _register as register
from tests.service.journal.test_durability import _signal as signal
from tests.service.journal.test_transactions import _check_exactly_once, _serve


async def _feed(broker: FakeBroker, expected: dict[tuple[str, str], str]) -> None:
    """Barriers completed by signals and timers that expire, spread over about 1.5 s."""
    for n in range(30):
        scope = SCOPES[n % len(SCOPES)]
        keys = [f"k{n}a", f"k{n}b"]
        register(broker, scope, f"op{n}", keys, timeout_ms=3_600_000)
        register(broker, scope, f"t{n}", [], timeout_ms=20 + 7 * (n % 5))
        expected[(scope, f"op{n}")] = "completed"
        expected[(scope, f"t{n}")] = "expired"
        await trio.sleep(0.02)
        signal(broker, scope, keys[0])
        signal(broker, scope, keys[1])
        await trio.sleep(0.03)


@pytest.mark.parametrize("second_ack_delay_s", [0.0005, 0.002, 0.007])
async def test_two_owners_that_take_turns_commit_each_outcome_once(
    second_ack_delay_s: float, autojump_clock: trio.testing.MockClock
) -> None:
    broker = _broker()
    coordinator = Transactions(broker)
    expected: dict[tuple[str, str], str] = {}
    first: list[Service] = []
    second: list[Service] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            functools.partial(_serve, broker, coordinator, stop, first, seed=0, ack_delay_s=0.002)
        )
        nursery.start_soon(_feed, broker, expected)
        await trio.sleep(0.1)
        with trio.move_on_after(3.0):  # the second holds the same partitions, then goes
            await _serve(
                broker, coordinator, trio.Event(), second, seed=1, ack_delay_s=second_ack_delay_s
            )
        await trio.sleep(70)  # the first alone: its back-off, its restore, its commits
        stop.set()
    # They took turns: each was fenced by the other at least once.
    assert sum(first[0].follower.fences().values()) > 0
    assert sum(second[0].follower.fences().values()) > 0
    outcomes = _check_exactly_once(coordinator)
    assert {ident: doc["outcome"] for ident, doc in outcomes.items()} == expected
