"""Fixtures for the service tests: one real embedded Kafka broker (Tansu) per test session."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from purgatory.service._broker import EmbeddedBroker


def pytest_configure(config: pytest.Config) -> None:
    # kafka-python loads its protocol schemas with importlib.resources' legacy helpers.
    for message in ("read_text is deprecated", "open_text is deprecated"):
        config.addinivalue_line("filterwarnings", f"ignore:{message}:DeprecationWarning")


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[EmbeddedBroker]:
    """A Tansu broker on a free loopback port, started once and shared by the session.

    Tests keep out of each other's way by using topic and group names of their own.
    """
    # Imported here so that kafka-python loads after the warning filters above are in place.
    from purgatory.service._broker import EmbeddedBroker  # noqa: PLC0415

    with EmbeddedBroker() as broker:
        yield broker
