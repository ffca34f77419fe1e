"""Fixtures for the Spark bridge tests: one local Spark and one embedded Kafka broker per session.

The service tests' ``kafka_broker`` fixture lives in a sibling conftest, which pytest does not
share with this directory, so the same fixture is defined here (a second broker only starts when
both directories run in one session).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from purgatory.service._broker import EmbeddedBroker


def pytest_configure(config: pytest.Config) -> None:
    # kafka-python loads its protocol schemas with importlib.resources' legacy helpers.
    for message in ("read_text is deprecated", "open_text is deprecated"):
        config.addinivalue_line("filterwarnings", f"ignore:{message}:DeprecationWarning")


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[EmbeddedBroker]:
    """A Tansu broker on a free loopback port, started once and shared by the session.

    Tests keep out of each other's way by using topic names of their own.
    """
    # Imported here so that kafka-python loads after the warning filters above are in place.
    from purgatory.service._broker import EmbeddedBroker  # noqa: PLC0415

    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A ``local[2]`` SparkSession (UI off, 2 shuffle partitions, quiet logs) for the session."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from spark_bridge._session import local_session  # noqa: PLC0415

    session = local_session(cores=2, shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()
