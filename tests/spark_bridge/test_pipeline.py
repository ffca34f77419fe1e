"""Spark -> Kafka -> the service -> Kafka -> Spark: the bridge end to end, and the examples.

One service process (``purgatory serve``) runs for the module against the session's broker,
on topics of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.errors import StreamingQueryException

from purgatory._core import ConfigError
from purgatory.devtools.broker import EmbeddedBroker
from spark_bridge import signals_to_kafka
from spark_bridge.examples.barrier import BarrierResult, deadline_after, run_barrier
from spark_bridge.examples.inactivity import (
    BASE_MS,
    EVENTS,
    Session,
    expected_sessions,
    run_inactivity,
)
from tests.bounds import bound

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from purgatory.devtools.broker import Broker
    from tests.spark_bridge.conftest import Service


pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _callbacks(spark: SparkSession, service: Service, scope: str) -> list[Any]:
    return (
        spark.read.format("purgatory-callbacks")
        .option("bootstrap_servers", service.servers)
        .option("topic", service.callbacks)
        .option("scope", scope)
        .load()
        .collect()
    )


def test_spark_registers_and_signals_and_reads_exactly_the_completed_callbacks(
    spark: SparkSession, service: Service, tmp_path: Path
) -> None:
    scope = f"round-{uuid.uuid4().hex[:6]}"
    ops = spark.createDataFrame(
        [(f"op-{i}", [f"k{i}a", f"k{i}b"]) for i in range(20)], "op_id string, keys array<string>"
    )
    ops.write.format("purgatory-operations").mode("append") \
        .option("bootstrap_servers", service.servers).option("topic", service.requests) \
        .option("scope", scope).option("timeout_ms", "600000").save()  # fmt: skip
    # Every key of ops 0..14 through a stream; ops 15..19 get one key of two.
    signals = [(scope, f"k{i}{x}", i) for i in range(15) for x in "ab"]
    signals += [(scope, f"k{i}a", i) for i in range(15, 20)]
    source = tmp_path / "signals"
    source.mkdir()
    (source / "part-0.json").write_text(
        "".join(json.dumps({"scope": s, "key": k, "n": n}) + "\n" for s, k, n in signals)
    )
    query = (
        spark.readStream.schema("scope string, key string, n int").json(str(source))
        .selectExpr("scope", "key", "named_struct('n', n) AS payload")
        .writeStream.format("purgatory-signals")
        .option("bootstrap_servers", service.servers)
        .option("topic", service.signals)
        .option("payload_column", "payload")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )  # fmt: skip
    query.awaitTermination(60)
    assert query.exception() is None

    sink = tmp_path / "seen"
    seen: list[Any] = []
    reader: Any = (
        spark.readStream.format("purgatory-callbacks")
        .option("bootstrap_servers", service.servers)
        .option("topic", service.callbacks)
        .option("scope", scope)
        .load()
        .writeStream.format("parquet")
        .option("path", str(sink))
        .option("checkpointLocation", str(tmp_path / "callbacks-checkpoint"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        for _ in range(100):  # bounded: 100 micro-batches at most
            reader.processAllAvailable()
            if any(sink.glob("*.parquet")):
                seen = spark.read.parquet(str(sink)).collect()
                if len({r["op_id"] for r in seen}) >= 15:
                    break
            reader.awaitTermination(0.3)
    finally:
        reader.stop()
    completed = {r["op_id"]: r for r in seen}
    assert sorted(completed) == sorted(f"op-{i}" for i in range(15))
    for i in range(15):
        row = completed[f"op-{i}"]
        assert row["outcome"] == "completed"
        assert row["scope"] == scope
        assert sorted(row["keys"]) == [f"k{i}a", f"k{i}b"]
        assert json.loads(row["signals"]) == {f"k{i}a": {"n": i}, f"k{i}b": {"n": i}}


@pytest.mark.parametrize("connector", [False, True], ids=["data-sources", "connector"])
def test_the_barrier_example_proceeds_when_complete_and_names_the_missing_key_when_not(
    spark: SparkSession, service: Service, tmp_path: Path, connector: bool
) -> None:
    run = f"r{uuid.uuid4().hex[:6]}"
    lines: list[str] = []
    common: dict[str, Any] = {
        "bootstrap_servers": service.servers, "service_url": service.url,
        "work_dir": tmp_path, "signals_topic": service.signals, "show": lines.append,
        "connector": connector,
    }  # fmt: skip
    done = run_barrier(spark, run=f"{run}-1", **common)
    assert done.proceeded
    assert done.outcome["outcome"] == "completed"
    assert done.report_rows == 1_000 + 2_000 + 3_000
    assert done.upstream_s > 0
    late = run_barrier(
        spark, run=f"{run}-2", fail=("users",), deadline_in_ms=deadline_after(done), **common
    )
    assert not late.proceeded
    assert late.outcome["outcome"] == "expired"
    assert late.outcome["missing"] == [f"ingest/users@{run}-2"]
    assert late.outcome["outcome_ms"] == late.outcome["deadline_ms"]
    assert any("missing ['ingest/users@" in line for line in lines)


def _logical(rows: list[Any]) -> list[tuple[Any, ...]]:
    """A callback without what depends on processing time or on the scope's name."""
    return sorted(
        (r["op_id"], r["outcome"], r["deadline_ms"], tuple(r["keys"]), tuple(r["missing"]))
        for r in rows
    )


def test_event_time_sessions_follow_the_rule_and_a_replay_gives_the_same_callbacks(
    spark: SparkSession, service: Service, tmp_path: Path, kafka_broker: Broker
) -> None:
    """The first run goes through the data sources, the replay through Spark's Kafka connector
    (its reads too, except on the embedded broker: see docs/spark.md): the same sessions."""
    expected = expected_sessions(EVENTS, gap_ms=30_000, delay_ms=0, base_ms=BASE_MS)
    assert [s.entity for s in expected] == ["alice", "alice", "carol", "carol"]
    runs: list[tuple[list[Session], list[tuple[Any, ...]]]] = []
    for replay in range(2):
        scope = f"clicks-{uuid.uuid4().hex[:6]}"
        result = run_inactivity(
            spark, bootstrap_servers=service.servers, work_dir=tmp_path / str(replay),
            scope=scope, requests_topic=service.requests, callbacks_topic=service.callbacks,
            show=lambda _: None, connector=replay == 1,
            read_connector=replay == 1 and not isinstance(kafka_broker, EmbeddedBroker),
        )  # fmt: skip
        assert result.sessions == expected
        runs.append((result.sessions, _logical(_callbacks(spark, service, scope))))
    assert runs[0] == runs[1]
    assert len(runs[0][1]) == len(expected)  # one callback per closed session


@pytest.mark.parametrize("connector", [False, True], ids=["data-sources", "connector"])
def test_a_bad_row_fails_its_micro_batch_and_a_restart_loses_nothing(
    spark: SparkSession, service: Service, tmp_path: Path, connector: bool
) -> None:
    scope = f"retry-{uuid.uuid4().hex[:6]}"
    source = tmp_path / "in"
    source.mkdir()

    def put(name: str, keys: list[str | None], mtime: int) -> None:
        path = source / name
        path.write_text("".join(json.dumps({"key": k}) + "\n" for k in keys))
        os.utime(path, (mtime, mtime))

    def start() -> Any:
        rows = spark.readStream.schema("key string").option("maxFilesPerTrigger", 1) \
            .json(str(source))  # fmt: skip
        if connector:  # a stream goes through the connector one micro-batch at a time
            with pytest.raises(ConfigError, match="foreachBatch"):
                signals_to_kafka(rows, scope=scope)

            def write(batch: Any, _batch_id: int) -> None:
                signals_to_kafka(batch, scope=scope).write.format("kafka") \
                    .option("kafka.bootstrap.servers", service.servers) \
                    .option("topic", service.signals).save()  # fmt: skip

            return (
                rows.writeStream.foreachBatch(write)
                .option("checkpointLocation", str(tmp_path / "checkpoint"))
                .trigger(availableNow=True).start()
            )  # fmt: skip
        return (
            rows.writeStream.format("purgatory-signals")
            .option("bootstrap_servers", service.servers).option("topic", service.signals)
            .option("scope", scope)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True).start()
        )  # fmt: skip

    put("a.json", ["a1", "a2"], 1_700_000_000)
    put("b.json", ["b1", None, "b3"], 1_700_000_001)  # the null key fails this micro-batch
    first = start()
    with pytest.raises(StreamingQueryException, match=r"column 'key': must be a non-empty string"):
        first.awaitTermination(60)
    # The operator fixes the file and restarts from the checkpoint: Spark re-runs the batch.
    put("b.json", ["b1", "b2", "b3"], 1_700_000_001)
    second = start()
    second.awaitTermination(60)
    assert second.exception() is None

    every_key = ["a1", "a2", "b1", "b2", "b3"]
    from purgatory.client import PurgatoryClient  # noqa: PLC0415

    with PurgatoryClient(service.url) as client:
        client.register(scope=scope, op_id="all", keys=every_key, timeout_ms=60_000)
        answer = client.wait(scope, "all", timeout_ms=20_000)
    assert answer["outcome"]["outcome"] == "completed", answer


def test_the_demo_runs_the_whole_pipeline_and_every_check_holds(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")}
    done = subprocess.run(
        [sys.executable, "-m", "spark_bridge.demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=bound(300),  # 90-110 s on a quiet 2-core machine
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "barrier report@2026-11-22: completed" in out
    assert "barrier report@2026-11-23: expired; missing ['ingest/stock@2026-11-23']" in out
    assert out.count("inactivity: session ") == 4
    assert "summary: 1 completed, 5 expired" in out
    assert "FAILED" not in out


def test_a_late_barrier_s_deadline_grows_with_how_slow_the_upstream_jobs_were() -> None:
    quick = BarrierResult("r", {}, proceeded=True, report_rows=6_000, upstream_s=1.2)
    slow = dataclasses.replace(quick, upstream_s=40.0)
    assert deadline_after(quick) == 8_000  # never under the floor
    assert deadline_after(slow) == 120_000  # three times what the jobs took
