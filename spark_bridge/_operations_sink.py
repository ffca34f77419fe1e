"""The ``purgatory-operations`` sink: DataFrame rows -> registrations on Kafka (spark_bridge layer).

Batch ``df.write.format("purgatory-operations")...mode("append").save()`` and streaming
``df.writeStream.format("purgatory-operations")...start()`` publish one ``register`` record per
row on the requests topic (:func:`purgatory._codec.encode_request`), keyed by the scope.

Columns. A field is read from the column of its default name when the DataFrame has one, or
from the column an option names (which must then exist); a field with no column takes the fixed
value of its option, or the record's default:

============  ====================  ============================  ===============================
field         column (option)       type                          without a column
============  ====================  ============================  ===============================
op_id         ``op_id``             string                        required
scope         ``scope``             string                        option ``scope``, else required
keys          ``keys``              array<string>                 no keys: a timer
condition     ``condition``         string: all, any, count       option ``condition``, else all
count         ``count``             integer                       none
deadline      ``deadline_ms``       timestamp or epoch-ms integer option ``timeout_ms``
timeout_ms    ``timeout_ms``        integer                       option ``timeout_ms``
time_domain   ``time_domain``       string                        option ``time_domain``
payload       ``payload``           JSON text, struct, map, array none
============  ====================  ============================  ===============================

Each row must end with exactly one of a deadline or a timeout. A row that cannot become a valid
registration fails the task with a ``RowError`` naming the column and showing the row, before
anything of that task is sent: a task encodes every row of its partition before it sends the
first record. Until then it keeps the encoded records in memory up to ``stage_memory_bytes``
(64 MiB; record bytes plus about 130 bytes of Python overhead each) and spools the rest to an
unlinked temporary file in ``stage_dir`` (default: the first of Spark's local directories), so
memory stays bounded whatever the partition's size (see :mod:`spark_bridge._staging`). Tasks
that succeeded before another failed have sent their records, and Spark's retry sends them
again: they are duplicates, as below.

Semantics on the service. Registrations are idempotent: the same ``(scope, op_id)`` with the same
body is a duplicate, so at-least-once delivery (a retried task) is harmless, except for a timer
written with a relative ``timeout_ms``, which a re-send re-arms from its arrival. A timer (no keys)
registered again with another deadline is **re-armed**; that is how a streaming job keeps one
inactivity timer per entity: write ``(op_id = "session/<entity>", deadline = last event +
gap)`` each micro-batch. With ``watermark=true`` and ``event_time_column`` the sink then
publishes the scope's watermark (``max(event time) - watermark_delay_ms``, never backward) **on
the requests topic, after the batch's registrations**: a scope's records share a partition, so
the service applies the watermark only once the re-arms before it are applied, and a timer is
never fired by the watermark of the batch that moved it. A registration the service refuses
(another body under the same id) goes to its dead-letter topic with the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import (
    ArrayType,
    ByteType,
    DataType,
    IntegerType,
    LongType,
    MapType,
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
    RegisterRequest,
    canonical_json,
    decode_request,
    encode_request,
    message_key,
)
from purgatory._core import Condition, ConfigError, TimeDomain, UsageError
from spark_bridge._signals_sink import check_json_type
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

__all__ = ["OperationsDataSource"]

_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
_TIMES = (TimestampType, TimestampNTZType, *_INTEGERS)


@dataclass(frozen=True, slots=True)
class _Field:
    """One registration field: the column it may come from and the types that column may have."""

    name: str
    types: tuple[type[DataType], ...]
    description: str


_FIELDS = (
    _Field("op_id", (StringType,), "a string"),
    _Field("scope", (StringType,), "a string"),
    _Field("keys", (ArrayType,), "an array of strings"),
    _Field("condition", (StringType,), "a string (all, any, count)"),
    _Field("count", _INTEGERS, "an integer"),
    _Field("deadline_ms", _TIMES, "a timestamp or an integer of epoch milliseconds"),
    _Field("timeout_ms", _INTEGERS, "an integer of milliseconds"),
    _Field("time_domain", (StringType,), "a string (processing_time, event_time)"),
    _Field("payload", (StringType, ArrayType, MapType, StructType), "JSON text or a struct"),
)
_OPTION = {"deadline_ms": "deadline_column", "timeout_ms": "timeout_column"}


def _option_of(field: str) -> str:
    return _OPTION.get(field, f"{field}_column")


@dataclass(frozen=True, slots=True)
class _Options:
    """The sink's options and the column of each field, checked on the driver."""

    target: KafkaTarget
    columns: dict[str, str]  # field -> column
    naive_is_utc: dict[str, bool]  # field -> a TIMESTAMP_NTZ column
    scope: str | None
    condition: Condition
    time_domain: TimeDomain
    timeout_ms: int | None
    event_time_column: str | None
    watermark: WatermarkPolicy
    limits: Limits


def _element_is_string(kind: DataType) -> bool:
    return isinstance(kind, ArrayType) and isinstance(kind.elementType, StringType)


def _columns(options: Mapping[str, str], schema: StructType) -> dict[str, str]:
    """field -> column; raises ConfigError naming the column and its option."""
    kinds = {f.name: f.dataType for f in schema.fields}
    out: dict[str, str] = {}
    for spec in _FIELDS:
        option = _option_of(spec.name)
        named = options.get(option)
        column = named or spec.name
        if column not in kinds:
            if named:
                raise ConfigError(
                    f"column {column!r} (option {option!r}) is not in the DataFrame; "
                    f"its columns are {sorted(kinds)}"
                )
            continue
        kind = kinds[column]
        ok = isinstance(kind, spec.types)
        if ok and spec.name == "keys":
            ok = _element_is_string(kind)
        if ok and spec.name == "payload" and not isinstance(kind, StringType):
            ok = check_json_type(kind)
        if not ok:
            raise ConfigError(
                f"column {column!r} (option {option!r}) must be {spec.description}, "
                f"got {kind.simpleString()}"
            )
        out[spec.name] = column
    return out


def _enum_option(options: Mapping[str, str], name: str, kind: type[Any], default: Any) -> Any:
    raw = options.get(name)
    try:
        return default if raw is None else kind(raw.strip().lower())
    except ValueError:
        values = ", ".join(v.value for v in kind)
        raise ConfigError(f"option {name!r} must be one of {values}, got {raw!r}") from None


def _parse(options: Mapping[str, str], schema: StructType) -> _Options:
    """Raises ConfigError naming the option or the column."""
    target = kafka_target(options, "purgatory.requests")
    columns = _columns(options, schema)
    if "op_id" not in columns:
        raise ConfigError(
            "column 'op_id' (option 'op_id_column') is not in the DataFrame; "
            f"its columns are {sorted(schema.fieldNames())}"
        )
    scope = options.get("scope")
    if scope is not None and "scope" in columns and options.get("scope_column"):
        raise ConfigError("options 'scope' and 'scope_column' exclude each other: give one")
    if scope is not None:
        columns.pop("scope", None)
    elif "scope" not in columns:
        raise ConfigError(
            "column 'scope' (option 'scope_column') is not in the DataFrame and option "
            "'scope' is unset: give one"
        )
    timeout = options.get("timeout_ms")
    timeout_ms = None if timeout is None else int_option(options, "timeout_ms", 0, 1)
    event_time_column = options.get("event_time_column") or None
    if event_time_column is not None and event_time_column not in schema.fieldNames():
        raise ConfigError(
            f"column {event_time_column!r} (option 'event_time_column') is not in the DataFrame"
        )
    kind = None if event_time_column is None else schema[event_time_column].dataType
    if event_time_column is not None and not isinstance(kind, _TIMES):
        raise ConfigError(
            f"column {event_time_column!r} (option 'event_time_column') must be a timestamp or "
            f"an integer of epoch milliseconds, got {kind.simpleString() if kind else kind}"
        )
    naive = {
        name: isinstance(schema[column].dataType, TimestampNTZType)
        for name, column in columns.items()
    }
    if event_time_column is not None:
        naive["(event time)"] = isinstance(schema[event_time_column].dataType, TimestampNTZType)
    limits = Limits(max_key_bytes=int_option(options, "max_key_bytes", Limits().max_key_bytes, 1))
    return _Options(
        target=target,
        columns=columns,
        naive_is_utc=naive,
        scope=scope,
        condition=_enum_option(options, "condition", Condition, Condition.ALL),
        time_domain=_enum_option(options, "time_domain", TimeDomain, TimeDomain.PROCESSING_TIME),
        timeout_ms=timeout_ms,
        event_time_column=event_time_column,
        watermark=watermark_policy(options, event_time_column),
        limits=limits,
    )


class _Encoder:
    """Row -> (scope, event time, message key, value), validated as the service will decode it."""

    def __init__(self, opts: _Options) -> None:
        self._opts = opts

    def __call__(self, row: Row) -> tuple[str, int | None, bytes, bytes]:
        """Raises RowError naming the column and showing the row."""
        opts, columns = self._opts, self._opts.columns
        cells = row.asDict(recursive=True)

        def cell(name: str, default: object = None) -> object:
            column = columns.get(name)
            value = None if column is None else cells[column]
            return default if value is None else value

        try:
            keys = cell("keys", [])
            deadline = epoch_ms(cell("deadline_ms"), opts.naive_is_utc.get("deadline_ms", False))
            timeout = cell("timeout_ms")
            if deadline is None and timeout is None:
                timeout = opts.timeout_ms
            payload = cell("payload")
            if payload is not None and not isinstance(payload, str):
                try:
                    payload = canonical_json(payload)
                except UsageError as e:
                    raise RecordError("payload", str(e)) from None
            record = RegisterRequest(
                op_id=cell("op_id"),  # type: ignore[arg-type]
                scope=opts.scope if opts.scope is not None else cell("scope"),  # type: ignore[arg-type]
                keys=tuple(keys) if isinstance(keys, list) else keys,  # type: ignore[arg-type]
                condition=cell("condition", opts.condition),  # type: ignore[arg-type]
                count=cell("count"),  # type: ignore[arg-type]
                deadline_ms=deadline,  # type: ignore[arg-type]
                timeout_ms=timeout,  # type: ignore[arg-type]
                time_domain=cell("time_domain", opts.time_domain),  # type: ignore[arg-type]
                payload=payload,
            )
            value = encode_request(record)
            decode_request(value, opts.limits)  # the service's own checks, limits included
            event_time = None
            if opts.event_time_column is not None:
                raw = epoch_ms(cells[opts.event_time_column], opts.naive_is_utc["(event time)"])
                if not isinstance(raw, int) or raw < 0:
                    raise RowError(
                        opts.event_time_column,
                        f"must be a non-negative event time; row: {show_row(cells)}",
                    )
                event_time = raw
            return record.scope, event_time, message_key(record), value
        except RecordError as e:
            if isinstance(e, RowError):
                raise
            field = (e.field or "").split("[", 1)[0]
            if field == "scope" and opts.scope is not None:
                column = "scope (option)"
            elif field in ("deadline_ms", "timeout_ms") and field not in columns:
                column = "timeout_ms (option)" if opts.timeout_ms is not None else field
            else:
                column = columns.get(field, field or "(row)")
            raise RowError(column, f"{e.reason}; row: {show_row(cells)}") from None


def _writer_parts(
    options: Mapping[str, str], schema: StructType, overwrite: bool
) -> tuple[KafkaTarget, WatermarkPolicy, _Encoder, Staging]:
    """Check the options, the columns and the broker on the driver; raises naming them."""
    append_only("purgatory-operations", overwrite)
    opts = _parse(options, schema)
    policy = staging(options)
    probe(opts.target)
    return opts.target, opts.watermark, _Encoder(opts), policy


class OperationsDataSource(DataSource):
    """The ``purgatory-operations`` data source: register one operation per DataFrame row.

    Options (all strings): ``bootstrap_servers`` (required), ``topic`` (default
    ``purgatory.requests``), the column options of the table in the module docstring
    (``op_id_column``, ``scope_column``, ``keys_column``, ``condition_column``,
    ``count_column``, ``deadline_column``, ``timeout_column``, ``time_domain_column``,
    ``payload_column``), the fixed values ``scope``, ``condition``, ``time_domain``,
    ``timeout_ms``, the watermark options ``watermark``, ``event_time_column``,
    ``watermark_delay_ms``, ``watermark_state_path``, and ``max_key_bytes``,
    ``connect_timeout_ms``, ``delivery_timeout_ms``, the staging options
    ``stage_memory_bytes`` (64 MiB) and ``stage_dir`` (see the module docstring) and the Kafka
    client options (``CLIENT_OPTIONS``).

    Raises (from ``save()``/``start()``, wrapped by Spark): ConfigError naming the option or
    the column, TransportError naming ``bootstrap_servers``, RowError naming the column.
    """

    @classmethod
    def name(cls) -> str:
        return "purgatory-operations"

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        return RecordsWriter(*_writer_parts(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return RecordsStreamWriter(*_writer_parts(self.options, schema, overwrite))
