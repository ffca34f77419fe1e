"""The ``purgatory-callbacks`` data source against both real brokers and a real local Spark.

Every topic is filled with one batched produce (linger), the case where Tansu's ListOffsets
"latest" lags the real end by the last batch: a reader that trusted it would return almost
nothing there (on Kafka, the same reads show that the workaround costs nothing).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from purgatory._codec import encode_callback, outcome_id
from purgatory._core import ConfigError, Outcome, OutcomeKind, TimeDomain
from purgatory.devtools.broker import free_port
from spark_bridge._callbacks_source import (
    SCHEMA,
    CallbacksDataSource,
    _row,
    _settings,
    cap_offsets,
    dedupe,
)
from spark_bridge._writer import kafka_target

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from purgatory.devtools.broker import Broker

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

_FORMAT = "purgatory-callbacks"
_COLUMNS = [field.name for field in SCHEMA.fields]
# The callback record's columns come first; then where the row was read.
_RECORD = _COLUMNS.index("topic")
_TOPIC, _PARTITION, _OFFSET = _RECORD, _RECORD + 1, _RECORD + 2


@pytest.fixture(scope="module")
def source(spark: SparkSession) -> SparkSession:
    """The session with the data source registered."""
    spark.dataSource.register(CallbacksDataSource)
    return spark


def _outcome(i: int, scope: str) -> Outcome:
    """Outcomes that vary every field: completed with signals and payload, or expired."""
    if i % 2 == 0:
        return Outcome(
            op_id=f"{scope}/op-{i}",
            scope=scope,
            outcome=OutcomeKind.COMPLETED,
            registered_ms=1_000 + i,
            outcome_ms=2_000 + i,
            deadline_ms=3_000 + i,
            time_domain=TimeDomain.EVENT_TIME,
            sequence=i + 1,
            keys=("k1", f"k/{i}"),
            signals={"k1": '{"rows":1}', f"k/{i}": None},
            payload=f'{{"n":{i},"s":"é"}}',
            partition=i % 5,
        )
    return Outcome(
        op_id=f"{scope}/op-{i}",
        scope=scope,
        outcome=OutcomeKind.EXPIRED,
        registered_ms=1_000 + i,
        outcome_ms=3_000 + i,
        deadline_ms=3_000 + i,
        time_domain=TimeDomain.PROCESSING_TIME,
        sequence=i + 1,
        missing=("k1",),
        late=i % 3 == 0,
        partition=i % 5,
    )


def _expected(o: Outcome) -> tuple[Any, ...]:
    signals = ",".join(f'"{k}":{"null" if v is None else v}' for k, v in o.signals.items())
    return (
        o.op_id,
        o.scope,
        o.outcome.value,
        o.registered_ms,
        o.outcome_ms,
        o.deadline_ms,
        o.time_domain.value,
        o.sequence,
        o.partition,
        outcome_id(o),
        list(o.keys),
        list(o.missing),
        "{" + signals + "}",
        o.payload,
        o.late,
    )


def _topic(broker: Broker) -> str:
    name = f"callbacks-{uuid.uuid4().hex[:8]}"
    broker.create_topics({name: 2})
    return name


def _produce(
    broker: Broker,
    topic: str,
    values: Sequence[tuple[str, bytes]],
    *,
    partition: int | None = None,
) -> None:
    """Send ``(scope, value)`` records in one batched produce (linger), then flush."""
    from kafka import KafkaProducer  # noqa: PLC0415

    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap_servers, linger_ms=100, batch_size=1 << 20
    )
    try:
        for scope, value in values:
            producer.send(topic, key=scope.encode(), value=value, partition=partition)
        producer.flush(timeout=30)
    finally:
        producer.close()


def _callbacks(outcomes: Sequence[Outcome]) -> list[tuple[str, bytes]]:
    return [(o.scope, encode_callback(o)) for o in outcomes]


def _read(spark: SparkSession, broker: Broker, topic: str, **options: str) -> DataFrame:
    reader = spark.read.format(_FORMAT)
    for name, value in {"bootstrap_servers": broker.bootstrap_servers, "topic": topic}.items():
        reader = reader.option(name, value)
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def _read_stream(spark: SparkSession, broker: Broker, topic: str, **options: str) -> DataFrame:
    return (
        spark.readStream.format(_FORMAT)
        .option("bootstrap_servers", broker.bootstrap_servers)
        .option("topic", topic)
        .options(**options)
        .load()
    )


def _rows(df: DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(row) for row in df.collect()]


@pytest.fixture(scope="module")
def filled(source: SparkSession, kafka_broker: Broker) -> Iterator[tuple[str, list[Outcome]]]:
    """A 2-partition topic holding 300 callbacks of scopes a, b and c."""
    topic = _topic(kafka_broker)
    outcomes = [_outcome(i, "abc"[i % 3]) for i in range(300)]
    _produce(kafka_broker, topic, _callbacks(outcomes))
    yield topic, outcomes


def test_batch_reads_every_callback_with_every_field(
    source: SparkSession, kafka_broker: Broker, filled: tuple[str, list[Outcome]]
) -> None:
    topic, outcomes = filled
    df = _read(source, kafka_broker, topic)
    assert df.columns == _COLUMNS
    rows = _rows(df)
    assert len(rows) == len(outcomes)
    assert sorted(row[:_RECORD] for row in rows) == sorted(_expected(o) for o in outcomes)
    assert {row[_TOPIC] for row in rows} == {topic}
    for p in (0, 1):
        offsets = sorted(row[_OFFSET] for row in rows if row[_PARTITION] == p)
        assert offsets == list(range(len(offsets)))
    assert dedupe(df.union(df)).count() == len(outcomes)


def test_the_schema_carries_the_records_partition_and_id_after_sequence() -> None:
    at = _COLUMNS.index("sequence")
    assert _COLUMNS[at : at + 3] == ["sequence", "input_partition", "id"]
    assert _COLUMNS[_RECORD:] == ["topic", "partition", "offset"]
    assert len(set(_COLUMNS)) == len(_COLUMNS)  # the record's partition is input_partition
    assert not SCHEMA["input_partition"].nullable
    assert not SCHEMA["id"].nullable


def test_dedupe_keeps_different_outcomes_that_share_op_id_and_sequence(
    spark: SparkSession,
) -> None:
    """Only an exact re-send (the same id) is a duplicate, whatever op_id and sequence say."""
    settings = _settings({"bootstrap_servers": "h:1"})

    def outcome(scope: str, partition: int, registered_ms: int) -> Outcome:
        return Outcome(
            op_id="report", scope=scope, outcome=OutcomeKind.EXPIRED,
            registered_ms=registered_ms, outcome_ms=9_000, deadline_ms=9_000,
            time_domain=TimeDomain.PROCESSING_TIME, sequence=7, missing=("k",),
            partition=partition,
        )  # fmt: skip

    distinct = [
        outcome("nightly", 0, 1_000),
        outcome("hourly", 3, 1_000),  # another scope, decided by another partition
        outcome("nightly", 0, 2_000),  # the op_id registered again, its journal lost
    ]
    sent = [*distinct, distinct[0]]  # the last is a re-send of the first
    rows = [
        _row(
            settings,
            SimpleNamespace(
                value=encode_callback(o), topic="t", partition=o.partition, offset=offset
            ),
        )
        for offset, o in enumerate(sent)
    ]
    df = spark.createDataFrame(rows, SCHEMA)
    assert df.select("op_id", "sequence").distinct().count() == 1
    kept = dedupe(df).collect()
    assert sorted(r["id"] for r in kept) == sorted(outcome_id(o) for o in distinct)
    assert len({r["id"] for r in kept}) == len(distinct) == 3
    assert sorted((r["scope"], r["input_partition"]) for r in kept) == [
        ("hourly", 3), ("nightly", 0), ("nightly", 0)
    ]  # fmt: skip
    assert dedupe(df.union(df)).count() == len(distinct)


def test_scope_filter_keeps_only_the_named_scopes(
    source: SparkSession, kafka_broker: Broker, filled: tuple[str, list[Outcome]]
) -> None:
    topic, outcomes = filled
    only_a = _rows(_read(source, kafka_broker, topic, scope="a").select("op_id"))
    assert sorted(r[0] for r in only_a) == sorted(o.op_id for o in outcomes if o.scope == "a")
    a_and_c = _read(source, kafka_broker, topic, scope="a, c").select("scope").distinct()
    assert sorted(r[0] for r in a_and_c.collect()) == ["a", "c"]


def test_batch_from_latest_reads_nothing(
    source: SparkSession, kafka_broker: Broker, filled: tuple[str, list[Outcome]]
) -> None:
    topic, _ = filled
    assert _read(source, kafka_broker, topic, starting_offsets="latest").count() == 0
    from_offsets = _read(source, kafka_broker, topic, starting_offsets='{"0": 5}')
    assert from_offsets.filter("partition = 0 AND offset < 5").count() == 0
    assert from_offsets.filter("partition = 0").count() > 0


def _run_available_now(
    spark: SparkSession, broker: Broker, topic: str, out: Path, **options: str
) -> None:
    reader = (
        spark.readStream.format(_FORMAT)
        .option("bootstrap_servers", broker.bootstrap_servers)
        .option("topic", topic)
    )
    for name, value in options.items():
        reader = reader.option(name, value)
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(timeout=60)
    assert not query.isActive, "the availableNow query did not finish"
    assert query.exception() is None


def _written(spark: SparkSession, out: Path) -> list[tuple[Any, ...]]:
    if not (out / "data").exists():
        return []
    return _rows(spark.read.schema(SCHEMA).parquet(str(out / "data")))


def test_streaming_restart_from_checkpoint_loses_and_repeats_nothing(
    source: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    topic = _topic(kafka_broker)
    first = [_outcome(i, "s") for i in range(150)]
    later = [_outcome(i, "s") for i in range(150, 230)]
    _produce(kafka_broker, topic, _callbacks(first))
    _run_available_now(source, kafka_broker, topic, tmp_path)
    assert len(_written(source, tmp_path)) == len(first)

    _produce(kafka_broker, topic, _callbacks(later))
    _run_available_now(source, kafka_broker, topic, tmp_path)
    rows = _written(source, tmp_path)
    assert len(rows) == len(first) + len(later)
    assert sorted(row[:_RECORD] for row in rows) == sorted(_expected(o) for o in first + later)
    assert len({(row[_PARTITION], row[_OFFSET]) for row in rows}) == len(rows)


def test_a_running_query_stopped_mid_stream_resumes_from_its_checkpoint(
    source: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    """A continuous query is stopped while callbacks keep coming, then restarted."""
    topic = _topic(kafka_broker)
    outcomes = [_outcome(i, "s") for i in range(400)]

    def start() -> Any:
        return (
            _read_stream(source, kafka_broker, topic)
            .writeStream.format("parquet")
            .option("path", str(tmp_path / "data"))
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    query = start()
    for chunk in range(4):  # the first half, in four produces while the query runs
        _produce(kafka_broker, topic, _callbacks(outcomes[chunk * 50 : (chunk + 1) * 50]))
    query.processAllAvailable()
    _produce(kafka_broker, topic, _callbacks(outcomes[200:260]))
    query.stop()  # perhaps in the middle of a micro-batch
    _produce(kafka_broker, topic, _callbacks(outcomes[260:]))
    query = start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    rows = _written(source, tmp_path)
    # Nothing lost; the file sink commits each micro-batch once, so nothing repeated either.
    assert sorted(row[:_RECORD] for row in rows) == sorted(_expected(o) for o in outcomes)
    assert len({(row[_PARTITION], row[_OFFSET]) for row in rows}) == len(outcomes)


def test_streaming_from_latest_skips_earlier_records(
    source: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    topic = _topic(kafka_broker)
    _produce(kafka_broker, topic, _callbacks([_outcome(i, "s") for i in range(40)]))
    _run_available_now(source, kafka_broker, topic, tmp_path, starting_offsets="latest")
    assert _written(source, tmp_path) == []

    newer = [_outcome(i, "s") for i in range(40, 70)]
    _produce(kafka_broker, topic, _callbacks(newer))
    _run_available_now(source, kafka_broker, topic, tmp_path, starting_offsets="latest")
    assert sorted(r[0] for r in _written(source, tmp_path)) == sorted(o.op_id for o in newer)


def test_malformed_record_fails_naming_its_offset_or_is_skipped(
    source: SparkSession, kafka_broker: Broker
) -> None:
    topic = _topic(kafka_broker)
    good = [_outcome(i, "s") for i in range(4)]
    bad = ("s", b'{"v":1,"type":"callback"}')
    values = [*_callbacks(good[:2]), bad, *_callbacks(good[2:])]
    _produce(kafka_broker, topic, values, partition=0)

    with pytest.raises(Exception, match=r"partition 0 offset 2\b") as caught:
        _read(source, kafka_broker, topic).collect()
    assert "on_malformed=skip" in str(caught.value)

    rows = _rows(_read(source, kafka_broker, topic, on_malformed="skip"))
    assert sorted(r[0] for r in rows) == sorted(o.op_id for o in good)
    assert sorted(r[_OFFSET] for r in rows) == [0, 1, 3, 4]


def test_missing_bootstrap_servers_is_named(source: SparkSession) -> None:
    with pytest.raises(Exception, match="bootstrap_servers"):
        source.read.format(_FORMAT).load().collect()


def test_an_unreachable_broker_is_named(source: SparkSession) -> None:
    port = free_port()  # nobody listens on it
    read = source.read.format(_FORMAT).option("bootstrap_servers", f"127.0.0.1:{port}") \
        .option("connect_timeout_ms", "2000")  # fmt: skip
    with pytest.raises(
        Exception, match=f"option bootstrap_servers: no broker answered at 127.0.0.1:{port}"
    ):
        read.load().collect()


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({}, "bootstrap_servers"),
        ({"bootstrap_servers": "h:1", "bootstrap.servers": "h:1"}, "bootstrap.servers"),
        ({"bootstrap_servers": "h:1", "starting_offsets": "middle"}, "starting_offsets"),
        ({"bootstrap_servers": "h:1", "on_malformed": "ignore"}, "on_malformed"),
        ({"bootstrap_servers": "h:1", "read_timeout_ms": "0"}, "read_timeout_ms"),
        ({"bootstrap_servers": "h:1", "max_records_per_trigger": "0"}, "max_records_per_trigger"),
        ({"bootstrap_servers": "h:1", "scope": " , "}, "scope"),
    ],
)
def test_bad_options_are_named(options: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        _settings(options)


def test_the_source_takes_the_sinks_kafka_client_options() -> None:
    options = {
        "bootstrap_servers": "h:1", "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
        "sasl_username": "u", "sasl_password": "p", "ssl_cafile": __file__,
        "ssl_check_hostname": "false",
    }  # fmt: skip
    source = _settings(options)
    assert source.kafka_kwargs() == kafka_target(options, "t").kafka_kwargs() == {
        "bootstrap_servers": ["h:1"], "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u", "sasl_plain_password": "p", "ssl_cafile": __file__,
    }  # fmt: skip
    assert source.ssl_check_hostname is False


@given(
    st.dictionaries(st.sampled_from(["0", "1", "2", "3"]), st.integers(0, 1_000), min_size=1),
    st.lists(st.integers(0, 500), min_size=4, max_size=4),
    st.integers(1, 2_000),
)
def test_a_cap_reads_at_most_the_limit_without_passing_an_end(
    start: dict[str, int], backlog: list[int], most: int
) -> None:
    ends = {p: offset + backlog[int(p)] for p, offset in start.items()}
    capped = cap_offsets(start, ends, most)
    assert capped.keys() == ends.keys()
    assert all(start[p] <= capped[p] <= ends[p] for p in ends)
    waiting = sum(ends[p] - start[p] for p in ends)
    assert sum(capped[p] - start[p] for p in ends) == min(most, waiting)
    assert cap_offsets(start, ends, most) == capped  # deterministic


def test_max_records_per_trigger_reads_a_backlog_in_bounded_micro_batches(
    source: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    topic = _topic(kafka_broker)
    outcomes = [_outcome(i, "s") for i in range(250)]
    _produce(kafka_broker, topic, _callbacks(outcomes))
    query = (
        _read_stream(source, kafka_broker, topic, max_records_per_trigger="100")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "data"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [100, 100, 50]
    rows = _written(source, tmp_path)
    assert sorted(row[:_RECORD] for row in rows) == sorted(_expected(o) for o in outcomes)


def _transactions(
    broker: Broker, topic: str, batches: Sequence[tuple[bool, list[Outcome]]]
) -> None:
    """Write each batch of callbacks in a transaction of its own, committed or aborted."""
    from kafka import KafkaProducer  # noqa: PLC0415

    producer = KafkaProducer(
        bootstrap_servers=broker.bootstrap_servers, transactional_id=f"t-{uuid.uuid4().hex[:8]}"
    )
    try:
        producer.init_transactions()
        for commit, outcomes in batches:
            producer.begin_transaction()
            for scope, value in _callbacks(outcomes):
                producer.send(topic, key=scope.encode(), value=value)
            producer.flush(timeout=30)
            if commit:
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close()


@pytest.mark.parametrize("kafka_broker", ["kafka"], indirect=True)
def test_read_committed_reads_committed_transactions_alone_in_batch_and_stream(
    source: SparkSession, kafka_broker: Broker, tmp_path: Path
) -> None:
    topic = _topic(kafka_broker)
    outcomes = [_outcome(i, "abc"[i % 3]) for i in range(90)]
    committed = outcomes[:40] + outcomes[60:]
    _transactions(kafka_broker, topic, [(True, outcomes[:40]), (False, outcomes[40:60])])
    _transactions(kafka_broker, topic, [(True, outcomes[60:])])

    batch = _rows(_read(source, kafka_broker, topic, isolation_level="read_committed"))
    assert sorted(row[:_RECORD] for row in batch) == sorted(_expected(o) for o in committed)
    everything = _read(source, kafka_broker, topic)  # read_uncommitted: the aborted ones too
    assert everything.count() == len(outcomes)

    _run_available_now(source, kafka_broker, topic, tmp_path, isolation_level="read_committed")
    streamed = _written(source, tmp_path)
    assert sorted(row[:_RECORD] for row in streamed) == sorted(_expected(o) for o in committed)


def test_isolation_level_must_be_one_of_kafkas_two() -> None:
    with pytest.raises(ConfigError, match="option isolation_level must be read_uncommitted"):
        _settings({"bootstrap_servers": "127.0.0.1:9092", "isolation_level": "committed"})
    assert _settings(
        {"bootstrap_servers": "127.0.0.1:9092", "isolation_level": "READ_COMMITTED"}
    ).read_committed
