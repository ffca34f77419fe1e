"""The ``purgatory-signals`` sink: DataFrame rows -> signal records on Kafka (spark_bridge layer).

A PySpark Python data source, so no connector jar is needed. Batch
``df.write.format("purgatory-signals")...mode("append").save()`` and streaming
``df.writeStream.format("purgatory-signals")...start()`` publish one ``signal`` record per row,
encoded by :func:`purgatory._codec.encode_signal`, with the scope in UTF-8 as the message key.

Theory of operation. Spark builds the writer on the driver, where the options, the schema and
the broker are checked, so a wrong option, a missing or mistyped column, or an unreachable broker
fails the job before any task runs, with a message naming the option or the column. Each task
then encodes its rows, sends them with one kafka-python producer, flushes, and raises on any
delivery error, so Spark retries the task (or fails the micro-batch) instead of dropping records.
A row that cannot become a valid signal (null or empty scope or key, a key over
``max_key_bytes``, a negative event time, a payload that is not JSON) fails the task with a
:class:`SignalRowError` naming the column and the row's values: no silent drops. Delivery is
at-least-once; that is enough because signals are facts, not tokens: re-delivering one only
refreshes its TTL on the service.

Watermarks (``watermark=true``). A sink never sees Spark's own query watermark (it lives in the
stateful operators, and the sink is handed rows only), so the watermark published here is the
batch's event-time high mark: after each micro-batch (in ``commit`` on the driver, once every task
has flushed its signals) the sink publishes, for every scope seen in the batch, a ``watermark``
record at ``max(event time) - watermark_delay_ms``. Publishing after the signals keeps the order
the service needs (a watermark never overtakes the signals it covers), and the delay is the
allowance for late rows, like Spark's ``withWatermark``. Marks never go backward: the last mark
per scope is kept in a small JSON file (``watermark_state_path``, by default inside a local
``checkpointLocation``) and only higher marks are published; without a state file they are
monotonic within one driver process, and the service ignores backward watermarks anyway.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
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
    WatermarkRecord,
    canonical_json,
    decode_signal,
    encode_signal,
    message_key,
)
from purgatory._core import ConfigError, TransportError, UsageError

__all__ = ["SignalRowError", "SignalsDataSource", "register_signals_sink"]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_MS = dt.timedelta(milliseconds=1)
_JSON_LEAVES = (StringType, BooleanType, ByteType, ShortType, IntegerType, LongType, FloatType,
                DoubleType, NullType)  # fmt: skip
_SECURITY = {"security_protocol": "security_protocol", "sasl_mechanism": "sasl_mechanism",
             "sasl_username": "sasl_plain_username", "sasl_password": "sasl_plain_password",
             "ssl_cafile": "ssl_cafile"}  # fmt: skip
# Without a state file, the high marks of this driver process (see the module docstring).
_MARKS_IN_PROCESS: dict[tuple[str, str], dict[str, int]] = {}


class SignalRowError(RecordError):
    """A row that cannot become a signal; ``field`` is the column, the message shows the row."""

    def __init__(self, column: str, reason: str) -> None:
        super().__init__(column, reason)
        self.args = (f"column {column!r}: {reason}",)


@dataclass(frozen=True, slots=True)
class _Options:
    """The sink's options, parsed and checked on the driver."""

    bootstrap_servers: str
    topic: str
    scope: str | None
    scope_column: str | None
    key_column: str
    event_time_column: str | None
    payload_column: str | None
    watermark: bool
    watermark_delay_ms: int
    watermark_state_path: str | None
    max_key_bytes: int
    connect_timeout_ms: int
    delivery_timeout_ms: int
    security: tuple[tuple[str, str], ...]

    def producer(self, **extra: Any) -> Any:
        """A kafka-python producer for these options (imported here: it runs on workers too)."""
        from kafka import KafkaProducer  # noqa: PLC0415

        return KafkaProducer(
            bootstrap_servers=self.bootstrap_servers.split(","),
            acks="all",
            linger_ms=5,
            bootstrap_timeout_ms=self.connect_timeout_ms,
            max_block_ms=self.connect_timeout_ms,
            request_timeout_ms=min(30_000, self.delivery_timeout_ms),
            delivery_timeout_ms=self.delivery_timeout_ms,
            **dict(self.security),
            **extra,
        )


def _int_option(options: Mapping[str, str], name: str, default: int, low: int) -> int:
    raw = options.get(name)
    try:
        value = default if raw is None else int(raw)
    except ValueError:
        raise ConfigError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < low:
        raise ConfigError(f"option {name!r} must be >= {low}, got {value}")
    return value


def _parse_options(options: Mapping[str, str]) -> _Options:
    """Raises ConfigError naming the option."""
    servers = (options.get("bootstrap_servers") or "").strip()
    if not servers:
        raise ConfigError("option 'bootstrap_servers' is required (host:port[,host:port...])")
    watermark = (options.get("watermark") or "false").strip().lower()
    if watermark not in ("true", "false"):
        raise ConfigError(f"option 'watermark' must be 'true' or 'false', got {watermark!r}")
    scope, scope_column = options.get("scope"), options.get("scope_column")
    if scope is not None and scope_column is not None:
        raise ConfigError("options 'scope' and 'scope_column' exclude each other: give one")
    if scope is not None:
        try:
            message_key(SignalRecord(scope=scope, key="-"))
        except RecordError as e:
            raise ConfigError(f"option 'scope': {e.reason}") from None
    event_time_column = options.get("event_time_column") or None
    if watermark == "true" and event_time_column is None:
        raise ConfigError("option 'watermark' is 'true' but option 'event_time_column' is unset")
    state_path = options.get("watermark_state_path")
    checkpoint = options.get("checkpointLocation") or ""
    if state_path is None and checkpoint and "://" not in checkpoint.removeprefix("file://"):
        state_path = os.path.join(checkpoint.removeprefix("file:"), "purgatory-watermarks.json")
    return _Options(
        bootstrap_servers=servers,
        topic=options.get("topic") or "purgatory.signals",
        scope=scope,
        scope_column=None if scope is not None else (scope_column or "scope"),
        key_column=options.get("key_column") or "key",
        event_time_column=event_time_column,
        payload_column=options.get("payload_column") or None,
        watermark=watermark == "true",
        watermark_delay_ms=_int_option(options, "watermark_delay_ms", 0, 0),
        watermark_state_path=state_path,
        max_key_bytes=_int_option(options, "max_key_bytes", Limits().max_key_bytes, 1),
        connect_timeout_ms=_int_option(options, "connect_timeout_ms", 10_000, 1),
        delivery_timeout_ms=_int_option(options, "delivery_timeout_ms", 120_000, 1),
        security=tuple((_SECURITY[k], v) for k in sorted(_SECURITY) if (v := options.get(k))),
    )


def _json_type(kind: DataType) -> bool:
    if isinstance(kind, StructType):
        return all(_json_type(f.dataType) for f in kind.fields)
    if isinstance(kind, ArrayType):
        return _json_type(kind.elementType)
    if isinstance(kind, MapType):
        return isinstance(kind.keyType, StringType) and _json_type(kind.valueType)
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
            option == "payload_column" and not isinstance(kind, StringType) and not _json_type(kind)
        ):
            raise ConfigError(
                f"column {column!r} (option {option!r}) must be {description}, "
                f"got {kind.simpleString()}"
            )


def _probe(opts: _Options) -> None:
    """Raises TransportError naming bootstrap_servers (or topic) if the broker does not answer."""
    from kafka.errors import KafkaError  # noqa: PLC0415

    try:
        producer = opts.producer()
    except KafkaError as e:
        raise TransportError(
            f"option 'bootstrap_servers': no broker answered at {opts.bootstrap_servers!r} "
            f"within {opts.connect_timeout_ms} ms (option 'connect_timeout_ms'): {e}"
        ) from None
    try:
        if not producer.partitions_for(opts.topic):
            raise TransportError(f"option 'topic': {opts.topic!r} has no partitions")
    except KafkaError as e:
        raise TransportError(
            f"option 'topic': no metadata for {opts.topic!r} at {opts.bootstrap_servers!r}: {e}"
        ) from None
    finally:
        producer.close(timeout=1)


def _epoch_ms(value: object) -> object:
    """Epoch milliseconds of a timestamp cell (naive means local, as PySpark hands them out)."""
    if isinstance(value, dt.datetime):
        aware = value if value.tzinfo is not None else value.astimezone()
        return (aware - _EPOCH) // _ONE_MS
    return value


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


@dataclass(slots=True)
class _TaskReport(WriterCommitMessage):
    """What one task wrote: its record count and, per scope, the highest event time."""

    records: int = 0
    high_marks: dict[str, int] = field(default_factory=dict)


class _Encoder:
    """Row -> (message key, value), validated as the service will decode it."""

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

    def encode(self, row: Row) -> tuple[SignalRecord, bytes, bytes]:
        """Raises SignalRowError naming the column and showing the row."""
        opts = self._opts
        cells = row.asDict(recursive=True)
        scope = opts.scope if opts.scope is not None else cells.get(opts.scope_column or "")
        try:
            event_time = None
            if opts.event_time_column is not None:
                raw = cells[opts.event_time_column]
                if self._naive_is_utc and isinstance(raw, dt.datetime):
                    raw = raw.replace(tzinfo=dt.UTC)
                event_time = _epoch_ms(raw)
            payload = None if opts.payload_column is None else cells[opts.payload_column]
            if payload is not None and not isinstance(payload, str):
                try:
                    payload = canonical_json(payload)
                except UsageError as e:
                    raise RecordError("payload", str(e)) from None
            record = SignalRecord(scope, cells[opts.key_column], event_time, payload)  # type: ignore[arg-type]
            value = encode_signal(record)
            decode_signal(value, self._limits)  # the service's own checks, limits included
            return record, message_key(record), value
        except RecordError as e:
            column = self._columns.get(e.field or "", "") or "(row)"
            shown = ", ".join(f"{k}={_short(v)}" for k, v in cells.items())
            raise SignalRowError(column, f"{e.reason}; row: {shown}") from None


class _SignalsWriterBase:
    """The write and commit logic shared by the batch and the streaming writer."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("mode: the purgatory-signals sink only appends; use mode('append')")
        self._opts = _parse_options(options)
        _check_schema(self._opts, schema)
        kind = None
        if self._opts.event_time_column is not None:
            kind = schema[self._opts.event_time_column].dataType
        self._naive_is_utc = isinstance(kind, TimestampNTZType)
        _probe(self._opts)

    def write(self, iterator: Iterator[Row]) -> _TaskReport:
        """Send this partition's rows, flush, and raise on any delivery error."""
        from kafka.errors import KafkaError  # noqa: PLC0415

        opts, encoder, report = self._opts, _Encoder(self._opts, self._naive_is_utc), _TaskReport()
        errors: list[BaseException] = []
        try:
            producer = opts.producer()
        except KafkaError as e:
            raise TransportError(
                f"option 'bootstrap_servers' {opts.bootstrap_servers!r}: {e}"
            ) from None
        try:
            for row in iterator:
                record, key, value = encoder.encode(row)
                producer.send(opts.topic, key=key, value=value).add_errback(errors.append)
                report.records += 1
                if record.event_time_ms is not None:
                    marks = report.high_marks
                    marks[record.scope] = max(marks.get(record.scope, 0), record.event_time_ms)
            producer.flush(timeout=opts.delivery_timeout_ms / 1000)
        except KafkaError as e:
            errors.append(e)
        finally:
            producer.close(timeout=opts.delivery_timeout_ms / 1000)
        if errors:
            raise TransportError(
                f"{len(errors)} signal record(s) not delivered to topic {opts.topic!r} at "
                f"{opts.bootstrap_servers!r} (the task fails so that Spark retries it): {errors[0]}"
            )
        return report

    def _publish_watermarks(self, messages: list[WriterCommitMessage | None]) -> None:
        opts = self._opts
        if not opts.watermark:
            return
        high: dict[str, int] = {}
        for message in messages:
            if isinstance(message, _TaskReport):
                for scope, mark in message.high_marks.items():
                    high[scope] = max(high.get(scope, 0), mark)
        published = self._load_marks()
        due = {
            scope: wm
            for scope, mark in sorted(high.items())
            if (wm := max(0, mark - opts.watermark_delay_ms)) > published.get(scope, -1)
        }
        if not due:
            return
        from kafka.errors import KafkaError  # noqa: PLC0415

        errors: list[BaseException] = []
        producer = opts.producer()
        try:
            for scope, wm in due.items():
                record = WatermarkRecord(scope, wm)
                future = producer.send(
                    opts.topic, key=message_key(record), value=encode_signal(record)
                )
                future.add_errback(errors.append)
            producer.flush(timeout=opts.delivery_timeout_ms / 1000)
        except KafkaError as e:
            errors.append(e)
        finally:
            producer.close(timeout=opts.delivery_timeout_ms / 1000)
        if errors:
            raise TransportError(f"watermark records not delivered to {opts.topic!r}: {errors[0]}")
        self._save_marks({**published, **due})

    def _load_marks(self) -> dict[str, int]:
        path = self._opts.watermark_state_path
        if path is None:
            return dict(_MARKS_IN_PROCESS.get((self._opts.bootstrap_servers, self._opts.topic), {}))
        try:
            with open(path, encoding="utf-8") as f:
                marks: dict[str, int] = json.load(f)
        except FileNotFoundError:
            return {}
        return marks

    def _save_marks(self, marks: dict[str, int]) -> None:
        path = self._opts.watermark_state_path
        if path is None:
            _MARKS_IN_PROCESS[(self._opts.bootstrap_servers, self._opts.topic)] = marks
            return
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".purgatory-watermarks-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(marks, f, sort_keys=True)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class _SignalsWriter(_SignalsWriterBase, DataSourceWriter):
    """Batch writes; ``watermark=true`` publishes the job's high marks once, at the end."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._publish_watermarks(messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: delivered signals are facts, and Spark re-runs the whole write."""


class _SignalsStreamWriter(_SignalsWriterBase, DataSourceStreamWriter):
    """Streaming writes; ``watermark=true`` publishes each micro-batch's high marks."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self._publish_watermarks(messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to undo: the micro-batch is re-run, and re-sent signals are idempotent."""


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
        security_protocol, sasl_mechanism, sasl_username, sasl_password, ssl_cafile: passed
            to kafka-python.

    Raises (from ``save()``/``start()``, wrapped by Spark): ConfigError naming the option or
    the column, TransportError naming ``bootstrap_servers``, SignalRowError naming the column.
    """

    @classmethod
    def name(cls) -> str:
        return "purgatory-signals"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return _SignalsWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return _SignalsStreamWriter(self.options, schema, overwrite)


def register_signals_sink(spark: Any) -> None:
    """Register the ``purgatory-signals`` format with ``spark`` (a SparkSession)."""
    spark.dataSource.register(SignalsDataSource)
