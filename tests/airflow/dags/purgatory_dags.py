"""The DAGs of the Airflow tests: a barrier over three upstream tasks' signals, and a wait.

Each upstream task "lands" its data, then signals its key; the barrier task defers until all
three keys are in. In these tests the upstream tasks first wait until the barrier is registered
(and land one after another), so that the barrier task really waits in the triggerer. Runs take
their scope from the run's conf (``params``), so that each test has a scope of its own.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

import pendulum
from airflow.sdk import dag, get_current_context, task

from purgatory.airflow import (
    PurgatoryBarrierOperator,
    PurgatoryHook,
    PurgatorySignalOperator,
    PurgatoryWaitOperator,
)
from purgatory.client import ApiError

KEYS = ["ingest/orders", "ingest/users", "ingest/events"]
PARAMS: dict[str, Any] = {"scope": "airflow", "skip": "", "delay_s": 1.0, "op_id": "elsewhere"}
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@task  # type: ignore[untyped-decorator]
def land(key: str, nth: int, signal: bool = True) -> float | None:
    """Wait for the barrier's registration, land after ``nth`` delays, then signal ``key``."""
    context = get_current_context()
    params = context["params"]
    op_id = f"{context['dag'].dag_id}/{context['run_id']}/wait"
    with PurgatoryHook().get_conn() as client:
        for _ in range(600):  # bounded: 60 s for the barrier task to register
            try:
                client.get(params["scope"], op_id)
                break
            except ApiError as exc:
                if exc.status != 404:
                    raise
                time.sleep(0.1)  # noqa: TID251 - a task of a real DAG run
        time.sleep(params["delay_s"] * nth)  # noqa: TID251
        if key == params["skip"] or not signal:
            return None
        client.signal(params["scope"], key, payload={"rows": 1000 * (nth + 1)})
    return time.time()  # noqa: TID251


@task  # type: ignore[untyped-decorator]
def report(callback: dict[str, Any]) -> list[str]:
    """What runs once the barrier is complete: here, the keys it saw."""
    return sorted(callback["signals"])


def _barrier(dag_id: str, timeout: dt.timedelta) -> Any:
    @dag(dag_id=dag_id, schedule=None, start_date=START, catchup=False, params=PARAMS)  # type: ignore[untyped-decorator]
    def barrier() -> None:
        wait = PurgatoryBarrierOperator(
            task_id="wait", scope="{{ params.scope }}", keys=KEYS, timeout=timeout
        )
        land.override(task_id="land_orders")(KEYS[0], 1)
        land.override(task_id="land_users")(KEYS[1], 2)
        land.override(task_id="land_events")(KEYS[2], 3, signal=False) >> PurgatorySignalOperator(
            task_id="signal_events", scope="{{ params.scope }}", key=KEYS[2]
        )
        report(wait.output)

    return barrier()


purgatory_barrier = _barrier("purgatory_barrier", dt.timedelta(minutes=5))
purgatory_barrier_missing = _barrier("purgatory_barrier_missing", dt.timedelta(seconds=15))


@dag(dag_id="purgatory_wait", schedule=None, start_date=START, catchup=False, params=PARAMS)  # type: ignore[untyped-decorator]
def _wait() -> None:
    PurgatoryWaitOperator(
        task_id="wait", scope="{{ params.scope }}", op_id="{{ params.op_id }}",
        timeout=dt.timedelta(minutes=5),
    )  # fmt: skip


purgatory_wait = _wait()


@dag(dag_id="purgatory_signal_docs", schedule=None, start_date=START, catchup=False, params=PARAMS)  # type: ignore[untyped-decorator]
def _signal_docs() -> None:
    """A signal through the connection docs/airflow.md adds (``purgatory_docs``)."""
    PurgatorySignalOperator(
        task_id="signal", scope="{{ params.scope }}", key="k", purgatory_conn_id="purgatory_docs"
    )


purgatory_signal_docs = _signal_docs()
