"""DAGs that wait on purgatory, run by a real Airflow against a real service (see conftest).

A barrier task registers its operation and defers; the triggerer holds the service's long poll
until the last of three upstream signals; the task resumes with the callback. The same with one
upstream that never signals fails at the deadline naming its key; the same run again is a
duplicate of the finished operation; a triggerer killed mid-wait hands the wait to the next.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from typing import TYPE_CHECKING, Any

import pytest

from purgatory.client import PurgatoryClient
from tests.airflow.conftest import AIRFLOW, PYTHON

if TYPE_CHECKING:
    from tests.airflow.conftest import Airflow, Service

pytestmark = [pytest.mark.airflow, pytest.mark.xdist_group("airflow")]

KEYS = ["ingest/orders", "ingest/users", "ingest/events"]
SUCCESS = "success"


def _scope() -> str:
    return f"af-{uuid.uuid4().hex[:8]}"


def test_the_barrier_task_waits_for_the_last_of_three_signals_then_runs(
    airflow: Airflow, purgatory_service: Service
) -> None:
    scope = _scope()
    result = airflow.run("purgatory_barrier", {"scope": scope, "delay_s": 1.0})
    tasks = result["tasks"]
    assert result["state"] == SUCCESS, tasks
    assert {t: v["state"] for t, v in tasks.items()} == dict.fromkeys(tasks, SUCCESS)
    callback = tasks["wait"]["xcom"]
    assert callback["outcome"] == "completed" and callback["scope"] == scope
    assert callback["op_id"] == f"purgatory_barrier/{result['run_id']}/wait"
    assert sorted(callback["signals"]) == sorted(KEYS)
    assert tasks["report"]["xcom"] == sorted(KEYS)
    # The task resumed after the last signal (events, sent by the signal operator), not before.
    last = tasks["signal_events"]["end"]
    assert tasks["wait"]["end"] >= callback["outcome_ms"] / 1000 >= tasks["land_orders"]["xcom"]
    assert callback["outcome_ms"] / 1000 >= tasks["signal_events"]["start"]
    assert tasks["wait"]["end"] - last < 30
    # It deferred, and waited in the triggerer on the service's long poll.
    run_id = result["run_id"]
    assert "Pausing task as DEFERRED" in airflow.task_log("purgatory_barrier", run_id, "wait")
    trigger = airflow.task_log("purgatory_barrier", run_id, "wait", trigger=True)
    assert f"waiting for the outcome of {scope}/purgatory_barrier/{run_id}/wait" in trigger
    assert "'status': 'completed'" in trigger
    print(f"last signal -> task resumed: {tasks['wait']['end'] - last:.2f} s")


def test_an_upstream_that_never_signals_fails_the_task_at_the_deadline_naming_it(
    airflow: Airflow,
) -> None:
    scope = _scope()
    conf = {"scope": scope, "delay_s": 0.5, "skip": "ingest/users"}
    result = airflow.run("purgatory_barrier_missing", conf)
    tasks, run_id = result["tasks"], result["run_id"]
    assert result["state"] == "failed"
    assert tasks["wait"]["state"] == "failed" and tasks["wait"]["try_number"] == 1
    assert tasks["report"]["state"] == "upstream_failed"
    assert tasks["land_users"]["state"] == SUCCESS  # it ran, and never said so
    log = airflow.task_log("purgatory_barrier_missing", run_id, "wait")
    op_id = f"purgatory_barrier_missing/{run_id}/wait"
    assert f"purgatory operation {op_id!r} in scope {scope!r} expired at its deadline" in log, log[
        -3000:
    ]
    assert "missing keys ['ingest/users']" in log
    # It failed at the deadline (15 s after the run's moment), not before.
    trigger = airflow.task_log("purgatory_barrier_missing", run_id, "wait", trigger=True)
    assert "'status': 'expired'" in trigger


def test_the_same_run_again_is_a_duplicate_and_resumes_with_the_first_outcome(
    airflow: Airflow,
) -> None:
    scope, moment = _scope(), time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    first = airflow.run("purgatory_barrier", {"scope": scope, "delay_s": 0.2}, moment)
    second = airflow.run("purgatory_barrier", {"scope": scope, "delay_s": 0.2}, moment, 60)
    assert first["run_id"] == second["run_id"]
    assert first["state"] == second["state"] == SUCCESS, second["tasks"]
    one, two = first["tasks"]["wait"]["xcom"], second["tasks"]["wait"]["xcom"]
    assert one["outcome"] == "completed"
    assert two == one  # the same callback: the operation was registered once
    # The second registration found the finished operation: the task never deferred.
    log = airflow.task_log("purgatory_barrier", second["run_id"], "wait")
    assert log.count("Pausing task as DEFERRED") == 1  # the first run's only


def _wait_until(probe: Any, what: str, bound_s: float = 120.0) -> None:
    end = time.monotonic() + bound_s  # noqa: TID251 - a bound on real processes
    while not probe():
        assert time.monotonic() < end, f"not within {bound_s:g} s: {what}"  # noqa: TID251
        time.sleep(0.2)  # noqa: TID251


def test_a_triggerer_killed_mid_wait_hands_the_wait_to_the_next(
    airflow: Airflow, purgatory_service: Service
) -> None:
    """An operation registered elsewhere (a Spark job, say); the triggerer is SIGKILLed while it
    waits; a new triggerer re-creates the trigger from its serialized form and goes on."""
    scope, op_id = _scope(), "spark/daily-load"

    def service() -> PurgatoryClient:
        return PurgatoryClient(purgatory_service.url, token=purgatory_service.token)

    with service() as client:
        client.register(scope=scope, op_id=op_id, keys=["table/ready"], timeout_ms=600_000)
    run = airflow.begin_dag("purgatory_wait", {"scope": scope, "op_id": op_id})
    waiting = f"waiting for the outcome of {scope}/{op_id}"

    def trigger_log() -> str:
        logs = airflow.home / "logs" / "dag_id=purgatory_wait"
        return "".join(
            p.read_text(errors="replace") for p in logs.glob("*/task_id=wait/*.trigger.*")
        )

    try:
        _wait_until(lambda: waiting in trigger_log(), "the first triggerer waits")
        airflow.kill("triggerer")
        airflow.start("triggerer", "triggerer")
        _wait_until(lambda: trigger_log().count(waiting) >= 2, "the next triggerer waits")
        with service() as client:
            client.signal(scope, "table/ready", payload={"rows": 42})
        result = airflow.finish_dag(run)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert result["state"] == SUCCESS, result["tasks"]
    callback = result["tasks"]["wait"]["xcom"]
    assert callback["outcome"] == "completed" and callback["op_id"] == op_id
    assert callback["signals"] == {"table/ready": {"rows": 42}}


def test_the_connection_added_as_the_docs_say_is_what_the_tasks_use(
    airflow: Airflow, purgatory_service: Service
) -> None:
    """docs/airflow.md's ``airflow connections add``, into Airflow's database: the hook reads it
    in a task and its token lets a signal through; the provider is discovered by its entry
    point, and the trigger's stored form holds no secret."""
    env = {k: v for k, v in airflow.env.items() if not k.startswith("AIRFLOW_CONN_")}
    add = [
        str(AIRFLOW), "connections", "add", "purgatory_docs", "--conn-type", "purgatory",
        "--conn-host", purgatory_service.url, "--conn-password", purgatory_service.token,
    ]  # fmt: skip
    subprocess.run(add, env=env, check=True, capture_output=True, timeout=120)
    script = """
import json
from airflow.providers_manager import ProvidersManager
from purgatory.airflow import PurgatoryTrigger
manager = ProvidersManager()
hook = manager.hooks.get("purgatory")
trigger = PurgatoryTrigger("s", "o", 1.5, purgatory_conn_id="purgatory_docs")
path, kwargs = trigger.serialize()
again = type(trigger)(**kwargs)
print("RESULT " + json.dumps({
    "hook": hook.hook_class_name, "provider": manager.providers["purgatory"].version,
    "triggers": [t.trigger_class_name for t in manager.trigger if t.package_name == "purgatory"],
    "path": path, "kwargs": kwargs, "same": again.serialize() == (path, kwargs),
}))
"""
    out = subprocess.run(
        [str(PYTHON), "-c", script],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert result["hook"] == "purgatory.airflow.hooks.PurgatoryHook"
    assert result["provider"] == "0.1.0"
    assert result["triggers"] == ["purgatory.airflow.triggers"]
    assert result["path"] == "purgatory.airflow.triggers.PurgatoryTrigger" and result["same"]
    assert "password" not in json.dumps(result["kwargs"]) and "token" not in result["kwargs"]
    run = airflow.run("purgatory_signal_docs", {"scope": _scope()})
    assert run["state"] == SUCCESS, run["tasks"]
    assert run["tasks"]["signal"]["xcom"] == {"accepted": 1, "completed": 0}
