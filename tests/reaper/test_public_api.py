"""The reaper package's public names: a sorted ``__all__`` that resolves."""

from __future__ import annotations

import reaper


def test_all_is_sorted_and_complete() -> None:
    assert reaper.__all__ == sorted(reaper.__all__)
    for name in reaper.__all__:
        assert getattr(reaper, name) is not None
    public = {name for name in vars(reaper) if not name.startswith("_")}
    assert public - set(reaper.__all__) == set()
