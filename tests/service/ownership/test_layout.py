"""The topics' partition counts, against the in-memory broker, in virtual time.

At start, topics keyed by scope of different partition counts (or not the declared count)
refuse the start, naming every topic and its count. While running, a topic that gains
partitions is seen, logged, shown on ``/readyz`` and in the metrics, and from then on no input
is applied (Kafka or HTTP), while reads and expirations go on; a restart is refused.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import httpx
import pytest
import structlog
import trio
import trio.testing

from purgatory._codec import encode_request, encode_signal
from purgatory._codec._records import CancelRequest, RegisterRequest, SignalRecord
from purgatory._core import ConfigError
from purgatory.service.app import Service, topics_of
from purgatory.service.kafka.config import raising_single_errors
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport

EPOCH_MS = 1_763_780_400_000
SETTINGS = Settings.from_env({}, shutdown_grace_ms=5_000)
REQUESTS, SIGNALS = SETTINGS.topic_requests, SETTINGS.topic_signals
CHANGELOG, SNAPSHOTS = SETTINGS.topic_changelog, SETTINGS.topic_snapshots
CALLBACKS = SETTINGS.topic_callbacks
# A scope that stays on its partition from 2 partitions to 4 (so the service reads its records
# after the change, and would apply them), and one that moves to a partition nobody reads.
STAYS = next(f"s{i}" for i in range(100) if partition_for(f"s{i}", 4) < 2)
MOVES = next(f"s{i}" for i in range(100) if partition_for(f"s{i}", 4) >= 2)


def _broker(counts: Mapping[str, int] | None = None) -> FakeBroker:
    return FakeBroker({t: 2 for t in topics_of(SETTINGS)} | dict(counts or {}))


async def _run(
    broker: FakeBroker,
    stop: trio.Event,
    services: list[Service],
    settings: Settings = SETTINGS,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    fake = FakeTransport(broker)
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=[REQUESTS, SIGNALS], group_id="g", assignment=None) as source,
    ):
        service = Service(settings, Clock(offset_ms=EPOCH_MS), source, sink, reader)
        services.append(service)
        await service.run(stop, serve_http=False, task_status=task_status)


async def _refused(broker: FakeBroker, settings: Settings = SETTINGS) -> str:
    """Start a service on ``broker``; the message of the ConfigError that refuses it."""
    with trio.fail_after(60), pytest.raises(ConfigError) as refused, raising_single_errors():
        await _run(broker, trio.Event(), [], settings)  # the fake's nurseries group it
    return str(refused.value)


@pytest.mark.parametrize(
    ("counts", "declared", "named"),
    [
        # Restarted on grown input topics, the journal and snapshots left as they were.
        (
            {REQUESTS: 4, SIGNALS: 4},
            None,
            [f"{REQUESTS} has 4", f"{SIGNALS} has 4", f"{CHANGELOG} has 2", f"{SNAPSHOTS} has 2"],
        ),
        ({SIGNALS: 3}, None, [f"{REQUESTS} has 2", f"{SIGNALS} has 3"]),
        ({CHANGELOG: 4, SNAPSHOTS: 4}, None, [f"{CHANGELOG} has 4", f"{REQUESTS} has 2"]),
        ({SNAPSHOTS: 3}, None, [f"{SNAPSHOTS} has 3", f"{CHANGELOG} has 2"]),
        # Every topic grown together: the declared count still tells.
        (
            dict.fromkeys(topics_of(SETTINGS), 4),
            2,
            [f"{REQUESTS} has 4", f"{CHANGELOG} has 4", "PURGATORY_TOPIC_PARTITIONS is 2"],
        ),
    ],
)
async def test_topics_of_other_partition_counts_refuse_the_start(
    autojump_clock: trio.testing.MockClock,
    counts: dict[str, int],
    declared: int | None,
    named: list[str],
) -> None:
    broker = _broker(counts)
    declaring = {} if declared is None else {"topic_partitions": declared}
    settings = Settings.from_env({}, shutdown_grace_ms=5_000, **declaring)
    message = await _refused(broker, settings)
    for text in named:
        assert text in message, message
    assert "same number of partitions" in message
    assert "docs/service.md" in message  # how to fix it
    assert broker.steps == 0  # nothing was read, journaled or sent


async def test_the_snapshots_topic_is_checked_only_with_snapshots_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    broker = _broker({SNAPSHOTS: 3, REQUESTS: 4, SIGNALS: 4})
    off = Settings.from_env({}, shutdown_grace_ms=5_000, snapshot_interval_ms=0)
    message = await _refused(broker, off)
    assert f"{CHANGELOG} has 2" in message
    assert SNAPSHOTS not in message


def _register(broker: FakeBroker, scope: str, op_id: str, keys: list[str], **kw: Any) -> None:
    request = RegisterRequest(op_id=op_id, scope=scope, keys=tuple(keys), **kw)
    broker.append(REQUESTS, scope.encode(), encode_request(request))


def _values(broker: FakeBroker, topic: str) -> list[dict[str, Any]]:
    return [json.loads(r.value or b"") for r in broker.records(topic)]


@pytest.mark.parametrize("grown", [REQUESTS, SIGNALS, CHANGELOG, SNAPSHOTS])
async def test_a_topic_that_gains_partitions_while_running_stops_the_inputs(
    autojump_clock: trio.testing.MockClock, grown: str
) -> None:
    broker = _broker()
    stop = trio.Event()
    services: list[Service] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(_run, broker, stop, services))
        (service,) = services
        _register(broker, STAYS, "barrier", ["k"], timeout_ms=3_600_000)
        _register(broker, STAYS, "cancel-me", ["never"], timeout_ms=3_600_000)
        _register(broker, STAYS, "timer", [], timeout_ms=20_000)
        await trio.sleep(1)
        assert service.status.is_ready()
        committed = dict(broker.committed)

        with structlog.testing.capture_logs() as logs:
            broker.add_partitions(grown, 4)
            await trio.sleep(31)  # the changelog's and snapshots' counts are asked every 30 s
        changed = [e for e in logs if e["event"] == "topic_partitions_changed"]
        assert [(e["topic"], e["old"], e["new"], e["log_level"]) for e in changed] == [
            (grown, 2, 4, "error")
        ]

        # /readyz: not ready, and why.
        readiness = service.status.readiness()
        assert readiness["ready"] is False
        assert readiness["topics"] == {
            t: 4 if t == grown else 2 for t in (REQUESTS, SIGNALS, CHANGELOG, SNAPSHOTS)
        }
        why = readiness["inputs_stopped"]
        assert isinstance(why, str)
        assert f"partition count of {grown} changed from 2 to 4" in why
        transport = httpx.ASGITransport(app=service.app)
        async with httpx.AsyncClient(base_url="http://api", transport=transport) as http:
            answer = await http.get("/readyz")
            assert answer.status_code == 503
            assert answer.json()["inputs_stopped"] == why
            # The metrics.
            scrape = (await http.get("/metrics")).text
            assert "purgatory_partition_count_mismatch 1.0" in scrape
            assert f'purgatory_topic_partitions{{topic="{grown}"}} 4.0' in scrape
            # No input from now on: Kafka records of a scope that stayed on its partition ...
            broker.append(SIGNALS, STAYS.encode(), encode_signal(SignalRecord(STAYS, "k")))
            cancel = CancelRequest(op_id="cancel-me", scope=STAYS)
            broker.append(REQUESTS, STAYS.encode(), encode_request(cancel))
            # ... of one that moved (on a partition nobody reads) ...
            broker.append(SIGNALS, MOVES.encode(), encode_signal(SignalRecord(MOVES, "k")))
            # ... or HTTP writes.
            refused = await http.post(
                "/v1/signals", json={"signals": [{"scope": STAYS, "key": "k"}]}
            )
            assert refused.status_code == 503, refused.text
            assert "takes no input" in refused.json()["error"]["message"]
            await trio.sleep(5)
            # Reads go on.
            read = await http.get("/v1/operation", params={"scope": STAYS, "op_id": "barrier"})
            assert read.status_code == 200
            assert read.json()["status"] == "pending"

        for op_id in ("barrier", "cancel-me"):
            found = service.reads.lookup(STAYS, op_id)
            assert found is not None and found[1] is None, op_id  # still pending
        # Expirations and deliveries go on; nothing else was decided.
        assert [(c["op_id"], c["outcome"]) for c in _values(broker, CALLBACKS)] == [
            ("timer", "expired")
        ]
        inputs = {tp: o for tp, o in broker.committed.items() if tp[0] in (REQUESTS, SIGNALS)}
        assert inputs == {tp: o for tp, o in committed.items() if tp[0] in (REQUESTS, SIGNALS)}
        stop.set()

    # A restart is refused until every topic has one count again.
    message = await _refused(broker)
    assert f"{grown} has 4" in message
