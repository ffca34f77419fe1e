"""Airflow tasks that wait on purgatory: no worker slot held, nothing polled (``airflow`` extra).

Install ``purgatory[airflow]`` into the Airflow environment; Airflow discovers the provider
(:mod:`purgatory.airflow.provider`). The core and the service never import this package.

* :class:`PurgatoryBarrierOperator` -- register a barrier over watch keys with a deadline and
  defer until its outcome: the callback on ``completed``, a failure naming the missing keys on
  ``expired``;
* :class:`PurgatoryWaitOperator` -- defer until the outcome of an operation registered
  elsewhere (a Spark job, another DAG);
* :class:`PurgatorySignalOperator` -- publish a signal (an upstream task's "done");
* :class:`PurgatoryHook` -- the ``purgatory`` connection (the service's URL and API token) and
  its clients;
* :class:`PurgatoryTrigger` -- the triggerer's wait on the service's long poll;
* :data:`DEFAULT_OP_ID` -- a barrier's op_id unless given: ``<dag_id>/<run_id>/<task_id>``.

See docs/airflow.md for a DAG to copy and how it compares to a sensor.
"""

from purgatory.airflow.hooks import PurgatoryHook
from purgatory.airflow.operators import (
    DEFAULT_OP_ID,
    PurgatoryBarrierOperator,
    PurgatorySignalOperator,
    PurgatoryWaitOperator,
)
from purgatory.airflow.triggers import PurgatoryTrigger

__all__ = [
    "DEFAULT_OP_ID",
    "PurgatoryBarrierOperator",
    "PurgatoryHook",
    "PurgatorySignalOperator",
    "PurgatoryTrigger",
    "PurgatoryWaitOperator",
]
