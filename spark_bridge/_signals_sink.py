"""The ``purgatory-signals`` sink: DataFrame rows -> signal records on Kafka (spark_bridge layer).

A PySpark Python data source, so no connector jar is needed. Batch
``df.write.format("purgatory-signals")...mode("append").save()`` and streaming
``df.writeStream.format("purgatory-signals")...start()`` publish one ``signal`` record per row,
encoded by :func:`purgatory._codec.encode_signal`, with the scope in UTF-8 as the message key.

Theory of operation. Spark builds the writer on the driver, where the options, the schema and
the broker are checked, so a wrong option, a missing or mistyped column, or an unreachable broker
fails the job before any task runs, with a message naming the option or the column. Each task
then encodes every row of its partition, and only then sends them with one kafka-python
producer, flushes, and raises on any delivery error, so Spark retries the task (or fails the
micro-batch) instead of dropping records. A row that cannot become a valid signal (null or empty
scope or key, a key over ``max_key_bytes``, a negative event time, a payload that is not JSON)
fails the task with a ``RowError`` naming the column and the row's values, before anything of
that task is sent: no silent drops, and no half-sent partition. Until the send, a task keeps its
encoded records in memory up to ``stage_memory_bytes`` (64 MiB; record bytes plus about 130
bytes of Python overhead each) and the rest in an unlinked temporary file in ``stage_dir``
(default: the first of Spark's local directories), so memory stays bounded whatever the
partition's size (see :mod:`spark_bridge._staging`).

Delivery is at-least-once, and that is enough: a signal is identified by its ``(scope, key)``,
and it is a fact, not a token, so re-delivering one satisfies nothing new (an operation that it
completed is finished, and one waiting on it already counts it) and only refreshes its TTL.

Watermarks (``watermark=true``, with ``event_time_column``): after each batch the sink
publishes, per scope, ``max(event time) - watermark_delay_ms`` on the signals topic, after the
batch's signals and never backward (see :mod:`spark_bridge._writer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    Row,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from purgatory._codec import (
    Limits,
    RecordError,
    SignalRecord,
    canonical_json,
    decode_signal,
    encode_signal,
    message_key,
)
from purgatory._core import ConfigError, UsageError
from spark_bridge._staging import Staging
from spark_bridge._writer import (
    KafkaTarget,
    RecordsStreamWriter,
    RecordsWriter,
    RowError,
    WatermarkPolicy,
    append_only,
    epoch_ms,
    int_option,
    kafka_target,
    probe,
    show_row,
    staging,
    watermark_policy,
)

__all__ = ["SignalsDataSource", "check_json_type"]

_JSON_LEAVES = (StringType, BooleanType, ByteType, ShortType, IntegerType, LongType, FloatType,
                DoubleType, NullType)  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Options:
    """The sink's options, parsed and checked on the driver."""

    target: KafkaTarget
    scope: str | None
    scope_column: str | None
    key_column: str
    event_time_column: str | None
    payload_column: str | None
    watermark: WatermarkPolicy
    max_key_bytes: int


def _parse_options(options: Mapping[str, str]) -> _Options:
    """Raises ConfigError naming the option."""
    target = kafka_target(options, "purgatory.signals")
    scope, scope_column = options.get("scope"), options.get("scope_column")
    if scope is not None and scope_column is not None:
        raise ConfigError("options 'scope' and 'scope_column' exclude each other: give one")
    if scope is not None:
        try:
            message_key(SignalRecord(scope=scope, key="-"))
        except RecordError as e:
            raise ConfigError(f"option 'scope': {e.reason}") from None
    event_time_column = options.get("event_time_column") or None
    return _Options(
        target=target,
        scope=scope,
        scope_column=None if scope is not None else (scope_column or "scope"),
        key_column=options.get("key_column") or "key",
        event_time_column=event_time_column,
        payload_column=options.get("payload_column") or None,
        watermark=watermark_policy(options, event_time_column),
        max_key_bytes=int_option(options, "max_key_bytes", Limits().max_key_bytes, 1),
    )


def check_json_type(kind: DataType) -> bool:
    """True if every value of a column of this type is plain JSON (a payload column)."""
    if isinstance(kind, StructType):
        return all(check_json_type(f.dataType) for f in kind.fields)
    if isinstance(kind, ArrayType):
        return check_json_type(kind.elementType)
    if isinstance(kind, MapType):
        return isinstance(kind.keyType, StringType) and check_json_type(kind.valueType)
    return isinstance(kind, _JSON_LEAVES)


def _check_schema(opts: _Options, schema: StructType) -> None:
    """Raises ConfigError naming the column (and the option that chose it)."""
    kinds = {f.name: f.dataType for f in schema.fields}
    wanted = [
        ("scope_column", opts.scope_column, (StringType,), "a string"),
        ("key_column", opts.key_column, (StringType,), "a string"),
        ("event_time_column", opts.event_time_column,
         (TimestampType, TimestampNTZType, LongType, IntegerType),
         "a timestamp or an integer of epoch milliseconds"),
        ("payload_column", opts.payload_column, (StringType, StructType, MapType, ArrayType),
         "a string of JSON text, or a struct, map or array of JSON values"),
    ]  # fmt: skip
    for option, column, types, description in wanted:
        if column is None:
            continue
        if column not in kinds:
            raise ConfigError(
                f"column {column!r} (option {option!r}) is not in the DataFrame; "
                f"its columns are {sorted(kinds)}"
            )
        kind = kinds[column]
        if not isinstance(kind, types) or (
            option == "payload_column"
            and not isinstance(kind, StringType)
            and not check_json_type(kind)
        ):
            raise ConfigError(
                f"column {column!r} (option {option!r}) must be {description}, "
                f"got {kind.simpleString()}"
            )


class _Encoder:
    """Row -> (scope, event time, message key, value), validated as the service will decode it."""

    def __init__(self, opts: _Options, naive_is_utc: bool) -> None:
        self._opts = opts
        self._limits = Limits(max_key_bytes=opts.max_key_bytes)
        self._naive_is_utc = naive_is_utc
        self._columns = {
            "scope": opts.scope_column or "scope (option)",
            "key": opts.key_column,
            "event_time_ms": opts.event_time_column or "",
            "payload": opts.payload_column or "",
        }

    def __call__(self, row: Row) -> tuple[str, int | None, bytes, bytes]:
        """Raises RowError naming the column and showing the row."""
        opts = self._opts
        cells = row.asDict(recursive=True)
        scope = opts.scope if opts.scope is not None else cells.get(opts.scope_column or "")
        try:
            event_time = None
            if opts.event_time_column is not None:
                event_time = epoch_ms(cells[opts.event_time_column], self._naive_is_utc)
            payload = None if opts.payload_column is None else cells[opts.payload_column]
            if payload is not None and not isinstance(payload, str):
                try:
                    payload = canonical_json(payload)
                except UsageError as e:
                    raise RecordError("payload", str(e)) from None
            record = SignalRecord(scope, cells[opts.key_column], event_time, payload)  # type: ignore[arg-type]
            value = encode_signal(record)
            decode_signal(value, self._limits)  # the service's own checks, limits included
            return record.scope, record.event_time_ms, message_key(record), value
        except RecordError as e:
            column = self._columns.get(e.field or "", "") or "(row)"
            raise RowError(column, f"{e.reason}; row: {show_row(cells)}") from None


def _writer_parts(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> tuple[KafkaTarget, WatermarkPolicy, _Encoder, Staging]:
    """Check the options, the columns and the broker on the driver; raises naming them."""
    append_only("purgatory-signals", overwrite)
    opts = _parse_options(options)
    _check_schema(opts, schema)
    policy = staging(options)
    kind = None if opts.event_time_column is None else schema[opts.event_time_column].dataType
    probe(opts.target)
    encoder = _Encoder(opts, isinstance(kind, TimestampNTZType))
    return opts.target, opts.watermark, encoder, policy


class SignalsDataSource(DataSource):
    """The ``purgatory-signals`` data source: write DataFrames as purgatory signals.

    Options (all strings):
        bootstrap_servers: required, ``host:port[,host:port...]``.
        topic: default ``purgatory.signals``.
        scope_column: default ``scope``; or ``scope``: one fixed scope for every row.
        key_column: default ``key``.
        event_time_column: optional; a timestamp, or an integer of epoch milliseconds.
        payload_column: optional; JSON text, or a struct/map/array serialized to JSON.
        watermark: ``true`` publishes per-scope event-time high marks after each batch;
            ``watermark_delay_ms`` (default 0) is subtracted; ``watermark_state_path`` keeps
            the last marks (default: in a local ``checkpointLocation``).
        max_key_bytes: default 512; connect_timeout_ms: default 10000 (driver check and
            producer bootstrap); delivery_timeout_ms: default 120000.
        stage_memory_bytes: default 67108864 (64 MiB): a task's encoded records kept in memory
            until its whole partition is encoded; beyond it they are spooled to a temporary
            file in ``stage_dir`` (default: the first of ``SPARK_LOCAL_DIRS``, else the
            system's temporary directory).
        client_id, security_protocol, sasl_mechanism, sasl_username, sasl_password,
            ssl_cafile, ssl_certfile, ssl_keyfile, ssl_password: passed to kafka-python.

    Raises (from ``save()``/``start()``, wrapped by Spark): ConfigError naming the option or
    the column, TransportError naming ``bootstrap_servers``, RowError naming the column.
    """

    @classmethod
    def name(cls) -> str:
        return "purgatory-signals"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return RecordsWriter(*_writer_parts(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return RecordsStreamWriter(*_writer_parts(self.options, schema, overwrite))
