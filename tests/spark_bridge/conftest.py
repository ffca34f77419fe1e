"""Fixtures for the Spark bridge tests: one local Spark per session (the broker is shared)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from purgatory.devtools.broker import Broker


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """A ``local[2]`` SparkSession (UI off, 2 shuffle partitions, quiet logs) for the session,
    with the bridge's data sources registered."""
    from spark_bridge._session import local_session  # noqa: PLC0415 - pyspark loads on use

    session = local_session(cores=2, shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture
def topic(kafka_broker: Broker) -> str:
    """A new topic of 2 partitions on the session's broker."""
    name = f"topic-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topics({name: 2})
    return name
