"""``purgatory top``'s frame, from an overview answer."""

from __future__ import annotations

from typing import Any

import pytest

from purgatory.service.ops.top import _relative, render_top

NOW = 1_800_000_000_000


def _overview(**fields: Any) -> dict[str, Any]:
    return {"now_ms": NOW, "ready": True, "pending": 0, "scope_count": 0, **fields}


def test_an_idle_replica_says_none_in_each_section() -> None:
    frame = render_top(_overview(partitions={"0": {"state": "serving"}}))
    assert frame.splitlines()[0].startswith("purgatory  ready=yes  partitions=1/1 serving")
    for title in ("busiest scopes", "next deadlines", "latest outcomes", "latest dead letters"):
        assert f"{title}: none" in frame


def test_a_restoring_partition_and_each_section_show() -> None:
    frame = render_top(
        _overview(
            ready=False,
            partitions={
                "1": {"state": "restoring", "restore_records": 120, "restore_seconds": 0.5},
                "0": {"state": "serving"},
            },
            scopes=[{"scope": "s", "pending": 3, "partition": 1}],
            deadlines=[{"scope": "s", "op_id": "o", "deadline_ms": NOW + 65_000}],
            outcomes=[
                {
                    "at_ms": NOW - 500,
                    "outcome": "expired",
                    "late": True,
                    "scope": "s",
                    "op_id": "x",
                    "missing": ["a", "b"],
                },
            ],
            dead_letters=[
                {
                    "at_ms": NOW - 3_000,
                    "topic": "t",
                    "partition": 0,
                    "offset": 7,
                    "reason": "not valid JSON",
                },
            ],
        )
    )
    assert "ready=NO  partitions=1/2 serving" in frame
    assert "partition 1: restoring, 120 records in 0.5 s" in frame
    assert "partition 0" not in frame  # serving, never fenced: nothing to say
    assert "3        1          s" in frame
    assert "1m05s  s      o" in frame
    assert "500ms  expired LATE  s      x      a,b" in frame
    assert "3.0s  t/0@7  not valid JSON" in frame


def test_rows_are_bounded() -> None:
    scopes = [{"scope": f"s{i}", "pending": 1, "partition": 0} for i in range(50)]
    frame = render_top(_overview(scopes=scopes), rows=5)
    assert "s4" in frame and "s5" not in frame


@pytest.mark.parametrize(
    ("ms", "shown"),
    [(0, "0ms"), (999, "999ms"), (1_000, "1.0s"), (59_999, "60.0s"), (60_000, "1m00s"),
     (3_599_000, "59m59s"), (3_600_000, "1h00m"), (-2_500, "-2.5s")],
)  # fmt: skip
def test_durations_are_short(ms: int, shown: str) -> None:
    assert _relative(ms) == shown


def test_a_fenced_partition_names_the_other_writer() -> None:
    frame = render_top(
        _overview(
            partitions={
                "0": {"state": "fenced", "fenced": 3},
                "1": {"state": "serving", "fenced": 1},
                "2": {"state": "serving", "fenced": 0},
            }
        )
    )
    assert "partitions=2/3 serving" in frame
    assert (
        "partition 0: FENCED, waiting to restore (fenced 3x: another writer appended to its"
        " changelog)" in frame
    )
    assert "partition 1: serving (fenced 1x: another writer" in frame
    assert "partition 2" not in frame
