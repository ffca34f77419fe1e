"""spark_bridge: Spark jobs and purgatory, through Kafka (data sources) and HTTP (the driver).

Three PySpark Python data sources (no connector jar), registered with
:func:`register_data_sources`:

* ``purgatory-signals`` (sink, batch and streaming): rows -> signals, optionally followed by the
  scope's event-time watermark;
* ``purgatory-operations`` (sink, batch and streaming): rows -> registrations (timers re-arm),
  with in-band watermarks;
* ``purgatory-callbacks`` (source, batch and streaming): the callbacks topic -> rows of
  :data:`CALLBACKS_SCHEMA`, with per-partition offsets checkpointed by Spark.

Public names:

* :func:`register_data_sources` -- registers the three formats with a session;
* :data:`CALLBACKS_SCHEMA` -- the schema of the rows ``purgatory-callbacks`` reads;
* :func:`dedupe` -- drops the repeated callbacks of an at-least-once stream, by ``id``;
* :class:`RowError` -- a row that cannot become a record (the column and the row named);
* :class:`Driver` -- the service seen from a driver, over HTTP: ``register``, ``signal``,
  ``wait_for`` (a barrier with its own deadline);
* :class:`BarrierTimeoutError` -- ``wait_for`` ran out of its own timeout;
* :func:`local_session` -- a ``local[N]`` session with the formats registered (examples, tests).

The example jobs are :mod:`spark_bridge.examples`; :mod:`spark_bridge.demo`
(``purgatory-pipeline``) runs them end to end with an embedded broker and the service. The
bridge never imports the service (an import-linter contract checks it); the demo alone starts
it.
"""

from spark_bridge._callbacks_source import SCHEMA as CALLBACKS_SCHEMA
from spark_bridge._callbacks_source import dedupe
from spark_bridge._driver import BarrierTimeoutError, Driver
from spark_bridge._session import local_session, register_data_sources
from spark_bridge._writer import RowError

__all__ = [
    "CALLBACKS_SCHEMA",
    "BarrierTimeoutError",
    "Driver",
    "RowError",
    "dedupe",
    "local_session",
    "register_data_sources",
]
