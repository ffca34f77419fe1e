"""A real Airflow beside a real purgatory service, for the tests of purgatory.airflow.

Airflow runs in its own environment (``.venv-airflow``, ``make airflow``), never imported here:
this session starts its api-server (the execution API the executor's tasks report to) and a
triggerer as processes, on a temporary SQLite database, and runs each DAG with
``dag.test(use_executor=True)`` in a third (tests/airflow/_run_dag.py), so that the waiting task
really defers and the triggerer really waits. The service runs on the embedded broker with an
API token, which the DAGs' tasks read from the ``purgatory_default`` connection (an
``AIRFLOW_CONN_`` variable, as a secrets backend would hand it over).
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
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pytest

from purgatory.devtools.broker import free_port
from purgatory.devtools.child import service_process

if TYPE_CHECKING:
    from purgatory.devtools.broker import EmbeddedBroker

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-airflow" / "bin" / "python"
AIRFLOW = ROOT / ".venv-airflow" / "bin" / "airflow"


@dataclass(frozen=True)
class Service:
    url: str
    token: str


@pytest.fixture(scope="session")
def purgatory_service(
    tansu_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    tag, token = uuid.uuid4().hex[:6], secrets.token_urlsafe(24)
    names = {
        "PURGATORY_TOPIC_REQUESTS": f"af-requests-{tag}",
        "PURGATORY_TOPIC_SIGNALS": f"af-signals-{tag}",
        "PURGATORY_TOPIC_CALLBACKS": f"af-callbacks-{tag}",
        "PURGATORY_TOPIC_DEAD_LETTERS": f"af-dead-{tag}",
        "PURGATORY_TOPIC_CHANGELOG": f"af-changelog-{tag}",
        "PURGATORY_TOPIC_SNAPSHOTS": f"af-snapshots-{tag}",
        "PURGATORY_KAFKA_GROUP_ID": f"af-group-{tag}",
    }
    tansu_broker.create_topics({topic: 2 for name, topic in names.items() if "TOPIC" in name})
    log = tmp_path_factory.mktemp("purgatory") / "service.log"
    env = {**names, "PURGATORY_API_TOKEN": token}
    with service_process(tansu_broker.bootstrap_servers, log, env) as child:
        yield Service(child.url, token)


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    for _ in range(1_200):  # bounded: 120 s
        if process.poll() is not None:
            raise RuntimeError(f"exited {process.returncode}: {log.read_text()[-3000:]}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.1)  # noqa: TID251 - a bound on a real process
    raise RuntimeError(f"not listening on {port} within 120 s: {log.read_text()[-3000:]}")


@dataclass
class Airflow:
    """The session's Airflow: its environment, its processes, and a way to run a DAG."""

    home: Path
    env: dict[str, str]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[str, IO[bytes]] = field(default_factory=dict)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = self.logs.get(name) or (self.home / f"{name}.log").open("ab")
        self.logs[name] = log
        process = subprocess.Popen(  # a group of its own: its children go with it
            [str(AIRFLOW), *args], env=self.env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        self.processes[name] = process
        return process

    def log(self, name: str) -> str:
        return (self.home / f"{name}.log").read_text(errors="replace")

    def task_log(self, dag_id: str, run_id: str, task_id: str, *, trigger: bool = False) -> str:
        """A task's log (every attempt), or the log its triggers wrote."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        pattern = "attempt=*.log.trigger.*.log" if trigger else "attempt=*.log"
        return "".join(path.read_text(errors="replace") for path in sorted(folder.glob(pattern)))

    def kill(self, name: str) -> None:
        """SIGKILL a process and its children, as a node's loss would."""
        process = self.processes.pop(name)
        _signal_group(process, signal.SIGKILL)
        process.wait(timeout=30)

    def run(
        self,
        dag_id: str,
        conf: dict[str, Any],
        logical_date: str | None = None,
        timeout_s: float = 300,
    ) -> dict[str, Any]:
        """Run ``dag_id`` to its end (bounded: 5 minutes); its state and its tasks'."""
        return self.finish(self.begin(dag_id, conf, logical_date), timeout_s)

    def begin(
        self, dag_id: str, conf: dict[str, Any], logical_date: str | None = None
    ) -> subprocess.Popen[str]:
        args = [str(PYTHON), str(Path(__file__).parent / "_run_dag.py"), dag_id, json.dumps(conf)]
        return subprocess.Popen(
            [*args, *([logical_date] if logical_date else [])],
            env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip

    @staticmethod
    def finish(run: subprocess.Popen[str], timeout_s: float = 300) -> dict[str, Any]:
        try:
            output, _ = run.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired as exc:
            _signal_group(run, signal.SIGKILL)
            output, _ = run.communicate()
            raise AssertionError(
                f"the DAG run did not end within {timeout_s:g} s:\n{output[-6000:]}"
            ) from exc
        _signal_group(run, signal.SIGKILL)  # what the run left of its group (executor workers)
        lines = [line for line in output.splitlines() if line.startswith("RESULT ")]
        assert lines, f"the DAG run printed no result:\n{output[-4000:]}"
        result: dict[str, Any] = json.loads(lines[-1].removeprefix("RESULT "))
        return result

    def close(self) -> None:
        for process in self.processes.values():
            _signal_group(process, signal.SIGTERM)
        for process in self.processes.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=30)
            _signal_group(process, signal.SIGKILL)  # what is left of its group
        for log in self.logs.values():
            log.close()


def _signal_group(process: subprocess.Popen[Any], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


def _environment(home: Path, service: Service) -> dict[str, str]:
    api_port = free_port()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "PURGATORY_"))}
    return {
        **keep,
        "AIRFLOW_HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "AIRFLOW__CORE__DAGS_FOLDER": str(Path(__file__).parent / "dags"),
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
            {"conn_type": "purgatory", "host": service.url, "password": service.token}
        ),
    }


@pytest.fixture(scope="session")
def airflow(
    purgatory_service: Service, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Airflow]:
    if not AIRFLOW.exists():
        pytest.fail("Airflow's environment is missing: run `make airflow`")
    home = tmp_path_factory.mktemp("airflow")
    env = _environment(home, purgatory_service)
    subprocess.run(
        [str(AIRFLOW), "db", "migrate"], env=env, check=True, capture_output=True, timeout=300
    )
    airflow = Airflow(home, env)
    try:
        api = airflow.start("api-server", "api-server", "--apps", "execution")
        _wait_for_port(int(env["AIRFLOW__API__PORT"]), api, home / "api-server.log")
        airflow.start("triggerer", "triggerer")
        yield airflow
    finally:
        airflow.close()
