"""spark_bridge: Spark jobs and purgatory, through Kafka (data sources) and HTTP (the driver).

Three PySpark Python data sources (no connector jar), registered with
:func:`register_data_sources`:

* ``purgatory-signals`` (sink, batch and streaming): rows -> signals, optionally followed by the
  scope's event-time watermark;
* ``purgatory-operations`` (sink, batch and streaming): rows -> registrations (timers re-arm),
  with in-band watermarks;
* ``purgatory-callbacks`` (source, batch and streaming): the callbacks topic -> rows of
  :data:`CALLBACKS_SCHEMA`, with per-partition offsets checkpointed by Spark.

Driver-side helpers (:class:`Driver`: ``register``, ``signal``, ``wait_for`` as a barrier with
a deadline) talk to the service's HTTP API. The bridge never imports the service (an
import-linter contract checks it).
"""

from spark_bridge._callbacks_source import SCHEMA as CALLBACKS_SCHEMA
from spark_bridge._callbacks_source import CallbacksDataSource, dedupe
from spark_bridge._driver import BarrierTimeoutError, Driver
from spark_bridge._operations_sink import OperationsDataSource
from spark_bridge._session import local_session, register_data_sources
from spark_bridge._signals_sink import SignalsDataSource
from spark_bridge._writer import RowError

__all__ = [
    "CALLBACKS_SCHEMA",
    "BarrierTimeoutError",
    "CallbacksDataSource",
    "Driver",
    "OperationsDataSource",
    "RowError",
    "SignalsDataSource",
    "dedupe",
    "local_session",
    "register_data_sources",
]
