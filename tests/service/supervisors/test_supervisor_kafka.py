"""``purgatory serve`` with its real snapshotter child, on both real brokers: SIGKILL the
snapshotter and the service reaps it (no zombie), logs it, counts it, starts a new one that
writes snapshots again, and ``/metrics`` shows how old each partition's latest snapshot is."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import TypeVar

import httpx
import pytest
from kafka import KafkaConsumer, TopicPartition
from prometheus_client.parser import text_string_to_metric_families

from purgatory._core.durability.manifest import decode_manifest
from purgatory.client import PurgatoryClient
from purgatory.devtools.broker import Broker
from purgatory.devtools.child import service_process
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.settings import Settings, env_name
from purgatory.service.snapshots.snapshots import MANIFEST_KEY
from tests.service.end_to_end.test_e2e import PARTITIONS, _settings

pytestmark = pytest.mark.kafka

_T = TypeVar("_T")


def _until(what: str, probe: Callable[[], _T | None], timeout_s: float = 30) -> _T:
    end = time.perf_counter() + timeout_s
    while time.perf_counter() < end:
        found = probe()
        if found is not None:
            return found
        time.sleep(0.1)  # noqa: TID251 - a real process and a real broker: real time
    raise AssertionError(f"not within {timeout_s} s: {what}")


def _state(pid: int) -> str | None:
    """The process state letter (``Z``: a zombie), or None once it is gone (reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2 :].split()[0]


def _snapshotter_of(pid: int) -> int | None:
    """The pid of the running ``purgatory snapshotter`` child of ``pid``, if there is one."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat[stat.rindex(")") + 2 :].split()[1])
        if parent == pid and b"snapshotter" in command:
            return int(entry.name)
    return None


def _scrape(url: str) -> dict[tuple[str, str], float]:
    """``{(name, partition label): value}`` of the snapshots' series."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {
        (s.name, s.labels.get("partition", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith(("purgatory_snapshot_", "purgatory_snapshotter_"))
    }


def _env(settings: Settings) -> dict[str, str]:
    return {
        "PURGATORY_SNAPSHOT_INTERVAL_MS": "1000",
        "PURGATORY_KAFKA_GROUP_ID": settings.kafka_group_id,
        **{
            env_name(f.name): getattr(settings, f.name)
            for f in fields(Settings)
            if f.name.startswith("topic_") and f.name != "topic_partitions"
        },
    }


def _latest_manifest(
    broker: Broker, topic: str, partition: int, timeout_s: float = 10
) -> tuple[int, int] | None:
    """``(timestamp_ms, journal_offset)`` of the partition's last manifest on the topic."""
    consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap_servers, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        latest = None
        end = time.perf_counter() + timeout_s
        while time.perf_counter() < end:
            for records in consumer.poll(timeout_ms=200).values():
                for r in records:
                    if r.key == MANIFEST_KEY:
                        latest = (r.timestamp, decode_manifest(r.value).journal_offset)
            highwater = consumer.highwater(tp)
            if highwater is not None and consumer.position(tp) >= highwater:
                return latest
        raise AssertionError(f"{topic}[{partition}] not read to its end")
    finally:
        consumer.close()


def _snapshot_after(
    broker: Broker, topic: str, partition: int, since_ms: int
) -> Callable[[], tuple[int, int] | None]:
    """A probe: the partition's latest manifest, once one was written since ``since_ms``."""

    def probe() -> tuple[int, int] | None:
        latest = _latest_manifest(broker, topic, partition)
        return latest if latest is not None and latest[0] >= since_ms else None

    return probe


def _shows(url: str, partition: int, written_ms: int) -> Callable[[], bool | None]:
    """A probe: ``/metrics`` shows that snapshot as the partition's latest, covering the whole
    changelog."""

    def probe() -> bool | None:
        seen = _scrape(url)
        expected_s = (_wall_ms() - written_ms) / 1000
        age = seen.get(("purgatory_snapshot_age_seconds", str(partition)), -1.0)
        lag = seen.get(("purgatory_snapshot_lag_records", str(partition)))
        return (lag == 0 and abs(age - expected_s) < 1.5) or None

    return probe


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def test_a_killed_snapshotter_is_reaped_logged_counted_and_restarted(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    settings = _settings(kafka_broker)
    topic = settings.topic_snapshots
    log_path = tmp_path / "serve.log"
    scope = "supervised"
    partition = partition_for(scope, PARTITIONS)
    with service_process(
        kafka_broker.bootstrap_servers, log_path, _env(settings), partitions=PARTITIONS
    ) as serve:
        first = _until("the snapshotter started", lambda: _snapshotter_of(serve.pid))
        seen = _scrape(serve.url)
        assert seen[("purgatory_snapshotter_restarts_total", "")] == 0
        assert {p for name, p in seen if name == "purgatory_snapshot_age_seconds"} == {"0", "1"}
        since_ms = _wall_ms()
        with PurgatoryClient(serve.url, timeout_s=10) as client:
            client.register(scope=scope, op_id="before", keys=["k"], timeout_ms=600_000)
        written_ms, covered = _until(
            "a snapshot of the registration",
            _snapshot_after(kafka_broker, topic, partition, since_ms),
        )
        assert covered >= 1
        _until("its age and lag in the metrics", _shows(serve.url, partition, written_ms))

        os.kill(first, signal.SIGKILL)
        _until("the killed snapshotter reaped", lambda: _state(first) is None or None)
        second = _until("a new snapshotter", lambda: _snapshotter_of(serve.pid))
        assert second != first
        restarts = _scrape(serve.url)[("purgatory_snapshotter_restarts_total", "")]
        assert restarts == 1
        # The new one writes snapshots: the journal grows, and a snapshot covers it again.
        since_ms = _wall_ms()
        with PurgatoryClient(serve.url, timeout_s=10) as client:
            client.register(scope=scope, op_id="after", keys=["k"], timeout_ms=600_000)
        written_ms, again = _until(
            "a snapshot after the restart",
            _snapshot_after(kafka_broker, topic, partition, since_ms),
        )
        assert again > covered
        _until("the new snapshot in the metrics", _shows(serve.url, partition, written_ms))
        assert _state(second) not in (None, "Z")
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line[:1] == "{"]
    (exited,) = [e for e in events if e["event"] == "snapshotter_exited"]
    assert (exited["pid"], exited["signal"], exited["restart_in_s"]) == (first, "SIGKILL", 1)
    started = [e["pid"] for e in events if e["event"] == "snapshotter_started"]
    assert started == [first, second]
    (stopped,) = [e for e in events if e["event"] == "snapshotter_stopped"]
    assert (stopped["pid"], stopped["exit_code"]) == (second, 0), stopped  # it stops on SIGTERM
