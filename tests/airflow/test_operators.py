"""The operators' decisions, in Airflow's environment, without a DAG run: the connection's URL,
the deadline a run gets, and what each trigger event makes of the task (the outcomes a real run
does not reach cheaply: cancelled, no outcome in time, a refusal)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.airflow.conftest import PYTHON

pytestmark = [pytest.mark.airflow, pytest.mark.xdist_group("airflow")]

SCRIPT = r"""
import datetime as dt, json
from types import SimpleNamespace
from airflow.sdk.exceptions import AirflowException, AirflowFailException
from purgatory.airflow import DEFAULT_OP_ID, PurgatoryBarrierOperator, PurgatoryWaitOperator
from purgatory.airflow.hooks import base_url

out = {}
out["urls"] = [
    base_url("http://svc:8080", None), base_url("svc", 8080), base_url("https://svc/", None),
    base_url("http://svc", 9000), base_url("http://svc:8080", 9000),
]
try:
    base_url("", None)
except ValueError as exc:
    out["no_host"] = str(exc)

op = PurgatoryBarrierOperator(task_id="t", scope="s", keys=["a"], timeout=dt.timedelta(minutes=5))
moment = dt.datetime(2026, 11, 27, 6, 0, tzinfo=dt.timezone.utc)
run = SimpleNamespace(run_after=moment, logical_date=None)
out["deadline_from_run_after"] = op._deadline_ms({"dag_run": run})
out["default_op_id"] = op.op_id == DEFAULT_OP_ID
at_seven = "2026-11-27T07:00:00+00:00"
fixed = PurgatoryBarrierOperator(task_id="f", scope="s", keys=["a"], deadline=at_seven)
out["deadline_given"] = fixed._deadline_ms({})
for bad in ({}, {"deadline": 1, "timeout": dt.timedelta(1)}):
    try:
        PurgatoryBarrierOperator(task_id="x", scope="s", keys=["a"], **bad)
    except ValueError as exc:
        out.setdefault("one_of", []).append(str(exc))
naive = PurgatoryBarrierOperator(task_id="n", scope="s", keys=["a"], deadline="2026-11-27T07:00:00")
try:
    naive._deadline_ms({})
except ValueError as exc:
    out["naive"] = str(exc)

def settle(operator, event):
    try:
        return ["returned", operator.execute_complete({}, event)]
    except AirflowFailException as exc:
        return ["fail", str(exc)]
    except AirflowException as exc:
        return ["retryable", str(exc)]

callback = {"outcome": "expired", "missing": ["b"], "deadline_ms": 5}
day = dt.timedelta(1)
waits = PurgatoryWaitOperator(task_id="w", scope="s", op_id="o", timeout=day)
lenient = PurgatoryWaitOperator(
    task_id="l", scope="s", op_id="o", timeout=day, fail_on_expired=False
)
out["settle"] = {
    "completed": settle(waits, {"status": "completed", "outcome": {"outcome": "completed"}}),
    "expired": settle(waits, {"status": "expired", "outcome": callback}),
    "expired_lenient": settle(lenient, {"status": "expired", "outcome": callback}),
    "cancelled": settle(waits, {"status": "cancelled", "outcome": {"outcome": "cancelled"}}),
    "timeout": settle(waits, {"status": "timeout", "message": "no outcome within 9 s"}),
    "error": settle(waits, {"status": "error", "message": "401 authorization: x"}),
    "none": settle(waits, None),
}
print("RESULT " + json.dumps(out))
"""


@pytest.fixture(scope="module")
def decided() -> dict[str, object]:
    out = subprocess.run(
        [str(PYTHON), "-c", SCRIPT], check=False, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, out.stdout[-3000:] + out.stderr[-3000:]
    result: dict[str, object] = json.loads(lines[-1].removeprefix("RESULT "))
    return result


def test_the_connection_gives_the_services_url(decided: dict[str, object]) -> None:
    assert decided["urls"] == [
        "http://svc:8080", "http://svc:8080", "https://svc", "http://svc:9000", "http://svc:8080"
    ]  # fmt: skip
    assert decided["no_host"] == "the purgatory connection has no host: set it to the service's URL"


def test_a_timeout_counts_from_the_runs_moment_and_a_deadline_is_absolute(
    decided: dict[str, object],
) -> None:
    six = 1_795_759_200_000  # 2026-11-27T06:00:00Z
    assert decided["deadline_from_run_after"] == six + 300_000
    assert decided["deadline_given"] == six + 3_600_000
    assert decided["default_op_id"] is True
    assert decided["one_of"] == ["x: give one of deadline or timeout"] * 2
    assert decided["naive"] == "deadline 2026-11-27T07:00:00 has no time zone"


def test_each_outcome_decides_the_task(decided: dict[str, object]) -> None:
    name = "purgatory operation 'o' in scope 's'"
    assert decided["settle"] == {
        "completed": ["returned", {"outcome": "completed"}],
        "expired": ["fail", f"{name} expired at its deadline (5 ms): missing keys ['b']"],
        "expired_lenient": [
            "returned", {"outcome": "expired", "missing": ["b"], "deadline_ms": 5}
        ],
        "cancelled": ["fail", f"{name} was cancelled"],
        "timeout": ["retryable", f"{name}: no outcome within 9 s"],  # the task's retries apply
        "error": ["fail", f"{name}: 401 authorization: x"],
        "none": ["retryable", f"purgatory {name[10:]}: the trigger fired no event"],
    }  # fmt: skip
