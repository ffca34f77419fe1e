"""Fixtures shared by every test directory: one real embedded Kafka broker (Tansu) per session.

The broker starts on first use only, so a run that needs no broker never starts one.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from purgatory.service._broker import EmbeddedBroker


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[EmbeddedBroker]:
    """A Tansu broker on a free loopback port, started once and shared by the session.

    Tests keep out of each other's way by using topic and group names of their own.
    """
    from purgatory.service._broker import EmbeddedBroker  # noqa: PLC0415 - only when used

    with EmbeddedBroker() as broker:
        yield broker
