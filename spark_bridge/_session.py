"""Sessions for the bridge (spark_bridge layer): registering its formats, and a local Spark.

``register_data_sources`` registers the bridge's three formats with a session (every job calls
it once). ``local_session`` builds (or returns the already running) ``local[N]`` session with
the web UI off, few shuffle partitions and quiet logs, and points ``PYSPARK_PYTHON`` at the
running interpreter so that Spark's Python workers see the same packages as the driver; it is
for tests, examples and notebooks. Production jobs build their own session and call
``register_data_sources`` on it.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session", "register_data_sources"]

# Errors only from Spark's JVM (its default prints warnings about the local machine).
_LOG4J = Path(__file__).with_name("log4j2.properties").as_uri()


def local_session(
    *, cores: int = 2, app_name: str = "purgatory-spark-bridge", shuffle_partitions: int = 2
) -> SparkSession:
    """A local SparkSession fit for tests: ``local[cores]``, UI off, quiet logs.

    Args:
        cores: worker threads of the local master.
        app_name: the application name shown in logs.
        shuffle_partitions: ``spark.sql.shuffle.partitions`` (Spark's default of 200 makes
            small jobs slow).

    Returns:
        The session (``SparkSession.builder.getOrCreate()``: an already running one is reused,
        and then the settings above are not applied again), with the bridge's data sources
        registered.

    Raises:
        ValueError: if ``cores`` or ``shuffle_partitions`` is below 1.
    """
    if cores < 1 or shuffle_partitions < 1:
        raise ValueError(
            f"cores and shuffle_partitions must be >= 1: {cores}, {shuffle_partitions}"
        )
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark is an optional extra

    session = (
        SparkSession.builder.master(f"local[{cores}]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.default.parallelism", str(cores))
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile={_LOG4J}")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register_data_sources(session)
    return session


def register_data_sources(spark: SparkSession) -> None:
    """Register ``purgatory-signals``, ``purgatory-operations`` and ``purgatory-callbacks``."""
    from spark_bridge._callbacks_source import CallbacksDataSource  # noqa: PLC0415
    from spark_bridge._operations_sink import OperationsDataSource  # noqa: PLC0415
    from spark_bridge._signals_sink import SignalsDataSource  # noqa: PLC0415

    for source in (SignalsDataSource, OperationsDataSource, CallbacksDataSource):
        spark.dataSource.register(source)
