"""spark_bridge: Spark jobs and purgatory, through Kafka (data sources) and HTTP (the driver).

Three PySpark Python data sources (no connector jar), registered with
:func:`register_data_sources`:

* ``purgatory-signals`` (sink, batch and streaming): rows -> signals, optionally followed by the
  scope's event-time watermark;
* ``purgatory-operations`` (sink, batch and streaming): rows -> registrations (timers re-arm),
  with in-band watermarks;
* ``purgatory-callbacks`` (source, batch and streaming): the callbacks topic -> rows of
  :data:`CALLBACKS_SCHEMA`, with per-partition offsets checkpointed by Spark.

Or Spark's own Kafka connector (``format("kafka")``, the ``spark-sql-kafka-0-10`` jar), with
column helpers that put purgatory's wire format on its rows: :func:`callbacks_from_kafka` (the
connector's rows -> :data:`CALLBACKS_SCHEMA`) and :func:`signals_to_kafka` (rows -> ``key`` and
``value``).

Public names:

* :func:`register_data_sources` -- registers the three formats with a session;
* :data:`CALLBACKS_SCHEMA` -- the schema of the rows ``purgatory-callbacks`` reads;
* :func:`dedupe` -- drops the repeated callbacks of an at-least-once stream, by ``id``;
* :class:`RowError` -- a row that cannot become a record (the column and the row named),
  raised in the data sources' Spark tasks: the driver gets pyspark's ``PythonException``,
  whose message ends with it (docs/spark.md, "What a failed write raises");
* :class:`Driver` -- the service seen from a driver, over HTTP: ``register``, ``signal``,
  ``wait_for`` (a barrier with its own deadline);
* :class:`BarrierTimeoutError` -- ``wait_for`` ran out of its own timeout;
* :func:`callbacks_from_kafka` -- the connector's rows of the callbacks topic -> rows of
  :data:`CALLBACKS_SCHEMA` (batch and streaming);
* :func:`signals_to_kafka` -- rows -> the connector's ``key`` and ``value``, one signal each;
  a faulty row fails the write before its task sends anything;
* :func:`operations_to_kafka` -- rows -> ``key`` and ``value``, one registration each (timers
  re-arm), checked as :func:`signals_to_kafka`;
* :func:`watermarks_to_kafka` -- rows -> each scope's event-time watermark, to write after them;
* :data:`KAFKA_CONNECTOR_PACKAGE` -- the connector's coordinate for ``spark.jars.packages``;
* :func:`local_session` -- a ``local[N]`` session with the formats registered and the
  connector's jars when found (examples, tests).

The example jobs are :mod:`spark_bridge.examples`; :mod:`spark_bridge.demo`
(``purgatory-pipeline``) runs them end to end with an embedded broker and the service. The
bridge never imports the service (an import-linter contract checks it); the demo alone starts
it.
"""

from spark_bridge._callbacks_source import SCHEMA as CALLBACKS_SCHEMA
from spark_bridge._callbacks_source import dedupe
from spark_bridge._connector import (
    callbacks_from_kafka,
    operations_to_kafka,
    signals_to_kafka,
    watermarks_to_kafka,
)
from spark_bridge._driver import BarrierTimeoutError, Driver
from spark_bridge._session import KAFKA_CONNECTOR_PACKAGE, local_session, register_data_sources
from spark_bridge._writer import RowError

__all__ = [
    "CALLBACKS_SCHEMA",
    "KAFKA_CONNECTOR_PACKAGE",
    "BarrierTimeoutError",
    "Driver",
    "RowError",
    "callbacks_from_kafka",
    "dedupe",
    "local_session",
    "operations_to_kafka",
    "register_data_sources",
    "signals_to_kafka",
    "watermarks_to_kafka",
]
