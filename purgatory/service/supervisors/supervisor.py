"""The snapshotter's supervisor (service layer): a child process reaped, restarted and counted.

``purgatory serve`` runs ``purgatory snapshotter`` beside it (see :mod:`purgatory.service.run`). A
:class:`Supervisor` starts the child, waits for it to exit (the wait reaps it: no zombie), logs
``snapshotter_exited`` with its exit code or signal, and starts it again after a back-off:
1 s, doubling to at most 60 s, and 1 s again once a run lasted 2 minutes. Its
:meth:`~Supervisor.statistics` count the restarts for ``purgatory_snapshotter_restarts_total``.
Cancelled (the service stops), it sends the child SIGTERM, gives it 10 s, then SIGKILL, reaps
it, and starts nothing more.

Worked example: a child that dies on start is started at t = 0, 1, 3, 7, 15, 31, 63, 123 and
then every 60 s; a child that runs 5 minutes between crashes is restarted 1 s after each.

All timing is trio's (``trio.sleep``, ``trio.current_time``), and the child comes from a
function given to the supervisor, so tests drive it with fake children under ``MockClock``.
:func:`start_process` is the real function. It forks from the trio thread on purpose, not with
``trio.lowlevel.open_process``, which forks from a worker thread: the kernel's parent-death
signal (``with_pdeathsig``) belongs to the thread that forked, and trio ends an idle worker
thread after 10 s, which would SIGKILL the child 10 s after every start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import trio

from purgatory._core import UsageError
from purgatory._core._backoff import Backoff
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.stats import SupervisorStatistics

__all__ = [
    "LIVES_WITH_PROCESS",
    "Child",
    "Supervisor",
    "exit_fields",
    "start_process",
    "with_pdeathsig",
]

_log = get_logger()

#: The wait before a restart after short runs in a row (the first one: 1 s).
RESTART = Backoff(first_s=1.0, max_s=60.0)
HEALTHY_AFTER_S = 120.0  # a run this long resets the back-off
STOP_TIMEOUT_S = 10.0  # between SIGTERM and SIGKILL at the stop
_POLL_S = 0.5  # how often an exit is looked for where the kernel has no pidfd

#: A thread with this attribute set to True promises to run until its process exits (a
#: watchdog parked forever once its work is done), so a child it starts with
#: ``die_with_parent`` dies with the process, as one the main thread starts does.
LIVES_WITH_PROCESS = "purgatory_lives_with_process"

# argv: owner pid, then the command. PR_SET_PDEATHSIG is 1 (linux/prctl.h).
_PDEATHSIG_EXEC = """\
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) != 0:
    sys.exit("prctl(PR_SET_PDEATHSIG): " + os.strerror(ctypes.get_errno()))
if os.getppid() != int(sys.argv[1]):
    sys.exit("the owner died before the child started")
os.execvp(sys.argv[2], sys.argv[2:])
"""


def with_pdeathsig(command: Sequence[str]) -> list[str]:
    """``command`` wrapped so that the kernel SIGKILLs it when this thread (or process) dies.

    Pass the result to ``subprocess.Popen`` from the main thread: the kernel's "parent" is the
    thread that forks, and only the main thread lives as long as the process (or a thread
    marked :data:`LIVES_WITH_PROCESS`, which promises to). On other systems than Linux the
    command is returned as it is.

    Raises:
        UsageError: not called from the main thread (or a thread marked to live as long).
    """
    thread = threading.current_thread()
    if thread is not threading.main_thread() and not getattr(thread, LIVES_WITH_PROCESS, False):
        raise UsageError(
            "die_with_parent needs the main thread: the child would die with this thread"
        )
    if sys.platform != "linux":
        return list(command)
    return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_EXEC, str(os.getpid()), *command]


class Child(Protocol):
    """A started child process, as the supervisor needs it."""

    @property
    def pid(self) -> int:
        """Its process id."""
        ...

    async def wait(self) -> int:
        """Wait until it exits and reap it.

        Returns:
            Its exit status as ``subprocess`` gives it: the exit code, or ``-N`` when signal N
            killed it.
        """
        ...

    def terminate(self) -> None:
        """Send SIGTERM (nothing if it already exited)."""
        ...

    def kill(self) -> None:
        """Send SIGKILL (nothing if it already exited)."""
        ...


def exit_fields(status: int) -> dict[str, object]:
    """An exit status as log fields: ``exit_code`` and ``signal`` (one of them None)."""
    if status >= 0:
        return {"exit_code": status, "signal": None}
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = str(-status)
    return {"exit_code": None, "signal": name}


class Supervisor:
    """Runs a child process and starts it again whenever it exits, until cancelled.

    Args:
        start: starts the child (synchronously) and returns it; an ``OSError`` counts as an
            exit.
        backoff: the wait before a restart after short runs in a row.
        healthy_after_s: a run at least this long resets the back-off.
        stop_timeout_s: how long the child may take to exit after SIGTERM at the stop.
    """

    def __init__(
        self,
        start: Callable[[], Child],
        *,
        backoff: Backoff = RESTART,
        healthy_after_s: float = HEALTHY_AFTER_S,
        stop_timeout_s: float = STOP_TIMEOUT_S,
    ) -> None:
        self._start = start
        self._backoff = backoff
        self._healthy_after_s = healthy_after_s
        self._stop_timeout_s = stop_timeout_s
        self._child: Child | None = None
        self._starts = 0
        self._last_exit: int | None = None

    def statistics(self) -> SupervisorStatistics:
        """The counts now (cheap; for the metrics at scrape time)."""
        return SupervisorStatistics(
            starts=self._starts,
            restarts=max(0, self._starts - 1),
            pid=self._child.pid if self._child is not None else None,
            last_exit=self._last_exit,
        )

    def backoff_s(self, short_runs: int) -> float:
        """The wait before a restart that follows ``short_runs`` short runs in a row (>= 1)."""
        return self._backoff.delay_s(short_runs - 1)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Start the child, then restart it after each exit until cancelled; started once the
        first child was started (or failed to start)."""
        short_runs = 0
        try:
            while True:
                started_s = trio.current_time()
                ended = await self._run_once(task_status)
                task_status = trio.TASK_STATUS_IGNORED
                ran_s = trio.current_time() - started_s
                short_runs = 1 if ran_s >= self._healthy_after_s else short_runs + 1
                delay_s = self.backoff_s(short_runs)
                if isinstance(ended, OSError):
                    _log.error(
                        "snapshotter_start_failed",
                        error=str(ended),
                        restarts=self._starts - 1,
                        restart_in_s=delay_s,
                    )
                else:
                    pid, status = ended
                    _log.warning(
                        "snapshotter_exited",
                        pid=pid,
                        **exit_fields(status),
                        ran_s=round(ran_s, 3),
                        restart_in_s=delay_s,
                    )
                await trio.sleep(delay_s)
        finally:
            child, self._child = self._child, None
            if child is not None:
                with trio.CancelScope(shield=True):
                    await self._stop(child)

    async def _run_once(self, task_status: trio.TaskStatus[None]) -> tuple[int, int] | OSError:
        """Start one child and wait for its exit: its pid and exit status, or why it did not
        start."""
        self._starts += 1
        try:
            child = self._start()
        except OSError as exc:
            task_status.started()
            return exc
        self._child = child
        _log.info("snapshotter_started", pid=child.pid, restarts=self._starts - 1)
        task_status.started()
        status = await child.wait()
        self._child = None
        self._last_exit = status
        return child.pid, status

    async def _stop(self, child: Child) -> None:
        child.terminate()
        with trio.move_on_after(self._stop_timeout_s):
            status = await child.wait()
            _log.info("snapshotter_stopped", pid=child.pid, **exit_fields(status))
            return
        child.kill()
        status = await child.wait()
        _log.warning(
            "snapshotter_killed",
            pid=child.pid,
            after_s=self._stop_timeout_s,
            **exit_fields(status),
        )


class _Process:
    """A :class:`Child` over a ``subprocess.Popen``, waited for in trio."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self._popen = popen

    @property
    def pid(self) -> int:
        return self._popen.pid

    async def wait(self) -> int:
        status = self._popen.poll()
        if status is not None:
            return status
        pidfd = _pidfd(self._popen.pid)
        if pidfd is None:
            while (status := self._popen.poll()) is None:
                await trio.sleep(_POLL_S)
            return status
        try:
            await trio.lowlevel.wait_readable(pidfd)  # readable once the process exited
        finally:
            trio.lowlevel.notify_closing(pidfd)
            os.close(pidfd)
        return self._popen.wait()  # exited: reaps it at once

    def terminate(self) -> None:
        self._popen.terminate()

    def kill(self) -> None:
        self._popen.kill()


def _pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (Linux 5.3 and later), or None where there is none."""
    if sys.platform != "linux":
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:  # ENOSYS on an old kernel; a process already reaped
        return None


def start_process(command: Sequence[str], env: Mapping[str, str]) -> Child:
    """Start ``command`` as a child in a session of its own, from the calling (trio) thread.

    Its own session keeps a terminal's Ctrl-C from reaching it: the supervisor stops it.
    stdout and stderr are this process's (the child's log lines go where the service's go).

    Raises:
        OSError: the command could not be started.
    """
    popen = subprocess.Popen(
        list(command), env=dict(env), stdin=subprocess.DEVNULL, start_new_session=True
    )
    return _Process(popen)
