"""A real Prometheus for the monitoring tests: where its binaries are, and a server to query.

``make prometheus`` unpacks Debian's ``prometheus`` package (server and ``promtool``) into the
venv, ``<venv>/prometheus/usr/bin``; binaries on PATH serve as well. Without either the tests
fail, naming the make target: they are part of the gate, never skipped.

:func:`run_prometheus` starts the server on a free loopback port with a generated config (one
scrape job, a short interval, storage in a directory of the test's), under coreutils'
``timeout`` so that it ends even if the test process dies; it is stopped on exit. Every wait
polls the HTTP API with a deadline.
"""

from __future__ import annotations

import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

__all__ = ["Prometheus", "Sample", "binary", "pause", "run_prometheus"]

_ROOT = Path(__file__).resolve().parents[2]
# The venv running the tests first (make's VENV), then the repository's default one.
_DIRS = (
    Path(sys.prefix) / "prometheus" / "usr" / "bin",
    _ROOT / ".venv" / "prometheus" / "usr" / "bin",
)


def binary(name: str) -> Path:
    """The path of ``promtool`` or ``prometheus``; fails the test, naming the fix, if missing."""
    for directory in _DIRS:
        if (directory / name).is_file() and os.access(directory / name, os.X_OK):
            return directory / name
    found = shutil.which(name)
    if found is not None:
        return Path(found)
    pytest.fail(
        f"{name} is not installed: run `make prometheus` (it unpacks Debian's prometheus"
        f" package into {_DIRS[0].parents[1]}), or put {name} on PATH",
        pytrace=False,
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def pause(seconds: float) -> None:
    """Wait for real: a real server scrapes on its own clock."""
    time.sleep(seconds)  # noqa: TID251 - real processes, real time


@dataclass(frozen=True, slots=True)
class Sample:
    """One element of an instant vector: its labels (``__name__`` left out) and value."""

    labels: dict[str, str]
    value: float


class Prometheus:
    """A running server's HTTP API."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self._proc = proc
        self._log = log
        self._http = httpx.Client(base_url=url, timeout=10)

    def api(self, path: str, **params: str | list[str]) -> Any:
        """``GET /api/v1/<path>``'s ``data``; fails on an error answer."""
        self._check_alive()
        answer = self._http.get(f"/api/v1/{path}", params=params)
        body = answer.json()
        assert body["status"] == "success", f"{path} {params}: {body}"
        return body["data"]

    def query(self, expr: str) -> list[Sample]:
        """Evaluate an instant query now."""
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", f"{expr}: {data['resultType']}"
        return [
            Sample(
                {k: v for k, v in item["metric"].items() if k != "__name__"},
                float(item["value"][1]),
            )
            for item in data["result"]
        ]

    def value(self, expr: str) -> float:
        """The value of a query that returns one sample (NaN if it returns none)."""
        samples = self.query(expr)
        assert len(samples) <= 1, f"{expr}: {samples}"
        return samples[0].value if samples else math.nan

    def wait_for(
        self,
        expr: str,
        done: Callable[[list[Sample]], bool],
        *,
        timeout_s: float,
        what: str,
    ) -> list[Sample]:
        """Poll ``expr`` until ``done`` holds for its result; fail after ``timeout_s``."""
        end = time.perf_counter() + timeout_s
        while True:
            samples = self.query(expr)
            if done(samples):
                return samples
            if time.perf_counter() >= end:
                pytest.fail(f"{what}: not within {timeout_s} s; {expr} = {samples}")
            pause(0.2)

    def close(self) -> None:
        self._http.close()

    def log_tail(self, chars: int = 3000) -> str:
        text = self._log.read_text(errors="replace") if self._log.exists() else ""
        return f"--- {self._log} (tail) ---\n{text[-chars:]}"

    def _check_alive(self) -> None:
        code = self._proc.poll()
        assert code is None, f"prometheus exited with {code}\n{self.log_tail()}"


def _config(job: str, target: str, labels: Mapping[str, str], rules: Path | None) -> str:
    config: dict[str, Any] = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": job,
                "static_configs": [{"targets": [target], "labels": dict(labels)}],
            }
        ],
    }
    if rules is not None:
        config["rule_files"] = [str(rules)]
    text: str = yaml.safe_dump(config, sort_keys=False)
    return text


@contextmanager
def run_prometheus(
    workdir: Path,
    *,
    job: str,
    target: str,
    labels: Mapping[str, str],
    rules: Path | None = None,
    lifetime_s: int = 300,
) -> Iterator[Prometheus]:
    """Run a Prometheus server that scrapes ``target`` every second, until the block ends.

    Args:
        workdir: a directory of the test's (config, storage, log).
        job: the scrape job's name (the ``job`` label).
        target: ``host:port`` of a ``/metrics`` endpoint.
        labels: target labels added to every series (as Kubernetes discovery would).
        rules: a rules file to load and evaluate every second.
        lifetime_s: the server is killed after this long whatever happens to the test.

    Raises:
        AssertionError: the server did not become ready within 30 s.
    """
    config = workdir / "prometheus.yml"
    config.write_text(_config(job, target, labels, rules))
    port = _free_port()
    argv = [
        str(binary("prometheus")),
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
        "--log.level=warn",
    ]
    timeout = shutil.which("timeout")
    if timeout is not None:
        argv = [timeout, "--kill-after=5", str(lifetime_s), *argv]
    log = workdir / "prometheus.log"
    with log.open("wb") as out:
        # A session of its own: the whole group (timeout and its child) can be killed at once.
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = Prometheus(f"http://127.0.0.1:{port}", proc, log)
    try:
        end = time.perf_counter() + 30
        while True:
            server._check_alive()
            try:
                if httpx.get(f"{server.url}/-/ready", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.perf_counter() < end, f"not ready within 30 s\n{server.log_tail()}"
            pause(0.1)
        yield server
    finally:
        server.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
