"""Sessions for the bridge (spark_bridge layer): registering its formats, and a local Spark.

``register_data_sources`` registers the bridge's three formats with a session (every job calls
it once). ``local_session`` builds (or returns the already running) ``local[N]`` session with
the web UI off, few shuffle partitions and quiet logs, and points ``PYSPARK_PYTHON`` at the
running interpreter so that Spark's Python workers see the same packages as the driver; it is
for tests, examples and notebooks. Production jobs build their own session and call
``register_data_sources`` on it.

Spark's Kafka connector: ``local_session`` puts the jars of ``spark-sql-kafka-0-10`` on
``spark.jars`` when it finds them: in the folder named by ``PURGATORY_SPARK_KAFKA_JARS``, else in
``<the interpreter's prefix>/spark-kafka/jars`` (where ``make spark-kafka`` copies them, from
``.ci/spark-kafka/pom.xml``). A session of one's own gets them with
``spark.jars.packages=`` :data:`KAFKA_CONNECTOR_PACKAGE`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "KAFKA_CONNECTOR_PACKAGE",
    "kafka_connector_jars",
    "local_session",
    "register_data_sources",
]

#: The Maven coordinate of Spark's Kafka connector for the pinned pyspark (``spark.jars.packages``).
KAFKA_CONNECTOR_PACKAGE = "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0"

# Errors only from Spark's JVM (its default prints warnings about the local machine).
_LOG4J = Path(__file__).with_name("log4j2.properties").as_uri()


def kafka_connector_jars() -> list[Path]:
    """The connector's jars that ``local_session`` puts on ``spark.jars`` (empty: none found)."""
    folder = os.environ.get("PURGATORY_SPARK_KAFKA_JARS")
    where = Path(folder) if folder else Path(sys.prefix) / "spark-kafka" / "jars"
    return sorted(where.glob("*.jar")) if where.is_dir() else []


def has_kafka_connector(spark: SparkSession) -> bool:
    """Whether ``spark`` was given Spark's Kafka connector (on ``spark.jars`` or
    ``spark.jars.packages``)."""
    conf = spark.sparkContext.getConf()
    listed = f"{conf.get('spark.jars', '')},{conf.get('spark.jars.packages', '')}"
    return "spark-sql-kafka-0-10" in listed


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
        registered and Spark's Kafka connector on its class path when its jars are found (see
        :func:`kafka_connector_jars`).

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

    builder = SparkSession.builder
    jars = kafka_connector_jars()
    if jars:
        builder = builder.config("spark.jars", ",".join(str(jar) for jar in jars))
    session = (
        builder.master(f"local[{cores}]")
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
