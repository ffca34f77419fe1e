"""What the bridge's Kafka sinks share (spark_bridge layer): options, delivery and watermarks.

Both sinks (``purgatory-signals`` and ``purgatory-operations``) turn rows into records and
publish them with kafka-python, and both can publish the scope's event-time watermark after a
batch. This module holds that common part, so that each sink only says how a row becomes a
record:

* :func:`kafka_target` reads the connection options (``bootstrap_servers``, ``topic``,
  timeouts, SASL/SSL; :func:`client_options` checks them by the service's rules) and
  :func:`probe` checks on the driver that the broker answers and the topic exists, so a wrong
  address fails the job before any task runs, naming the option. kafka-python's connection
  arguments are built from them where a client is made, on the executors, by the builder the
  service uses (:func:`purgatory._kafka_options.kafka_client_kwargs`);
* :func:`send_all` publishes one task's records with one producer, flushes, and raises
  :class:`TransportError` if any record was not acknowledged, so Spark retries the task (or
  fails the micro-batch) instead of dropping records;
* :func:`write_partition` is a task's work: it encodes (and so checks) every row of its
  partition first, staged within ``stage_memory_bytes`` (:mod:`spark_bridge._staging`), and
  sends only then, so a task that fails on a bad row has published nothing;
* :class:`RecordsWriter` and :class:`RecordsStreamWriter` are the batch and streaming writers
  of both sinks: each task runs :func:`write_partition` with the sink's encoder and
  :func:`send_all`; ``commit`` publishes the watermarks;
* :func:`watermark_policy` and :func:`publish_watermarks` implement ``watermark=true``: after a
  batch (in the writer's ``commit``, on the driver, once every task has flushed) one watermark
  per scope at ``max(event time) - watermark_delay_ms``, never backward (the last marks are
  kept in ``watermark_state_path``, by default inside a local ``checkpointLocation``). That is
  the rule of Spark's ``withWatermark``: a sink never sees the query's own watermark (it is
  handed rows only), so it computes the same bound from the rows it writes.

Every row error is a :class:`RowError` naming the column and showing the row's values.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import Row

from purgatory._codec import RecordError, WatermarkRecord, encode_signal, message_key
from purgatory._core import ConfigError, TransportError
from purgatory._kafka_options import (
    CLIENT_ARGUMENTS,
    kafka_client_kwargs,
    kafka_connection_problems,
)
from purgatory._kafka_options import OPTIONS as KAFKA_OPTIONS
from spark_bridge._staging import DEFAULT_MEMORY_BYTES, StagedRecords, Staging

__all__ = [
    "CLIENT_OPTIONS",
    "Encode",
    "KafkaTarget",
    "RecordsStreamWriter",
    "RecordsWriter",
    "RowError",
    "Send",
    "TaskReport",
    "WatermarkPolicy",
    "append_only",
    "client_options",
    "epoch_ms",
    "int_option",
    "kafka_target",
    "probe",
    "publish_watermarks",
    "send_all",
    "show_row",
    "staging",
    "watermark_policy",
    "write_partition",
]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_ONE_MS = dt.timedelta(milliseconds=1)
#: The Kafka client options of every bridge format beside ``bootstrap_servers``; each sets the
#: kafka-python argument :data:`purgatory._kafka_options.CLIENT_ARGUMENTS` names.
CLIENT_OPTIONS = tuple(option for option in CLIENT_ARGUMENTS if option != "bootstrap_servers")
#: A sink's row encoder: row -> (scope, event time or None, message key, value); it raises
#: RowError naming the column. It is pickled to the executors with the writer.
Encode = Callable[[Row], tuple[str, int | None, bytes, bytes]]
#: Publishes a task's encoded ``(key, value)`` records and counts them (:func:`send_all`).
Send = Callable[[Iterable[tuple[bytes, bytes]]], int]
# Without a state file, the high marks of this process (see watermark_policy).
_MARKS_IN_PROCESS: dict[tuple[str, str], dict[str, int]] = {}


class RowError(RecordError):
    """A row that cannot become a record; ``field`` is the column, the message shows the row."""

    def __init__(self, column: str, reason: str) -> None:
        super().__init__(column, reason)
        self.args = (f"column {column!r}: {reason}",)


@dataclass(frozen=True, slots=True)
class KafkaTarget:
    """Where a sink publishes, and how long it may take.

    Attributes:
        client: the :data:`CLIENT_OPTIONS` set, checked (:func:`client_options`).
    """

    bootstrap_servers: str
    topic: str
    connect_timeout_ms: int
    delivery_timeout_ms: int
    client: tuple[tuple[str, str], ...] = ()

    def kafka_kwargs(self) -> dict[str, Any]:
        """kafka-python's connection arguments (the service's builder, from the options)."""
        return kafka_client_kwargs(
            {"bootstrap_servers": self.bootstrap_servers, **dict(self.client)}
        )

    def producer(self) -> Any:
        """A kafka-python producer (imported here: this runs on the executors too)."""
        from kafka import KafkaProducer  # noqa: PLC0415

        return KafkaProducer(
            **self.kafka_kwargs(),
            acks="all",
            linger_ms=5,
            bootstrap_timeout_ms=self.connect_timeout_ms,
            max_block_ms=self.connect_timeout_ms,
            request_timeout_ms=min(30_000, self.delivery_timeout_ms),
            delivery_timeout_ms=self.delivery_timeout_ms,
        )


def int_option(options: Mapping[str, str], name: str, default: int, low: int) -> int:
    """An integer option, at least ``low``.

    Raises:
        ConfigError: naming the option.
    """
    raw = options.get(name)
    try:
        value = default if raw is None else int(raw)
    except ValueError:
        raise ConfigError(f"option {name!r} must be an integer, got {raw!r}") from None
    if value < low:
        raise ConfigError(f"option {name!r} must be >= {low}, got {value}")
    return value


def kafka_target(options: Mapping[str, str], default_topic: str) -> KafkaTarget:
    """The connection options of a sink.

    Raises:
        ConfigError: naming the option.
    """
    servers = (options.get("bootstrap_servers") or "").strip()
    if not servers:
        raise ConfigError("option 'bootstrap_servers' is required (host:port[,host:port...])")
    return KafkaTarget(
        bootstrap_servers=servers,
        topic=(options.get("topic") or default_topic).strip(),
        connect_timeout_ms=int_option(options, "connect_timeout_ms", 10_000, 1),
        delivery_timeout_ms=int_option(options, "delivery_timeout_ms", 120_000, 1),
        client=client_options(options),
    )


def client_options(options: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The :data:`CLIENT_OPTIONS` set among ``options``, checked.

    They are checked with ``bootstrap_servers`` by the rules the service applies to its own
    (:func:`purgatory._kafka_options.kafka_connection_problems`; SSL files must be readable
    here, on the driver), and become kafka-python's arguments where a client is made
    (:func:`purgatory._kafka_options.kafka_client_kwargs`).

    Raises:
        ConfigError: one line per problem, each naming the option.
    """
    problems = kafka_connection_problems(
        {name: options.get(name) for name in KAFKA_OPTIONS}, name="option {}".format
    )
    if problems:
        raise ConfigError("\n".join(problems))
    return tuple((name, value) for name in CLIENT_OPTIONS if (value := options.get(name)))


def probe(target: KafkaTarget) -> None:
    """Check that the broker answers and the topic exists.

    Raises:
        TransportError: naming ``bootstrap_servers`` or ``topic``.
    """
    from kafka.errors import KafkaError  # noqa: PLC0415

    try:
        producer = target.producer()
    except KafkaError as e:
        raise TransportError(
            f"option 'bootstrap_servers': no broker answered at {target.bootstrap_servers!r} "
            f"within {target.connect_timeout_ms} ms (option 'connect_timeout_ms'): {e}"
        ) from None
    try:
        if not producer.partitions_for(target.topic):
            raise TransportError(f"option 'topic': {target.topic!r} has no partitions")
    except KafkaError as e:
        raise TransportError(
            f"option 'topic': no metadata for {target.topic!r} at {target.bootstrap_servers!r}: {e}"
        ) from None
    finally:
        producer.close(timeout=1)


def send_all(target: KafkaTarget, records: Iterable[tuple[bytes, bytes]]) -> int:
    """Publish ``(key, value)`` records with one producer, flush, and count them.

    Raises:
        TransportError: any record was not acknowledged (the task fails, Spark retries it).
    """
    from kafka.errors import KafkaError  # noqa: PLC0415

    errors: list[BaseException] = []
    try:
        producer = target.producer()
    except KafkaError as e:
        raise TransportError(
            f"option 'bootstrap_servers' {target.bootstrap_servers!r}: {e}"
        ) from None
    sent = 0
    try:
        for key, value in records:
            producer.send(target.topic, key=key, value=value).add_errback(errors.append)
            sent += 1
        producer.flush(timeout=target.delivery_timeout_ms / 1000)
    except KafkaError as e:
        errors.append(e)
    finally:
        producer.close(timeout=target.delivery_timeout_ms / 1000)
    if errors:
        raise TransportError(
            f"{len(errors)} record(s) not delivered to topic {target.topic!r} at "
            f"{target.bootstrap_servers!r} (the task fails so that Spark retries it): {errors[0]}"
        )
    return sent


def epoch_ms(value: object, naive_is_utc: bool) -> object:
    """Epoch milliseconds of a timestamp cell; other values are returned as they are.

    PySpark hands ``TIMESTAMP`` cells out as naive local datetimes and ``TIMESTAMP_NTZ`` cells
    as naive wall-clock datetimes, which the bridge reads as UTC (``naive_is_utc``).
    """
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC) if naive_is_utc else value.astimezone()
        return (value - _EPOCH) // _ONE_MS
    return value


def show_row(cells: Mapping[str, object]) -> str:
    """The row's values, each cut to 80 characters, for an error message."""

    def short(value: object) -> str:
        text = repr(value)
        return text if len(text) <= 80 else text[:77] + "..."

    return ", ".join(f"{k}={short(v)}" for k, v in cells.items())


@dataclass(slots=True)
class TaskReport(WriterCommitMessage):
    """What one task wrote: its record count and, per scope, the highest event time."""

    records: int = 0
    high_marks: dict[str, int] = field(default_factory=dict)

    def saw(self, scope: str, event_time_ms: int | None) -> None:
        """Count one record of ``scope`` and keep its event time if it is the highest."""
        self.records += 1
        if event_time_ms is not None and event_time_ms > self.high_marks.get(scope, -1):
            self.high_marks[scope] = event_time_ms


@dataclass(frozen=True, slots=True)
class WatermarkPolicy:
    """``watermark=true``: publish ``max(event time) - delay_ms`` per scope after each batch."""

    enabled: bool
    delay_ms: int
    state_path: str | None


def watermark_policy(options: Mapping[str, str], event_time_column: str | None) -> WatermarkPolicy:
    """The watermark options of a sink.

    Raises:
        ConfigError: naming the option.
    """
    enabled = (options.get("watermark") or "false").strip().lower()
    if enabled not in ("true", "false"):
        raise ConfigError(f"option 'watermark' must be 'true' or 'false', got {enabled!r}")
    if enabled == "true" and event_time_column is None:
        raise ConfigError("option 'watermark' is 'true' but option 'event_time_column' is unset")
    state_path = options.get("watermark_state_path")
    checkpoint = options.get("checkpointLocation") or ""
    if state_path is None and checkpoint and "://" not in checkpoint.removeprefix("file://"):
        state_path = os.path.join(checkpoint.removeprefix("file:"), "purgatory-watermarks.json")
    return WatermarkPolicy(
        enabled=enabled == "true",
        delay_ms=int_option(options, "watermark_delay_ms", 0, 0),
        state_path=state_path,
    )


def publish_watermarks(
    target: KafkaTarget, policy: WatermarkPolicy, messages: Iterable[object]
) -> dict[str, int]:
    """Publish the batch's watermarks that move a scope forward; returns what was published.

    Raises:
        TransportError: a watermark was not acknowledged (the batch fails and is retried).
    """
    if not policy.enabled:
        return {}
    high: dict[str, int] = {}
    for message in messages:
        if isinstance(message, TaskReport):
            for scope, mark in message.high_marks.items():
                high[scope] = max(high.get(scope, 0), mark)
    published = _load_marks(target, policy)
    due = {
        scope: mark
        for scope, top in sorted(high.items())
        if (mark := max(0, top - policy.delay_ms)) > published.get(scope, -1)
    }
    if due:
        records = [WatermarkRecord(scope, mark) for scope, mark in due.items()]
        send_all(target, ((message_key(r), encode_signal(r)) for r in records))
        _save_marks(target, policy, {**published, **due})
    return due


def _load_marks(target: KafkaTarget, policy: WatermarkPolicy) -> dict[str, int]:
    if policy.state_path is None:
        return dict(_MARKS_IN_PROCESS.get((target.bootstrap_servers, target.topic), {}))
    try:
        with open(policy.state_path, encoding="utf-8") as f:
            marks: dict[str, int] = json.load(f)
    except FileNotFoundError:
        return {}
    return marks


def _save_marks(target: KafkaTarget, policy: WatermarkPolicy, marks: dict[str, int]) -> None:
    path = policy.state_path
    if path is None:
        _MARKS_IN_PROCESS[(target.bootstrap_servers, target.topic)] = marks
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


def staging(options: Mapping[str, str]) -> Staging:
    """The staging options of a sink: ``stage_memory_bytes`` and ``stage_dir``.

    Raises:
        ConfigError: naming the option.
    """
    spool_dir = options.get("stage_dir")
    if spool_dir is not None and not spool_dir.strip():
        raise ConfigError("option 'stage_dir' must be a directory path, got an empty string")
    return Staging(
        memory_bytes=int_option(options, "stage_memory_bytes", DEFAULT_MEMORY_BYTES, 0),
        spool_dir=None if spool_dir is None else spool_dir.strip(),
    )


def write_partition(rows: Iterable[Row], encode: Encode, send: Send, policy: Staging) -> TaskReport:
    """One task's write: encode every row of the partition, then send them all.

    Nothing is sent before the last row is encoded, so a bad row anywhere in the partition
    fails the task with nothing of it published. The encoded records wait in
    :class:`StagedRecords`: in memory up to ``policy.memory_bytes``, the rest in a spool file.
    An empty partition sends nothing (and opens no producer).

    Returns:
        What the task wrote, for the driver's ``commit``.

    Raises:
        RowError: from ``encode``, naming the column and showing the row; nothing was sent.
        OSError: the spool file could not be written; nothing was sent.
        TransportError: from ``send``, a record was not acknowledged.
    """
    report = TaskReport()
    with StagedRecords(policy) as staged:
        for row in rows:
            scope, event_time, key, value = encode(row)
            report.saw(scope, event_time)
            staged.add(key, value)
        if len(staged):
            send(staged)
    return report


def append_only(sink: str, overwrite: bool) -> None:
    """Raises ConfigError if Spark asks ``sink`` to overwrite: the sinks only append."""
    if overwrite:
        raise ConfigError(f"mode: the {sink} sink only appends; use mode('append')")


class _Records:
    """The task and commit logic of both sinks' batch and streaming writers."""

    def __init__(
        self, target: KafkaTarget, watermark: WatermarkPolicy, encode: Encode, policy: Staging
    ) -> None:
        self._target = target
        self._watermark = watermark
        self._encode = encode
        self._staging = policy

    def write(self, iterator: Iterator[Row]) -> TaskReport:
        """Encode this partition's rows, then send them, flush, and raise on any error."""
        send = functools.partial(send_all, self._target)
        return write_partition(iterator, self._encode, send, self._staging)

    def _publish_watermarks(self, messages: list[WriterCommitMessage | None]) -> None:
        publish_watermarks(self._target, self._watermark, messages)


class RecordsWriter(_Records, DataSourceWriter):
    """Batch writes; ``watermark=true`` publishes the job's high marks once, at the end."""

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self._publish_watermarks(messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to undo: a failed task sent nothing; the tasks that succeeded did, and a
        re-run of the write sends their records again (consumers recognise them: README)."""


class RecordsStreamWriter(_Records, DataSourceStreamWriter):
    """Streaming writes; ``watermark=true`` publishes each micro-batch's high marks."""

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        self._publish_watermarks(messages)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing to undo: a failed task sent nothing; the tasks that succeeded did, and the
        re-run of the micro-batch sends their records again (consumers recognise them: README)."""
