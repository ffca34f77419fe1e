"""The snapshotter's supervisor: every exit reaped, logged, counted and followed by a restart
after a bounded back-off; at the stop the child is stopped and not restarted.

Fake children under ``MockClock`` for the timing; then real processes, SIGKILLed by the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import MutableMapping
from typing import Any

import pytest
import structlog
import trio
import trio.testing

from purgatory.service.supervisors.supervisor import (
    Supervisor,
    exit_fields,
    start_process,
    with_pdeathsig,
)


class FakeChild:
    """A child that exits when the test says, or on a signal (unless it ignores SIGTERM)."""

    def __init__(self, pid: int, *, ignores_term: bool = False) -> None:
        self.pid = pid
        self.ignores_term = ignores_term
        self.signals: list[str] = []
        self.status: int | None = None
        self._exited = trio.Event()

    def exit(self, status: int) -> None:
        if self.status is None:
            self.status = status
            self._exited.set()

    async def wait(self) -> int:
        await self._exited.wait()
        assert self.status is not None
        return self.status

    def terminate(self) -> None:
        self.signals.append("SIGTERM")
        if not self.ignores_term:
            self.exit(-signal.SIGTERM)

    def kill(self) -> None:
        self.signals.append("SIGKILL")
        self.exit(-signal.SIGKILL)


class Starter:
    """The supervisor's start function: records when it is called, fails on cue."""

    def __init__(self, *, failures: int = 0, ignores_term: bool = False) -> None:
        self.children: list[FakeChild] = []
        self.started_at: list[float] = []
        self.failures = failures
        self.ignores_term = ignores_term
        self._called = trio.Event()

    async def next_call(self) -> None:
        """Wait for the next start."""
        await self._called.wait()

    def __call__(self) -> FakeChild:
        self.started_at.append(trio.current_time())
        self._called.set()
        self._called = trio.Event()
        if self.failures:
            self.failures -= 1
            raise OSError("fork: Resource temporarily unavailable")
        child = FakeChild(1000 + len(self.children), ignores_term=self.ignores_term)
        self.children.append(child)
        return child


def _events(logs: list[MutableMapping[str, Any]], event: str) -> list[MutableMapping[str, Any]]:
    return [e for e in logs if e["event"] == event]


async def test_a_killed_child_is_logged_counted_and_started_again_a_second_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starter = Starter()
    supervisor = Supervisor(starter)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            first = starter.children[0]
            assert supervisor.statistics().pid == first.pid
            assert supervisor.statistics().restarts == 0
            await trio.sleep(30)
            first.exit(-signal.SIGKILL)
            await trio.sleep(0.5)
            stats = supervisor.statistics()
            assert (stats.pid, stats.restarts, stats.last_exit) == (None, 0, -9)
            await trio.sleep(0.6)
            assert [t - starter.started_at[0] for t in starter.started_at] == [0, 31]
            second = starter.children[1]
            await trio.sleep(5)
            second.exit(3)
            await trio.sleep(3)
            stats = supervisor.statistics()
            assert (stats.pid, stats.restarts, stats.starts) == (1002, 2, 3)
            nursery.cancel_scope.cancel()
    exited = _events(logs, "snapshotter_exited")
    assert [(e["pid"], e["signal"], e["exit_code"]) for e in exited] == [
        (1000, "SIGKILL", None),
        (1001, None, 3),
    ]
    assert [e["restart_in_s"] for e in exited] == [1, 2]  # runs shorter than 2 minutes
    assert all(e["log_level"] == "warning" for e in exited)
    assert [e["restarts"] for e in _events(logs, "snapshotter_started")] == [0, 1, 2]


async def test_the_backoff_doubles_to_a_minute_and_starts_again_after_a_healthy_run(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starter = Starter()
    supervisor = Supervisor(starter)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        for _ in range(9):  # each child dies as it starts
            starter.children[-1].exit(1)
            await starter.next_call()
        since = [t - starter.started_at[0] for t in starter.started_at]
        assert since == [0, 1, 3, 7, 15, 31, 63, 123, 183, 243]
        # A run of two minutes or more is healthy: the next restart waits 1 s again.
        await trio.sleep(150)
        starter.children[-1].exit(1)
        await starter.next_call()
        assert starter.started_at[-1] - starter.started_at[-2] == 151
        starter.children[-1].exit(1)
        await starter.next_call()
        assert starter.started_at[-1] - starter.started_at[-2] == 2
        nursery.cancel_scope.cancel()
    assert supervisor.backoff_s(1) == 1
    assert supervisor.backoff_s(7) == 60
    assert supervisor.backoff_s(10_000) == 60


async def test_at_the_stop_the_child_gets_sigterm_is_reaped_and_never_restarted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starter = Starter()
    supervisor = Supervisor(starter)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            await trio.sleep(5)
            nursery.cancel_scope.cancel()
        await trio.sleep(600)
    (child,) = starter.children
    assert child.signals == ["SIGTERM"]
    assert child.status == -signal.SIGTERM
    assert supervisor.statistics().pid is None
    assert _events(logs, "snapshotter_exited") == []
    (stopped,) = _events(logs, "snapshotter_stopped")
    assert (stopped["pid"], stopped["signal"]) == (1000, "SIGTERM")


async def test_a_child_that_ignores_sigterm_is_killed_after_ten_seconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starter = Starter(ignores_term=True)
    supervisor = Supervisor(starter)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            nursery.cancel_scope.cancel()
            stopping = trio.current_time()
    assert trio.current_time() - stopping == pytest.approx(10)
    (child,) = starter.children
    assert child.signals == ["SIGTERM", "SIGKILL"]
    (killed,) = _events(logs, "snapshotter_killed")
    assert (killed["signal"], killed["after_s"]) == ("SIGKILL", 10)


async def test_a_stop_during_the_backoff_starts_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starter = Starter()
    supervisor = Supervisor(starter)
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        starter.children[0].exit(-signal.SIGSEGV)
        await trio.sleep(0.5)  # the back-off waits 1 s
        nursery.cancel_scope.cancel()
    await trio.sleep(120)
    assert len(starter.children) == 1
    assert starter.children[0].signals == []


async def test_a_start_that_fails_is_tried_again_with_the_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starter = Starter(failures=2)
    supervisor = Supervisor(starter)
    with structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            await trio.sleep(10)
            assert starter.started_at == [0, 1, 3]
            stats = supervisor.statistics()
            assert (stats.restarts, stats.pid) == (2, 1000)
            nursery.cancel_scope.cancel()
    failed = _events(logs, "snapshotter_start_failed")
    assert [(e["restarts"], e["restart_in_s"]) for e in failed] == [(0, 1), (1, 2)]
    assert "Resource temporarily unavailable" in failed[0]["error"]
    assert all(e["log_level"] == "error" for e in failed)
    assert _events(logs, "snapshotter_exited") == []


def test_exit_statuses_read_as_a_code_or_a_signal() -> None:
    assert exit_fields(0) == {"exit_code": 0, "signal": None}
    assert exit_fields(2) == {"exit_code": 2, "signal": None}
    assert exit_fields(-9) == {"exit_code": None, "signal": "SIGKILL"}
    assert exit_fields(-15) == {"exit_code": None, "signal": "SIGTERM"}


# -- real processes --------------------------------------------------------------------------

_SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


def _reaped(pid: int) -> bool:
    """Whether ``pid`` is no child of this process any more (exited and reaped: no zombie)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


async def _until(condition: Any, timeout_s: float = 15) -> None:
    with trio.fail_after(timeout_s):
        while not condition():
            await trio.sleep(0.02)


async def test_a_real_child_killed_by_sigkill_is_reaped_and_restarted() -> None:
    command = with_pdeathsig(_SLEEPER)  # as serve starts the snapshotter (pytest runs on main)
    supervisor = Supervisor(lambda: start_process(command, os.environ))
    try:
        with structlog.testing.capture_logs() as logs:
            async with trio.open_nursery() as nursery:
                await nursery.start(supervisor.run)
                first = supervisor.statistics().pid
                assert first is not None
                os.kill(first, signal.SIGKILL)
                await _until(lambda: supervisor.statistics().restarts == 1)
                second = supervisor.statistics().pid
                assert second not in (None, first)
                assert _reaped(first)
                assert not _reaped(second)  # running, ours
                nursery.cancel_scope.cancel()
        assert second is not None and _reaped(second)
        (exited,) = _events(logs, "snapshotter_exited")
        assert (exited["pid"], exited["signal"], exited["restart_in_s"]) == (first, "SIGKILL", 1)
        (stopped,) = _events(logs, "snapshotter_stopped")
        assert (stopped["pid"], stopped["signal"]) == (second, "SIGTERM")
    finally:
        pid = supervisor.statistics().pid
        if pid is not None:  # a failed assertion above: leave no process behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


async def test_a_real_child_outlives_trios_idle_worker_threads() -> None:
    # The kernel's parent-death signal belongs to the thread that forked; trio ends an idle
    # worker thread after 10 s. A child forked from one would be killed then, and restarted.
    command = with_pdeathsig(_SLEEPER)
    supervisor = Supervisor(lambda: start_process(command, os.environ))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        first = supervisor.statistics().pid
        await trio.to_thread.run_sync(lambda: None)  # a worker thread exists, then idles
        end = time.perf_counter() + 11.5
        while time.perf_counter() < end:
            await trio.sleep(0.25)
            assert supervisor.statistics().pid == first
        assert supervisor.statistics().restarts == 0
        nursery.cancel_scope.cancel()
    assert first is not None and _reaped(first)
