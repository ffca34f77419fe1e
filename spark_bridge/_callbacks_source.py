"""The ``purgatory-callbacks`` Spark data source (Spark bridge concept: callbacks in, from Kafka).

A PySpark Python data source that reads the callbacks topic, batch and streaming, and decodes
every record with :func:`purgatory._codec.decode_callback` into one row of :data:`SCHEMA`::

    spark.dataSource.register(CallbacksDataSource)
    df = (spark.readStream.format("purgatory-callbacks")
          .option("bootstrap_servers", "kafka:9092").option("scope", "nightly").load())

Theory of operation. An offset is a JSON object ``{"<partition>": next_offset}`` with one entry
per Kafka partition, so Spark checkpoints it and a restarted query resumes exactly where it
stopped. Every micro-batch is planned as one :class:`InputPartition` per Kafka partition with
records in ``[start, end)``; the executor that reads it assigns that partition explicitly (no
consumer group), seeks to ``start`` and polls until its position reaches ``end``.

The end of a partition is never taken from ListOffsets alone. The development broker answers
ListOffsets "latest" with a value that lags the real end by the last batch after a batched
produce (we saw 1 for a partition of hundreds of records); a source that trusted it would
silently stop short of the tail. So each ``latestOffset`` (and each batch plan) *probes*: a
short-lived consumer seeks every partition to the highest end known so far (the previous end,
the micro-batch's start, ListOffsets' answer, whichever is highest) and reads forward until its
position reaches the high watermark carried by the fetch responses (exact on every broker we
know). The end is then ``max(ListOffsets end, highest offset seen + 1, fetch high watermark)``,
so the probe reads only the records that arrived since the previous probe. A probe is bounded
by ``probe_timeout_ms``; if it runs out, it returns the end it reached and the next probe goes on
from there, so the tail is delayed, never skipped. Under ``Trigger.AvailableNow`` the first
probe of the run fixes the target, and later calls never go past it.

Callbacks are at-least-once on the wire: a retried produce or a service restart may write one
outcome twice, and the copy repeats the record's ``id`` exactly. ``id`` identifies an outcome
across scopes, partitions, replicas and restarts, so :func:`dedupe` drops the copies by ``id``
alone. ``(op_id, sequence)`` does not identify one: op_ids repeat across scopes and ``sequence``
counts per input partition, so de-duplicating on it would drop real outcomes. Records are read in
offset order per partition and never twice by one query (the offsets are in the checkpoint), so
duplicates come from the producer only.

The record's ``partition`` field (the input partition whose engine decided the outcome) is the
column ``input_partition``: ``partition``, as in Spark's Kafka source, is the callbacks-topic
partition the row was read from (with ``topic`` and ``offset``).

Options (all strings, names case-insensitive; an unknown option is an error that names it):

* ``bootstrap_servers`` (required): ``host:port[,host:port...]``;
* ``topic``: default ``purgatory.callbacks``;
* ``scope``: keep only callbacks of this scope, or of any of a comma-separated list;
* ``starting_offsets``: ``earliest`` (default), ``latest``, or a JSON object
  ``{"0": 42, ...}`` (partitions left out start at their earliest offset); a restarted
  streaming query ignores it and resumes from its checkpoint;
* ``isolation_level``: ``read_uncommitted`` (default) or ``read_committed``: read only
  records of committed transactions. Set it when the service runs with
  ``PURGATORY_DELIVERY=transactional``: each outcome is then read exactly once and ``dedupe``
  has nothing to drop. Each partition's end is then its last stable offset, as Kafka's
  ListOffsets reports it for ``read_committed`` (exact on Apache Kafka, the only broker whose
  transactions the service uses), not the probe described above;
* ``on_malformed``: ``fail`` (default: the read fails with an error naming the topic, partition
  and offset) or ``skip`` (undecodable records and tombstones are dropped);
* ``max_records_per_trigger``: at most this many records per micro-batch (streaming), shared
  between the partitions in proportion to what each has waiting, so a backlog (say, after the
  reader was down) is read in bounded micro-batches instead of one huge one; unset: no limit.
  Spark ignores it when a trigger asks for everything (``Trigger.Once``);
* ``connect_timeout_ms`` (default 10000: how long to wait for a broker to answer before the
  read fails naming ``bootstrap_servers``), ``probe_timeout_ms`` (default 10000),
  ``read_timeout_ms`` (default 60000: how long a read may go without receiving a record before
  it fails instead of hanging);
* the Kafka client options of every bridge format (``client_id``, ``security_protocol``,
  ``sasl_mechanism``, ``sasl_username``, ``sasl_password``, ``ssl_cafile``, ``ssl_certfile``,
  ``ssl_keyfile``, ``ssl_password``; see ``spark_bridge._writer.CLIENT_OPTIONS``), and
  ``ssl_check_hostname`` (true/false).

kafka-python is imported only inside the functions that Spark runs (planning on the driver's
Python worker, reading on the executors), so importing this module needs pyspark only.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from purgatory._codec import RecordError, decode_callback
from purgatory._core import BadRecordError, ConfigError, TransportError
from purgatory._kafka_options import kafka_client_kwargs
from spark_bridge._writer import CLIENT_OPTIONS, client_options, int_option

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["SCHEMA", "CallbacksDataSource", "cap_offsets", "dedupe"]

#: The rows of ``purgatory-callbacks``: the callback record's fields in the format's order
#: (``signals`` as JSON object text, ``payload`` as JSON text or null; the record's ``partition``
#: as ``input_partition``), then where it was read (``topic``, ``partition``, ``offset``).
SCHEMA = StructType(
    [
        StructField("op_id", StringType(), nullable=False),
        StructField("scope", StringType(), nullable=False),
        StructField("outcome", StringType(), nullable=False),
        StructField("registered_ms", LongType(), nullable=False),
        StructField("outcome_ms", LongType(), nullable=False),
        StructField("deadline_ms", LongType(), nullable=False),
        StructField("time_domain", StringType(), nullable=False),
        StructField("sequence", LongType(), nullable=False),
        StructField("input_partition", IntegerType(), nullable=False),
        StructField("id", StringType(), nullable=False),
        StructField("keys", ArrayType(StringType(), containsNull=False), nullable=False),
        StructField("missing", ArrayType(StringType(), containsNull=False), nullable=False),
        StructField("signals", StringType(), nullable=False),
        StructField("payload", StringType(), nullable=True),
        StructField("late", BooleanType(), nullable=False),
        StructField("topic", StringType(), nullable=False),
        StructField("partition", IntegerType(), nullable=False),
        StructField("offset", LongType(), nullable=False),
    ]
)

_NAME = "purgatory-callbacks"
_DEFAULT_TOPIC = "purgatory.callbacks"
_OPTIONS = frozenset(
    (
        "bootstrap_servers",
        "topic",
        "scope",
        "starting_offsets",
        "on_malformed",
        "isolation_level",
        "connect_timeout_ms",
        "probe_timeout_ms",
        "read_timeout_ms",
        "max_records_per_trigger",
        "ssl_check_hostname",
        *CLIENT_OPTIONS,
    )
)
# A fetch returns after at most _FETCH_WAIT_MS when nothing is new (kafka-python waits 500 ms
# by default, and a probe of an idle topic would then cost three polls); a poll returns after
# _POLL_MS when no record came, which bounds a probe of an idle topic near 50 ms.
_FETCH_WAIT_MS = 20
_POLL_MS = 50
_Offsets = dict[str, int]


@dataclass(frozen=True)
class _Settings:
    """The validated options; pickled to the executors with the readers."""

    bootstrap_servers: str
    topic: str
    scopes: frozenset[str] | None
    starting_offsets: str | dict[int, int]
    skip_malformed: bool
    connect_timeout_ms: int
    probe_timeout_ms: int
    read_timeout_ms: int
    max_records_per_trigger: int | None
    client: tuple[tuple[str, str], ...]  # the CLIENT_OPTIONS set (client_options)
    read_committed: bool = False
    ssl_check_hostname: bool = True

    def kafka_kwargs(self) -> dict[str, Any]:
        """kafka-python's connection arguments (the service's builder, from the options)."""
        return kafka_client_kwargs(
            {"bootstrap_servers": self.bootstrap_servers, **dict(self.client)}
        )


def _starting_offsets(text: str) -> str | dict[int, int]:
    if text in ("earliest", "latest"):
        return text
    bad = ConfigError(
        f"{_NAME}: option starting_offsets must be earliest, latest or a JSON object "
        f'{{"<partition>": offset}}, got {text!r}'
    )
    try:
        raw = json.loads(text)
    except ValueError:
        raise bad from None
    if not isinstance(raw, dict):
        raise bad
    out: dict[int, int] = {}
    for key, value in raw.items():
        if not key.isdigit() or type(value) is not int or value < 0:
            raise bad
        out[int(key)] = value
    return out


def _settings(options: Mapping[str, str]) -> _Settings:
    """Validate the options of a read; every error names the option.

    Raises:
        ConfigError: an option is missing, unknown or invalid.
    """
    unknown = sorted(name for name in options if name.lower() not in _OPTIONS)
    if unknown:
        raise ConfigError(
            f"{_NAME}: unknown option {unknown[0]} (known: {', '.join(sorted(_OPTIONS))})"
        )
    servers = options.get("bootstrap_servers", "").strip()
    if not servers:
        raise ConfigError(f"{_NAME}: option bootstrap_servers is required (host:port,...)")
    topic = options.get("topic", _DEFAULT_TOPIC).strip()
    if not topic:
        raise ConfigError(f"{_NAME}: option topic must not be empty")
    scopes = None
    if "scope" in options:
        scopes = frozenset(s.strip() for s in options["scope"].split(",") if s.strip())
        if not scopes:
            raise ConfigError(f"{_NAME}: option scope must name at least one scope")
    on_malformed = options.get("on_malformed", "fail").strip().lower()
    if on_malformed not in ("fail", "skip"):
        raise ConfigError(
            f"{_NAME}: option on_malformed must be fail or skip, got {on_malformed!r}"
        )
    isolation = options.get("isolation_level", "read_uncommitted").strip().lower()
    if isolation not in ("read_uncommitted", "read_committed"):
        raise ConfigError(
            f"{_NAME}: option isolation_level must be read_uncommitted or read_committed,"
            f" got {isolation!r}"
        )
    client = client_options(options)
    check = options.get("ssl_check_hostname", "true").strip().lower()
    if check not in ("true", "false"):
        raise ConfigError(f"{_NAME}: option ssl_check_hostname must be true or false")
    return _Settings(
        bootstrap_servers=servers,
        topic=topic,
        scopes=scopes,
        starting_offsets=_starting_offsets(
            options.get("starting_offsets", "earliest").strip().lower()
        ),
        skip_malformed=on_malformed == "skip",
        connect_timeout_ms=int_option(options, "connect_timeout_ms", 10_000, 1),
        probe_timeout_ms=int_option(options, "probe_timeout_ms", 10_000, 1),
        read_timeout_ms=int_option(options, "read_timeout_ms", 60_000, 1),
        max_records_per_trigger=(
            int_option(options, "max_records_per_trigger", 0, 1)
            if "max_records_per_trigger" in options
            else None
        ),
        client=client,
        read_committed=isolation == "read_committed",
        ssl_check_hostname=check == "true",
    )


def _now_ms() -> int:
    # Spark runs these readers in plain threads and processes (no trio): bounding a blocking
    # Kafka read needs the real monotonic clock.
    return int(time.monotonic() * 1000)  # noqa: TID251


def _consumer(settings: _Settings) -> Any:
    """A kafka-python consumer without a group (explicit assignment, nothing committed)."""
    from kafka import KafkaConsumer  # noqa: PLC0415 - only where Spark runs the reader
    from kafka.errors import KafkaError  # noqa: PLC0415

    try:
        return KafkaConsumer(
            **settings.kafka_kwargs(),
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            bootstrap_timeout_ms=settings.connect_timeout_ms,
            fetch_max_wait_ms=_FETCH_WAIT_MS,
            isolation_level="read_committed" if settings.read_committed else "read_uncommitted",
            ssl_check_hostname=settings.ssl_check_hostname,
        )
    except KafkaError as e:
        raise TransportError(
            f"{_NAME}: option bootstrap_servers: no broker answered at "
            f"{settings.bootstrap_servers}: {type(e).__name__}: {e}"
        ) from e


def _topic_partitions(settings: _Settings, consumer: Any) -> list[Any]:
    from kafka import TopicPartition  # noqa: PLC0415

    numbers = consumer.partitions_for_topic(settings.topic)
    if not numbers:
        raise ConfigError(f"{_NAME}: topic {settings.topic!r} does not exist (option topic)")
    return [TopicPartition(settings.topic, p) for p in sorted(numbers)]


def _earliest(settings: _Settings) -> _Offsets:
    consumer = _consumer(settings)
    try:
        tps = _topic_partitions(settings, consumer)
        first = consumer.beginning_offsets(tps)
        return {str(tp.partition): int(first[tp]) for tp in tps}
    finally:
        consumer.close()


def _probe_ends(settings: _Settings, floors: Mapping[str, int]) -> _Offsets:
    """The end of every partition: max(ListOffsets, highest offset seen + 1, high watermark).

    Reads forward from the highest end already known (``floors``, or ListOffsets' answer when
    higher) until each partition's position reaches the high watermark of a fetch response, or
    until ``probe_timeout_ms``; either way the result is never below what was actually read.
    """
    consumer = _consumer(settings)
    try:
        tps = _topic_partitions(settings, consumer)
        first = consumer.beginning_offsets(tps)
        listed = consumer.end_offsets(tps)
        ends = {
            tp: max(int(floors.get(str(tp.partition), first[tp])), int(listed[tp]), int(first[tp]))
            for tp in tps
        }
        if settings.read_committed:  # ListOffsets' last stable offset: exact, and final
            return {str(tp.partition): end for tp, end in ends.items()}
        consumer.assign(tps)
        for tp in tps:
            consumer.seek(tp, ends[tp])
        deadline_ms = _now_ms() + settings.probe_timeout_ms
        pending = set(tps)
        while pending and _now_ms() < deadline_ms:
            consumer.poll(timeout_ms=_POLL_MS, max_records=10_000)
            for tp in list(pending):
                position = int(consumer.position(tp))
                ends[tp] = max(ends[tp], position)
                highwater = consumer.highwater(tp)
                # The consumer is fresh, so a known high watermark comes from a fetch made
                # at or after the seek above.
                if highwater is not None and position >= highwater:
                    pending.discard(tp)
                    consumer.pause(tp)
        return {str(tp.partition): end for tp, end in ends.items()}
    finally:
        consumer.close()


def _initial(settings: _Settings) -> _Offsets:
    """The offsets a new read starts from, per ``starting_offsets``."""
    start = settings.starting_offsets
    earliest = _earliest(settings)
    if start == "earliest":
        return earliest
    if start == "latest":
        return _probe_ends(settings, earliest)
    assert isinstance(start, dict)
    return {p: max(first, start.get(int(p), first)) for p, first in earliest.items()}


class _Range(InputPartition):
    """The records ``[start, end)`` of one Kafka partition: the work of one Spark task."""

    def __init__(self, partition: int, start: int, end: int) -> None:
        super().__init__((partition, start, end))
        self.partition = partition
        self.start = start
        self.end = end


def _ranges(start: Mapping[str, int], end: Mapping[str, int]) -> list[_Range]:
    return [
        _Range(int(p), start.get(p, 0), stop)
        for p, stop in sorted(end.items(), key=lambda item: int(item[0]))
        if stop > start.get(p, 0)
    ]


def cap_offsets(start: Mapping[str, int], ends: Mapping[str, int], most: int) -> dict[str, int]:
    """``ends`` cut so that at most ``most`` records lie between ``start`` and them.

    Each partition gets a share proportional to what it has waiting (rounded down), and what
    rounding leaves goes one record at a time to the partitions in order, so the cut is
    deterministic, never passes a partition's end, and reads ``min(most, waiting)`` records.
    """
    waiting = {p: max(0, end - start.get(p, 0)) for p, end in ends.items()}
    total = sum(waiting.values())
    if total <= most:
        return dict(ends)
    share = {p: n * most // total for p, n in waiting.items()}
    left = most - sum(share.values())
    for p in sorted(waiting, key=int):
        if left == 0:
            break
        if share[p] < waiting[p]:
            share[p] += 1
            left -= 1
    return {p: start.get(p, 0) + share[p] if waiting[p] else end for p, end in ends.items()}


def _signals_text(signals: Mapping[str, str | None]) -> str:
    # The values are canonical JSON texts already: splice them in, never re-parse them.
    body = ",".join(
        json.dumps(key) + ":" + ("null" if value is None else value)
        for key, value in signals.items()
    )
    return "{" + body + "}"


def _row(settings: _Settings, record: Any) -> tuple[Any, ...] | None:
    """One row of :data:`SCHEMA`, or None for a record filtered out or skipped."""
    try:
        if record.value is None:
            raise RecordError(None, "null value (a tombstone), not a callback")
        c = decode_callback(record.value)
    except RecordError as e:
        if settings.skip_malformed:
            return None
        raise BadRecordError(
            f"{_NAME}: malformed callback at topic {record.topic} partition {record.partition} "
            f"offset {record.offset}: {e} (option on_malformed=skip drops such records)"
        ) from e
    if settings.scopes is not None and c["scope"] not in settings.scopes:
        return None
    signals = c["signals"]
    assert isinstance(signals, dict)
    return (
        c["op_id"],
        c["scope"],
        c["outcome"],
        c["registered_ms"],
        c["outcome_ms"],
        c["deadline_ms"],
        c["time_domain"],
        c["sequence"],
        c["partition"],
        c["id"],
        c["keys"],
        c["missing"],
        _signals_text(signals),
        c["payload"],
        c["late"],
        record.topic,
        record.partition,
        record.offset,
    )


def _read(settings: _Settings, work: _Range) -> Iterator[tuple[Any, ...]]:
    """The rows of one range; fails rather than hangs when the records do not come."""
    from kafka import TopicPartition  # noqa: PLC0415

    if work.end <= work.start:
        return
    tp = TopicPartition(settings.topic, work.partition)
    consumer = _consumer(settings)
    try:
        consumer.assign([tp])
        consumer.seek(tp, work.start)
        progress_ms = _now_ms()
        position = work.start
        while position < work.end:
            records = consumer.poll(timeout_ms=_POLL_MS, max_records=2_000).get(tp, [])
            moved = int(consumer.position(tp))  # past aborted records too, reading committed
            if records or moved > position:
                progress_ms = _now_ms()
                position = moved
            elif _now_ms() - progress_ms > settings.read_timeout_ms:
                raise TransportError(
                    f"{_NAME}: no record for {settings.read_timeout_ms} ms reading topic "
                    f"{settings.topic} partition {work.partition} at offset "
                    f"{consumer.position(tp)} (planned end {work.end}; option read_timeout_ms)"
                )
            for record in records:
                if record.offset >= work.end:
                    return
                row = _row(settings, record)
                if row is not None:
                    yield row
    finally:
        consumer.close()


class _BatchReader(DataSourceReader):
    """``spark.read``: from the starting offsets to the ends probed when the query is planned."""

    def __init__(self, settings: _Settings) -> None:
        self._settings = settings

    def partitions(self) -> Sequence[InputPartition]:
        start = _initial(self._settings)
        ranges = _ranges(start, _probe_ends(self._settings, start))
        # Spark wants at least one partition, even for nothing to read.
        return ranges or [_Range(0, 0, 0)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Range)
        return _read(self._settings, partition)


class _StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: micro-batches between probed, checkpointed per-partition offsets."""

    def __init__(self, settings: _Settings) -> None:
        self._settings = settings
        self._known: _Offsets = {}
        self._available_now = False
        self._target: _Offsets | None = None

    def initialOffset(self) -> dict[str, int]:  # noqa: N802 - Spark's name
        return _initial(self._settings)

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802 - Spark's name
        """``ReadMaxRows(max_records_per_trigger)`` when the option is set."""
        most = self._settings.max_records_per_trigger
        return ReadAllAvailable() if most is None else ReadMaxRows(most)

    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:  # noqa: N802
        """The probed ends (never below ``start``; under AvailableNow, the run's fixed target),
        cut to ``limit`` records when Spark passes a ``ReadMaxRows``."""
        if self._target is not None:
            ends = {p: max(start.get(p, 0), end) for p, end in self._target.items()}
        else:
            floors = dict(self._known)
            for p, offset in start.items():
                floors[p] = max(floors.get(p, 0), offset)
            ends = _probe_ends(self._settings, floors)
            self._known = ends
            if self._available_now:
                self._target = ends
        if isinstance(limit, ReadMaxRows):
            return cap_offsets(start, ends, limit.max_rows)
        return ends

    def reportLatestOffset(self) -> dict[str, int] | None:  # noqa: N802 - Spark's name
        """The ends of the last probe, for the query's progress reports."""
        return dict(self._known) or None

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802 - Spark's name
        # The target is the first probe's answer: the probe needs the run's start offsets
        # (from the checkpoint), which only latestOffset receives.
        self._available_now = True
        self._target = None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return _ranges(start, end)

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, _Range)
        return _read(self._settings, partition)

    def commit(self, end: dict[str, int]) -> None:
        # Nothing to release: the offsets live in Spark's checkpoint, not in a consumer group.
        del end


class CallbacksDataSource(DataSource):
    """The ``purgatory-callbacks`` data source: one row of :data:`SCHEMA` per callback record.

    Register it once per session with ``spark.dataSource.register(CallbacksDataSource)``, then
    ``spark.read.format("purgatory-callbacks")`` (batch: from ``starting_offsets`` to the ends
    probed at planning time) or ``spark.readStream.format("purgatory-callbacks")`` (streaming,
    resumable from the query's checkpoint). The options are listed in the module docstring.

    Raises:
        ConfigError: (when Spark plans the read) an option is missing, unknown or invalid;
            the message names it.
    """

    @classmethod
    def name(cls) -> str:
        return _NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        del schema
        return _BatchReader(_settings(self.options))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        del schema
        return _StreamReader(_settings(self.options))


def dedupe(df: DataFrame) -> DataFrame:
    """Drop the duplicate callbacks of an at-least-once stream: the same ``id``.

    A re-sent callback repeats its ``id`` exactly, and two different outcomes never share one
    (even with the same ``op_id`` and ``sequence``, in other scopes or partitions), so only the
    copies go.

    On a streaming DataFrame, ``dropDuplicates`` keeps every key seen in the query's state
    store for ever; for a long-running query add an event-time watermark and use
    ``withWatermark(...).dropDuplicatesWithinWatermark(["id"])`` instead
    (for example on ``timestamp_millis(outcome_ms)``), which bounds the state by the delay.

    Args:
        df: rows of :data:`SCHEMA` (at least the ``id`` column).

    Returns:
        ``df`` with one row per ``id``.
    """
    return df.dropDuplicates(["id"])
