"""A start that ``purgatory serve`` refuses never starts a snapshotter.

On the embedded broker (Tansu), which takes every transactional call and fences nobody,
transactional delivery is refused at start. ``serve`` runs that check before its supervisor
starts the snapshotter child, so the refusal leaves no snapshotter to start, reap and stop.
The real check against the real broker; only the child is a recording fake.
"""

from __future__ import annotations

import pytest
import trio

from purgatory._core import ConfigError
from purgatory.devtools.broker import Broker
from purgatory.service.run import serve_with_snapshotter
from tests.service.end_to_end.test_e2e import _settings
from tests.service.supervisors.test_supervisor import Starter

pytestmark = pytest.mark.kafka


@pytest.mark.parametrize("kafka_broker", ["tansu"], indirect=True)
async def test_a_transactional_start_refused_by_the_broker_starts_no_snapshotter(
    kafka_broker: Broker,
) -> None:
    settings = _settings(kafka_broker, delivery="transactional", snapshot_interval_ms=1000)
    starter = Starter()
    with trio.fail_after(60), pytest.raises(ConfigError, match="cannot do Kafka transactions"):
        await serve_with_snapshotter(settings, starter)
    assert starter.started_at == [], "a snapshotter was started before the refusal"
