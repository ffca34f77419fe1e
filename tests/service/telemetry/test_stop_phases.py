"""The phases of a graceful stop, timed from the stop in virtual time."""

from __future__ import annotations

import trio
import trio.testing

from purgatory.service.telemetry.stop_phases import StopPhases


async def test_each_phase_ends_in_seconds_from_the_stop_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    phases = StopPhases()
    assert phases.seconds() == {}  # no stop yet
    await trio.sleep(100)  # what came before the stop does not count
    ends_at = phases.begin(10.0)
    assert ends_at == trio.current_time() + 10.0
    await trio.sleep(0.25)
    phases.end("http")
    await trio.sleep(1.5)
    phases.end("inputs")
    phases.end("journal")
    assert phases.seconds() == {"http_s": 0.25, "inputs_s": 1.75, "journal_s": 1.75}
    assert list(phases.seconds()) == ["http_s", "inputs_s", "journal_s"]
