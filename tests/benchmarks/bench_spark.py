"""The Spark bridge on a real local Spark: signals written, callbacks read, latency (harness).

``python -m tests.benchmarks.bench_spark [--rows N] [--callbacks M] [--ops K] [--quick]
[--broker tansu|kafka] [--out DIR]`` starts one broker (the embedded Tansu by default, or Apache
Kafka) and one local Spark (``local[2]``, from
:func:`spark_bridge.local_session`) in this process, and measures the bridge's three paths, each
beside a baseline in the same run: the same volume through plain kafka-python from this one
Python process, with the clients' settings the bridge uses, so the difference is what Spark
costs.

1. **Signals written from Spark**: a batch ``df.write.format("purgatory-signals")...save()`` of
   ``N`` rows (``spark.range`` in 2 partitions, 8 scopes, key ``k{i}``) into a fresh 2-partition
   topic, timed from the start of ``save()`` to its return (each task flushes its producer and
   fails on any unacknowledged record, so every record is acknowledged when ``save()`` returns);
   then the same rows as a stream (parquet files -> ``writeStream`` ``availableNow``, timed from
   ``start()`` to the query's end). Baseline: one kafka-python producer (``acks=all``,
   ``linger_ms=5``, as the sink's) encodes, sends and flushes the same ``N`` signals. Each run
   checks the topic then holds exactly ``N`` records (the high watermarks of its partitions).
2. **Callbacks read into Spark**: a 2-partition topic is filled with ``M`` callbacks encoded by
   :func:`purgatory._codec.encode_callback` (with kafka-python, untimed); then
   ``spark.read.format("purgatory-callbacks")...load().count()`` and a streaming
   ``availableNow`` query into the ``noop`` sink are timed. Baseline: one kafka-python consumer
   reads the ``M`` records and decodes each with :func:`purgatory._codec.decode_callback` (and,
   to show the decoding's share, reads them without decoding). Each run checks it saw ``M`` rows.
3. **Latency from a Spark write to a Spark read**, through the service (``purgatory serve`` as a
   process of its own, :func:`purgatory.devtools.child.service_process`, on 2-partition topics
   of its own): ``K`` operations, one key each, are registered over HTTP; a streaming
   ``purgatory-callbacks`` query (``processingTime`` trigger, 100 ms by default) hands every
   micro-batch to ``foreachBatch``, which collects the rows and stamps them with ``time.time()``.
   In rounds, a Spark batch job signals a few operations, the wall-clock send time read just
   before the DataFrame is built and ``save()`` is called riding in the signal's payload (it
   comes back in the callback's ``signals``); the next round starts once the round's callbacks
   were seen, after a random pause of up to one trigger interval (so the writes do not lock onto
   the trigger's phase). Latency = seen - sent. Each sample is split at ``save()``'s return and
   at the callback's ``outcome_ms`` (the service's clock, the same machine's), and the query's
   progress reports give the micro-batch phases (``latestOffset`` is the source's probe of the
   topic's end; that probe is also timed alone on the idle topic once the query stopped, since
   it sets how often an idle reader looks for new callbacks). Baseline: the same rounds with a
   kafka-python producer and consumer (no Spark), with the consumer's default
   ``fetch_max_wait_ms`` (500 ms) and with 20 ms (as the bridge's consumers).

Parts 1 and 2 use topics nobody else reads, and no service runs then, so the figures are the
bridge's and the clients' alone; the broker, Spark's JVM, its Python workers and this process
share the machine's CPUs over loopback. Times are wall seconds (``time.perf_counter``); latencies
are wall-clock milliseconds (``time.time``), one clock for the sender and the reader. The report
is a markdown table with the machine and the command, and ``DIR/bench-spark.json`` (``DIR``
defaults to ``docs``). A default run takes about four minutes on 2 cores; every wait is bounded.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import kafka
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from pyspark.sql import functions as F  # noqa: N812 - the name every Spark user reads

from purgatory._codec import SignalRecord, decode_callback, encode_callback, encode_signal
from purgatory._core import Outcome, OutcomeKind, TimeDomain
from purgatory.client import PurgatoryClient, operation
from purgatory.devtools.broker import Broker
from purgatory.devtools.child import service_process
from purgatory.devtools.dev_broker import describe, open_dev_broker
from spark_bridge import callbacks_from_kafka, local_session, signals_to_kafka
from spark_bridge._callbacks_source import _FETCH_WAIT_MS, _POLL_MS, _probe_ends, _settings
from tests.benchmarks._measure import machine_info, quiet_kafka_warnings

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "FULL",
    "QUICK",
    "LatencyResult",
    "MicroBatchPhases",
    "RateResult",
    "SparkBenchConfig",
    "SparkReport",
    "bench_callbacks",
    "bench_latency",
    "bench_signals",
    "main",
    "render",
    "run_spark_benchmarks",
    "write_json",
]

_PARTITIONS = 2
_FETCH_MAX_WAIT_MS: int = KafkaConsumer.DEFAULT_CONFIG["fetch_max_wait_ms"]
_SCOPES = 8
_LONG_TIMEOUT_MS = 3_600_000  # the latency run's operations never expire during a run
_WARMUP_RECORDS = 2_000
_WARMUP_OPS = 4
_ROUND_TIMEOUT_S = 60.0
_QUERY_TIMEOUT_S = 300.0
_READ_TIMEOUT_S = 120.0
_PHASES = ("triggerExecution", "latestOffset", "queryPlanning", "addBatch", "walCommit",
           "commitOffsets")  # fmt: skip


@dataclass(frozen=True, slots=True)
class SparkBenchConfig:
    """Sizes of one run: ``rows`` signals written, ``callbacks`` read, ``ops`` latency samples
    (``per_round`` operations signalled by each Spark job), ``repeats`` runs per rate."""

    rows: int
    callbacks: int
    ops: int
    per_round: int = 5
    trigger_ms: int = 100
    repeats: int = 3
    streaming: bool = True
    connector: bool = True


FULL = SparkBenchConfig(rows=200_000, callbacks=200_000, ops=200)
QUICK = SparkBenchConfig(rows=20_000, callbacks=20_000, ops=40, repeats=2)


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RateResult:
    """One way of moving ``records`` records, run ``len(seconds)`` times."""

    measurement: str  # "signals written" or "callbacks read"
    path: str
    records: int
    seconds: list[float]
    median_per_s: float
    best_per_s: float
    counts: list[int]  # what each run checked it moved (records in the topic, rows seen)
    exact: bool


@dataclass(frozen=True, slots=True)
class LatencyResult:
    """Write-to-read latency over ``samples`` operations, with its split (medians, ms)."""

    path: str
    samples: int
    missing: int
    rounds: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    min_ms: float
    send_to_write_returned_p50_ms: float  # save() (or producer.flush()) returned
    send_to_outcome_p50_ms: float  # the service decided (its outcome_ms)
    outcome_to_seen_p50_ms: float  # the reader held the row
    consumer_fetch_max_wait_ms: int | None


@dataclass(frozen=True, slots=True)
class MicroBatchPhases:
    """The streaming reader's micro-batches that carried rows (Spark's ``durationMs``), and
    what one probe of the source costs when no record came since the previous one: the call
    behind ``latestOffset`` on an idle topic, timed after the query stopped."""

    trigger_ms: int
    batches: int
    median_ms: dict[str, float]
    max_ms: dict[str, float]
    idle_probe_ms: list[float]


@dataclass(frozen=True, slots=True)
class SparkReport:
    """Everything one run produced."""

    machine: dict[str, str | int]
    config: SparkBenchConfig
    signals: list[RateResult]
    callbacks: list[RateResult]
    latency: list[LatencyResult]
    micro_batches: MicroBatchPhases
    wall_s: float


def _rate(
    measurement: str, path: str, records: int, runs: Sequence[tuple[float, int]]
) -> RateResult:
    seconds = [s for s, _ in runs]
    counts = [n for _, n in runs]
    return RateResult(
        measurement=measurement,
        path=path,
        records=records,
        seconds=[round(s, 4) for s in seconds],
        median_per_s=records / statistics.median(seconds),
        best_per_s=records / min(seconds),
        counts=counts,
        exact=all(n == records for n in counts),
    )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an ascending sequence (0 for an empty one)."""
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, max(0, math.ceil(q * len(sorted_values)) - 1))]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


# -- Kafka helpers ------------------------------------------------------------------------------


def _topic(broker: Broker, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    broker.create_topics({name: _PARTITIONS})
    return name


def _producer(servers: str, **options: Any) -> Any:
    return KafkaProducer(bootstrap_servers=servers.split(","), **options)


def _consumer(servers: str, **options: Any) -> Any:
    return KafkaConsumer(
        bootstrap_servers=servers.split(","),
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        **options,
    )


def topic_size(servers: str, topic: str, timeout_s: float = 30.0) -> int:
    """Records in ``topic`` (fresh, so offsets start at 0): the sum of its high watermarks."""
    return sum(topic_ends(servers, topic, timeout_s).values())


def topic_ends(servers: str, topic: str, timeout_s: float = 30.0) -> dict[int, int]:
    """Each partition's end (its high watermark) in ``topic``, fresh (offsets start at 0).

    The broker's ListOffsets answer may lag the real end (see :mod:`purgatory.devtools.broker`),
    so each partition is read forward from it until a fetch response says where the end is.

    Raises:
        RuntimeError: no fetch response in ``timeout_s``.
    """
    consumer = _consumer(servers, fetch_max_wait_ms=50)
    try:
        tps = [TopicPartition(topic, p) for p in range(_PARTITIONS)]
        first, listed = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, listed[tp])
        ends: dict[Any, int] = {}
        deadline = time.perf_counter() + timeout_s
        while len(ends) < len(tps):
            if time.perf_counter() > deadline:
                raise RuntimeError(f"topic {topic}: no high watermark within {timeout_s} s")
            consumer.poll(timeout_ms=100, max_records=10_000)
            for tp in tps:
                high, position = consumer.highwater(tp), consumer.position(tp)
                if tp not in ends and high is not None and position >= high:
                    ends[tp] = int(high)
        return {tp.partition: ends[tp] - int(first[tp]) for tp in tps}
    finally:
        consumer.close()


def _signal_rows(spark: SparkSession, rows: int) -> DataFrame:
    return spark.range(0, rows, 1, _PARTITIONS).selectExpr(
        f"concat('s', id % {_SCOPES}) AS scope", "concat('k', id) AS key"
    )


def _write_signals(df: DataFrame, servers: str, topic: str, **options: str) -> None:
    writer = (
        df.write.format("purgatory-signals")
        .mode("append")
        .option("bootstrap_servers", servers)
        .option("topic", topic)
    )
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def _write_connector(df: DataFrame, servers: str, topic: str, *, checked: bool = True) -> None:
    """Signals through Spark's Kafka connector: ``signals_to_kafka`` (``checked``), or the same
    records with no row checks (what the checks and their per-task sort cost)."""
    if checked:
        out = signals_to_kafka(df)
    else:
        record = F.struct(
            F.lit(1).alias("v"), F.lit("signal").alias("type"), F.col("scope"), F.col("key")
        )
        out = df.select(
            F.encode("scope", "UTF-8").alias("key"), F.to_json(record).cast("binary").alias("value")
        )
    out.write.format("kafka").option("kafka.bootstrap.servers", servers).option(
        "topic", topic
    ).save()


def _await(query: Any, what: str) -> None:
    """Wait (bounded) for an ``availableNow`` query to end; raise if it failed or hung."""
    if not query.awaitTermination(_QUERY_TIMEOUT_S):
        query.stop()
        raise RuntimeError(f"{what}: the query did not end within {_QUERY_TIMEOUT_S} s")
    if query.exception() is not None:
        raise RuntimeError(f"{what}: {query.exception()}")


# -- 1. signals written -------------------------------------------------------------------------


def _produce_signals(servers: str, topic: str, rows: int) -> int:
    """The baseline: encode, send and flush ``rows`` signals; returns the failures."""
    errors: list[BaseException] = []
    producer = _producer(servers, acks="all", linger_ms=5)
    try:
        for i in range(rows):
            scope = f"s{i % _SCOPES}"
            value = encode_signal(SignalRecord(scope, f"k{i}"))
            producer.send(topic, key=scope.encode(), value=value).add_errback(errors.append)
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=10)
    return len(errors)


def _stream_signals(spark: SparkSession, servers: str, topic: str, files: Path, work: Path) -> None:
    query = (
        spark.readStream.schema("scope string, key string").parquet(str(files))
        .writeStream.format("purgatory-signals")
        .option("bootstrap_servers", servers).option("topic", topic)
        .option("checkpointLocation", str(work / f"signals-checkpoint-{topic}"))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    _await(query, "signals streaming")


def bench_signals(
    spark: SparkSession,
    broker: Broker,
    config: SparkBenchConfig,
    work: Path,
    say: Callable[[str], None],
) -> list[RateResult]:
    """Measurement 1 (see the module's documentation)."""
    servers, n = broker.bootstrap_servers, config.rows
    df = _signal_rows(spark, n)
    say(f"signals written: warm-up ({_WARMUP_RECORDS} rows)")
    _write_signals(_signal_rows(spark, _WARMUP_RECORDS), servers, _topic(broker, "warm-signals"))

    batch: list[tuple[float, int]] = []
    for run in range(config.repeats):
        say(f"signals written: Spark batch save(), {n} rows, run {run + 1}")
        topic = _topic(broker, "signals-batch")
        start = time.perf_counter()
        _write_signals(df, servers, topic)
        batch.append((time.perf_counter() - start, topic_size(servers, topic)))
    results = [_rate("signals written", "Spark batch: df.write purgatory-signals save()", n, batch)]
    if config.connector:
        _write_connector(_signal_rows(spark, _WARMUP_RECORDS), servers, _topic(broker, "warm"))
        for checked, label in ((True, "signals_to_kafka"), (False, "no row checks")):
            runs: list[tuple[float, int]] = []
            for run in range(config.repeats):
                say(f"signals written: Spark's Kafka connector ({label}), {n} rows, run {run + 1}")
                topic = _topic(broker, "signals-connector")
                start = time.perf_counter()
                _write_connector(df, servers, topic, checked=checked)
                runs.append((time.perf_counter() - start, topic_size(servers, topic)))
            path = f"Spark batch through the connector: {label}, df.write kafka save()"
            results.append(_rate("signals written", path, n, runs))

    if config.streaming:
        warm_source, source = work / "warm-signal-files", work / "signal-files"
        _signal_rows(spark, _WARMUP_RECORDS).write.parquet(str(warm_source))
        df.write.parquet(str(source))
        say("signals written: streaming warm-up")
        _stream_signals(spark, servers, _topic(broker, "warm-signals"), warm_source, work)
        stream: list[tuple[float, int]] = []
        for run in range(config.repeats):
            say(f"signals written: Spark streaming availableNow, {n} rows, run {run + 1}")
            topic = _topic(broker, "signals-stream")
            start = time.perf_counter()
            _stream_signals(spark, servers, topic, source, work)
            stream.append((time.perf_counter() - start, topic_size(servers, topic)))
        results.append(
            _rate(
                "signals written",
                "Spark streaming: parquet files -> writeStream purgatory-signals, availableNow",
                n,
                stream,
            )
        )

    baseline: list[tuple[float, int]] = []
    _produce_signals(servers, _topic(broker, "warm-signals"), _WARMUP_RECORDS)
    for run in range(config.repeats):
        say(f"signals written: baseline kafka-python producer, {n} records, run {run + 1}")
        topic = _topic(broker, "signals-kafka")
        start = time.perf_counter()
        failed = _produce_signals(servers, topic, n)
        seconds = time.perf_counter() - start
        baseline.append((seconds, topic_size(servers, topic) - failed))
    results.append(
        _rate(
            "signals written",
            "baseline: kafka-python producer, one process (encode, send, flush)",
            n,
            baseline,
        )
    )
    return results


# -- 2. callbacks read --------------------------------------------------------------------------


def _callback_value(i: int, base_ms: int) -> tuple[bytes, bytes]:
    scope, key = f"s{i % _SCOPES}", f"k{i}"
    outcome = Outcome(
        op_id=f"o{i}",
        scope=scope,
        outcome=OutcomeKind.COMPLETED,
        registered_ms=base_ms,
        outcome_ms=base_ms + i,
        deadline_ms=base_ms + _LONG_TIMEOUT_MS,
        time_domain=TimeDomain.PROCESSING_TIME,
        sequence=i + 1,
        keys=(key,),
        signals={key: f'{{"n":{i}}}'},
    )
    return scope.encode(), encode_callback(outcome)


def _fill_callbacks(servers: str, topic: str, count: int) -> None:
    base_ms = int(time.time() * 1000)
    producer = _producer(servers, acks=1, linger_ms=5, batch_size=512 * 1024)
    try:
        for i in range(count):
            key, value = _callback_value(i, base_ms)
            producer.send(topic, key=key, value=value)
        producer.flush(timeout=120)
    finally:
        producer.close(timeout=10)


def _consume(servers: str, topic: str, count: int, *, decode: bool) -> int:
    """The baseline: read ``count`` records from the start (decoding each); returns how many."""
    consumer = _consumer(servers)
    seen = 0
    try:
        tps = [TopicPartition(topic, p) for p in range(_PARTITIONS)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        deadline = time.perf_counter() + _READ_TIMEOUT_S
        while seen < count and time.perf_counter() < deadline:
            for records in consumer.poll(timeout_ms=200, max_records=2_000).values():
                if decode:
                    for record in records:
                        decode_callback(record.value)
                seen += len(records)
    finally:
        consumer.close()
    return seen


def _read_callbacks(spark: SparkSession, servers: str, topic: str) -> int:
    return (
        spark.read.format("purgatory-callbacks")
        .option("bootstrap_servers", servers)
        .option("topic", topic)
        .load()
        .count()
    )


def _connector_callbacks(
    spark: SparkSession, servers: str, topic: str, ends: dict[int, int]
) -> tuple[DataFrame, int]:
    """``callbacks_from_kafka`` over the connector's batch read of ``topic`` up to ``ends``
    (given exactly: the embedded broker's ListOffsets lags), and the records it covers."""
    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", json.dumps({topic: {str(p): e for p, e in ends.items()}}))
        .load()
    )
    return callbacks_from_kafka(raw), sum(ends.values())


def _read_callbacks_connector(
    spark: SparkSession, servers: str, topic: str, ends: dict[int, int]
) -> int:
    """Every column of every row computed (the ``noop`` sink); the records covered."""
    rows, covered = _connector_callbacks(spark, servers, topic, ends)
    rows.write.format("noop").mode("overwrite").save()
    return covered


def _stream_callbacks(spark: SparkSession, servers: str, topic: str, checkpoint: Path) -> int:
    query: Any = (
        spark.readStream.format("purgatory-callbacks")
        .option("bootstrap_servers", servers).option("topic", topic).load()
        .writeStream.format("noop").option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True).start()
    )  # fmt: skip
    _await(query, "callbacks streaming")
    return sum(int(p.numInputRows) for p in query.recentProgress)


def bench_callbacks(
    spark: SparkSession,
    broker: Broker,
    config: SparkBenchConfig,
    work: Path,
    say: Callable[[str], None],
) -> list[RateResult]:
    """Measurement 2 (see the module's documentation)."""
    servers, m = broker.bootstrap_servers, config.callbacks
    warm, topic = _topic(broker, "warm-callbacks"), _topic(broker, "callbacks")
    say(f"callbacks read: filling a topic with {m} callbacks")
    _fill_callbacks(servers, warm, _WARMUP_RECORDS)
    _fill_callbacks(servers, topic, m)
    filled = topic_size(servers, topic)
    if filled != m:
        raise RuntimeError(f"the callbacks topic holds {filled} records, not {m}")
    say("callbacks read: warm-up")
    _read_callbacks(spark, servers, warm)
    _stream_callbacks(spark, servers, warm, work / "warm-callbacks-checkpoint")
    _consume(servers, warm, _WARMUP_RECORDS, decode=True)

    def timed(read: Callable[[int], int], label: str) -> list[tuple[float, int]]:
        runs = []
        for run in range(config.repeats):
            say(f"callbacks read: {label}, {m} records, run {run + 1}")
            start = time.perf_counter()
            seen = read(run)
            runs.append((time.perf_counter() - start, seen))
        return runs

    spark_batch = timed(lambda _: _read_callbacks(spark, servers, topic), "Spark batch count()")
    results = [
        _rate(
            "callbacks read", "Spark batch: read purgatory-callbacks load().count()", m, spark_batch
        )
    ]
    if config.connector:
        ends, warm_ends = topic_ends(servers, topic), topic_ends(servers, warm)
        rows, covered = _connector_callbacks(spark, servers, topic, ends)
        if rows.count() != m or covered != m:  # once, untimed: every record became a row
            raise RuntimeError(f"callbacks_from_kafka: {rows.count()} rows of {covered}, not {m}")
        _read_callbacks_connector(spark, servers, warm, warm_ends)
        connector = timed(
            lambda _: _read_callbacks_connector(spark, servers, topic, ends),
            "Spark's Kafka connector, callbacks_from_kafka -> noop",
        )
        results.append(
            _rate(
                "callbacks read",
                "Spark batch through the connector: callbacks_from_kafka -> noop",
                m,
                connector,
            )
        )
    if config.streaming:
        stream = timed(
            lambda run: _stream_callbacks(
                spark, servers, topic, work / f"callbacks-checkpoint-{run}"
            ),
            "Spark streaming availableNow -> noop",
        )
        results.append(
            _rate(
                "callbacks read",
                "Spark streaming: readStream purgatory-callbacks -> noop, availableNow",
                m,
                stream,
            )
        )
    decoded = timed(lambda _: _consume(servers, topic, m, decode=True), "baseline, decoded")
    raw = timed(lambda _: _consume(servers, topic, m, decode=False), "baseline, not decoded")
    results += [
        _rate(
            "callbacks read",
            "baseline: kafka-python consumer, one process, decode_callback each",
            m,
            decoded,
        ),
        _rate(
            "callbacks read", "baseline': kafka-python consumer, one process, no decoding", m, raw
        ),
    ]
    return results


# -- 3. latency ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _Sample:
    """One operation's trip: when it was sent, the write returned, decided, seen (epoch ms)."""

    sent_ms: float
    written_ms: float
    outcome_ms: float | None = None
    seen_ms: float | None = None


_SeenRow = tuple[float, int, float | None]
"""When a callback was in hand (epoch ms), its ``outcome_ms``, the send time its signal carried."""


class _Seen:
    """Callbacks seen by ``scope/op_id`` (``foreachBatch`` runs in a thread of the driver)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rows: dict[str, _SeenRow] = {}

    def add(self, seen_ms: float, rows: Sequence[tuple[str, int, float | None]]) -> None:
        with self._lock:
            for op_id, outcome_ms, sent_ms in rows:
                self._rows.setdefault(op_id, (seen_ms, outcome_ms, sent_ms))

    def get(self, op_id: str) -> _SeenRow | None:
        with self._lock:
            return self._rows.get(op_id)

    def has_all(self, op_ids: Sequence[str]) -> bool:
        with self._lock:
            return all(op_id in self._rows for op_id in op_ids)


def _sent_ms(payload: object) -> float | None:
    """The send time in a signal's payload (``{"sent_us": ...}``, as JSON text or parsed), ms."""
    if isinstance(payload, str):
        payload = json.loads(payload)
    return payload["sent_us"] / 1000 if isinstance(payload, dict) else None


def _wait_for(done: Callable[[], bool], timeout_s: float, check: Callable[[], None]) -> bool:
    """Wait until ``done()``, calling ``check()`` every 2 ms; False after ``timeout_s``."""
    end = time.perf_counter() + timeout_s
    while not done():
        check()
        if time.perf_counter() >= end:
            return False
        time.sleep(0.002)
    return True


def _rounds(
    write: Callable[[list[tuple[str, str]]], None],
    seen: _Seen,
    check: Callable[[], None],
    *,
    prefix: str,
    ops: int,
    per_round: int,
    pause_s: float,
) -> tuple[dict[str, _Sample], int]:
    """Signal operations ``{prefix}{i}`` (key ``k{i}``) ``per_round`` at a time through ``write``
    (given ``(key, payload)`` pairs), each round once the previous one was seen."""
    samples: dict[str, _Sample] = {}
    rounds = 0
    for first in range(0, ops, per_round):
        ids = list(range(first, min(ops, first + per_round)))
        sent_ms = time.time() * 1000
        payload = json.dumps({"sent_us": int(sent_ms * 1000)})
        write([(f"k{i}", payload) for i in ids])
        written_ms = time.time() * 1000
        op_ids = [f"{prefix}{i}" for i in ids]
        for op_id in op_ids:
            samples[op_id] = _Sample(sent_ms, written_ms)
        rounds += 1
        if not _wait_for(functools.partial(seen.has_all, op_ids), _ROUND_TIMEOUT_S, check):
            break
        time.sleep(random.uniform(0, pause_s))
    for op_id, sample in samples.items():
        got = seen.get(op_id)
        if got is not None:
            sample.seen_ms, sample.outcome_ms = got[0], got[1]
    return samples, rounds


def _latency(
    path: str, samples: dict[str, _Sample], ops: int, rounds: int, fetch_max_wait_ms: int | None
) -> LatencyResult:
    done = [s for s in samples.values() if s.seen_ms is not None and s.outcome_ms is not None]
    total = sorted(s.seen_ms - s.sent_ms for s in done if s.seen_ms is not None)

    def ms(value: float) -> float:
        return round(value, 2)

    return LatencyResult(
        path=path,
        samples=len(total),
        missing=ops - len(total),
        rounds=rounds,
        p50_ms=ms(percentile(total, 0.50)),
        p90_ms=ms(percentile(total, 0.90)),
        p99_ms=ms(percentile(total, 0.99)),
        max_ms=ms(total[-1] if total else 0.0),
        min_ms=ms(total[0] if total else 0.0),
        send_to_write_returned_p50_ms=ms(_median([s.written_ms - s.sent_ms for s in done])),
        send_to_outcome_p50_ms=ms(
            _median([s.outcome_ms - s.sent_ms for s in done if s.outcome_ms])
        ),
        outcome_to_seen_p50_ms=ms(
            _median([s.seen_ms - s.outcome_ms for s in done if s.seen_ms and s.outcome_ms])
        ),
        consumer_fetch_max_wait_ms=fetch_max_wait_ms,
    )


def _register(url: str, scope: str, ops: int, prefix: str) -> None:
    bodies = [
        operation(scope=scope, op_id=f"{prefix}{i}", keys=[f"k{i}"], timeout_ms=_LONG_TIMEOUT_MS)
        for i in range(ops)
    ]
    with PurgatoryClient(url, timeout_s=60) as client:
        answer = client.register_many(bodies)
    bad = [r for r in answer["results"] if r["http_status"] != 201]
    if bad:
        raise RuntimeError(f"{len(bad)} registrations refused, e.g. {bad[0]}")


def _idle_probes(servers: str, topic: str, times: int = 5) -> list[float]:
    """Milliseconds of the source's end-of-topic probe when nothing new came since the last."""
    settings = _settings({"bootstrap_servers": servers, "topic": topic})
    ends = _probe_ends(settings, {})
    spent = []
    for _ in range(times):
        start = time.perf_counter()
        ends = _probe_ends(settings, ends)
        spent.append(round((time.perf_counter() - start) * 1000, 1))
    return spent


def _phases(query: Any, trigger_ms: int, idle_probe_ms: list[float]) -> MicroBatchPhases:
    progress = [p for p in query.recentProgress if int(p.numInputRows) > 0]
    phases = {name: [float(p.durationMs.get(name, 0)) for p in progress] for name in _PHASES}
    return MicroBatchPhases(
        trigger_ms=trigger_ms,
        batches=len(progress),
        median_ms={name: _median(v) for name, v in phases.items()},
        max_ms={name: max(v, default=0.0) for name, v in phases.items()},
        idle_probe_ms=idle_probe_ms,
    )


def _spark_latency(
    spark: SparkSession,
    topics: dict[str, str],
    config: SparkBenchConfig,
    *,
    servers: str,
    work: Path,
    say: Callable[[str], None],
) -> tuple[LatencyResult, MicroBatchPhases]:
    seen = _Seen()
    scope = "spark"

    def on_batch(df: DataFrame, batch_id: int) -> None:
        del batch_id
        rows = df.select("scope", "op_id", "outcome_ms", "keys", "signals").collect()
        now_ms = time.time() * 1000
        seen.add(
            now_ms,
            [
                (f"{r['scope']}/{r['op_id']}", r["outcome_ms"],
                 _sent_ms(json.loads(r["signals"]).get(r["keys"][0])))
                for r in rows
            ],
        )  # fmt: skip

    spark.conf.set("spark.sql.streaming.numRecentProgressUpdates", "1000")
    query: Any = (
        spark.readStream.format("purgatory-callbacks")
        .option("bootstrap_servers", servers).option("topic", topics["callbacks"]).load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(work / "latency-checkpoint"))
        .trigger(processingTime=f"{config.trigger_ms} milliseconds").start()
    )  # fmt: skip

    checked = [0.0]

    def check() -> None:
        now = time.perf_counter()
        if now - checked[0] >= 0.25:  # a call into the JVM: not every 2 ms
            checked[0] = now
            if not query.isActive:
                raise RuntimeError(f"the callbacks query stopped: {query.exception()}")

    def write_to(scope_name: str) -> Callable[[list[tuple[str, str]]], None]:
        def write(rows: list[tuple[str, str]]) -> None:
            df = spark.createDataFrame(rows, "key string, payload string")
            _write_signals(df, servers, topics["signals"], scope=scope_name,
                           payload_column="payload")  # fmt: skip

        return write

    try:
        say("latency, Spark: warm-up")
        _rounds(write_to("warm-spark"), seen, check, prefix="warm-spark/w", ops=_WARMUP_OPS,
                per_round=_WARMUP_OPS, pause_s=0)  # fmt: skip
        say(f"latency, Spark: {config.ops} operations, {config.per_round} per Spark job")
        samples, rounds = _rounds(write_to(scope), seen, check, prefix=f"{scope}/o",
                                  ops=config.ops, per_round=config.per_round,
                                  pause_s=config.trigger_ms / 1000)  # fmt: skip
    finally:
        query.stop()
    _check_payloads(samples, seen)
    path = (
        f"Spark -> Spark: batch save() purgatory-signals -> service -> readStream "
        f"purgatory-callbacks, processingTime {config.trigger_ms} ms, foreachBatch collect()"
    )
    phases = _phases(query, config.trigger_ms, _idle_probes(servers, topics["callbacks"]))
    return _latency(path, samples, config.ops, rounds, None), phases


def _check_payloads(samples: dict[str, _Sample], seen: _Seen) -> None:
    """Every callback carries its own signal's send time: the rows are the ones sent."""
    for op_id, sample in samples.items():
        got = seen.get(op_id)
        if got is None:
            continue
        sent = got[2]
        if sent is None or abs(sent - sample.sent_ms) > 0.01:
            raise RuntimeError(f"{op_id}: the callback carries send time {sent}, not {sample}")


def _kafka_latency(
    topics: dict[str, str],
    config: SparkBenchConfig,
    *,
    servers: str,
    scope: str,
    fetch_max_wait_ms: int,
    say: Callable[[str], None],
) -> LatencyResult:
    seen = _Seen()
    producer = _producer(servers, acks="all", linger_ms=5)
    consumer = _consumer(servers, fetch_max_wait_ms=fetch_max_wait_ms)
    try:
        tps = [TopicPartition(topics["callbacks"], p) for p in range(_PARTITIONS)]
        consumer.assign(tps)
        # May land before the end (ListOffsets lags): older callbacks are kept under their own
        # scope/op_id and never asked for.
        consumer.seek_to_end(*tps)
        producer.partitions_for(topics["signals"])

        def write_to(scope_name: str) -> Callable[[list[tuple[str, str]]], None]:
            def write(rows: list[tuple[str, str]]) -> None:
                for key, payload in rows:
                    value = encode_signal(SignalRecord(scope_name, key, None, payload))
                    producer.send(topics["signals"], key=scope_name.encode(), value=value)
                producer.flush(timeout=30)

            return write

        def poll() -> None:
            got = []
            for records in consumer.poll(timeout_ms=10).values():
                for record in records:
                    c: dict[str, Any] = decode_callback(record.value)
                    sent_ms = _sent_ms(c["signals"].get(c["keys"][0]))
                    got.append((f"{c['scope']}/{c['op_id']}", c["outcome_ms"], sent_ms))
            if got:
                seen.add(time.time() * 1000, got)

        say(f"latency, baseline kafka-python (fetch_max_wait_ms={fetch_max_wait_ms})")
        warm = f"warm-{scope}"
        _rounds(write_to(warm), seen, poll, prefix=f"{warm}/w", ops=_WARMUP_OPS,
                per_round=_WARMUP_OPS, pause_s=0)  # fmt: skip
        samples, rounds = _rounds(write_to(scope), seen, poll, prefix=f"{scope}/o",
                                  ops=config.ops, per_round=config.per_round,
                                  pause_s=config.trigger_ms / 1000)  # fmt: skip
    finally:
        producer.close(timeout=10)
        consumer.close()
    _check_payloads(samples, seen)
    path = (
        f"baseline: kafka-python producer -> service -> kafka-python consumer, one process, "
        f"fetch_max_wait_ms={fetch_max_wait_ms}"
    )
    return _latency(path, samples, config.ops, rounds, fetch_max_wait_ms)


def bench_latency(
    spark: SparkSession,
    broker: Broker,
    config: SparkBenchConfig,
    work: Path,
    say: Callable[[str], None],
) -> tuple[list[LatencyResult], MicroBatchPhases]:
    """Measurement 3 (see the module's documentation)."""
    tag = uuid.uuid4().hex[:8]
    names = {
        "PURGATORY_TOPIC_REQUESTS": f"requests-{tag}",
        "PURGATORY_TOPIC_SIGNALS": f"signals-{tag}",
        "PURGATORY_TOPIC_CALLBACKS": f"callbacks-{tag}",
        "PURGATORY_TOPIC_DEAD_LETTERS": f"dead-{tag}",
        "PURGATORY_TOPIC_CHANGELOG": f"changelog-{tag}",
        "PURGATORY_TOPIC_SNAPSHOTS": f"snapshots-{tag}",
    }
    broker.create_topics({topic: _PARTITIONS for topic in names.values()})
    env = {**names, "PURGATORY_KAFKA_GROUP_ID": f"group-{tag}", "PURGATORY_LOG_LEVEL": "warning"}
    topics = {"signals": names["PURGATORY_TOPIC_SIGNALS"],
              "callbacks": names["PURGATORY_TOPIC_CALLBACKS"]}  # fmt: skip
    servers = broker.bootstrap_servers
    say("latency: starting the service")
    with service_process(servers, work / "service.log", env) as child:
        url = child.url
        waits = (_FETCH_MAX_WAIT_MS, 20)
        for scope in ("spark", *(f"kafka{wait}" for wait in waits)):
            _register(url, f"warm-{scope}", _WARMUP_OPS, "w")
            _register(url, scope, config.ops, "o")
        result, phases = _spark_latency(spark, topics, config, servers=servers, work=work, say=say)
        results = [result]
        results += [
            _kafka_latency(
                topics,
                config,
                servers=servers,
                scope=f"kafka{wait}",
                fetch_max_wait_ms=wait,
                say=say,
            )
            for wait in waits
        ]
    return results, phases


# -- the report ---------------------------------------------------------------------------------


def _versions(spark: SparkSession) -> dict[str, str]:
    jvm: Any = spark.sparkContext._jvm
    system = jvm.java.lang.System
    return {
        "spark": spark.version,
        "spark_master": spark.sparkContext.master,
        "java": f"{system.getProperty('java.vendor')} {system.getProperty('java.version')}",
        "java_vm": str(system.getProperty("java.vm.name")),
        "kafka_python": kafka.__version__,
    }


def _loadavg() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine shows here."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _k(value: float) -> str:
    return f"{value / 1e3:,.1f} k" if value < 1e6 else f"{value / 1e6:,.2f} M"


def _ms(value: float) -> str:
    return f"{value:,.1f}" if value < 100 else f"{value:,.0f}"


def _rate_rows(results: Sequence[RateResult], number: str) -> list[str]:
    spark = [r for r in results if r.path.startswith("Spark")]
    base = next((r for r in results if r.path.startswith("baseline:")), None)
    rows = []
    for r in results:
        versus = ""
        if base is not None and r in spark:
            versus = f"{r.median_per_s / base.median_per_s:.2f}x baseline"
        runs = ", ".join(f"{s:.2f}" for s in r.seconds)
        rows.append(
            f"| {number}. {r.measurement}: {r.path} | {r.records:,} | {runs} "
            f"| **{_k(r.median_per_s)}/s** | {_k(r.best_per_s)}/s | {versus} "
            f"| {'ok' if r.exact else 'MISMATCH ' + str(r.counts)} |"
        )
    return rows


def _dominant(report: SparkReport) -> list[str]:
    spark, phases = report.latency[0], report.micro_batches
    base = min(report.latency[1:], key=lambda r: r.p50_ms, default=None)
    write, read = spark.send_to_outcome_p50_ms, spark.outcome_to_seen_p50_ms
    after = spark.send_to_write_returned_p50_ms - write
    lines = [
        f"Where Spark's latency goes (medians): send -> the service decided (outcome_ms) "
        f"{_ms(write)} ms: the write job up to its records reaching Kafka, the service's "
        f"intake and decision; outcome_ms -> the row in foreachBatch {_ms(read)} ms: the "
        f"callback's produce, the reader's wait for its next micro-batch and that "
        f"micro-batch. save() itself returned {_ms(abs(after))} ms "
        f"{'after' if after >= 0 else 'before'} the service decided (the tasks close their "
        "producers, Spark commits the job).",
        f"The reader's {phases.batches} micro-batches that carried rows took "
        f"{_ms(phases.median_ms['triggerExecution'])} ms each (median; trigger every "
        f"{phases.trigger_ms} ms): "
        + ", ".join(f"{name} {_ms(phases.median_ms[name])}" for name in _PHASES[1:])
        + " ms (latestOffset: the source probing the topic's end; addBatch: reading the "
        "records and running foreachBatch; walCommit, commitOffsets: the checkpoint).",
        f"A probe that finds nothing new takes {_ms(_median(phases.idle_probe_ms))} ms (median "
        f"of {phases.idle_probe_ms} ms): the source's consumer asks the broker to answer a fetch "
        f"within {_FETCH_WAIT_MS} ms and polls {_POLL_MS} ms at a time until a fetch answer "
        "gives the high watermark.",
    ]
    if base is not None:
        lines.append(
            f"Without Spark (kafka-python, fetch_max_wait_ms={base.consumer_fetch_max_wait_ms}) "
            f"the same trip takes p50 {_ms(base.p50_ms)} ms: the service and the broker account "
            f"for that much of Spark's {_ms(spark.p50_ms)} ms."
        )
    return lines


def render(report: SparkReport, command: str) -> str:
    """The report as markdown: machine, command, rates, latencies, what dominates."""
    m, c = report.machine, report.config
    lines = [
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['implementation']} {m['python']}, "
        f"Spark {m['spark']} ({m['spark_master']}), Java {m['java']}, kafka-python "
        f"{m['kafka_python']}, {m['platform']}. The broker (Tansu, in-memory), Spark (JVM and "
        "Python workers), the service (part 3) and this process share these CPUs, over loopback.",
        "",
        f"Command: `{command}` ({report.wall_s:.0f} s; load average {m['loadavg_at_start']} "
        f"at the start, {m['loadavg_at_end']} at the end)",
        "",
        "| measurement | records | runs (s) | median | best | Spark vs baseline | checks |",
        "|---|---:|---:|---:|---:|---:|:---:|",
        *_rate_rows(report.signals, "1"),
        *_rate_rows(report.callbacks, "2"),
        "",
        f"3. Latency, {c.ops} operations signalled {c.per_round} per round (ms):",
        "",
        "| path | samples | p50 | p90 | p99 | max | send -> write returned (p50) "
        "| send -> outcome (p50) | outcome -> seen (p50) | checks |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|:---:|",
        *(
            f"| {r.path} | {r.samples} | {_ms(r.p50_ms)} | {_ms(r.p90_ms)} "
            f"| **{_ms(r.p99_ms)}** | {_ms(r.max_ms)} | {_ms(r.send_to_write_returned_p50_ms)} "
            f"| {_ms(r.send_to_outcome_p50_ms)} | {_ms(r.outcome_to_seen_p50_ms)} "
            f"| {'ok' if not r.missing else f'{r.missing} MISSING'} |"
            for r in report.latency
        ),
        "",
        *_dominant(report),
        "",
    ]
    return "\n".join(lines)


def run_spark_benchmarks(
    config: SparkBenchConfig,
    *,
    progress: Callable[[str], None] | None = None,
    broker_kind: str = "tansu",
) -> SparkReport:
    """Run every measurement of ``config`` on a broker (``tansu``, embedded, or ``kafka``,
    Apache Kafka) and a local Spark started here."""
    say = progress or (lambda _message: None)
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(open_dev_broker(broker_kind))
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-spark-")))
        say(f"broker: {describe(broker_kind, broker)}; starting Spark local[2]")
        spark = local_session(cores=2, app_name="purgatory-bench-spark")
        stack.callback(spark.stop)
        machine: dict[str, str | int] = {**machine_info(), **_versions(spark)}
        machine["loadavg_at_start"] = _loadavg()
        machine["broker"] = describe(broker_kind, broker)
        signals = bench_signals(spark, broker, config, work, say)
        callbacks = bench_callbacks(spark, broker, config, work, say)
        latency, phases = bench_latency(spark, broker, config, work, say)
        machine["loadavg_at_end"] = _loadavg()
    return SparkReport(
        machine=machine,
        config=config,
        signals=signals,
        callbacks=callbacks,
        latency=latency,
        micro_batches=phases,
        wall_s=time.perf_counter() - start,
    )


def write_json(report: SparkReport, path: Path, command: str) -> None:
    """Write the report (with the command and the units) as JSON."""
    payload: dict[str, Any] = {"command": command, **asdict(report)}
    payload["units"] = {
        "seconds": "wall seconds (time.perf_counter) per run",
        "per_s": "records over a run's seconds: median and best of the runs",
        "counts": "records each run checked it moved: records in the topic, rows seen",
        "latency_ms": "row in hand in the reader (time.time) minus the send time read just "
        "before the write, wall-clock milliseconds, one machine",
        "micro_batches": "Spark's durationMs of the reader's micro-batches that carried rows",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.benchmarks.bench_spark [--rows N] [--callbacks M] [--ops K] ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_spark", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    parser.add_argument("--rows", type=int, help=f"signals written (default {FULL.rows:,})")
    parser.add_argument("--callbacks", type=int, help=f"callbacks read ({FULL.callbacks:,})")
    parser.add_argument("--ops", type=int, help=f"latency samples (default {FULL.ops})")
    parser.add_argument("--per-round", type=int, help="operations per Spark job (default 5)")
    parser.add_argument("--trigger-ms", type=int, help="the reader's trigger (default 100)")
    parser.add_argument("--repeats", type=int, help="runs per rate (default 3)")
    parser.add_argument("--no-streaming", action="store_true", help="skip the streaming variants")
    parser.add_argument(
        "--broker",
        choices=("tansu", "kafka"),
        default="tansu",
        help="the broker: embedded Tansu (default) or Apache Kafka (after make kafka)",
    )
    parser.add_argument("--out", type=Path, default=Path("docs"), help="output directory")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    config = SparkBenchConfig(
        rows=args.rows or base.rows,
        callbacks=args.callbacks or base.callbacks,
        ops=args.ops or base.ops,
        per_round=args.per_round or base.per_round,
        trigger_ms=args.trigger_ms or base.trigger_ms,
        repeats=args.repeats or base.repeats,
        streaming=base.streaming and not args.no_streaming,
    )
    command = " ".join(
        ["python -m tests.benchmarks.bench_spark", *(argv if argv is not None else sys.argv[1:])]
    )

    def progress(message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)

    with quiet_kafka_warnings():
        report = run_spark_benchmarks(config, progress=progress, broker_kind=args.broker)
    print(render(report, command))
    out = args.out / ("bench-spark.json" if args.broker == "tansu" else "bench-spark-kafka.json")
    write_json(report, out, command)
    print(f"Wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
