"""One replica of the rollout: a ``purgatory serve`` process on loopback, stopped and started as
a Kubernetes Deployment stops and starts a pod.

Unlike the nemesis's :class:`~tests.nemesis.replicas.Replica`, it needs no lab: nothing cuts a
link here, so every replica listens on its own loopback port and advertises that URL to the
consumer group. ``serve`` runs in a process group of its own and dies with the harness
(``with_pdeathsig``: starts come from the main thread); its snapshotter child runs in a session
of its own, so a stop waits for both. :meth:`RolloutReplica.stop` is the pod's termination:
SIGTERM to ``serve`` alone (it stops its intake, delivers what it decided, hands its
partitions over, then stops its snapshotter, which writes a last snapshot of each partition),
and the seconds until both processes are gone. :meth:`RolloutReplica.wait_ready` is the
readiness probe a rollout waits on. Every incarnation logs to ``r<index>/serve-<n>.log``, the
layout :func:`tests.nemesis.report.log_events` reads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import trio

from purgatory.devtools.broker import free_port
from purgatory.service.supervisors.supervisor import with_pdeathsig
from tests.benchmarks.bench_service import alive, child_pids

__all__ = ["ReplicaTimeoutError", "RolloutReplica", "Stopped"]

_POLL_EXIT_S = 0.02
_POLL_READY_S = 0.1
_KILL_WAIT_S = 10.0
_TAIL_CHARS = 2000


class ReplicaTimeoutError(RuntimeError):
    """A replica did not stop or become ready within its bound (the message says which)."""


@dataclass(frozen=True, slots=True)
class Stopped:
    """One graceful stop: seconds from SIGTERM until ``serve`` and its snapshotter were gone,
    ``serve``'s exit code, and whether its snapshotter was seen at all."""

    seconds: float
    code: int
    snapshotters: int


class RolloutReplica:
    """Replica ``index``: its settings, its port (kept across restarts) and its incarnations.

    Args:
        index: its number (0, 1, 2, ...): host name ``r<index>``.
        env: its environment: every ``PURGATORY_*`` setting but its own address.
        logs: the run's directory; the incarnations log to ``r<index>/serve-<n>.log``.
        prefix: put before ``serve``'s command line, a command that executes the rest
            (``nice -n 10``).
    """

    def __init__(
        self, index: int, env: Mapping[str, str], logs: Path, prefix: Sequence[str] = ()
    ) -> None:
        self.index = index
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._env = {
            **env,
            "PURGATORY_HTTP_HOST": "127.0.0.1",
            "PURGATORY_HTTP_PORT": str(self.port),
            "PURGATORY_ADVERTISED_URL": self.url,
            "PURGATORY_KAFKA_CLIENT_ID": f"rollout-r{index}",
        }
        self._prefix = list(prefix)
        self.logs = logs / f"r{index}"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.incarnation = -1
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        """``serve``'s process id while it runs."""
        return self._proc.pid if self.running and self._proc is not None else None

    def children(self) -> list[int]:
        """``serve``'s children while it runs: its snapshotter."""
        pid = self.pid
        return [] if pid is None else child_pids(pid)

    def log_path(self, incarnation: int | None = None) -> Path:
        n = self.incarnation if incarnation is None else incarnation
        return self.logs / f"serve-{n}.log"

    def tail(self) -> str:
        """The end of the running (or last) incarnation's log."""
        path = self.log_path()
        return path.read_text(errors="replace")[-_TAIL_CHARS:] if path.exists() else "(no log)"

    def start(self) -> None:
        """Start a new incarnation with the same settings (call from the main thread)."""
        assert not self.running, f"r{self.index} still runs"
        self._close_log()
        self.incarnation += 1
        self._log = self.log_path().open("wb")
        serve = [*self._prefix, sys.executable, "-m", "purgatory.service.cli", "serve"]
        self._proc = subprocess.Popen(
            with_pdeathsig(serve),
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            process_group=0,
        )

    async def wait_ready(self, bound_s: float, token: str) -> float:
        """Poll ``/readyz`` every 100 ms until it answers 200; the seconds it took.

        Raises:
            ReplicaTimeoutError: ``serve`` exited, or ``/readyz`` was not 200 within ``bound_s``
                (naming the last answer and the log).
        """
        began = trio.current_time()
        last = "no answer yet"
        headers = {"authorization": f"Bearer {token}"}
        async with httpx.AsyncClient(headers=headers, timeout=2.0) as http:
            while True:
                if self._proc is None or self._proc.poll() is not None:
                    code = None if self._proc is None else self._proc.returncode
                    raise ReplicaTimeoutError(
                        f"r{self.index} exited ({code}) before /readyz answered 200; log "
                        f"{self.log_path()}:\n{self.tail()}"
                    )
                try:
                    response = await http.get(f"{self.url}/readyz")
                    if response.status_code == 200:
                        return trio.current_time() - began
                    last = f"HTTP {response.status_code} {response.text[:600]}"
                except httpx.HTTPError as exc:
                    last = f"no answer ({type(exc).__name__})"
                if trio.current_time() - began >= bound_s:
                    raise ReplicaTimeoutError(
                        f"r{self.index}: /readyz was not 200 within {bound_s:.0f} s of its start;"
                        f" last: {last} (log {self.log_path()})"
                    )
                await trio.sleep(_POLL_READY_S)

    async def stop(self, bound_s: float) -> Stopped:
        """SIGTERM to ``serve``, as Kubernetes ends a pod; wait until it and its snapshotter
        are gone.

        Raises:
            ReplicaTimeoutError: one of them still ran after ``bound_s`` (both are killed then).
        """
        proc = self._proc
        assert proc is not None and proc.poll() is None, f"r{self.index} is not running"
        snapshotters = child_pids(proc.pid)
        began = trio.current_time()
        proc.send_signal(signal.SIGTERM)
        while proc.poll() is None or any(alive(pid) for pid in snapshotters):
            if trio.current_time() - began >= bound_s:
                rest = [pid for pid in snapshotters if alive(pid)]
                self.close(snapshotters)
                raise ReplicaTimeoutError(
                    f"r{self.index}: after SIGTERM, serve (exit {proc.poll()}) or its "
                    f"snapshotter {rest} still ran after {bound_s:.0f} s (killed; log "
                    f"{self.log_path()})"
                )
            await trio.sleep(_POLL_EXIT_S)
        seconds = trio.current_time() - began
        self._proc = None
        self._close_log()
        return Stopped(round(seconds, 3), proc.returncode, len(snapshotters))

    def close(self, snapshotters: list[int] | None = None) -> None:
        """SIGKILL whatever still runs, ``serve``'s group and its snapshotter (idempotent)."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            others = child_pids(proc.pid) if snapshotters is None else snapshotters
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            for pid in others:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(_KILL_WAIT_S)
        elif snapshotters:
            for pid in snapshotters:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
