"""Fixtures for the Spark bridge tests: one local Spark per session (the broker is shared)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from purgatory.devtools.child import own_names, service_process

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


@dataclass(frozen=True)
class Service:
    url: str
    servers: str
    requests: str
    signals: str
    callbacks: str
    dead_letters: str


@pytest.fixture(scope="module")
def service(  # one service process per test module, on topics of its own
    kafka_broker: Broker, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    tag = uuid.uuid4().hex[:6]
    names = own_names("", tag)
    kafka_broker.create_topics({topic: 2 for name, topic in names.items() if "TOPIC" in name})
    log = tmp_path_factory.mktemp("service") / "service.log"
    with service_process(kafka_broker.bootstrap_servers, log, names) as child:
        yield Service(
            child.url,
            kafka_broker.bootstrap_servers,
            names["PURGATORY_TOPIC_REQUESTS"],
            names["PURGATORY_TOPIC_SIGNALS"],
            names["PURGATORY_TOPIC_CALLBACKS"],
            names["PURGATORY_TOPIC_DEAD_LETTERS"],
        )
