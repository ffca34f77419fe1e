"""Run one DAG of tests/airflow/dags with ``dag.test(use_executor=True)``; print its result.

Runs in the Airflow environment (``.venv-airflow``), driven by tests/airflow: the executor runs
the tasks, the api-server and the triggerer of the test session serve them. The last line of
output is ``RESULT <json>``: the run's state and each task's state, times and XCom.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

DAGS = Path(__file__).parent / "dags" / "purgatory_dags.py"


def _bound_the_executors_end() -> None:
    """LocalExecutor.end joins each worker with no bound; once in about ten runs here an idle
    worker missed its shutdown message and the run, its DAG long finished, never returned. The
    tests' executor ends within 20 s a worker: the rest is terminated."""
    from airflow.executors.local_executor import LocalExecutor  # noqa: PLC0415

    def end(self: Any) -> None:
        for proc in self.workers.values():
            if proc.is_alive():
                self.activity_queue.put(None)
        for proc in self.workers.values():
            proc.join(timeout=20)
            if proc.is_alive():
                proc.terminate()
                proc.join(timeout=5)
        self._read_results()

    LocalExecutor.end = end


def main(dag_id: str, conf: dict[str, Any], logical_date: str | None) -> None:
    from airflow.models.xcom import XComModel  # noqa: PLC0415
    from airflow.utils.session import create_session  # noqa: PLC0415
    from sqlalchemy import select  # noqa: PLC0415

    _bound_the_executors_end()
    spec = importlib.util.spec_from_file_location("purgatory_dags", DAGS)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    dag = next(v for v in vars(module).values() if getattr(v, "dag_id", None) == dag_id)
    moment = dt.datetime.fromisoformat(logical_date) if logical_date else None
    run = dag.test(run_conf=conf, logical_date=moment, run_after=moment, use_executor=True)
    tasks: dict[str, Any] = {}
    with create_session() as session:
        for ti in run.get_task_instances(session=session):
            tasks[ti.task_id] = {
                "state": str(ti.state),
                "try_number": ti.try_number,
                "start": ti.start_date.timestamp() if ti.start_date else None,
                "end": ti.end_date.timestamp() if ti.end_date else None,
            }
        query = select(XComModel.task_id, XComModel.value).where(
            XComModel.run_id == run.run_id, XComModel.dag_id == dag_id,
            XComModel.key == "return_value",
        )  # fmt: skip
        for task_id, value in session.execute(query).all():
            tasks[task_id]["xcom"] = json.loads(value) if isinstance(value, str) else value
    print("RESULT " + json.dumps({"state": str(run.state), "run_id": run.run_id, "tasks": tasks}))


if __name__ == "__main__":
    main(sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else None)
