"""The demo scenario, replayed in virtual time: every callback at its exact millisecond."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from purgatory.devtools.demo import run_demo, summarize
from purgatory.service import main
from reaper import Clock


async def test_demo_delivers_each_outcome_at_its_exact_millisecond(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lines: list[str] = []
    result = await run_demo(Clock(offset_ms=1_763_780_400_000), show=lines.append)
    got = [
        (o.op_id, o.outcome.value, o.outcome_ms - result.start_ms, o.keys, o.missing)
        for o in result.outcomes
    ]
    assert got == [
        ("replicas", "completed", 450, ("r1", "r3"), ("r2",)),
        ("nightly-report", "completed", 500, ("ingest/orders", "ingest/users", "ingest/stock"), ()),
        ("dashboard", "completed", 600, ("ingest/users",), ()),
        ("session/alice", "expired", 1_000, (), ()),
        (
            "nightly-audit",
            "expired",
            1_200,
            ("ingest/orders", "ingest/users", "ingest/stock"),
            ("ingest/returns",),
        ),
        ("hourly-rollup", "expired", 1_700, (), ("rollup",)),
    ]
    assert [o.sequence for o in result.outcomes] == [1, 2, 3, 4, 5, 6]
    assert result.max_reaper_lateness_ms == 0
    assert sum(line.startswith("callback ") for line in lines) == 6
    assert summarize(result).startswith("summary: 6 callbacks (3 completed, 3 expired)")


def test_cli_rejects_a_bad_speed_naming_the_argument(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--speed", "fast"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--speed" in err and "must be a number" in err
