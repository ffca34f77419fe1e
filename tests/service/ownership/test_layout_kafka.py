"""The topics' partition counts against real brokers: checked at start, watched while running.

Input topics of 4 partitions with a changelog and snapshots of 2 (what a restart meets after
the inputs were grown), a replica given partitions 0 and 1: it used to start and be ready,
never reading partitions 2 and 3. Now the start is refused, naming every topic and its count:
``purgatory serve`` exits 2 before it starts anything, and ``run_service`` raises
``ConfigError`` (on both brokers). The embedded broker refuses CreatePartitions, so a
partition added to a live input topic is tried on Apache Kafka alone: the consumer's metadata
shows it within seconds and the service stops its inputs, saying why on ``/readyz`` and
``/metrics`` (the in-memory broker tries every topic: ``tests/service/ownership/test_layout.py``).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import httpx
import pytest
import trio
from kafka.admin import KafkaAdminClient, NewPartitions

from purgatory._core import ConfigError
from purgatory.devtools.broker import Broker, free_port
from purgatory.devtools.kafka_broker import KafkaBroker
from purgatory.service.app import run_service
from purgatory.service.settings import Settings, env_name

pytestmark = pytest.mark.kafka

INPUT_PARTITIONS = 4
JOURNAL_PARTITIONS = 2  # the changelog's and the snapshots'


def _settings(
    broker: Broker, inputs: int = INPUT_PARTITIONS, journal: int = JOURNAL_PARTITIONS
) -> Settings:
    """Topics of this test's own: the inputs (and callbacks, dead letters) of ``inputs``
    partitions (4), the changelog and snapshots of ``journal`` (2); the replica owns
    partitions 0 and 1."""
    prefix = f"l{uuid.uuid4().hex[:10]}"
    settings = Settings.from_env(
        {},
        kafka_bootstrap_servers=broker.bootstrap_servers,
        kafka_group_id=f"{prefix}-group",
        kafka_static_partitions=tuple(range(JOURNAL_PARTITIONS)),
        topic_requests=f"{prefix}.requests",
        topic_signals=f"{prefix}.signals",
        topic_callbacks=f"{prefix}.callbacks",
        topic_dead_letters=f"{prefix}.dead-letters",
        topic_changelog=f"{prefix}.changelog",
        topic_snapshots=f"{prefix}.snapshots",
        http_port=free_port(),
    )
    broker.create_topics(
        {
            settings.topic_requests: inputs,
            settings.topic_signals: inputs,
            settings.topic_callbacks: inputs,
            settings.topic_dead_letters: inputs,
            settings.topic_changelog: journal,
            settings.topic_snapshots: journal,
        }
    )
    return settings


def _named(settings: Settings) -> list[str]:
    return [
        f"{settings.topic_requests} has {INPUT_PARTITIONS}",
        f"{settings.topic_signals} has {INPUT_PARTITIONS}",
        f"{settings.topic_changelog} has {JOURNAL_PARTITIONS}",
        f"{settings.topic_snapshots} has {JOURNAL_PARTITIONS}",
    ]


def test_serve_refuses_a_journal_of_fewer_partitions(kafka_broker: Broker) -> None:
    settings = _settings(kafka_broker)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")},
        **{
            env_name(name): str(getattr(settings, name))
            for name in (
                "kafka_bootstrap_servers",
                "kafka_group_id",
                "http_port",
                "topic_requests",
                "topic_signals",
                "topic_callbacks",
                "topic_dead_letters",
                "topic_changelog",
                "topic_snapshots",
            )
        },
        env_name("kafka_static_partitions"): ",".join(map(str, range(JOURNAL_PARTITIONS))),
    }
    done = subprocess.run(
        [sys.executable, "-m", "purgatory.service.cli", "serve"],
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,  # a service that starts never exits: the test fails here
        check=False,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "purgatory: configuration error: " in done.stderr
    for text in _named(settings):
        assert text in done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    assert "snapshotter_started" not in done.stderr  # refused before anything started


async def test_run_service_refuses_a_journal_of_fewer_partitions(
    kafka_broker: Broker,
) -> None:
    settings = _settings(kafka_broker)
    with trio.fail_after(30), pytest.raises(ConfigError) as refused:
        await run_service(settings, stop=trio.Event())
    for text in _named(settings):
        assert text in str(refused.value)


def _grow(servers: str, topic: str, count: int) -> None:
    admin = KafkaAdminClient(bootstrap_servers=servers)
    try:
        admin.create_partitions({topic: NewPartitions(total_count=count)})
    finally:
        admin.close()


async def test_partitions_added_to_a_live_input_topic_stop_the_inputs(
    apache_kafka: KafkaBroker,
) -> None:
    # On Kafka alone: Tansu refuses CreatePartitions (see the module docstring).
    settings = _settings(apache_kafka, inputs=2, journal=2)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        with trio.fail_after(60):
            await nursery.start(
                lambda task_status: run_service(settings, stop=stop, task_status=task_status)
            )
        url = f"http://{settings.http_host}:{settings.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            assert (await http.get("/readyz")).status_code == 200
            servers = apache_kafka.bootstrap_servers
            await trio.to_thread.run_sync(_grow, servers, settings.topic_signals, 4)
            with trio.fail_after(30):  # the consumer's metadata is at most 5 s old
                while (answer := await http.get("/readyz")).json()["inputs_stopped"] is None:
                    await trio.sleep(0.2)
            assert answer.status_code == 503
            why = answer.json()["inputs_stopped"]
            assert f"partition count of {settings.topic_signals} changed from 2 to 4" in why
            assert answer.json()["topics"][settings.topic_signals] == 4
            scrape = (await http.get("/metrics")).text
            assert "purgatory_partition_count_mismatch 1.0" in scrape
            assert f'purgatory_topic_partitions{{topic="{settings.topic_signals}"}} 4.0' in scrape
            write = await http.post("/v1/signals", json={"signals": [{"scope": "s", "key": "k"}]})
            assert write.status_code == 503
            assert "takes no input" in write.json()["error"]["message"]
        stop.set()
