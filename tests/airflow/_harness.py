"""A real Airflow as processes, for tests/airflow and tests/benchmarks/bench_airflow.

Airflow lives in its own environment (``.venv-airflow``, ``make airflow``) and is never imported
here: its api-server (the execution API the executor's tasks report to) and its triggerer run as
processes, each in a session of its own so that its children (log servers, executor workers) go
with it, on a temporary SQLite database; a DAG runs with ``dag.test(use_executor=True)`` in
another process (tests/airflow/_run_dag.py), which prints ``RESULT <json>`` last.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from purgatory.devtools.broker import free_port

__all__ = ["AIRFLOW", "PYTHON", "ROOT", "AirflowProcesses", "airflow_env", "result_of"]

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-airflow" / "bin" / "python"
AIRFLOW = ROOT / ".venv-airflow" / "bin" / "airflow"


def signal_group(process: subprocess.Popen[Any], sig: signal.Signals) -> None:
    """Signal ``process``'s session (it was started with one of its own)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def airflow_env(home: Path, dags: Path, service_url: str, token: str) -> dict[str, str]:
    """Airflow's settings for a run on this machine: its home and DAGs, LocalExecutor, the
    execution API on a free port, and the ``purgatory_default`` connection (as a secrets
    backend would hand it over)."""
    api_port = free_port()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PURGATORY_"))}
    return {
        **keep,
        "AIRFLOW_HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": "8",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__API__PORT": str(api_port),
        "AIRFLOW__API_AUTH__JWT_SECRET": secrets.token_hex(32),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        # A killed triggerer's waits move to the next one after 5 s without its heartbeat.
        "AIRFLOW__SCHEDULER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "5",
        "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
        "AIRFLOW_CONN_PURGATORY_DEFAULT": json.dumps(
            {"conn_type": "purgatory", "host": service_url, "password": token}
        ),
    }


def result_of(output: str, what: str) -> dict[str, Any]:
    """The ``RESULT <json>`` line a DAG run printed last."""
    lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
    if not lines:
        raise RuntimeError(f"{what} printed no result:\n{output[-4000:]}")
    result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


@dataclass
class AirflowProcesses:
    """A temporary Airflow: its home, its environment, its processes and their logs."""

    home: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, IO[bytes]] = field(default_factory=dict)

    def migrate(self) -> None:
        """Create the database."""
        subprocess.run(
            [str(AIRFLOW), "db", "migrate"], env=self.env, check=True, capture_output=True,
            timeout=300,
        )  # fmt: skip

    def serve(self) -> subprocess.Popen[bytes]:
        """Start the execution API (bounded: 120 s to listen)."""
        api = self.start("api-server", "api-server", "--apps", "execution")
        port, log = int(self.env["AIRFLOW__API__PORT"]), self.home / "api-server.log"
        for _ in range(1_200):
            if api.poll() is not None:
                raise RuntimeError(f"exited {api.returncode}: {log.read_text()[-3000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                return api
            time.sleep(0.1)  # noqa: TID251 - a bound on a real process
        raise RuntimeError(f"not listening on {port} within 120 s: {log.read_text()[-3000:]}")

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        """``airflow *args`` in a session of its own, its output in ``<home>/<name>.log``."""
        log = self.logs.get(name) or (self.home / f"{name}.log").open("ab")
        self.logs[name] = log
        process = subprocess.Popen(
            [str(AIRFLOW), *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        """What the process ``name`` wrote."""
        return (self.home / f"{name}.log").read_text(errors="replace")

    def kill(self, name: str) -> None:
        """SIGKILL a process and its children, as a node's loss would."""
        process = self.processes.pop(name)
        signal_group(process, signal.SIGKILL)
        process.wait(timeout=30)

    def begin(self, *args: str) -> subprocess.Popen[str]:
        """A DAG run: ``.venv-airflow/bin/python *args`` in a session of its own."""
        return subprocess.Popen(
            [str(PYTHON), *args], env=self.env, cwd=ROOT, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip

    @staticmethod
    def finish(run: subprocess.Popen[str], what: str, timeout_s: float = 300) -> str:
        """The run's output once it ended (bounded: then killed, and an error with its tail)."""
        try:
            output, _ = run.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            signal_group(run, signal.SIGKILL)
            output, _ = run.communicate()
            raise RuntimeError(f"{what} did not end in {timeout_s:g} s:\n{output[-6000:]}") from exc
        finally:
            signal_group(run, signal.SIGKILL)  # what the run left of its group
        return output

    def close(self) -> None:
        """SIGTERM each process's group, then SIGKILL what is left of it."""
        for process in self.processes.values():
            signal_group(process, signal.SIGTERM)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            signal_group(process, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        for log in self.logs.values():
            log.close()
