"""Column helpers for Spark's own Kafka connector (spark_bridge layer: ``format("kafka")``).

A Spark user who reads and writes Kafka already does it with Spark's connector (the
``spark-sql-kafka-0-10`` jar): offsets in the checkpoint, the JVM's Kafka client, ``kafka.*``
options for security and ``kafka.isolation.level``. These helpers put purgatory's wire format on
that path, as column expressions only, so no Python worker stands between Kafka and the JVM::

    raw = (spark.readStream.format("kafka")
           .option("kafka.bootstrap.servers", "kafka:9092")
           .option("subscribe", "purgatory.callbacks").load())
    callbacks = dedupe(callbacks_from_kafka(raw))          # the rows of CALLBACKS_SCHEMA

    (signals_to_kafka(events, key_column="table")          # key, value: a signal per row
     .write.format("kafka").option("kafka.bootstrap.servers", "kafka:9092")
     .option("topic", "purgatory.signals").save())

Reading: :func:`callbacks_from_kafka` parses each record's value with ``from_json`` and checks
what :func:`purgatory._codec.decode_callback` checks that a schema cannot say (the version and
type, every required field present and of its type, the outcome and time domain among their
values); a record that fails is, by default, a failed query naming its topic, partition, offset
and the first field at fault (``on_malformed="skip"`` drops it instead). ``signals`` and
``payload`` are JSON text, as the ``purgatory-callbacks`` source gives them (equal as JSON; the
text may differ in number spelling and in escaping).

Writing: each ``*_to_kafka`` helper returns ``key`` (the scope in UTF-8, which is the key the
service requires) and ``value`` (the record), ready for ``write.format("kafka")``; a stream
writes each micro-batch so in ``writeStream.foreachBatch`` (a streaming DataFrame is refused:
Spark sorts no stream, and the sort below is what keeps a faulty task from sending).
A row that cannot become a record fails the write with the column and the row named, and the
task that holds it publishes nothing: the connector sends rows as it reads them, so the helper
first sorts each task's rows with the faulty ones in front (``sortWithinPartitions`` on the
fault: a sort reads its whole input before it yields a row, and needs no shuffle), and the
first faulty row raises before any row of its task reaches the producer. Other tasks of the
same job may have published theirs, as with any failed Spark write; a retried signal is
harmless (a signal is a fact, identified by its scope and key).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import functions as F  # noqa: N812 - the name every Spark user reads
from pyspark.sql.types import (
    ArrayType,
    BooleanType,
    DataType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    VariantType,
)

from purgatory._codec import Limits
from purgatory._core import ConfigError
from purgatory._core.engine.validate import MAX_TIME_MS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "callbacks_from_kafka",
    "operations_to_kafka",
    "signals_to_kafka",
    "watermarks_to_kafka",
]

_FORMAT_VERSION = 1
_ERROR = "_purgatory_error"

# The callback record as from_json reads it: payload as a variant (so that a JSON string stays
# JSON text), signals as the text of its object (from_json keeps an object as its JSON text).
_WIRE = StructType(
    [
        StructField("v", IntegerType()),
        StructField("type", StringType()),
        StructField("op_id", StringType()),
        StructField("scope", StringType()),
        StructField("outcome", StringType()),
        StructField("registered_ms", LongType()),
        StructField("outcome_ms", LongType()),
        StructField("deadline_ms", LongType()),
        StructField("time_domain", StringType()),
        StructField("sequence", LongType()),
        StructField("partition", IntegerType()),
        StructField("id", StringType()),
        StructField("keys", ArrayType(StringType())),
        StructField("missing", ArrayType(StringType())),
        StructField("signals", StringType()),
        StructField("payload", VariantType()),
        StructField("late", BooleanType()),
    ]
)
_REQUIRED = [f.name for f in _WIRE.fields if f.name not in ("v", "type", "payload")]
_ID_PATTERN = r"^[0-9]+-[0-9]+-[0-9a-f]{16}$"


def _first(*checks: tuple[Column, str]) -> Column:
    """The reason of the first check that holds, or null."""
    return F.coalesce(*(F.when(cond, F.lit(reason)) for cond, reason in checks))


def _callback_fault(c: Column) -> Column:
    """Why a parsed callback (the struct ``c``) is not one, or null."""
    return _first(
        (c.isNull() | c["v"].isNull(), "v: required field is missing or not JSON"),
        (c["v"] != _FORMAT_VERSION, f"v: unsupported version (this build reads {_FORMAT_VERSION})"),
        (F.coalesce(c["type"], F.lit("")) != "callback", "type: expected callback"),
        *(
            (c[name].isNull(), f"{name}: required field is missing or mistyped")
            for name in _REQUIRED
        ),
        (
            ~c["outcome"].isin("completed", "expired", "cancelled"),
            "outcome: expected one of completed, expired, cancelled",
        ),
        (
            ~c["time_domain"].isin("processing_time", "event_time"),
            "time_domain: expected one of processing_time, event_time",
        ),
        (~c["id"].rlike(_ID_PATTERN), "id: must be '<partition>-<sequence>-<16 hex digits>'"),
        (c["sequence"] < 1, "sequence: must be >= 1"),
    )


def callbacks_from_kafka(df: DataFrame, *, on_malformed: str = "fail") -> DataFrame:
    """The rows of :data:`spark_bridge.CALLBACKS_SCHEMA` from the connector's rows.

    Args:
        df: ``spark.read[Stream].format("kafka")...load()`` on the callbacks topic (at least
            ``value``, ``topic``, ``partition`` and ``offset``); batch or streaming.
        on_malformed: ``fail`` (a record that is not a callback fails the query, naming its
            topic, partition, offset and field) or ``skip`` (such records and tombstones are
            dropped).

    Returns:
        A DataFrame of ``CALLBACKS_SCHEMA``'s columns, in its order, so :func:`dedupe` and what
        follows work as on the ``purgatory-callbacks`` source.

    Raises:
        ConfigError: ``on_malformed`` is neither ``fail`` nor ``skip``, or a column is missing.
    """
    if on_malformed not in ("fail", "skip"):
        raise ConfigError(f"on_malformed must be fail or skip, got {on_malformed!r}")
    _need(df, ("value", "topic", "partition", "offset"), "the Kafka connector's")
    c = F.from_json(F.col("value").cast("string"), _WIRE)
    # Parsed once in a projection of its own: the checks read its fields many times, and a
    # from_json inlined into each reference would parse the record again for each.
    parsed = df.select(
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("value").isNull().alias("_nil"),
        c.alias("c"),
    ).select(
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("c"),
        F.coalesce(
            F.when(F.col("_nil"), F.lit("null value (a tombstone), not a callback")),
            _callback_fault(F.col("c")),
        ).alias(_ERROR),
    )
    if on_malformed == "skip":
        checked = parsed.where(F.col(_ERROR).isNull())
    else:
        message = F.concat(
            F.lit("purgatory callbacks: malformed callback at topic "),
            F.col("topic"),
            F.lit(" partition "),
            F.col("partition").cast("string"),
            F.lit(" offset "),
            F.col("offset").cast("string"),
            F.lit(": "),
            F.col(_ERROR),
            F.lit(" (on_malformed='skip' drops such records)"),
        )
        checked = parsed.where(
            F.when(F.col(_ERROR).isNull(), True).otherwise(F.raise_error(message))
        )
    payload = F.to_json(F.col("c.payload"))
    return checked.select(
        *(F.col(f"c.{name}").alias(name) for name in ("op_id", "scope", "outcome")),
        *(
            F.col(f"c.{name}").alias(name)
            for name in ("registered_ms", "outcome_ms", "deadline_ms")
        ),
        F.col("c.time_domain").alias("time_domain"),
        F.col("c.sequence").alias("sequence"),
        F.col("c.partition").alias("input_partition"),
        F.col("c.id").alias("id"),
        F.col("c.keys").alias("keys"),
        F.col("c.missing").alias("missing"),
        F.col("c.signals").alias("signals"),
        F.when(payload != "null", payload).alias("payload"),
        F.col("c.late").alias("late"),
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
    )


def _need(df: DataFrame, columns: tuple[str, ...], whose: str) -> None:
    missing = [name for name in columns if name not in df.columns]
    if missing:
        raise ConfigError(
            f"column {missing[0]!r} is not in the DataFrame ({whose} columns are needed: "
            f"{', '.join(columns)}); its columns are {sorted(df.columns)}"
        )


def _column_type(df: DataFrame, option: str, column: str) -> DataType:
    """The type of ``column``, or a ConfigError naming the option that chose it."""
    for field in df.schema.fields:
        if field.name == column:
            return field.dataType
    raise ConfigError(
        f"column {column!r} (option {option!r}) is not in the DataFrame; "
        f"its columns are {sorted(df.columns)}"
    )


def _text_column(df: DataFrame, option: str, column: str) -> Column:
    kind = _column_type(df, option, column)
    if not isinstance(kind, StringType):
        raise ConfigError(
            f"column {column!r} (option {option!r}) must be a string, got {kind.simpleString()}"
        )
    return F.col(column)


def _ms_column(df: DataFrame, option: str, column: str) -> Column:
    """Milliseconds from an integer column or a timestamp column."""
    kind = _column_type(df, option, column)
    if isinstance(kind, (LongType, IntegerType, ShortType)):
        return F.col(column).cast("long")
    if isinstance(kind, (TimestampType, TimestampNTZType)):
        return F.unix_millis(F.col(column).cast("timestamp"))
    raise ConfigError(
        f"column {column!r} (option {option!r}) must be an integer of milliseconds or a "
        f"timestamp, got {kind.simpleString()}"
    )


def _int_column(df: DataFrame, column: str) -> Column:
    kind = _column_type(df, column, column)
    if not isinstance(kind, (LongType, IntegerType, ShortType)):
        raise ConfigError(f"column {column!r} must be an integer, got {kind.simpleString()}")
    return F.col(column).cast("long")


_PAYLOAD = "_purgatory_payload"


def _with_payload(df: DataFrame, column: str) -> DataFrame:
    """``df`` with its payload parsed once into a variant column of its own (the value and two
    checks read it: parsed inline, each would parse the text again)."""
    kind = _column_type(df, "payload_column", column)
    if isinstance(kind, StringType):
        return df.withColumn(_PAYLOAD, F.try_parse_json(F.col(column)))
    if isinstance(kind, (StructType, MapType, ArrayType)):
        return df.withColumn(_PAYLOAD, F.parse_json(F.to_json(F.col(column))))
    raise ConfigError(
        f"column {column!r} (option 'payload_column') must be a string of JSON text, a struct, "
        f"a map or an array, got {kind.simpleString()}"
    )


def _payload_column(df: DataFrame, column: str) -> tuple[Column, Column]:
    """(the payload as a variant, null when the row has none; the fault check's condition for
    JSON text that does not parse), from ``df`` as :func:`_with_payload` made it."""
    parsed = F.col(_PAYLOAD)
    if isinstance(_column_type(df, "payload_column", column), StringType):
        return parsed, F.col(column).isNotNull() & parsed.isNull()
    return parsed, F.lit(False)


def _refuse_stream(df: DataFrame, what: str) -> None:
    """A stream is written per micro-batch, in ``foreachBatch``: Spark sorts no stream, and
    without the sort a faulty row could fail its task after others of it were sent."""
    if df.isStreaming:
        raise ConfigError(
            f"purgatory {what}: a streaming DataFrame cannot be checked before it is sent (Spark "
            "sorts no stream); call this in writeStream.foreachBatch, on each micro-batch"
        )


def _fail_before_sending(
    df: DataFrame, key: Column, value: Column, *, fault: Column, row: Column, what: str
) -> DataFrame:
    """``key`` and ``value`` of each row of ``df``, the rows of each task that has a fault
    sorted in front and ``value`` raising on the first of them (so that task sends nothing)."""
    _refuse_stream(df, what)
    staged = df.select(
        key.alias("key"),
        value.alias("value"),
        fault.alias(_ERROR),
        row.alias("_purgatory_row"),
        F.monotonically_increasing_id().alias("_purgatory_order"),
    )
    # The faulty rows first, then the rest in the order they came: a merge of spilled runs
    # would otherwise be free to reorder equal keys (and a timer re-armed twice in one task
    # must keep its last deadline).
    ordered = staged.sortWithinPartitions(F.col(_ERROR).isNull(), F.col("_purgatory_order"))
    message = F.concat(
        F.lit(f"purgatory {what}: "),
        F.col(_ERROR),
        F.lit(" (row: "),
        F.col("_purgatory_row"),
        F.lit(")"),
    )
    checked = F.when(F.col(_ERROR).isNotNull(), F.raise_error(message)).otherwise(F.col("value"))
    return ordered.select(F.col("key"), checked.cast("binary").alias("value"))


def _optional_fields(
    df: DataFrame, event_time_column: str | None, payload_column: str | None, limits: Limits
) -> tuple[list[Column], list[tuple[Column, str]], list[Column]]:
    """A signal's event time and payload: (fields, fault checks, columns shown in errors)."""
    fields: list[Column] = []
    checks: list[tuple[Column, str]] = []
    shown: list[Column] = []
    if event_time_column is not None:
        ms = _ms_column(df, "event_time_column", event_time_column)
        fields.append(ms.alias("event_time_ms"))
        checks.append(
            (
                (ms < 0) | (ms > MAX_TIME_MS),
                f"column {event_time_column!r}: must be in [0, {MAX_TIME_MS}] ms",
            )
        )
        shown.append(F.col(event_time_column))
    if payload_column is not None:
        payload, not_json = _payload_column(df, payload_column)
        fields.append(payload.alias("payload"))
        checks.append((not_json, f"column {payload_column!r}: not JSON text"))
        checks.append(
            (
                F.octet_length(F.to_json(payload)) > limits.max_payload_bytes,
                f"column {payload_column!r}: larger than {limits.max_payload_bytes} bytes "
                "(max_payload_bytes)",
            )
        )
        shown.append(F.col(payload_column))
    return fields, checks, shown


def signals_to_kafka(
    df: DataFrame,
    *,
    scope: str | None = None,
    scope_column: str = "scope",
    key_column: str = "key",
    event_time_column: str | None = None,
    payload_column: str | None = None,
    limits: Limits | None = None,
) -> DataFrame:
    """``key`` and ``value`` columns holding one signal per row of ``df``.

    Args:
        df: the rows to signal: a batch DataFrame; for a stream, each micro-batch in
            ``writeStream.foreachBatch`` (a streaming DataFrame is refused).
        scope: the scope of every row; otherwise each row's ``scope_column``.
        scope_column: the string column of the scope (when ``scope`` is None).
        key_column: the string column of the watch key.
        event_time_column: milliseconds (an integer column) or a timestamp column: the
            signal's event time (event-time operations), or None.
        payload_column: JSON text, or a struct, map or array column, carried to the callback;
            or None.
        limits: the sizes the service accepts (``max_key_bytes``, ``max_scope_bytes``,
            ``max_payload_bytes``); the defaults are the service's.

    Returns:
        A DataFrame of ``key`` (binary: the scope) and ``value`` (binary: the signal record),
        for ``write.format("kafka").option("topic", <the signals topic>)``.

    Raises:
        ConfigError: a column is missing or of a type that cannot be a signal's field (naming
            the column and the option); a faulty row fails the write itself, naming the
            column and showing the row.
    """
    limits = limits if limits is not None else Limits()
    if payload_column is not None:
        df = _with_payload(df, payload_column)
    scope_col, scope_name = _scope(df, scope, scope_column)
    key_col = _text_column(df, "key_column", key_column)
    fields = [
        F.lit(_FORMAT_VERSION).alias("v"),
        F.lit("signal").alias("type"),
        scope_col.alias("scope"),
        key_col.alias("key"),
    ]
    checks = [
        *_text_checks(scope_col, scope_name, limits.max_scope_bytes, "max_scope_bytes"),
        *_text_checks(key_col, key_column, limits.max_key_bytes, "max_key_bytes"),
    ]
    shown = [scope_col.alias(scope_name), key_col.alias(key_column)]
    extra_fields, extra_checks, extra_shown = _optional_fields(
        df, event_time_column, payload_column, limits
    )
    fields += extra_fields
    checks += extra_checks
    shown += extra_shown
    return _fail_before_sending(
        df,
        F.encode(scope_col, "UTF-8"),
        F.to_json(F.struct(*fields)),
        fault=_first(*checks),
        row=F.to_json(F.struct(*shown)),
        what="signals",
    )


def _text_checks(
    column: Column, name: str, most_bytes: int, limit: str
) -> list[tuple[Column, str]]:
    return [
        (F.coalesce(column, F.lit("")) == "", f"column {name!r}: must be a non-empty string"),
        (
            F.octet_length(column) > most_bytes,
            f"column {name!r}: longer than {most_bytes} bytes ({limit})",
        ),
    ]


def _scope(df: DataFrame, scope: str | None, scope_column: str) -> tuple[Column, str]:
    """The scope's column (or the keyword's value) and the name errors give it."""
    if scope is not None:
        if not scope:
            raise ConfigError("option 'scope' must be a non-empty string")
        return F.lit(scope), "scope (option)"
    return _text_column(df, "scope_column", scope_column), scope_column


def _choice(
    df: DataFrame, name: str, fixed: str | None, default: str, allowed: tuple[str, ...]
) -> Column:
    """A field from its column when ``df`` has one, else from ``fixed``, else ``default``."""
    if name in df.columns:
        if fixed is not None:
            raise ConfigError(f"column {name!r} and option {name!r} exclude each other: give one")
        return _text_column(df, name, name)
    value = fixed if fixed is not None else default
    if value not in allowed:
        raise ConfigError(f"option {name!r} must be one of {', '.join(allowed)}, got {value!r}")
    return F.lit(value)


def _keys_checks(keys: Column, limits: Limits) -> list[tuple[Column, str]]:
    return [
        (keys.isNull(), "column 'keys': must be an array of strings (empty: a timer)"),
        (
            F.size(keys) > limits.max_keys_per_operation,
            f"column 'keys': more than {limits.max_keys_per_operation} keys "
            "(max_keys_per_operation)",
        ),
        (
            F.exists(keys, lambda k: F.coalesce(k, F.lit("")) == ""),
            "column 'keys': every key must be a non-empty string",
        ),
        (
            F.exists(keys, lambda k: F.octet_length(k) > limits.max_key_bytes),
            f"column 'keys': a key is longer than {limits.max_key_bytes} bytes (max_key_bytes)",
        ),
        (F.size(F.array_distinct(keys)) != F.size(keys), "column 'keys': a key is repeated"),
    ]


def _deadline_checks(domain: Column, deadline: Column, timeout: Column) -> list[tuple[Column, str]]:
    return [
        (
            deadline.isNull() & timeout.isNull(),
            "column 'deadline_ms': one of deadline_ms or timeout_ms is required",
        ),
        (
            deadline.isNotNull() & timeout.isNotNull(),
            "column 'timeout_ms': not allowed together with deadline_ms",
        ),
        (
            (deadline < 0) | (deadline > MAX_TIME_MS),
            f"column 'deadline_ms': not in [0, {MAX_TIME_MS}]",
        ),
        (
            (timeout < 0) | (timeout > MAX_TIME_MS),
            f"column 'timeout_ms': not in [0, {MAX_TIME_MS}]",
        ),
        (
            timeout.isNotNull() & (domain != "processing_time"),
            "column 'timeout_ms': only allowed with time_domain processing_time",
        ),
    ]


def _count_checks(condition: Column, count: Column, keys: Column) -> list[tuple[Column, str]]:
    return [
        (~condition.isin("all", "any", "count"), "column 'condition': must be all, any or count"),
        (
            (condition == "count") & (count.isNull() | (count < 1) | (count > F.size(keys))),
            "column 'count': must be an integer in [1, the number of keys] with condition count",
        ),
        (
            (condition != "count") & count.isNotNull(),
            "column 'count': only allowed with condition count",
        ),
        (
            (F.size(keys) == 0) & (condition != "all"),
            "column 'condition': must be all for an operation without keys (a timer)",
        ),
    ]


def _keys_column(df: DataFrame) -> Column:
    """The ``keys`` column, or no keys (a timer) when ``df`` has none."""
    if "keys" not in df.columns:
        return F.array().cast("array<string>")
    kind = _column_type(df, "keys", "keys")
    if not (isinstance(kind, ArrayType) and isinstance(kind.elementType, StringType)):
        raise ConfigError(f"column 'keys' must be an array of strings, got {kind.simpleString()}")
    return F.col("keys")


def _deadline_columns(df: DataFrame, timeout_ms: int | None) -> tuple[Column, Column]:
    """(deadline_ms, timeout_ms): each from its column, the timeout else from the keyword."""
    deadline = (
        _ms_column(df, "deadline_ms", "deadline_ms")
        if "deadline_ms" in df.columns
        else F.lit(None).cast("long")
    )
    if "timeout_ms" in df.columns and timeout_ms is not None:
        raise ConfigError(
            "column 'timeout_ms' and option 'timeout_ms' exclude each other: give one"
        )
    timeout = (
        _int_column(df, "timeout_ms")
        if "timeout_ms" in df.columns
        else F.lit(timeout_ms).cast("long")
    )
    return deadline, timeout


def operations_to_kafka(
    df: DataFrame,
    *,
    scope: str | None = None,
    condition: str | None = None,
    timeout_ms: int | None = None,
    time_domain: str | None = None,
    limits: Limits | None = None,
) -> DataFrame:
    """``key`` and ``value`` columns holding one registration per row of ``df``, for the
    requests topic.

    A field is read from the column of its name when ``df`` has one (``op_id``, ``scope``,
    ``keys``, ``condition``, ``count``, ``deadline_ms``, ``timeout_ms``, ``time_domain``,
    ``payload``), else from its keyword, else it takes the record's default (no keys: a timer;
    ``condition`` all; ``time_domain`` processing_time). ``deadline_ms`` may be a timestamp or
    an integer of milliseconds; ``payload`` JSON text, a struct, a map or an array. Each row
    needs exactly one of a deadline or a timeout. As :func:`signals_to_kafka`, a faulty row
    fails the write naming its column and showing the row, before its task sends anything.

    A timer registered again under its op_id with another deadline is re-armed (one inactivity
    timer per entity); registrations are otherwise idempotent, so a retried write is harmless.

    Raises:
        ConfigError: ``op_id`` is missing, a column has a type no field takes, or a keyword
            conflicts with a column of the same name (naming it).
    """
    limits = limits if limits is not None else Limits()
    op_id = _text_column(df, "op_id", "op_id")
    scope_col, scope_name = _scope(df, scope, "scope")
    keys = _keys_column(df)
    cond = _choice(df, "condition", condition, "all", ("all", "any", "count"))
    domain = _choice(
        df, "time_domain", time_domain, "processing_time", ("processing_time", "event_time")
    )
    count = _int_column(df, "count") if "count" in df.columns else F.lit(None).cast("long")
    deadline, timeout = _deadline_columns(df, timeout_ms)
    fields = [
        F.lit(_FORMAT_VERSION).alias("v"),
        F.lit("register").alias("type"),
        op_id.alias("op_id"),
        scope_col.alias("scope"),
        keys.alias("keys"),
        cond.alias("condition"),
        count.alias("count"),
        deadline.alias("deadline_ms"),
        timeout.alias("timeout_ms"),
        domain.alias("time_domain"),
    ]
    checks = [
        *_text_checks(op_id, "op_id", limits.max_op_id_bytes, "max_op_id_bytes"),
        *_text_checks(scope_col, scope_name, limits.max_scope_bytes, "max_scope_bytes"),
        *_keys_checks(keys, limits),
        *_count_checks(cond, count, keys),
        (
            ~domain.isin("processing_time", "event_time"),
            "column 'time_domain': must be processing_time or event_time",
        ),
        *_deadline_checks(domain, deadline, timeout),
    ]
    shown = [F.col(name) for name in df.columns if name != "payload"]
    if "payload" in df.columns:
        df = _with_payload(df, "payload")
        payload_fields, payload_checks, _ = _optional_fields(df, None, "payload", limits)
        fields += payload_fields
        checks += payload_checks
    return _fail_before_sending(
        df,
        F.encode(scope_col, "UTF-8"),
        F.to_json(F.struct(*fields)),
        fault=_first(*checks),
        row=F.to_json(F.struct(*shown)) if shown else F.lit("{}"),
        what="operations",
    )


def watermarks_to_kafka(
    df: DataFrame,
    *,
    event_time_column: str,
    delay_ms: int = 0,
    scope: str | None = None,
    scope_column: str = "scope",
) -> DataFrame:
    """``key`` and ``value`` columns holding each scope's watermark: the latest event time of
    ``df``'s rows in that scope, less ``delay_ms`` (scopes whose result is below 0 send none).

    Write them after the rows they follow, to the topic those went to (the signals topic after
    signals, the requests topic after registrations), for example in ``foreachBatch``: the
    service applies a scope's watermark once the records before it on the scope's partition are
    applied, and a watermark that goes backward is a no-op there.

    Raises:
        ConfigError: a column is missing or of a type that is not an event time, or
            ``delay_ms`` is negative.
    """
    if delay_ms < 0:
        raise ConfigError(f"delay_ms must be >= 0, got {delay_ms}")
    _refuse_stream(df, "watermarks")
    scope_col, _ = _scope(df, scope, scope_column)
    ms = _ms_column(df, "event_time_column", event_time_column)
    latest = df.groupBy(scope_col.alias("scope")).agg((F.max(ms) - delay_ms).alias("watermark_ms"))
    record = F.struct(
        F.lit(_FORMAT_VERSION).alias("v"),
        F.lit("watermark").alias("type"),
        F.col("scope"),
        F.col("watermark_ms"),
    )
    return latest.where(
        F.col("scope").isNotNull() & (F.col("scope") != "") & (F.col("watermark_ms") >= 0)
    ).select(
        F.encode(F.col("scope"), "UTF-8").alias("key"),
        F.to_json(record).cast("binary").alias("value"),
    )
