"""A small local SparkSession for tests, examples and notebooks (spark_bridge layer).

``local_session`` builds (or returns the already running) ``local[N]`` session with the web UI
off, few shuffle partitions and quiet logs, and points ``PYSPARK_PYTHON`` at the running
interpreter so that Spark's Python workers see the same packages as the driver. Production jobs
build their own session; nothing else in the bridge depends on this module.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["local_session"]


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
        and then the settings above are not applied again).

    Raises:
        ValueError: if ``cores`` or ``shuffle_partitions`` is below 1.
    """
    if cores < 1 or shuffle_partitions < 1:
        raise ValueError(
            f"cores and shuffle_partitions must be >= 1: {cores}, {shuffle_partitions}"
        )
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
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session
