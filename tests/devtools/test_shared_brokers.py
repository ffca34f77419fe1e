"""A shared test broker comes back: killed, frozen, stopped or never started, the next test that
takes it gets one that serves; a fresh start that fails says why."""

from __future__ import annotations

import os
import signal

import pytest

from purgatory._core import TransportError
from purgatory.devtools.broker import EmbeddedBroker
from tests.conftest import _come_back, _state
from tests.freeze import freeze


def _serves(broker: EmbeddedBroker) -> None:
    broker.create_topics({"come-back": 1})  # raises if nothing answers


def test_a_killed_broker_is_started_afresh_with_a_longer_bound() -> None:
    with EmbeddedBroker(start_timeout_s=15) as broker:
        pid = broker.pid
        assert pid is not None
        # A test that kills it on purpose, and the next one right after: its port may still
        # accept a connection for a moment.
        os.killpg(pid, signal.SIGKILL)
        _come_back(broker)
        assert broker.pid not in (None, pid)
        assert broker.start_timeout_s == 30
        _serves(broker)


def test_a_frozen_broker_is_continued_not_restarted() -> None:
    with EmbeddedBroker(start_timeout_s=15) as broker:
        pid = broker.pid
        assert pid is not None
        os.killpg(pid, signal.SIGSTOP)  # the next test comes at once: the stop may be pending
        _come_back(broker)
        assert broker.pid == pid and _state(pid) != "T"
        _serves(broker)
        freeze(pid, group=True)  # frozen long since
        _come_back(broker)
        assert broker.pid == pid and _state(pid) != "T"
        _serves(broker)


def test_a_broker_that_never_started_is_started_by_the_next_test() -> None:
    broker = EmbeddedBroker(start_timeout_s=15)
    try:
        _come_back(broker)
        _serves(broker)
    finally:
        broker.close()


def test_a_fresh_start_that_fails_says_why() -> None:
    broker = EmbeddedBroker(start_timeout_s=5, binary="/bin/false")
    with pytest.raises(TransportError, match="exited with code 1"):
        _come_back(broker)
    assert broker.pid is None
