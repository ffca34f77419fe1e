"""Fixtures shared by every test directory: real brokers, each started once per session.

``kafka_broker`` is the embedded broker (Tansu); ``apache_kafka`` is Apache Kafka (one KRaft
node, its jars from ``make kafka``). Each starts on first use only, so a run that needs no
broker never starts one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from purgatory.service._broker import EmbeddedBroker
    from purgatory.service._kafka_broker import KafkaBroker


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[EmbeddedBroker]:
    """A Tansu broker on a free loopback port, started once and shared by the session.

    Tests keep out of each other's way by using topic and group names of their own.
    """
    from purgatory.service._broker import EmbeddedBroker  # noqa: PLC0415 - only when used

    with EmbeddedBroker() as broker:
        yield broker


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[KafkaBroker]:
    """An Apache Kafka broker on free loopback ports, started once and shared by the session.

    Its data dir is temporary and removed at the end. Tests keep out of each other's way by
    using topic, group and transactional ids of their own.
    """
    from purgatory.service._kafka_broker import KafkaBroker  # noqa: PLC0415 - only when used

    with KafkaBroker() as broker:
        yield broker
