"""``_SortedIds`` against an obviously correct model: a sorted Python list of the same items.

Random adds and removes of distinct strings, each followed by reads: ``after(item, limit)`` from
no item, from held items and from items not held, and ``bool()``. The sizes run past
``2 * _BLOCK`` so that blocks split, and the items are drained at the end so that blocks shrink,
merge and go. After each change the blocks must also hold the model's items, in order, each
block non-empty and ``_lasts`` its greatest item (what every bisection relies on).
"""

from __future__ import annotations

from bisect import bisect_right, insort

from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory._core.engine.sorted_ids import _BLOCK, _SortedIds

SPLIT = 2 * _BLOCK + 1  # one block over 2 * _BLOCK items splits

# Distinct strings from a small range, so adds and removes of the same item meet often; some
# fall among the run added in one place (below), where the blocks split.
spread = st.integers(min_value=0, max_value=3 * _BLOCK).map(lambda i: f"{i:05d}")
in_the_run = st.integers(min_value=0, max_value=SPLIT).map(lambda i: f"00100.{i:05d}")
items = spread | in_the_run
probes = st.none() | items | st.just("") | st.just("~")  # "" before every item, "~" after
limits = st.integers(min_value=0, max_value=2 * _BLOCK + 10)


def _check(ids: _SortedIds, model: list[str], item: str | None, limit: int) -> None:
    start = 0 if item is None else bisect_right(model, item)
    assert ids.after(item, limit) == model[start : start + limit]
    assert bool(ids) == bool(model)


def _check_blocks(ids: _SortedIds, model: list[str]) -> None:
    assert [item for block in ids._blocks for item in block] == model
    assert all(ids._blocks)
    assert ids._lasts == [block[-1] for block in ids._blocks]


def _toggle(ids: _SortedIds, model: list[str], item: str) -> None:
    """Add ``item`` if it is not held, else remove it, in both."""
    if item in model:
        ids.remove(item)
        model.remove(item)
    else:
        ids.add(item)
        insort(model, item)


@settings(max_examples=40, deadline=None)
@given(
    start=st.lists(items, unique=True, max_size=2 * _BLOCK + 50),
    steps=st.lists(st.tuples(items, probes, limits), max_size=40),
    drain=st.booleans(),
)
def test_sorted_ids_match_a_sorted_list(
    start: list[str], steps: list[tuple[str, str | None, int]], drain: bool
) -> None:
    model = sorted(start)
    ids = _SortedIds(list(model))
    _check(ids, model, None, len(model) + 1)
    _check_blocks(ids, model)
    # A run of adds into one place, past 2 * _BLOCK, so the block there splits.
    blocks = len(ids._blocks)
    for i in range(SPLIT):
        item = f"00100.{i:05d}"
        if item not in model:
            ids.add(item)
            insort(model, item)
    assert len(ids._blocks) > blocks
    _check_blocks(ids, model)
    _check(ids, model, "00100", 2 * _BLOCK + 10)
    # Random adds and removes among blocks that split, each followed by reads.
    for item, probe, limit in steps:
        _toggle(ids, model, item)
        _check_blocks(ids, model)
        _check(ids, model, probe, limit)
        _check(ids, model, item, limit)
    # Removes from the front until empty, so blocks shrink, merge and go.
    if drain:
        while model:
            ids.remove(model.pop(0))
            if len(model) % 97 == 0:
                _check_blocks(ids, model)
                _check(ids, model, None, 3)
        assert not ids
        assert ids.after(None, 10) == []
