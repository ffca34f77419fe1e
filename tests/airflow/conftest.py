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

import json
import secrets
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from purgatory.devtools.child import own_names, service_process
from tests.airflow._harness import AIRFLOW, PYTHON, AirflowProcesses, airflow_env, result_of

if TYPE_CHECKING:
    from purgatory.devtools.broker import EmbeddedBroker

__all__ = ["AIRFLOW", "PYTHON", "Airflow", "Service"]


@dataclass(frozen=True)
class Service:
    url: str
    token: str


@pytest.fixture(scope="session")
def purgatory_service(
    tansu_broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    tag, token = uuid.uuid4().hex[:6], secrets.token_urlsafe(24)
    names = own_names("af-", tag)
    tansu_broker.create_topics({topic: 2 for name, topic in names.items() if "TOPIC" in name})
    log = tmp_path_factory.mktemp("purgatory") / "service.log"
    env = {**names, "PURGATORY_API_TOKEN": token}
    with service_process(tansu_broker.bootstrap_servers, log, env) as child:
        yield Service(child.url, token)


class Airflow(AirflowProcesses):
    """The session's Airflow, and a way to run a DAG of tests/airflow/dags."""

    def run(
        self,
        dag_id: str,
        conf: dict[str, Any],
        logical_date: str | None = None,
        timeout_s: float = 300,
    ) -> dict[str, Any]:
        """Run ``dag_id`` to its end (bounded); its state and its tasks'."""
        return self.finish_dag(self.begin_dag(dag_id, conf, logical_date), timeout_s)

    def begin_dag(
        self, dag_id: str, conf: dict[str, Any], logical_date: str | None = None
    ) -> subprocess.Popen[str]:
        args = [str(Path(__file__).parent / "_run_dag.py"), dag_id, json.dumps(conf)]
        return self.begin(*args, *([logical_date] if logical_date else []))

    def finish_dag(self, run: subprocess.Popen[str], timeout_s: float = 300) -> dict[str, Any]:
        try:
            return result_of(self.finish(run, "the DAG run", timeout_s), "the DAG run")
        except RuntimeError as exc:
            raise AssertionError(str(exc)) from exc

    def task_log(self, dag_id: str, run_id: str, task_id: str, *, trigger: bool = False) -> str:
        """A task's log (every attempt), or the log its triggers wrote."""
        folder = self.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
        pattern = "attempt=*.log.trigger.*.log" if trigger else "attempt=*.log"
        return "".join(path.read_text(errors="replace") for path in sorted(folder.glob(pattern)))


@pytest.fixture(scope="session")
def airflow(
    purgatory_service: Service, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Airflow]:
    if not AIRFLOW.exists():
        pytest.fail("Airflow's environment is missing: run `make airflow`")
    home = tmp_path_factory.mktemp("airflow")
    dags = Path(__file__).parent / "dags"
    airflow = Airflow(home, airflow_env(home, dags, purgatory_service.url, purgatory_service.token))
    try:
        airflow.migrate()
        airflow.serve()
        airflow.start("triggerer", "triggerer")
        yield airflow
    finally:
        airflow.close()
