"""Fixtures shared by every test directory: real brokers, each started once per session.

``kafka_broker`` is *the* broker of a real-broker test, parametrized over both brokers: every
test that takes it (directly or through another fixture) runs once on Apache Kafka (id
``kafka``) and once on the embedded broker, Tansu (id ``tansu``). Apache Kafka is the broker
users run and the reference for every behaviour; Tansu is what ``purgatory dev`` and the demo
start, so the code's workarounds for its quirks must hold there and do no harm on Kafka.

``apache_kafka`` and ``tansu_broker`` are the two brokers themselves, for the few tests that
are about one of them (its launcher, a behaviour only it has); ``kafka_broker`` hands out the
same two instances, so each broker starts at most once per session, on first use, and a run
that needs no broker never starts one.

The order fails fast, and no test can spoil a half for the others: every test that needs no
broker first (most take milliseconds), then Kafka's half, then Tansu's, then the tests that take
one broker in particular (``apache_kafka``, ``tansu_broker``): some of them stop, freeze or
kill the session's broker on purpose. The fixture is session-scoped, so pytest groups the tests
by its parameter, in the order of ``BROKERS``; the hook below only moves those groups, with a
stable sort. Kafka's half goes first: it is the reference broker, and the one where a
behaviour the tests have not met yet is likeliest to show up. The halves take about as long, but
not test for test: a group join takes milliseconds on Kafka and half the session timeout on Tansu,
so the service's tests, which come before the Spark bridge's, report sooner on Kafka.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

import pytest
from hypothesis import settings

if TYPE_CHECKING:
    from purgatory.devtools.broker import Broker, EmbeddedBroker
    from purgatory.devtools.kafka_broker import KafkaBroker

# Hypothesis fails an example that runs past its deadline (200 ms of wall time): on a busy
# machine a 6 ms example of tests/codec/test_schemas.py once took 288 ms and failed the gate.
# What a test proves does not depend on the machine's load; time is the benchmarks' to measure.
settings.register_profile("purgatory", deadline=None)
settings.load_profile("purgatory")

# The parameters of ``kafka_broker``, in the order their halves run; each names its fixture.
BROKERS = {"kafka": "apache_kafka", "tansu": "tansu_broker"}


@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[EmbeddedBroker]:
    """A Tansu broker on a free loopback port, started once and shared by the session.

    Tests keep out of each other's way by using topic and group names of their own.
    """
    from purgatory.devtools.broker import EmbeddedBroker  # noqa: PLC0415 - only when used

    # die_with_parent: a test run killed outright (a CI timeout) leaves no broker behind.
    with EmbeddedBroker(die_with_parent=True) as broker:
        yield broker


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[KafkaBroker]:
    """An Apache Kafka broker on free loopback ports, started once and shared by the session.

    Its data dir is temporary and removed at the end. Tests keep out of each other's way by
    using topic, group and transactional ids of their own.
    """
    from purgatory.devtools.kafka_broker import KafkaBroker  # noqa: PLC0415 - only when used

    with KafkaBroker(die_with_parent=True) as broker:  # gone with a killed test run too
        yield broker


@pytest.fixture(scope="session", params=tuple(BROKERS), ids=tuple(BROKERS))
def kafka_broker(request: pytest.FixtureRequest) -> Broker:
    """The session's Apache Kafka, then its Tansu: the test runs once on each."""
    return cast("Broker", request.getfixturevalue(BROKERS[request.param]))


def pytest_itemcollected(item: pytest.Item) -> None:
    """The tests of a local Spark in one ``xdist_group``, so a run on several workers starts
    one; marked as each is collected, before pytest-xdist names each test's group."""
    if "spark" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.hookimpl(trylast=True)  # after pytest has grouped the tests by broker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests without a broker, then both halves, then the tests of one broker (stable)."""
    items.sort(key=_rank)


def _rank(item: pytest.Item) -> int:
    names = getattr(item, "fixturenames", ())
    if "kafka_broker" in names:
        return 1
    return 2 if {"apache_kafka", "tansu_broker"} & set(names) else 0
