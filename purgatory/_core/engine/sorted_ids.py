"""Sorted pending op_ids per scope (core concept: the page index; sans-IO, stdlib only).

The engine lists a scope's pending operations in pages, in ``op_id`` order
(:meth:`~purgatory._core.engine.engine.Engine.pending_page`), so it keeps each scope's pending
op_ids
sorted: in one sorted list while the scope is small, in a :class:`_SortedIds` of sorted blocks
once it is large. :func:`_add_id` and :func:`_remove_id` keep the index up to date on every
registration and outcome, and :func:`_ids_after` reads one page of it.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right, insort

# The pending op_ids of each scope, sorted, for pages of pending operations. A scope of at most
# 2 * _BLOCK operations (most scopes) holds them in one sorted list; a larger one in a
# _SortedIds, whose cost per insert or removal grows with the log of the scope's size only.
_BLOCK = 512


def _add_id(index: dict[str, list[str] | _SortedIds], scope: str, op_id: str) -> None:
    ids = index.get(scope)
    if ids is None:
        index[scope] = [op_id]
    elif isinstance(ids, list):
        insort(ids, op_id)
        if len(ids) > 2 * _BLOCK:
            index[scope] = _SortedIds(ids)
    else:
        ids.add(op_id)


def _add_ids(index: dict[str, list[str] | _SortedIds], scope: str, op_ids: list[str]) -> None:
    """Add many op_ids (none already held) at once: one sort instead of an insert each."""
    ids = index.get(scope)
    held = [] if ids is None else ids if isinstance(ids, list) else ids.items()
    merged = sorted([*held, *op_ids])
    index[scope] = merged if len(merged) <= 2 * _BLOCK else _SortedIds(merged)


def _remove_id(index: dict[str, list[str] | _SortedIds], scope: str, op_id: str) -> None:
    ids = index[scope]
    if isinstance(ids, list):
        at = bisect_left(ids, op_id)
        assert ids[at] == op_id, "removing an op_id that is not pending"
        del ids[at]
    else:
        ids.remove(op_id)
    if not ids:
        del index[scope]


def _ids_after(ids: list[str] | _SortedIds, after: str | None, limit: int) -> list[str]:
    if isinstance(ids, list):
        start = 0 if after is None else bisect_right(ids, after)
        return ids[start : start + limit]
    return ids.after(after, limit)


class _SortedIds:
    """A set of strings kept sorted, as a list of sorted blocks (a flat sorted list would move
    every later item on each insert: O(n) per registration in a scope of n operations).

    The blocks are in order and each is sorted, so ``_lasts`` (each block's greatest item)
    finds an item's block by bisection: add and remove cost O(log n + _BLOCK), and a page of
    ``limit`` items after a given one costs O(log n + limit). An emptied block is dropped and
    a small one is merged into its neighbour, so no block is empty and pages never walk
    empty blocks.
    """

    __slots__ = ("_blocks", "_lasts")

    def __init__(self, items: list[str]) -> None:
        self._blocks = [items[i : i + _BLOCK] for i in range(0, len(items), _BLOCK)]
        self._lasts = [block[-1] for block in self._blocks]

    def __bool__(self) -> bool:
        return bool(self._blocks)

    def add(self, item: str) -> None:
        """Add ``item`` (not already held)."""
        blocks, lasts = self._blocks, self._lasts
        if not blocks:
            blocks.append([item])
            lasts.append(item)
            return
        i = bisect_left(lasts, item)
        if i == len(lasts):  # after every item held: the end of the last block
            i -= 1
            block = blocks[i]
            block.append(item)
            lasts[i] = item
        else:
            block = blocks[i]
            insort(block, item)
        if len(block) > 2 * _BLOCK:
            self._split(i)

    def remove(self, item: str) -> None:
        """Remove ``item`` (held)."""
        blocks, lasts = self._blocks, self._lasts
        i = bisect_left(lasts, item)
        block = blocks[i]
        j = bisect_left(block, item)
        assert block[j] == item, "removing an op_id that is not pending"
        del block[j]
        if not block:
            del blocks[i]
            del lasts[i]
            return
        lasts[i] = block[-1]
        if len(block) < _BLOCK // 4 and i + 1 < len(blocks):
            block.extend(blocks[i + 1])  # the next block's items all sort after this one's
            del blocks[i + 1]
            del lasts[i]
            if len(block) > 2 * _BLOCK:
                self._split(i)

    def items(self) -> list[str]:
        """Every item, in order."""
        return [item for block in self._blocks for item in block]

    def after(self, item: str | None, limit: int) -> list[str]:
        """Up to ``limit`` items greater than ``item`` (None: the least ones), in order."""
        blocks = self._blocks
        if item is None:
            i, j = 0, 0
        else:
            i = bisect_right(self._lasts, item)
            j = bisect_right(blocks[i], item) if i < len(blocks) else 0
        found: list[str] = []
        while i < len(blocks) and len(found) < limit:
            found.extend(blocks[i][j : j + limit - len(found)])
            i, j = i + 1, 0
        return found

    def _split(self, i: int) -> None:
        block = self._blocks[i]
        self._blocks[i : i + 1] = [block[:_BLOCK], block[_BLOCK:]]
        self._lasts[i : i + 1] = [block[_BLOCK - 1], block[-1]]
