"""Spark's own Kafka connector with the bridge's column helpers, against the real service.

The connector's jars come from ``make spark-kafka`` (``.ci/spark-kafka/pom.xml``); the session
fixture's ``local_session`` puts them on ``spark.jars``. Each scenario runs on both brokers and
is checked against the Python data sources on the same records, so both paths must agree.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.errors import SparkRuntimeException

from purgatory._codec import (
    Limits,
    RegisterRequest,
    WatermarkRecord,
    decode_request,
    decode_signal,
)
from purgatory._core import Condition, ConfigError, TimeDomain
from spark_bridge import (
    callbacks_from_kafka,
    dedupe,
    operations_to_kafka,
    signals_to_kafka,
    watermarks_to_kafka,
)
from spark_bridge._session import KAFKA_CONNECTOR_PACKAGE, kafka_connector_jars
from tests.spark_bridge._support import SENTINEL, left_on, read_records

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from purgatory.devtools.broker import Broker
    from tests.spark_bridge.conftest import Service

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

_ROOT = Path(__file__).resolve().parents[2]


# Spark's Kafka reader bounds each batch by ListOffsets' "latest", which the embedded broker
# reports short of the real end after a batched produce (the purgatory-callbacks source probes
# past it): there the connector's reader misses a topic's last batch until more records come.
# Only a short read on that broker is an expected failure; a complete one is checked in full.
def _on_tansu_the_connector_reader_stops_short(broker: Broker) -> None:
    from purgatory.devtools.broker import EmbeddedBroker  # noqa: PLC0415

    if isinstance(broker, EmbeddedBroker):
        pytest.xfail("the embedded broker's ListOffsets lags the end of a batched produce")


def test_the_connector_pom_pins_the_version_of_the_installed_pyspark() -> None:
    import pyspark  # noqa: PLC0415

    pom = (_ROOT / ".ci" / "spark-kafka" / "pom.xml").read_text()
    pinned = re.search(r"<spark.version>([^<]+)</spark.version>", pom)
    assert pinned is not None
    assert pinned.group(1) == pyspark.__version__
    assert KAFKA_CONNECTOR_PACKAGE.endswith(f":{pyspark.__version__}")
    names = [jar.name for jar in kafka_connector_jars()]
    assert f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar" in names


def _register(spark: SparkSession, service: Service, scope: str, ops: int) -> None:
    df = spark.createDataFrame(
        [(f"op-{i}", [f"k{i}a", f"k{i}b"]) for i in range(ops)], "op_id string, keys array<string>"
    )
    df.write.format("purgatory-operations").mode("append") \
        .option("bootstrap_servers", service.servers).option("topic", service.requests) \
        .option("scope", scope).option("timeout_ms", "600000").save()  # fmt: skip


def _raw(spark: SparkSession, servers: str, topic: str) -> DataFrame:
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )


def _source_rows(spark: SparkSession, service: Service, scope: str) -> list[Any]:
    return (
        spark.read.format("purgatory-callbacks")
        .option("bootstrap_servers", service.servers)
        .option("topic", service.callbacks)
        .option("scope", scope)
        .load()
        .collect()
    )


def _wait_for(probe: Any, want: int, spark: SparkSession) -> list[Any]:
    rows: list[Any] = []
    for _ in range(100):  # bounded: about 30 s
        rows = probe()
        if len(rows) >= want:
            return rows
        spark.sparkContext.parallelize([0]).count()  # a short pause that does Spark work
    return rows


def _comparable(row: Any) -> tuple[Any, ...]:
    d = row.asDict()
    d["signals"] = json.loads(d["signals"])
    d["payload"] = None if d["payload"] is None else json.loads(d["payload"])
    return tuple(sorted(d.items()))


def test_connector_signals_complete_operations_and_its_callbacks_match_the_source(
    spark: SparkSession, service: Service, kafka_broker: Broker
) -> None:
    scope = f"conn-{uuid.uuid4().hex[:6]}"
    _register(spark, service, scope, 10)
    events = spark.createDataFrame(
        [(f"k{i}{x}", i, f'{{"n": {i}, "x": "{x}"}}') for i in range(8) for x in "ab"],
        "key string, n int, payload string",
    )
    (signals_to_kafka(events, scope=scope, payload_column="payload")
     .write.format("kafka").option("kafka.bootstrap.servers", service.servers)
     .option("topic", service.signals).save())  # fmt: skip

    def connector_rows() -> list[Any]:
        rows = callbacks_from_kafka(_raw(spark, service.servers, service.callbacks))
        return dedupe(rows.where(rows.scope == scope)).collect()

    # The service is done once the data source (which probes past a lagging end) sees them all.
    assert len(_wait_for(lambda: _source_rows(spark, service, scope), 8, spark)) >= 8
    rows = connector_rows()
    if len(rows) < 8:
        _on_tansu_the_connector_reader_stops_short(kafka_broker)
    assert sorted(r["op_id"] for r in rows) == sorted(f"op-{i}" for i in range(8))
    for r in rows:
        i = int(r["op_id"][3:])
        assert r["outcome"] == "completed" and r["payload"] is None
        assert json.loads(r["signals"]) == {
            f"k{i}a": {"n": i, "x": "a"},
            f"k{i}b": {"n": i, "x": "b"},
        }
    # The same records through the Python data source: the same rows, column for column.
    source = _source_rows(spark, service, scope)
    assert [f for f in rows[0].asDict()] == [f for f in source[0].asDict()]
    assert sorted(map(_comparable, rows)) == sorted(map(_comparable, dedupe_rows(source)))


def dedupe_rows(rows: list[Any]) -> list[Any]:
    seen: dict[str, Any] = {}
    for r in rows:
        seen.setdefault(r["id"], r)
    return list(seen.values())


def test_a_streaming_connector_read_restarted_from_its_checkpoint_reads_each_callback_once(
    spark: SparkSession, service: Service, tmp_path: Path, kafka_broker: Broker
) -> None:
    scope = f"stream-{uuid.uuid4().hex[:6]}"
    _register(spark, service, scope, 6)
    sink, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def signal(indices: range) -> None:
        df = spark.createDataFrame([(f"k{i}{x}",) for i in indices for x in "ab"], "key string")
        (signals_to_kafka(df, scope=scope).write.format("kafka")
         .option("kafka.bootstrap.servers", service.servers)
         .option("topic", service.signals).save())  # fmt: skip

    def run_once() -> None:
        raw = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", service.servers)
            .option("subscribe", service.callbacks)
            .option("startingOffsets", "earliest")
            .load()
        )
        rows = callbacks_from_kafka(raw)
        query = (
            dedupe(rows.where(rows.scope == scope))
            .writeStream.format("parquet")
            .option("path", str(sink))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    def written(want: int) -> list[Any]:
        # Once the data source (which probes past a lagging end) sees them all, one run.
        assert len(_wait_for(lambda: _source_rows(spark, service, scope), want, spark)) >= want
        run_once()
        return spark.read.parquet(str(sink)).collect() if any(sink.glob("*.parquet")) else []

    signal(range(3))
    first = written(3)
    if len(first) < 3:
        _on_tansu_the_connector_reader_stops_short(kafka_broker)
    assert sorted(r["op_id"] for r in first) == ["op-0", "op-1", "op-2"]
    signal(range(3, 6))
    both = written(6)
    if len(both) < 6:
        _on_tansu_the_connector_reader_stops_short(kafka_broker)
    assert sorted(r["op_id"] for r in both) == [f"op-{i}" for i in range(6)]  # each once


def test_a_bad_row_fails_the_write_naming_the_column_and_its_task_publishes_nothing(
    spark: SparkSession, kafka_broker: Broker
) -> None:
    topic = f"one-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topics({topic: 1})  # one partition: read in order up to a sentinel
    good = [("s1", f"k{i}", '{"i": 1}') for i in range(200)]
    rows = [*good[:150], ("s1", "", '{"i": 1}'), *good[150:]]  # an empty key, mid-task
    df = spark.createDataFrame(rows, "scope string, key string, payload string").coalesce(1)
    with pytest.raises(
        SparkRuntimeException, match="column 'key': must be a non-empty string"
    ) as caught:
        (signals_to_kafka(df, payload_column="payload").write.format("kafka")
         .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
         .option("topic", topic).save())  # fmt: skip
    assert '"scope (option)"' not in str(caught.value)
    assert '"key":""' in str(caught.value)  # the row is shown
    assert left_on(kafka_broker.bootstrap_servers, topic) == [SENTINEL]
    topic = f"one-{uuid.uuid4().hex[:8]}"  # a fresh one: the first now ends at its sentinel
    kafka_broker.create_topics({topic: 1})
    for bad, message in (
        (("s1", "k", "{not json"), "column 'payload': not JSON text"),
        (("s1", "k" * 513, "1"), "column 'key': longer than 512 bytes"),
        ((None, "k", "1"), "column 'scope': must be a non-empty string"),
    ):
        one = spark.createDataFrame([*good[:5], bad], "scope string, key string, payload string")
        with pytest.raises(SparkRuntimeException, match=re.escape(message)):
            (signals_to_kafka(one.coalesce(1), payload_column="payload").write.format("kafka")
             .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
             .option("topic", topic).save())  # fmt: skip
    assert left_on(kafka_broker.bootstrap_servers, topic) == [SENTINEL]


def test_signals_to_kafka_writes_the_wire_format_and_names_a_missing_column(
    spark: SparkSession,
) -> None:
    df = spark.createDataFrame(
        [("s", "k", 5, '{"a": [1, "é"]}'), ("s", "k2", None, None)],
        "scope string, key string, at long, payload string",
    )
    out = signals_to_kafka(df, event_time_column="at", payload_column="payload").collect()
    assert [r["key"] for r in out] == [b"s", b"s"]
    values = sorted((json.loads(bytes(r["value"])) for r in out), key=lambda v: str(v["key"]))
    assert values[0] == {
        "v": 1, "type": "signal", "scope": "s", "key": "k", "event_time_ms": 5,
        "payload": {"a": [1, "é"]},
    }  # fmt: skip
    assert values[1] == {"v": 1, "type": "signal", "scope": "s", "key": "k2"}
    with pytest.raises(ConfigError, match="column 'table' \\(option 'key_column'\\)"):
        signals_to_kafka(df, key_column="table")
    with pytest.raises(ConfigError, match="column 'key' \\(option 'event_time_column'\\)"):
        signals_to_kafka(df, event_time_column="key")
    tight = signals_to_kafka(
        df.limit(1), limits=Limits(max_payload_bytes=4), payload_column="payload"
    )
    with pytest.raises(SparkRuntimeException, match="larger than 4 bytes"):
        tight.collect()


def test_a_malformed_callback_fails_the_read_naming_its_offset_or_is_skipped(
    spark: SparkSession, kafka_broker: Broker, topic: str
) -> None:
    good = {
        "v": 1, "type": "callback", "op_id": "o", "scope": "s", "outcome": "expired",
        "registered_ms": 1, "outcome_ms": 3, "deadline_ms": 3, "time_domain": "processing_time",
        "sequence": 1, "partition": 0, "id": "0-1-0123456789abcdef", "keys": ["k"],
        "missing": ["k"], "signals": {}, "payload": "text", "late": False,
    }  # fmt: skip
    values = [json.dumps(good), "garbage", json.dumps({**good, "outcome": "won"})]
    df = spark.createDataFrame([(b"s", v.encode()) for v in values], "key binary, value binary")
    df.coalesce(1).write.format("kafka") \
        .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers) \
        .option("topic", topic).save()  # fmt: skip
    raw = _raw(spark, kafka_broker.bootstrap_servers, topic)
    with pytest.raises(
        SparkRuntimeException, match=f"malformed callback at topic {topic} partition"
    ):
        callbacks_from_kafka(raw).collect()
    kept = callbacks_from_kafka(raw, on_malformed="skip").collect()
    assert len(kept) == 1
    assert kept[0]["payload"] == '"text"' and kept[0]["signals"] == "{}"
    assert kept[0]["input_partition"] == 0 and kept[0]["topic"] == topic
    with pytest.raises(ConfigError, match="on_malformed"):
        callbacks_from_kafka(raw, on_malformed="drop")
    with pytest.raises(ConfigError, match="column 'offset'"):
        callbacks_from_kafka(raw.select("value", "topic", "partition"))


def test_operations_to_kafka_writes_what_the_service_decodes_and_names_each_fault(
    spark: SparkSession,
) -> None:
    df = spark.createDataFrame(
        [
            ("a", "s", ["k1", "k2"], "count", 1, None, 5_000, None, '{"x": 1}'),
            ("b", "s", [], "all", None, 9_000, None, "event_time", None),
        ],
        "op_id string, scope string, keys array<string>, condition string, count int, "
        "deadline_ms long, timeout_ms long, time_domain string, payload string",
    )
    rows = operations_to_kafka(df).collect()
    assert [bytes(r["key"]) for r in rows] == [b"s", b"s"]  # keyed by the scope
    decoded = sorted((decode_request(bytes(r["value"])) for r in rows), key=lambda r: r.op_id)
    assert decoded == [
        RegisterRequest(
            op_id="a", scope="s", keys=("k1", "k2"), condition=Condition.COUNT, count=1,
            timeout_ms=5_000, payload='{"x":1}',
        ),
        RegisterRequest(
            op_id="b", scope="s", keys=(), deadline_ms=9_000, time_domain=TimeDomain.EVENT_TIME,
        ),
    ]  # fmt: skip
    base = "'a' AS op_id, 's' AS scope, array('k') AS keys, 1000L AS timeout_ms"
    for change, message in (
        ("'' AS op_id", "column 'op_id': must be a non-empty string"),
        ("array('k', 'k') AS keys", "column 'keys': a key is repeated"),
        ("array('k', '') AS keys", "column 'keys': every key must be a non-empty string"),
        ("'most' AS condition", "column 'condition': must be all, any or count"),
        ("'count' AS condition", "column 'count': must be an integer in [1, the number of keys]"),
        ("CAST(NULL AS BIGINT) AS timeout_ms", "one of deadline_ms or timeout_ms is required"),
        ("'event_time' AS time_domain", "'timeout_ms': only allowed with time_domain processing"),
    ):
        name = change.rsplit(" AS ", 1)[1]
        columns = [c for c in base.split(", ") if not c.endswith(f" AS {name}")] + [change]
        bad = spark.sql("SELECT " + ", ".join(columns))
        with pytest.raises(SparkRuntimeException, match=re.escape(message)):
            operations_to_kafka(bad).collect()
    with pytest.raises(ConfigError, match="column 'op_id'"):
        operations_to_kafka(df.drop("op_id"))
    with pytest.raises(ConfigError, match="exclude each other"):
        operations_to_kafka(df, condition="any")


def test_watermarks_to_kafka_sends_each_scopes_latest_event_time_less_the_delay(
    spark: SparkSession,
) -> None:
    df = spark.createDataFrame(
        [("s1", 10_000), ("s1", 40_000), ("s2", 500), ("s2", None)], "scope string, at long"
    )
    rows = watermarks_to_kafka(df, event_time_column="at", delay_ms=1_000).collect()
    decoded = sorted((decode_signal(bytes(r["value"])) for r in rows), key=str)
    assert decoded == [WatermarkRecord("s1", 39_000)]  # s2's would be below 0: none
    assert [bytes(r["key"]) for r in rows] == [b"s1"]
    with pytest.raises(ConfigError, match="delay_ms"):
        watermarks_to_kafka(df, event_time_column="at", delay_ms=-1)


def test_a_barrier_through_the_connector_completes_or_expires_naming_the_missing_key(
    spark: SparkSession, service: Service
) -> None:
    scope = f"barrier-{uuid.uuid4().hex[:6]}"
    ops = spark.createDataFrame(
        [("done", ["in/a", "in/b"], 600_000), ("late", ["in/a", "in/c"], 3_000)],
        "op_id string, keys array<string>, timeout_ms long",
    )
    (operations_to_kafka(ops, scope=scope).write.format("kafka")
     .option("kafka.bootstrap.servers", service.servers)
     .option("topic", service.requests).save())  # fmt: skip
    signals = spark.createDataFrame([("in/a",), ("in/b",)], "key string")
    (signals_to_kafka(signals, scope=scope).write.format("kafka")
     .option("kafka.bootstrap.servers", service.servers)
     .option("topic", service.signals).save())  # fmt: skip
    rows = _wait_for(lambda: _source_rows(spark, service, scope), 2, spark)
    by_op = {r["op_id"]: r for r in rows}
    assert by_op["done"]["outcome"] == "completed"
    assert by_op["late"]["outcome"] == "expired"
    assert by_op["late"]["missing"] == ["in/c"]


def test_event_time_timers_fire_on_the_watermark_written_through_the_connector(
    spark: SparkSession, service: Service
) -> None:
    scope = f"clicks-{uuid.uuid4().hex[:6]}"
    timers = spark.createDataFrame(
        [("session/alice", 1_030_000), ("session/bob", 1_090_000)],
        "op_id string, deadline_ms long",
    )
    (operations_to_kafka(timers, scope=scope, time_domain="event_time").write.format("kafka")
     .option("kafka.bootstrap.servers", service.servers)
     .option("topic", service.requests).save())  # fmt: skip
    events = spark.createDataFrame([(scope, 1_050_000)], "scope string, at long")
    (watermarks_to_kafka(events, event_time_column="at").write.format("kafka")
     .option("kafka.bootstrap.servers", service.servers)
     .option("topic", service.requests).save())  # fmt: skip
    rows = _wait_for(lambda: _source_rows(spark, service, scope), 1, spark)
    assert [(r["op_id"], r["outcome"], r["deadline_ms"]) for r in rows] == [
        ("session/alice", "expired", 1_030_000)
    ]  # bob's deadline is past the watermark: still pending


def test_records_written_past_the_helpers_are_dead_lettered_and_the_rest_goes_on(
    spark: SparkSession, service: Service
) -> None:
    """A user's own ``to_json`` reaches the service unchecked: what it cannot read is
    dead-lettered with the reason and the field, and the good records beside it still count."""
    scope = f"raw-{uuid.uuid4().hex[:6]}"
    ops = spark.createDataFrame(
        [("op", ["in/a", "in/b"], 600_000)], "op_id string, keys array<string>, timeout_ms long"
    )
    (operations_to_kafka(ops, scope=scope).write.format("kafka")
     .option("kafka.bootstrap.servers", service.servers)
     .option("topic", service.requests).save())  # fmt: skip
    signal = {"v": 1, "type": "signal", "scope": scope}
    values = [
        json.dumps({**signal, "key": "in/a"}),
        "{not json",
        json.dumps(signal),  # no watch key
        json.dumps({**signal, "key": "in/b", "payload": "x" * 100_000}),  # payload > 64 KiB
        json.dumps({**signal, "key": "in/b"}),
    ]
    raw = spark.createDataFrame(
        [(scope.encode(), v.encode()) for v in values], "key binary, value binary"
    )
    raw.coalesce(1).write.format("kafka").option("kafka.bootstrap.servers", service.servers) \
        .option("topic", service.signals).save()  # fmt: skip
    rows = _wait_for(lambda: _source_rows(spark, service, scope), 1, spark)
    assert [(r["op_id"], r["outcome"]) for r in rows] == [("op", "completed")]
    mine: list[dict[str, Any]] = []
    for _ in range(20):  # bounded: the topic is the module's, so read until this scope's three
        records = read_records(service.servers, service.dead_letters, 10_000, timeout_s=1.0)
        mine = [d for d in map(json.loads, (r.value for r in records)) if d["key"] == scope]
        if len(mine) >= 3:
            break
    mine.sort(key=lambda d: d["offset"])
    assert [(d["field"], d["topic"], d["value_bytes"]) for d in mine] == [
        (None, service.signals, len(values[1])),
        ("key", service.signals, len(values[2])),
        ("payload", service.signals, len(values[3])),
    ]
    assert mine[0]["reason"].startswith("(record): not valid JSON")
    assert mine[1]["reason"] == "key: required field is missing"
    assert mine[2]["reason"] == "payload: at most 65536 bytes of JSON, got 100002"
    assert mine[2]["truncated"] and len(mine[2]["value"]) < len(values[3])


@pytest.mark.parametrize("position", [0, 20, 39], ids=["start", "middle", "end"])
def test_a_bad_registration_anywhere_in_a_task_fails_it_with_nothing_sent(
    spark: SparkSession, kafka_broker: Broker, position: int
) -> None:
    topic = f"one-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topics({topic: 1})
    rows: list[tuple[str, list[str | None], int]]
    rows = [(f"op-{i}", [f"k{i}"], 60_000) for i in range(40)]
    rows[position] = (f"op-{position}", [f"k{position}", None], 60_000)  # a null watch key
    df = spark.createDataFrame(rows, "op_id string, keys array<string>, timeout_ms long")
    with pytest.raises(
        SparkRuntimeException, match="column 'keys': every key must be a non-empty string"
    ):
        (operations_to_kafka(df.coalesce(1), scope="s").write.format("kafka")
         .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
         .option("topic", topic).save())  # fmt: skip
    assert left_on(kafka_broker.bootstrap_servers, topic) == [SENTINEL]


def test_a_good_task_is_sent_whole_and_in_order(spark: SparkSession, kafka_broker: Broker) -> None:
    topic = f"one-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topics({topic: 1})
    # One timer re-armed three times in one task: the last deadline must be the last record.
    rows = [("session/a", 1_000 + i) for i in range(3)] + [(f"op-{i}", 5_000) for i in range(37)]
    df = spark.createDataFrame(rows, "op_id string, deadline_ms long").coalesce(1)
    (operations_to_kafka(df, scope="s").write.format("kafka")
     .option("kafka.bootstrap.servers", kafka_broker.bootstrap_servers)
     .option("topic", topic).save())  # fmt: skip
    sent = [decode_request(v) for v in left_on(kafka_broker.bootstrap_servers, topic)[:-1]]
    assert [(r.op_id, r.deadline_ms) for r in sent] == rows  # type: ignore[union-attr]
