"""The committer: offsets coalesced to one commit per interval, at once when closing, retried
when refused, the latest offset per partition always; on the in-memory broker, virtual time."""

from __future__ import annotations

import itertools
from collections.abc import Mapping

import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory._core._backoff import Backoff
from purgatory.service.egress.committer import Committer
from reaper import Clock
from tests.service.egress.parts import INPUT, broker, commits_to

BACKOFF = Backoff(first_s=0.1, max_s=5.0)
P0, P1 = (INPUT, 0), (INPUT, 1)


def _committer(
    calls: list[tuple[int, dict[tuple[str, int], int]]], fail_commits: int = 0
) -> Committer:
    commit = commits_to(broker(fail_commits=fail_commits), calls)
    return Committer(commit, Clock(), interval_ms=100, backoff=BACKOFF)


async def test_the_worked_example_markers_within_the_interval_go_together(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[tuple[int, dict[tuple[str, int], int]]] = []
    committer = _committer(calls)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        committer.reached({P0: 3})
        await trio.sleep(0.04)
        committer.reached({P0: 7})
        committer.reached({P1: 2})
        await trio.sleep(1)
        committer.finish()
    assert calls == [(0, {P0: 3}), (100, {P0: 7, P1: 2})]
    assert committer.commits == 2 and committer.failures == 0


async def test_a_marker_exactly_one_interval_after_the_last_commit_goes_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[tuple[int, dict[tuple[str, int], int]]] = []
    committer = _committer(calls)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        committer.reached({P0: 1})
        await trio.sleep(0.099)
        committer.reached({P0: 2})  # 1 ms early: waits for the boundary
        await trio.sleep(0.101)
        committer.reached({P0: 3})  # at 200 ms, exactly one interval after the last
        await trio.sleep(0.05)
        committer.finish()
    assert calls == [(0, {P0: 1}), (100, {P0: 2}), (200, {P0: 3})]


async def test_closing_commits_at_once_and_finish_returns_after_the_last_commit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[tuple[int, dict[tuple[str, int], int]]] = []
    committer = _committer(calls)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        committer.reached({P0: 1})
        await trio.sleep(0.01)
        committer.reached({P0: 2})
        await trio.sleep(0.01)
        committer.close()  # the interval is not waited out
        committer.finish()
    assert calls == [(0, {P0: 1}), (20, {P0: 2})]
    assert round(trio.current_time() * 1000) == 21  # returned once the last commit was taken


async def test_a_refused_commit_is_retried_after_the_backoff_with_the_later_offsets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    calls: list[tuple[int, dict[tuple[str, int], int]]] = []
    committer = _committer(calls, fail_commits=2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        committer.reached({P0: 1, P1: 5})
        await trio.sleep(0.05)
        committer.reached({P0: 4})
        await trio.sleep(1)
        committer.finish()
    # refused at 0 (+1 ms round trip) then 0.1 s; refused at 101 (+1) then 0.2 s; taken at 302
    assert calls == [(0, {P0: 1, P1: 5}), (101, {P0: 4, P1: 5}), (302, {P0: 4, P1: 5})]
    assert (committer.commits, committer.failures) == (1, 2)


async def test_without_a_commit_function_nothing_is_committed_and_run_still_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    committer = Committer(None, Clock(), interval_ms=100, backoff=BACKOFF)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(committer.run)
        committer.reached({P0: 1})
        await trio.sleep(1)
        committer.finish()
    assert committer.commits == 0


# A step of a script: wait ``gap_ms``, maybe make the broker refuse the next commit, reach
# ``offsets``. The gaps include the interval's boundary and its neighbours.
_STEP = st.tuples(
    st.sampled_from([0, 1, 50, 99, 100, 101, 250]),
    st.booleans(),
    st.dictionaries(st.sampled_from([P0, P1]), st.integers(0, 99), min_size=1),
)


@settings(max_examples=150)
@given(st.lists(_STEP, max_size=12), st.integers(0, 12))
def test_each_commit_holds_the_latest_offsets_and_commits_are_an_interval_apart(
    script: list[tuple[int, bool, dict[tuple[str, int], int]]], close_at: int
) -> None:
    """Against a model of what was reached: every commit holds, per partition, the latest
    offset reached before it; commits start at least an interval apart until closed; with no
    commit refused, a reached offset is tried within an interval; in the end the latest offset
    of each partition is committed."""
    # Times in the committer's own clock: whole milliseconds, as it counts its interval.
    clock = Clock()
    events: list[tuple[str, int, dict[tuple[str, int], int]]] = []
    calls: list[tuple[int, dict[tuple[str, int], int]]] = []
    fake = broker()
    commit = commits_to(fake, calls)

    async def noted(offsets: Mapping[tuple[str, int], int]) -> None:
        events.append(("commit", clock.now_ms(), dict(offsets)))
        await commit(offsets)
        events.append(("committed", clock.now_ms(), dict(offsets)))

    committer = Committer(noted, clock, interval_ms=100, backoff=BACKOFF)
    closed_ms: list[int] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(committer.run)
            for index, (gap_ms, fail, offsets) in enumerate(script):
                if index == close_at:
                    committer.close()
                    closed_ms.append(clock.now_ms())
                await trio.sleep(gap_ms / 1000)
                fake.fail_commits += fail
                events.append(("reached", clock.now_ms(), offsets))
                committer.reached(offsets)
            committer.finish()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

    latest: dict[tuple[str, int], int] = {}
    committed: dict[tuple[str, int], int] = {}
    for kind, _ms, offsets in events:
        if kind == "reached":
            latest.update(offsets)
        elif kind == "commit":
            assert offsets and all(latest[tp] == value for tp, value in offsets.items())
        else:
            committed.update(offsets)
    assert committed == latest
    starts = [ms for kind, ms, _ in events if kind == "commit"]
    closing = closed_ms[0] if closed_ms else None
    for before, after in itertools.pairwise(starts):
        if closing is None or after < closing:
            assert after - before >= 100
    if not any(fail for _gap, fail, _offsets in script):
        for i, (kind, ms, _offsets) in enumerate(events):
            if kind == "reached":
                assert any(k == "commit" and at <= ms + 100 for k, at, _ in events[i + 1 :])
    assert (committer.commits, committer.failures) == (
        sum(kind == "committed" for kind, _, _ in events),
        len(calls) - sum(kind == "committed" for kind, _, _ in events),
    )
