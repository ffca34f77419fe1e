"""The partition table alone: which records it expects, against a simple model."""

from __future__ import annotations

import gc
import random
import weakref

import pytest
from hypothesis import given
from hypothesis import strategies as st

from purgatory._core import EngineConfig, OperationSpec, Outcome, OutcomeKind, TimeDomain
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.errors import NotServingError
from purgatory.service.ownership.life import LifeTable

TOPICS = ("requests", "signals")

actions = st.lists(
    st.one_of(
        st.tuples(
            st.just("serve"),
            st.integers(0, 2),
            st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 20)),
            st.dictionaries(st.sampled_from(TOPICS), st.integers(0, 3)),
        ),
        st.tuples(st.just("drop"), st.integers(0, 2)),
        st.tuples(
            st.just("reached"), st.sampled_from(TOPICS), st.integers(0, 2), st.integers(0, 30)
        ),
    ),
    max_size=30,
)
probes = st.lists(
    st.tuples(st.sampled_from(TOPICS), st.integers(0, 2), st.integers(0, 30), st.integers(0, 3)),
    min_size=1,
    max_size=10,
)


@given(actions, probes)
def test_a_record_is_expected_exactly_when_the_model_says(
    steps: list[tuple[object, ...]], records: list[tuple[str, int, int, int]]
) -> None:
    table = PartitionTable(EngineConfig(), partitions=3)
    served: set[int] = set()
    positions: dict[tuple[str, int], int] = {}
    epochs: dict[tuple[str, int], int] = {}
    for step in steps:
        if step[0] == "serve":
            _, p, pos, eps = step
            assert isinstance(p, int) and isinstance(pos, dict) and isinstance(eps, dict)
            table.serve(p, table.new_engine(p, start_ms=0), positions=pos, epochs=eps)
            served.add(p)
            positions.update({(t, p): o for t, o in pos.items()})
            epochs.update({(t, p): e for t, e in eps.items()})
        elif step[0] == "drop":
            p = step[1]
            assert isinstance(p, int)
            table.drop(p)
            served.discard(p)
            positions = {tp: o for tp, o in positions.items() if tp[1] != p}
            epochs = {tp: e for tp, e in epochs.items() if tp[1] != p}
        else:
            _, topic, p, offset = step
            assert isinstance(topic, str) and isinstance(p, int) and isinstance(offset, int)
            table.reached(topic, p, offset)
            positions[(topic, p)] = offset
    assert table.serving() == frozenset(served)
    for topic, p, offset, epoch in records:
        expected = (
            p in served
            and offset >= positions.get((topic, p), 0)
            and epoch >= epochs.get((topic, p), 0)
        )
        assert table.expects(topic, p, offset, epoch) is expected


def _outcome(partition: int, sequence: int) -> Outcome:
    return Outcome(
        op_id=f"op-{sequence}",
        scope="s",
        outcome=OutcomeKind.EXPIRED,
        registered_ms=0,
        outcome_ms=0,
        deadline_ms=0,
        time_domain=TimeDomain.PROCESSING_TIME,
        sequence=sequence,
        partition=partition,
    )


def test_the_delivered_mark_follows_a_served_partition_and_a_handed_over_one() -> None:
    table = PartitionTable(EngineConfig(), partitions=2)
    table.serve(0, table.new_engine(0, start_ms=0), acked=4)
    table.delivered(_outcome(0, 6))
    table.delivered(_outcome(0, 5))  # acknowledged out of order: the mark never goes back
    assert table.acked(0) == 6
    table.delivered(_outcome(1, 3))  # not served here: not followed
    assert table.acked(1) == 0
    table.drop(0, keep_acked=True)  # handed over: its last callbacks still count
    table.delivered(_outcome(0, 7))
    assert table.acked(0) == 7
    table.forget_acked(0)
    assert table.acked(0) == 0


def test_a_scope_of_a_partition_held_and_not_served_answers_restoring() -> None:
    life = LifeTable(random.Random(1))
    table = PartitionTable(EngineConfig(), partitions=2, life=life)
    scope = next(f"s{i}" for i in range(50) if table.partition_of(f"s{i}") == 1)
    life.take(1, 0.0)
    with pytest.raises(NotServingError) as restoring:
        table.engine_of(scope)
    assert restoring.value.restoring is True
    other = next(f"s{i}" for i in range(50) if table.partition_of(f"s{i}") == 0)
    with pytest.raises(NotServingError) as elsewhere:
        table.engine_of(other)
    assert elsewhere.value.restoring is False


def test_a_dropped_engine_is_collected_though_restores_froze_what_they_built() -> None:
    """A restore freezes what it built (no collection scans it again); the engine of a
    partition handed over is cyclic garbage, so dropping it must make it collectable."""
    table = PartitionTable(EngineConfig(), partitions=2)
    engine = table.new_engine(1, start_ms=0)
    engine.register(OperationSpec(op_id="o", scope="s", keys=("k",), deadline_ms=10_000), now_ms=0)
    table.serve(1, engine, positions={}, epochs={})
    gone = weakref.ref(engine.lifecycle)  # in a cycle with the class of its operations
    del engine
    gc.collect()
    gc.freeze()  # as at the end of a restore
    try:
        table.drop(1)
        gc.collect()
        assert gone() is None
    finally:
        gc.unfreeze()
