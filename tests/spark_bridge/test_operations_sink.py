"""The ``purgatory-operations`` sink against a real local Spark and both real brokers."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from purgatory._codec import RegisterRequest, WatermarkRecord, decode_requests_record
from purgatory._core import Condition, TimeDomain
from spark_bridge._operations_sink import OperationsDataSource
from tests.spark_bridge._support import failure, read_records
from tests.spark_bridge._support import writer as sink_writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from purgatory.devtools.broker import Broker

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

FORMAT = "purgatory-operations"


def writer(df: DataFrame, servers: str, topic: str, **options: str) -> Any:
    return sink_writer(df, FORMAT, servers, topic, **options)


def test_the_sink_is_named_purgatory_operations() -> None:
    assert OperationsDataSource.name() == FORMAT


def test_a_batch_write_registers_one_operation_per_row_with_every_field(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    deadline = dt.datetime(2026, 11, 22, 6, 0, tzinfo=dt.UTC)
    rows = [
        ("daily/report", ["ingest/a", "ingest/b"], "all", None, deadline, None, "x"),
        ("daily/quorum", ["r1", "r2", "r3"], "count", 2, None, 60_000, "y"),
        ("session/alice", [], None, None, deadline, None, None),
    ]
    df = spark.createDataFrame(
        rows,
        "op_id string, keys array<string>, condition string, count int, "
        "deadline_ms timestamp_ntz, timeout_ms long, tag string",
    ).selectExpr(
        "op_id", "keys", "condition", "count", "deadline_ms", "timeout_ms",
        "IF(tag IS NULL, NULL, named_struct('tag', tag)) AS payload",
    )  # fmt: skip
    deadline = deadline.replace(tzinfo=None)  # TIMESTAMP_NTZ: wall-clock time, read as UTC
    writer(df.repartition(2), kafka_broker.bootstrap_servers, topic, scope="nightly").save()

    records = read_records(kafka_broker.bootstrap_servers, topic, len(rows))
    decoded = [decode_requests_record(rec.value) for rec in records]
    got = {r.op_id: r for r in decoded if isinstance(r, RegisterRequest)}
    epoch_ms = 1_795_327_200_000  # 2026-11-22T06:00:00Z
    assert got == {
        "daily/report": RegisterRequest(
            "daily/report", "nightly", ("ingest/a", "ingest/b"), deadline_ms=epoch_ms,
            payload='{"tag":"x"}',
        ),
        "daily/quorum": RegisterRequest(
            "daily/quorum", "nightly", ("r1", "r2", "r3"), Condition.COUNT, 2,
            timeout_ms=60_000, payload='{"tag":"y"}',
        ),
        "session/alice": RegisterRequest("session/alice", "nightly", (), deadline_ms=epoch_ms),
    }  # fmt: skip
    assert {rec.key for rec in records} == {b"nightly"}


def test_a_stream_re_arms_timers_then_publishes_the_watermark_in_band(
    spark: SparkSession, kafka_broker: Broker, topic: str, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    batches = [  # (entity, event time ms) per micro-batch
        [("alice", 1_000), ("bob", 2_000)],
        [("bob", 4_000), ("carol", 3_000)],
    ]
    for i, batch in enumerate(batches):
        lines = [json.dumps({"entity": e, "t": t}) for e, t in batch]
        path = source / f"part-{i}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    events = spark.readStream.schema("entity string, t long") \
        .option("maxFilesPerTrigger", 1).json(str(source))  # fmt: skip
    timers = events.selectExpr(
        "concat('session/', entity) AS op_id", "t + 10000 AS deadline_ms", "t"
    )
    query = (
        timers.writeStream.format(FORMAT)
        .option("bootstrap_servers", kafka_broker.bootstrap_servers)
        .option("topic", topic)
        .option("scope", "clicks")
        .option("time_domain", "event_time")
        .option("event_time_column", "t")
        .option("watermark", "true")
        .option("watermark_delay_ms", "500")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None

    # One scope, so one partition, in this order: each batch's re-arms, then its watermark.
    records = read_records(kafka_broker.bootstrap_servers, topic, 4 + 2)
    assert len({r.partition for r in records}) == 1
    decoded = [decode_requests_record(r.value) for r in sorted(records, key=lambda r: r.offset)]

    def timer(entity: str, deadline_ms: int) -> RegisterRequest:
        return RegisterRequest(
            f"session/{entity}", "clicks", (), deadline_ms=deadline_ms,
            time_domain=TimeDomain.EVENT_TIME,
        )  # fmt: skip

    assert set(decoded[:2]) == {timer("alice", 11_000), timer("bob", 12_000)}
    assert decoded[2] == WatermarkRecord("clicks", 1_500)
    assert set(decoded[3:5]) == {timer("bob", 14_000), timer("carol", 13_000)}
    assert decoded[5:] == [WatermarkRecord("clicks", 3_500)]
    state = json.loads((tmp_path / "checkpoint" / "purgatory-watermarks.json").read_text())
    assert state == {"clicks": 3_500}


def test_a_null_op_id_fails_the_write_naming_the_column_and_sends_nothing_of_it(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    df = spark.createDataFrame([(None, "s")], "op_id string, scope string")
    save = writer(df.coalesce(1), kafka_broker.bootstrap_servers, topic, timeout_ms="1000").save
    message = failure(save)
    assert "RowError" in message
    assert "column 'op_id': must be a non-empty string; row: op_id=None, scope='s'" in message


def test_a_row_with_neither_deadline_nor_timeout_names_both(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    df = spark.createDataFrame([("op", "s")], "op_id string, scope string")
    message = failure(writer(df, kafka_broker.bootstrap_servers, topic).save)
    assert "deadline_ms" in message
    assert "timeout_ms" in message


def test_a_keys_column_of_integers_is_named_before_any_task_runs(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    df = spark.createDataFrame([("op", "s", [1])], "op_id string, scope string, ids array<int>")
    save = writer(df, kafka_broker.bootstrap_servers, topic, keys_column="ids").save
    message = failure(save)
    assert "column 'ids' (option 'keys_column') must be an array of strings, got array<int>" in (
        message
    )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"condition": "most"}, "option 'condition' must be one of all, any, count"),
        ({"time_domain": "wall"}, "option 'time_domain' must be one of"),
        ({"timeout_ms": "soon"}, "option 'timeout_ms' must be an integer"),
        ({"watermark": "true"}, "option 'event_time_column' is unset"),
        ({"scope_column": "team"}, "column 'team' (option 'scope_column') is not in the DataFrame"),
    ],
)
def test_bad_options_are_named(
    spark: SparkSession, kafka_broker: Broker, options: dict[str, str], named: str
) -> None:
    df = spark.createDataFrame([("op", "s")], "op_id string, scope string")
    assert named in failure(writer(df, kafka_broker.bootstrap_servers, "unused", **options).save)
