"""Freeze a process (SIGSTOP) and return only once it is frozen.

``kill(pid, SIGSTOP)`` returns before the process stops. The kernel queues the signal and wakes
one of the process's threads to take it; only when that thread runs does it stop the others.
Until then every other thread goes on: a broker's network thread reads a request, its handler
writes it to the log, and the answer goes out. On a quiet machine the window is microseconds; on
a busy one, where the woken thread waits for a core, it was long enough for a Kafka broker
"frozen" a moment before to acknowledge a produce request sent just after (the sink-outage test,
a clean-clone gate) and for the service to answer a registration 201 instead of 503 (the
journal-stall test). A test that means "from now on it answers nothing" calls :func:`freeze`,
which waits until every thread of the process (or of every process in its group) shows state
``T`` in ``/proc``.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from tests.bounds import bound

__all__ = ["freeze", "frozen"]

#: How long a stop may take on a quiet machine (it takes well under a millisecond).
_FREEZE_S = 2.0
#: The states of a thread that runs no more: stopped, traced, zombie, dead.
_STILL = frozenset("TtZX")


def freeze(pid: int, *, group: bool = False) -> None:
    """SIGSTOP ``pid`` (its process group if ``group``) and wait until all of it is stopped.

    Raises:
        AssertionError: a thread was still running at the bound.
    """
    if group:
        os.killpg(pid, signal.SIGSTOP)
    else:
        os.kill(pid, signal.SIGSTOP)
    within_s = bound(_FREEZE_S)
    began = time.perf_counter()
    for _ in range(1_000_000):  # bounded in count as well as in time
        running = _running(pid, group=group)
        if not running:
            return
        if time.perf_counter() - began > within_s:
            break
        time.sleep(0.001)  # noqa: TID251 - a real process stopping: real time
    raise AssertionError(f"SIGSTOP to {pid}: threads {running} still running after {within_s} s")


def frozen(pid: int, *, group: bool = False) -> bool:
    """Whether every thread of ``pid`` (of its process group if ``group``) is stopped."""
    return not _running(pid, group=group)


def _running(pid: int, *, group: bool) -> list[int]:
    """The threads of ``pid`` (or of its group's processes) that are neither stopped nor gone."""
    running = []
    for process in _group(pid) if group else [pid]:
        for tid in _tasks(process):
            fields = _stat_fields(Path(f"/proc/{process}/task/{tid}/stat"))
            if fields and fields[0] not in _STILL:
                running.append(tid)
    return running


def _group(pgid: int) -> list[int]:
    processes = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat_fields(entry / "stat")
            if len(fields) > 2 and int(fields[2]) == pgid:
                processes.append(int(entry.name))
    return processes


def _tasks(pid: int) -> list[int]:
    try:
        return [int(name) for name in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # gone
        return []


def _stat_fields(path: Path) -> list[str]:
    """The fields of a ``stat`` file after the command name: state, ppid, pgrp, ...; empty if
    the task is gone."""
    try:
        stat = path.read_text()
    except OSError:
        return []
    return stat[stat.rindex(")") + 2 :].split()
