"""Tasks that wait on purgatory, and a task that signals it (airflow integration: operators).

:class:`PurgatoryBarrierOperator` registers an operation (a barrier over watch keys with a
deadline) and *defers*: the task gives its worker slot back and :class:`PurgatoryTrigger` waits
in the triggerer on the service's long poll. When the outcome comes the task resumes:

* ``completed``: the task succeeds and returns the callback (its XCom);
* ``expired``: the task fails, naming the keys still missing (or succeeds and returns the
  callback, with ``fail_on_expired=False``); a retry would only find the same outcome, so the
  failure skips the task's retries;
* ``cancelled``, or the service refusing the registration (``409``: the same op_id with another
  body): the task fails, skipping its retries;
* no outcome within the wait (the service unreachable past the deadline and its ``grace``): the
  task fails and may be retried.

**Idempotent.** The op_id defaults to ``<dag_id>/<run_id>/<task_id>`` and a ``timeout`` counts
from the run's ``run_after`` (the moment the run is for), so a retried task, a task cleared and
run again, or a triggerer restarted mid-wait sends the *same* registration: the service answers
it as a duplicate, of the pending operation (the task waits on) or of the finished one (the task
resumes at once with its outcome). Give an absolute ``deadline`` for runs made long after their
moment (a backfill).

:class:`PurgatoryWaitOperator` waits on an operation somebody else registers (a Spark job, a
service), waiting for its registration too. :class:`PurgatorySignalOperator` publishes a signal.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from purgatory.airflow.hooks import PurgatoryHook
from purgatory.airflow.triggers import PurgatoryTrigger
from purgatory.client import ApiError

__all__ = [
    "DEFAULT_OP_ID",
    "PurgatoryBarrierOperator",
    "PurgatorySignalOperator",
    "PurgatoryWaitOperator",
]

#: The op_id of a barrier unless given: one per task of each DAG run.
DEFAULT_OP_ID = "{{ dag.dag_id }}/{{ run_id }}/{{ task.task_id }}"
_MARGIN = dt.timedelta(seconds=30)  # Airflow's own timeout comes after the trigger's


def _epoch_ms(moment: dt.datetime | str | int) -> int:
    if isinstance(moment, int):
        return moment
    if isinstance(moment, str):
        moment = dt.datetime.fromisoformat(moment)
    if moment.tzinfo is None:
        raise ValueError(f"deadline {moment.isoformat()} has no time zone")
    return int(moment.timestamp() * 1000)


def _run_moment_ms(context: Any) -> int:
    """When the run is for: its ``run_after``, else its logical date, else now."""
    run = context.get("dag_run")
    for name in ("run_after", "logical_date"):
        moment = getattr(run, name, None)
        if moment is not None:
            return _epoch_ms(moment)
    return int(time.time() * 1000)


class _Waiting(BaseOperator):  # type: ignore[misc]
    """What the waiting operators share: deferring to the trigger and reading its event."""

    def __init__(
        self,
        *,
        scope: str,
        op_id: str,
        fail_on_expired: bool = True,
        purgatory_conn_id: str = PurgatoryHook.default_conn_name,
        poll_ms: int = 30_000,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.scope = scope
        self.op_id = op_id
        self.fail_on_expired = fail_on_expired
        self.purgatory_conn_id = purgatory_conn_id
        self.poll_ms = poll_ms

    def _defer(self, until_s: float, *, wait_for_registration: bool) -> None:
        trigger = PurgatoryTrigger(
            self.scope, self.op_id, until_s, purgatory_conn_id=self.purgatory_conn_id,
            wait_for_registration=wait_for_registration, poll_ms=self.poll_ms,
        )  # fmt: skip
        left = dt.timedelta(seconds=max(0.0, until_s - time.time()))
        self.defer(trigger=trigger, method_name="execute_complete", timeout=left + _MARGIN)

    def execute_complete(self, context: Any, event: dict[str, Any] | None = None) -> Any:
        """Resume with the trigger's event: return the callback or fail (see the module)."""
        if event is None:
            raise AirflowException(f"purgatory {self._name}: the trigger fired no event")
        return self._settle(event["status"], event.get("outcome"), event.get("message"))

    @property
    def _name(self) -> str:
        return f"operation {self.op_id!r} in scope {self.scope!r}"

    def _settle(self, status: str, outcome: Any, message: str | None = None) -> Any:
        if status == "completed" or (status == "expired" and not self.fail_on_expired):
            return outcome
        if status == "expired":
            missing = outcome.get("missing") if isinstance(outcome, dict) else None
            deadline = outcome.get("deadline_ms") if isinstance(outcome, dict) else None
            raise AirflowFailException(
                f"purgatory {self._name} expired at its deadline ({deadline} ms):"
                f" missing keys {missing}"
            )
        if status == "cancelled":
            raise AirflowFailException(f"purgatory {self._name} was cancelled")
        if status == "timeout":
            raise AirflowException(f"purgatory {self._name}: {message}")
        raise AirflowFailException(f"purgatory {self._name}: {message}")


class PurgatoryBarrierOperator(_Waiting):
    """Register a barrier over ``keys`` and wait, deferred, for its outcome (see the module).

    Args:
        scope: the scope (templated).
        keys: the watch keys (templated).
        op_id: the operation's id (templated; :data:`DEFAULT_OP_ID` unless given).
        deadline: when it expires: an aware datetime, an ISO 8601 text (templated) or UNIX ms.
        timeout: ... or how long after the run's ``run_after`` it expires.
        condition: ``all`` (every key), ``any``, or ``count`` with ``count``.
        count: how many keys complete a ``count`` barrier.
        payload: JSON carried into the callback (templated).
        fail_on_expired: fail on ``expired`` (default) or return the callback.
        grace: how long past the deadline the trigger waits for the outcome to arrive.
        purgatory_conn_id: the connection (type ``purgatory``).
        poll_ms: one long poll's length.
    """

    template_fields: Sequence[str] = ("scope", "op_id", "keys", "deadline", "payload")

    def __init__(
        self,
        *,
        scope: str,
        keys: Sequence[str],
        op_id: str = DEFAULT_OP_ID,
        deadline: dt.datetime | str | int | None = None,
        timeout: dt.timedelta | None = None,
        condition: str = "all",
        count: int | None = None,
        payload: Any = None,
        grace: dt.timedelta = dt.timedelta(minutes=5),
        **kwargs: Any,
    ) -> None:
        super().__init__(scope=scope, op_id=op_id, **kwargs)
        if (deadline is None) == (timeout is None):
            raise ValueError(f"{self.task_id}: give one of deadline or timeout")
        self.keys = keys
        self.deadline = deadline
        self.wait_for = timeout
        self.condition = condition
        self.count = count
        self.payload = payload
        self.grace = grace

    def _deadline_ms(self, context: Any) -> int:
        if self.deadline is not None:
            return _epoch_ms(self.deadline)
        assert self.wait_for is not None
        return _run_moment_ms(context) + int(self.wait_for.total_seconds() * 1000)

    def execute(self, context: Any) -> Any:
        """Register (a duplicate when it was before) and defer, unless already decided."""
        deadline_ms = self._deadline_ms(context)
        try:
            with PurgatoryHook(self.purgatory_conn_id).get_conn() as client:
                answer = client.register(
                    scope=self.scope, op_id=self.op_id, keys=list(self.keys),
                    condition=self.condition, count=self.count, deadline_ms=deadline_ms,
                    payload=self.payload,
                )  # fmt: skip
        except ApiError as exc:
            raise AirflowFailException(f"purgatory refused {self._name}: {exc}") from exc
        outcome = answer.get("outcome")
        if outcome is not None:  # completed at once, or the outcome of an earlier run
            return self._settle(outcome["outcome"], outcome)
        self._defer(deadline_ms / 1000 + self.grace.total_seconds(), wait_for_registration=False)
        return None


class PurgatoryWaitOperator(_Waiting):
    """Wait, deferred, for the outcome of an operation registered elsewhere.

    An operation not registered yet is waited for. Args as :class:`PurgatoryBarrierOperator`'s
    (``scope`` and ``op_id`` templated), and ``timeout``: how long to wait from the task's start.
    """

    template_fields: Sequence[str] = ("scope", "op_id")

    def __init__(self, *, timeout: dt.timedelta, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.wait_for = timeout

    def execute(self, context: Any) -> None:
        """Defer to the trigger at once."""
        self._defer(time.time() + self.wait_for.total_seconds(), wait_for_registration=True)


class PurgatorySignalOperator(BaseOperator):  # type: ignore[misc]
    """Publish one signal: ``key`` happened in ``scope`` (each templated; ``payload`` too)."""

    template_fields: Sequence[str] = ("scope", "key", "payload")

    def __init__(
        self,
        *,
        scope: str,
        key: str,
        payload: Any = None,
        purgatory_conn_id: str = PurgatoryHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.scope = scope
        self.key = key
        self.payload = payload
        self.purgatory_conn_id = purgatory_conn_id

    def execute(self, context: Any) -> Any:
        """Send the signal; return the service's answer."""
        try:
            return PurgatoryHook(self.purgatory_conn_id).signal(
                self.scope, self.key, payload=self.payload
            )
        except ApiError as exc:
            raise AirflowFailException(f"purgatory refused the signal {self.key!r}: {exc}") from exc
