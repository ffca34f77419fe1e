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

A shared broker comes back. Before each test that takes one, :func:`_brokers_come_back` looks
at its process: one that exited (a test killed it, or it crashed), was stopped, or never
answered within its start bound is started afresh, with a start bound twice the last one (a
busy machine is slower, not broken); one a test left frozen (SIGSTOP) is continued. Only a
fresh start that fails fails, and its error ends with the broker's log. One test that loses the
broker no longer takes every later test with it.

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

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast

import pytest
from hypothesis import settings

from purgatory._core import TransportError
from tests.bounds import observe

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
#: How long each shared broker takes to start on a quiet machine (the measure of slowness).
KAFKA_QUIET_S = 8.0
TANSU_QUIET_S = 1.5
#: The first start bound of each shared broker, doubled at each fresh start, up to the last.
KAFKA_START_S = 60.0
TANSU_START_S = 30.0
MAX_START_S = 480.0
B = TypeVar("B", "EmbeddedBroker", "KafkaBroker")


@pytest.fixture(scope="session")
def tansu_broker() -> Iterator[EmbeddedBroker]:
    """A Tansu broker on a free loopback port, started once and shared by the session.

    Tests keep out of each other's way by using topic and group names of their own.
    """
    from purgatory.devtools.broker import EmbeddedBroker  # noqa: PLC0415 - only when used

    # die_with_parent: a test run killed outright (a CI timeout) leaves no broker behind.
    broker = EmbeddedBroker(die_with_parent=True, start_timeout_s=TANSU_START_S)
    yield from _shared(broker, "tansu start", TANSU_QUIET_S)


@pytest.fixture(scope="session")
def apache_kafka() -> Iterator[KafkaBroker]:
    """An Apache Kafka broker on free loopback ports, started once and shared by the session.

    Its data dir is temporary and removed at the end. Tests keep out of each other's way by
    using topic, group and transactional ids of their own.
    """
    from purgatory.devtools.kafka_broker import KafkaBroker  # noqa: PLC0415 - only when used

    # die_with_parent: gone with a killed test run too.
    broker = KafkaBroker(die_with_parent=True, start_timeout_s=KAFKA_START_S)
    yield from _shared(broker, "kafka start", KAFKA_QUIET_S)


def _shared(broker: B, what: str, quiet_s: float) -> Iterator[B]:
    """``broker`` for the session: started now if it can be (if not, the first test that
    takes it starts it afresh, see :func:`_brokers_come_back`), closed at the end; how long
    the start took grows every bound on a real wait (:mod:`tests.bounds`)."""
    began = time.perf_counter()
    with contextlib.suppress(TransportError):  # a missed start bound: tried again, longer
        broker.start()
    observe(what, time.perf_counter() - began, quiet_s)
    try:
        yield broker
    finally:
        broker.close()


@pytest.fixture(autouse=True)
def _brokers_come_back(request: pytest.FixtureRequest) -> None:
    """Before a test that takes a shared broker: bring it back if it is not serving."""
    names = set(request.fixturenames)
    if "kafka_broker" in names:
        names.add(BROKERS[request.node.callspec.params["kafka_broker"]])
    for name in sorted(names & set(BROKERS.values())):
        _come_back(request.getfixturevalue(name))


def _come_back(broker: Broker) -> None:
    """Continue a frozen broker; start afresh one that exited, was stopped or never started,
    its start bound doubled each time (up to :data:`MAX_START_S`).

    Raises:
        TransportError: the fresh start failed (the message ends with the broker's log).
    """
    pid = broker.pid
    if pid is not None and not _dying(pid) and broker.exit_status() is None:
        # A test may have frozen it (SIGSTOP), a moment ago or long since: a SIGCONT also
        # discards a stop still pending, and does nothing to a broker that runs.
        os.killpg(pid, signal.SIGCONT)
        if _accepts(broker.bootstrap_servers):
            return
        # Alive and refusing connections: wedged, or gone since.
    broker.stop()  # reap (or kill) what is left of it
    broker.start_timeout_s = min(2 * broker.start_timeout_s, MAX_START_S)
    broker.start()


def _accepts(address: str) -> bool:
    """Whether something accepts TCP connections at ``HOST:PORT`` (a frozen process's kernel
    still does, so a freeze is looked for first)."""
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            return True
    except OSError:
        return False


def _dying(pid: int) -> bool:
    """Whether the process is gone, a zombie, or has a SIGKILL pending (a test killed it a
    moment ago: its port may still accept a connection)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    pending = int(fields.get("SigPnd", "0"), 16) | int(fields.get("ShdPnd", "0"), 16)
    return fields.get("State", "Z")[0] in "ZX" or bool(pending & (1 << (signal.SIGKILL - 1)))


def _state(pid: int) -> str:
    """A process's state letter (``/proc/PID/stat``: ``T`` stopped), empty if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat[stat.rindex(")") + 2]


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
