"""The ``purgatory-signals`` sink against a real local Spark and both real brokers."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from purgatory._codec import SignalRecord, WatermarkRecord, decode_signal
from purgatory.devtools.broker import free_port
from spark_bridge._signals_sink import SignalsDataSource
from tests.spark_bridge._support import failure, read_records
from tests.spark_bridge._support import writer as sink_writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from purgatory.devtools.broker import Broker

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

FORMAT = "purgatory-signals"


def writer(df: DataFrame, servers: str, topic: str, **options: str) -> Any:
    return sink_writer(df, FORMAT, servers, topic, **options)


def test_the_source_is_named_purgatory_signals() -> None:
    assert SignalsDataSource.name() == FORMAT


def test_a_batch_write_publishes_exactly_one_signal_per_row(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    n = 300
    rows = [
        (f"scope-{i % 3}", f"ingest/part-{i}@2026-11-22", 1_000 + i, i, f"p{i}") for i in range(n)
    ]
    df = spark.createDataFrame(rows, "scope string, key string, t long, n int, tag string")
    df = df.selectExpr("scope", "key", "t", "named_struct('n', n, 'tag', tag) AS body")
    writer(df.repartition(2), kafka_broker.bootstrap_servers, topic,
           event_time_column="t", payload_column="body").save()  # fmt: skip

    records = read_records(kafka_broker.bootstrap_servers, topic, n)
    assert len(records) == n
    got = {}
    for record in records:
        signal = decode_signal(record.value)
        assert isinstance(signal, SignalRecord)
        assert record.key == signal.scope.encode()
        got[signal.key] = signal
    expected = {
        key: SignalRecord(scope, key, t, json.dumps({"n": i, "tag": tag}, separators=(",", ":")))
        for scope, key, t, i, tag in rows
    }
    assert got == expected


def test_a_stream_publishes_signals_then_monotonic_watermarks_per_scope(
    spark: SparkSession, kafka_broker: Broker, topic: str, tmp_path: Path
) -> None:
    source = tmp_path / "in"
    source.mkdir()
    batches = [  # (scope, key, event time ms): batch 2 brings scope "a" only older events
        [("a", "a1", 10_000), ("a", "a2", 12_000), ("b", "b1", 5_000)],
        [("a", "a3", 11_000), ("b", "b2", 9_000), ("c", "c1", 700)],
    ]
    for i, batch in enumerate(batches):
        lines = [json.dumps({"scope": s, "key": k, "t": t}) for s, k, t in batch]
        path = source / f"part-{i}.json"
        path.write_text("\n".join(lines) + "\n")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the file source's order
    df = spark.readStream.schema("scope string, key string, t long") \
        .option("maxFilesPerTrigger", 1).json(str(source))  # fmt: skip
    query = (
        df.writeStream.format(FORMAT)
        .option("bootstrap_servers", kafka_broker.bootstrap_servers)
        .option("topic", topic)
        .option("event_time_column", "t")
        .option("watermark", "true")
        .option("watermark_delay_ms", "1000")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(60)
    assert query.exception() is None

    # 6 signals; watermarks a: 11000 (batch 2 would go back), b: 4000 then 8000, c: 0.
    records = read_records(kafka_broker.bootstrap_servers, topic, 6 + 4)
    decoded = [decode_signal(r.value) for r in records]
    signals = {(s.scope, s.key, s.event_time_ms) for s in decoded if isinstance(s, SignalRecord)}
    assert signals == {row for batch in batches for row in batch}
    marks: dict[str, list[int]] = {}
    for record, value in zip(records, decoded, strict=True):
        assert record.key == value.scope.encode()
        if isinstance(value, WatermarkRecord):
            marks.setdefault(value.scope, []).append(value.watermark_ms)
    assert marks == {"a": [11_000], "b": [4_000, 8_000], "c": [0]}
    state = json.loads((tmp_path / "checkpoint" / "purgatory-watermarks.json").read_text())
    assert state == {"a": 11_000, "b": 8_000, "c": 0}


def test_a_null_key_fails_the_write_naming_the_key_column(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    df = spark.createDataFrame([("s", "k1"), ("s", None)], "scope string, key string")
    message = failure(writer(df.coalesce(1), kafka_broker.bootstrap_servers, topic).save)
    assert "RowError" in message
    assert "column 'key': must be a non-empty string; row: scope='s', key=None" in message


def test_a_key_over_max_key_bytes_fails_the_write_naming_the_key_column(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    df = spark.createDataFrame([("s", "x" * 9)], "scope string, key string")
    save = writer(df, kafka_broker.bootstrap_servers, topic, max_key_bytes="8").save
    assert "column 'key': " in failure(save)


def test_a_column_of_the_wrong_type_is_named_before_any_task_runs(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    df = spark.createDataFrame([("s", 1)], "scope string, id int")
    save = writer(df, kafka_broker.bootstrap_servers, topic, key_column="id").save
    assert "column 'id' (option 'key_column') must be a string, got int" in failure(save)


def test_a_missing_column_is_named(spark: SparkSession, kafka_broker: Broker, topic: str) -> None:
    df = spark.createDataFrame([("s", "k")], "scope string, name string")
    message = failure(writer(df, kafka_broker.bootstrap_servers, topic).save)
    assert "column 'key' (option 'key_column') is not in the DataFrame" in message


def test_a_missing_bootstrap_servers_option_is_named(spark: SparkSession) -> None:
    df = spark.createDataFrame([("s", "k")], "scope string, key string")
    save = df.write.format(FORMAT).mode("append").save
    assert "option 'bootstrap_servers' is required" in failure(save)


def test_an_unreachable_broker_is_named_within_seconds(spark: SparkSession) -> None:
    port = free_port()  # nobody listens on it
    df = spark.createDataFrame([("s", "k")], "scope string, key string")
    save = writer(df, f"127.0.0.1:{port}", "purgatory.signals", connect_timeout_ms="2000").save
    started = time.monotonic()  # noqa: TID251 - the bound is the point of this test
    message = failure(save)
    assert time.monotonic() - started < 15  # noqa: TID251
    assert f"option 'bootstrap_servers': no broker answered at '127.0.0.1:{port}'" in message


def test_overwrite_mode_is_refused_naming_the_mode(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    df = spark.createDataFrame([("s", "k")], "scope string, key string")
    save = writer(df, kafka_broker.bootstrap_servers, topic).mode("overwrite").save
    assert "mode: the purgatory-signals sink only appends; use mode('append')" in failure(save)
