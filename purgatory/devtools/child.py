"""The service as a child process (service layer; development, demos, tests and benchmarks).

:func:`service_process` starts ``purgatory serve`` as its own process against a broker, as it
runs in production, waits until ``/readyz`` answers 200, and stops it on leaving (SIGTERM, then
a kill). Whatever needs a real service beside it (the whole-pipeline demo, end-to-end tests,
benchmarks) runs it this way. With ``die_with_parent`` the kernel also kills the child
when its owner dies, even by SIGKILL (see :mod:`purgatory.devtools.broker`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from purgatory._core import ConfigError
from purgatory.devtools.broker import free_port
from purgatory.service.supervisors.supervisor import with_pdeathsig

__all__ = ["ServiceChild", "own_names", "service_process"]

_PARTITIONS = 2
_READY_TIMEOUT_S = 60.0
_TOPICS = ("requests", "signals", "callbacks", "dead_letters", "changelog", "snapshots")


def own_names(prefix: str, tag: str) -> dict[str, str]:
    """Settings that give a service topics and a consumer group of its own on a shared broker:
    ``PURGATORY_TOPIC_<KIND>`` = ``<prefix><kind>-<tag>`` (``dead`` for the dead letters) and
    ``PURGATORY_KAFKA_GROUP_ID`` = ``<prefix>group-<tag>``."""
    names = {
        f"PURGATORY_TOPIC_{kind.upper()}": f"{prefix}{kind.split('_')[0]}-{tag}" for kind in _TOPICS
    }
    return {**names, "PURGATORY_KAFKA_GROUP_ID": f"{prefix}group-{tag}"}


_STOP_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class ServiceChild:
    """A running ``purgatory serve`` child: its API's URL and its process id."""

    url: str
    pid: int


@contextlib.contextmanager
def service_process(
    bootstrap_servers: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    partitions: int = _PARTITIONS,
    static_partitions: Sequence[int] | None = None,
    port: int | None = None,
    die_with_parent: bool = False,
) -> Iterator[ServiceChild]:
    """``purgatory serve`` as a child process, ready; SIGTERM (then a kill) on leaving.

    The child sees this process's environment without its ``PURGATORY_*`` variables, then
    ``env``, then the broker, the loopback port and the static partitions set here.

    Args:
        bootstrap_servers: the broker.
        log_path: where the service's output goes.
        env: more ``PURGATORY_*`` settings (topic names, ...).
        partitions: the child owns partitions ``0 .. partitions - 1`` (static assignment)...
        static_partitions: ... or exactly these (a replica of several).
        port: the HTTP port (a free one by default; a replica's peers must know it first).
        die_with_parent: on Linux, the kernel kills the child when this process dies, even by
            SIGKILL; call from the main thread then (see :mod:`purgatory.devtools.broker`).

    Returns:
        A context manager that yields the ready :class:`ServiceChild`.

    Raises:
        ConfigError: the service exited, or was not ready within 60 s (with its log's tail).
        UsageError: ``die_with_parent`` is set and this is not the main thread.
    """
    port = port if port is not None else free_port()
    owned = static_partitions if static_partitions is not None else range(partitions)
    child_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")},
        **(env or {}),
        "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "PURGATORY_KAFKA_STATIC_PARTITIONS": ",".join(str(p) for p in owned),
        "PURGATORY_HTTP_HOST": "127.0.0.1",
        "PURGATORY_HTTP_PORT": str(port),
    }
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "purgatory.service.cli", "serve"]
    if die_with_parent:
        command = with_pdeathsig(command)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_ready(proc, url, log_path)
            yield ServiceChild(url, proc.pid)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=_STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    with httpx.Client(timeout=2.0) as client:
        for _ in range(int(_READY_TIMEOUT_S / 0.25)):
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/readyz").status_code == 200:
                    return
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.25)  # the pause, and it notices an early exit
            if proc.returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise ConfigError(f"the service exited with {proc.returncode}:\n{tail}")
    raise ConfigError(f"the service was not ready within {_READY_TIMEOUT_S} s (log: {log_path})")
