"""Waiters: a long poll wakes when its outcome is delivered, not when it is decided."""

from __future__ import annotations

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from purgatory.service.dispatch.waiters import Waiters

_IDENTS = st.tuples(st.sampled_from(["s0", "s1"]), st.sampled_from(["a", "b", "c"]))


@given(steps=st.lists(st.tuples(st.booleans(), _IDENTS), max_size=40))
def test_undelivered_follows_a_set_model(steps: list[tuple[bool, tuple[str, str]]]) -> None:
    waiters, model = Waiters(), set()
    for decide, ident in steps:
        if decide:
            waiters.decided([ident])
            model.add(ident)
        else:
            waiters.delivered(ident)
            model.discard(ident)
        assert all(waiters.undelivered(i) == (i in model) for _, i in steps)
    assert waiters.counts() == (len(model), 0)


async def test_a_wait_ends_at_the_delivery_or_at_its_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    waiters = Waiters()
    ident = ("s0", "a")
    waiters.decided([ident])
    start = trio.current_time()
    await waiters.wait(ident, 2.0)  # nobody delivers: the timeout ends it
    assert trio.current_time() - start == 2.0 and waiters.undelivered(ident)
    async with trio.open_nursery() as nursery:

        async def deliver_later() -> None:
            await trio.sleep(0.5)
            assert waiters.counts() == (1, 1)  # one undelivered, one waited for
            waiters.delivered(ident)

        nursery.start_soon(deliver_later)
        start = trio.current_time()
        await waiters.wait(ident, 10.0)
        assert trio.current_time() - start == 0.5
    assert not waiters.undelivered(ident) and waiters.counts() == (0, 0)
