"""The replicas under test: ``purgatory serve`` processes, each in its host's namespace.

Each replica is a consumer-group member (no static partitions) that advertises its own URL, so
the group's map tells every member where to forward. It runs in a process group of its own with
its snapshotter child, so that SIGSTOP freezes and SIGKILL kills both, as a paused or killed pod
would be; and it dies with the harness (``with_pdeathsig``: starts come from the main thread).
Every incarnation logs to a file of its own, and every exit is recorded in the history with its
code and whether the nemesis caused it: an exit nobody caused is a finding, and the replica is
started again so that the run goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import IO

import httpx

from purgatory.service.supervisors.supervisor import with_pdeathsig
from tests.freeze import freeze
from tests.nemesis._clock import Deadline, pause, wall_ms
from tests.nemesis.history import Exit, HistoryWriter
from tests.nemesis.lab import ADDRESSES, REPLICAS, Net

__all__ = ["HTTP_PORT", "Replica"]

HTTP_PORT = 8080
_STOP_TIMEOUT_S = 30.0
_KILL_WAIT_S = 10.0
_TAIL_CHARS = 3000


class Replica:
    """Replica ``index`` of the run: its process, its incarnations and its exits.

    Args:
        index: 0, 1 or 2 (host ``r<index>``).
        net: the lab.
        env: its environment (every ``PURGATORY_*`` setting but its own address).
        logs: the directory of its incarnations' logs.
        history: where its exits are recorded.
    """

    def __init__(
        self, index: int, net: Net, env: Mapping[str, str], logs: Path, history: HistoryWriter
    ) -> None:
        self.index = index
        self.host = REPLICAS[index]
        address = ADDRESSES[self.host]
        self.url = f"http://{address}:{HTTP_PORT}"
        self._net = net
        self._env = {
            **env,
            "PURGATORY_HTTP_HOST": address,
            "PURGATORY_HTTP_PORT": str(HTTP_PORT),
            "PURGATORY_ADVERTISED_URL": self.url,
            "PURGATORY_KAFKA_CLIENT_ID": f"nemesis-{self.host}",
        }
        self.logs = logs
        logs.mkdir(parents=True, exist_ok=True)
        self._history = history
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self.incarnation = -1
        self.paused = False

    @property
    def running(self) -> bool:
        """Whether an incarnation is running (or paused)."""
        return self._proc is not None and self._proc.poll() is None

    def log_path(self, incarnation: int) -> Path:
        return self.logs / f"serve-{incarnation}.log"

    def start(self) -> None:
        """Start a new incarnation (call from the main thread)."""
        assert self._proc is None or self._proc.poll() is not None
        self._close_log()
        self.incarnation += 1
        self._log = self.log_path(self.incarnation).open("wb")
        serve = [sys.executable, "-m", "purgatory.service.cli", "serve"]
        self._proc = subprocess.Popen(
            [*self._net.exec_prefix(self.host), *with_pdeathsig(serve)],
            env=self._env,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            process_group=0,  # with its snapshotter: a pause or a kill takes both
        )
        self.paused = False

    def wait_ready(self, timeout_s: float, token: str) -> bool:
        """Until ``/readyz`` answers 200 (False: not within ``timeout_s``, or it exited)."""
        deadline = Deadline(timeout_s)
        headers = {"authorization": f"Bearer {token}"}
        while not deadline.passed():
            if self._proc is None or self._proc.poll() is not None:
                return False
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", headers=headers, timeout=1).status_code == 200:
                    return True
            pause(0.25)
        return False

    def exited_on_its_own(self) -> bool:
        """Whether the running incarnation exited though nobody stopped it; records the exit."""
        if self._proc is None or self._proc.poll() is None:
            return False
        self._record(self._proc.returncode, by_nemesis=False)
        self._proc = None
        return True

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the replica's process group (it and its snapshotter)."""
        if self._proc is not None and self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                if signum == signal.SIGSTOP:
                    freeze(self._proc.pid, group=True)  # frozen when this returns
                else:
                    os.killpg(self._proc.pid, signum)
        self.paused = signum == signal.SIGSTOP or (self.paused and signum != signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, as the nemesis does; the exit is recorded as the nemesis's."""
        if self._proc is None:
            return
        self.signal(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(_KILL_WAIT_S)
        self._record(self._proc.poll() or -signal.SIGKILL, by_nemesis=True)
        self._proc = None
        self.paused = False

    def stop(self) -> int | None:
        """The final stop: SIGCONT, SIGTERM, then SIGKILL after 30 s; its exit code."""
        if self._proc is None:
            return None
        self.signal(signal.SIGCONT)
        self._proc.send_signal(signal.SIGTERM)
        try:
            code = self._proc.wait(_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            code = self._proc.wait(_KILL_WAIT_S)
        self._record(code, by_nemesis=False, final_stop=True)
        self._proc = None
        self._close_log()
        return code

    def close(self) -> None:
        """Kill whatever still runs (idempotent); for the ``finally``."""
        if self._proc is not None and self._proc.poll() is None:
            self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._proc.wait(_KILL_WAIT_S)
        self._proc = None
        self._close_log()

    def _record(self, code: int, *, by_nemesis: bool, final_stop: bool = False) -> None:
        if self._log is not None:
            self._log.flush()
        path = self.log_path(self.incarnation)
        tail = path.read_text(errors="replace")[-_TAIL_CHARS:] if path.exists() else ""
        self._history.add(
            Exit(self.index, self.incarnation, wall_ms(), code, by_nemesis, final_stop,
                 "" if by_nemesis or (final_stop and code == 0) else tail)
        )  # fmt: skip

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
