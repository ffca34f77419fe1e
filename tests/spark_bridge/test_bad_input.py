"""Bad input in a partition: the sinks' failing task publishes nothing (real Spark and broker).

Each DataFrame has one partition, so one task writes every row, and a bad row at its start, in
its middle or at its end (with good rows, some of them spooled, before it) fails that task. The
topic has one partition: after the failed write a sentinel record is produced, and reading up
to it shows everything the write left on the topic.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest
from pyspark.errors import PythonException

from purgatory._codec import SignalRecord, decode_signal
from tests.spark_bridge._support import SENTINEL, failure, left_on, writer

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from purgatory.devtools.broker import Broker

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

ROWS = 40
POSITIONS = {"start": 0, "middle": ROWS // 2, "end": ROWS - 1}
# Small enough that the rows after the first few are spooled to a file before the bad one.
BUDGET = {"stage_memory_bytes": "1000"}


@pytest.fixture
def topic_of_one_partition(kafka_broker: Broker) -> str:
    name = f"bad-input-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topics({name: 1})
    return name


def signals(spark: SparkSession, bad_at: int | None) -> DataFrame:
    rows = [("s", None if i == bad_at else f"key-{i}") for i in range(ROWS)]
    return spark.createDataFrame(rows, "scope string, key string").coalesce(1)


def operations(spark: SparkSession, bad_at: int) -> DataFrame:
    rows = [(f"op-{i}", ["ready", None if i == bad_at else f"key-{i}"]) for i in range(ROWS)]
    return spark.createDataFrame(rows, "op_id string, keys array<string>").coalesce(1)


@pytest.mark.parametrize("where", list(POSITIONS))
def test_a_null_key_in_a_partition_of_signals_fails_it_with_nothing_sent(
    spark: SparkSession, kafka_broker: Broker, topic_of_one_partition: str, where: str
) -> None:
    servers, topic, bad_at = (
        kafka_broker.bootstrap_servers,
        topic_of_one_partition,
        POSITIONS[where],
    )
    df = signals(spark, bad_at)
    # The worker's RowError reaches the driver as Spark's PythonException (docs/spark.md).
    message = failure(
        writer(df, "purgatory-signals", servers, topic, **BUDGET).save, PythonException
    )

    assert "spark_bridge._writer.RowError: " in message
    assert "column 'key': must be a non-empty string; row: scope='s', key=None" in message
    assert left_on(servers, topic) == [SENTINEL]


@pytest.mark.parametrize("where", list(POSITIONS))
def test_a_null_watch_key_in_a_partition_of_operations_fails_it_with_nothing_sent(
    spark: SparkSession, kafka_broker: Broker, topic_of_one_partition: str, where: str
) -> None:
    servers, topic, bad_at = (
        kafka_broker.bootstrap_servers,
        topic_of_one_partition,
        POSITIONS[where],
    )
    df = operations(spark, bad_at)
    options = {"scope": "s", "timeout_ms": "60000", **BUDGET}
    message = failure(
        writer(df, "purgatory-operations", servers, topic, **options).save, PythonException
    )

    assert "spark_bridge._writer.RowError: " in message
    assert (
        f"column 'keys': must be a non-empty string; row: op_id='op-{bad_at}', keys=['ready', None]"
    ) in message
    assert left_on(servers, topic) == [SENTINEL]


def test_a_good_partition_is_sent_whole_and_in_order_through_the_spool(
    spark: SparkSession, kafka_broker: Broker, topic_of_one_partition: str
) -> None:
    servers, topic = kafka_broker.bootstrap_servers, topic_of_one_partition
    writer(signals(spark, None), "purgatory-signals", servers, topic, **BUDGET).save()

    values = left_on(servers, topic)
    assert values[-1] == SENTINEL
    assert [decode_signal(v) for v in values[:-1]] == [
        SignalRecord("s", f"key-{i}") for i in range(ROWS)
    ]
