"""Example: per-entity inactivity timers over event-time data (sessions that close by silence).

A stream of click events ``(entity, t)`` arrives in micro-batches, a little out of order. A
session closes when an entity has been silent for ``gap`` in **event time**: the same answer
however fast or slow the data is replayed. Two streaming queries:

1. **re-arm**: a running ``max(t)`` per entity (Spark state, so a deadline never moves back
   when an older event arrives late) is written each micro-batch through the
   ``purgatory-operations`` sink as a timer ``session/<entity>`` with deadline ``last + gap`` in
   event time, followed, in band, by the watermark ``max(t) - delay`` of the scope. The
   aggregation runs in update mode, which Spark's Python data source writers do not take, so the
   query writes through ``foreachBatch`` with the sink's batch writer (the watermark marks are
   kept next to the query's checkpoint);
2. **sessions**: a ``purgatory-callbacks`` stream filtered on the scope turns every fired timer
   into a closed session ``(entity, last_event_ms, session_end_ms)`` and appends it to a
   Parquet table.

The rule is Flink's inactivity timer: a session closes once the watermark passes ``last +
gap``; an event that arrives before the watermark got there extends the session.
:func:`expected_sessions` is that rule written plainly over the same micro-batches, so a run
can be checked against it.

Run it against a service and its broker::

    python -m spark_bridge.examples.inactivity --bootstrap-servers 127.0.0.1:9092
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = [
    "BASE_MS",
    "EVENTS",
    "InactivityResult",
    "Session",
    "expected_sessions",
    "main",
    "run_inactivity",
    "write_event_files",
]

#: 2026-11-22T09:00:00Z: event time zero of the example's data.
BASE_MS = 1_795_338_000_000
#: The example's clicks, ``(entity, seconds after BASE_MS)``, in micro-batches as they arrive.
#: carol's click at 55 s comes one batch late; bob never stops.
EVENTS: tuple[tuple[tuple[str, int], ...], ...] = (
    (("alice", 0), ("bob", 5), ("alice", 10), ("bob", 20), ("alice", 20), ("alice", 30),
     ("bob", 35), ("alice", 40), ("carol", 50), ("bob", 50)),
    (("carol", 60), ("carol", 55), ("bob", 65), ("bob", 80), ("bob", 95), ("bob", 110)),
    (("alice", 120), ("bob", 125), ("alice", 130), ("bob", 140), ("bob", 155), ("bob", 170)),
    (("bob", 185), ("carol", 200), ("bob", 200), ("bob", 215), ("bob", 230)),
    (("bob", 245), ("bob", 260), ("bob", 275), ("bob", 290)),
)  # fmt: skip


@dataclass(frozen=True, slots=True, order=True)
class Session:
    """A closed session: the entity and its last event; it ended ``gap`` later."""

    entity: str
    last_event_ms: int
    session_end_ms: int


@dataclass(frozen=True, slots=True)
class InactivityResult:
    """The closed sessions the second query wrote, and the callbacks behind them."""

    sessions: list[Session]
    callbacks: list[dict[str, Any]]


def expected_sessions(
    batches: Sequence[Sequence[tuple[str, int]]], *, gap_ms: int, delay_ms: int, base_ms: int
) -> list[Session]:
    """The sessions the rule closes, batch by batch (a plain model of the pipeline)."""
    last: dict[str, int] = {}
    watermark = -1
    closed: list[Session] = []
    for batch in batches:
        for entity, seconds in batch:
            t = base_ms + seconds * 1000
            last[entity] = max(last.get(entity, t), t)
        watermark = max(watermark, max(base_ms + s * 1000 for _, s in batch) - delay_ms)
        for entity, t in sorted(last.items()):
            if t + gap_ms <= watermark:
                closed.append(Session(entity, t, t + gap_ms))
                del last[entity]
    return sorted(closed)


def write_event_files(
    directory: Path, batches: Sequence[Sequence[tuple[str, int]]], base_ms: int
) -> None:
    """One JSON-lines file per micro-batch, with modification times in batch order."""
    directory.mkdir(parents=True, exist_ok=True)
    for i, batch in enumerate(batches):
        path = directory / f"clicks-{i:03d}.json"
        lines = [json.dumps({"entity": e, "t": base_ms + s * 1000}) for e, s in batch]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))  # the file source's order


def _rearm_query(
    spark: SparkSession,
    events_dir: Path,
    work_dir: Path,
    *,
    bootstrap_servers: str,
    requests_topic: str,
    scope: str,
    gap_ms: int,
    delay_ms: int,
    connector: bool = False,
) -> Any:
    events = spark.readStream.schema("entity string, t long") \
        .option("maxFilesPerTrigger", 1).json(str(events_dir))  # fmt: skip
    last = events.groupBy("entity").agg({"t": "max"}).withColumnRenamed("max(t)", "last_t")
    timers = last.selectExpr(
        "concat('session/', entity) AS op_id",
        f"last_t + {gap_ms} AS deadline_ms",
        "to_json(named_struct('entity', entity)) AS payload",
        "last_t",
    )
    marks = work_dir / "rearm-watermarks.json"

    def write(batch: DataFrame, batch_id: int) -> None:
        del batch_id  # registrations are idempotent: a re-run batch is harmless
        if connector:  # the registrations, then the scope's watermark after them
            from spark_bridge._connector import (  # noqa: PLC0415 - pyspark loads on use
                operations_to_kafka,
                watermarks_to_kafka,
            )

            kafka = {"kafka.bootstrap.servers": bootstrap_servers, "topic": requests_topic}
            operations_to_kafka(batch, scope=scope, time_domain="event_time") \
                .write.format("kafka").options(**kafka).save()  # fmt: skip
            watermarks_to_kafka(batch, scope=scope, event_time_column="last_t",
                                delay_ms=delay_ms) \
                .write.format("kafka").options(**kafka).save()  # fmt: skip
            return
        batch.write.format("purgatory-operations").mode("append") \
            .option("bootstrap_servers", bootstrap_servers).option("topic", requests_topic) \
            .option("scope", scope).option("time_domain", "event_time") \
            .option("event_time_column", "last_t").option("watermark", "true") \
            .option("watermark_delay_ms", str(delay_ms)) \
            .option("watermark_state_path", str(marks)).save()  # fmt: skip

    return (
        timers.writeStream.outputMode("update")
        .foreachBatch(write)
        .option("checkpointLocation", str(work_dir / "rearm-checkpoint"))
        .trigger(availableNow=True)
        .start()
    )


def _sessions_query(
    spark: SparkSession,
    work_dir: Path,
    *,
    bootstrap_servers: str,
    callbacks_topic: str,
    scope: str,
    gap_ms: int,
    connector: bool = False,
) -> Any:
    if connector:
        from pyspark.sql import functions as F  # noqa: N812, PLC0415 - pyspark loads on use

        from spark_bridge._connector import callbacks_from_kafka  # noqa: PLC0415

        raw = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap_servers)
            .option("subscribe", callbacks_topic)
            .option("startingOffsets", "earliest")
            .load()
        )
        callbacks = callbacks_from_kafka(raw).where(F.col("scope") == scope)
    else:
        callbacks = (
            spark.readStream.format("purgatory-callbacks")
            .option("bootstrap_servers", bootstrap_servers)
            .option("topic", callbacks_topic)
            .option("scope", scope)
            .load()
        )
    sessions = callbacks.where("outcome = 'expired'").selectExpr(
        "get_json_object(payload, '$.entity') AS entity",
        f"deadline_ms - {gap_ms} AS last_event_ms",
        "deadline_ms AS session_end_ms",
        "op_id",
        "sequence",
        "id",
    )
    return (
        sessions.writeStream.format("parquet")
        .option("path", str(work_dir / "sessions"))
        .option("checkpointLocation", str(work_dir / "sessions-checkpoint"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )


def run_inactivity(
    spark: SparkSession,
    *,
    bootstrap_servers: str,
    work_dir: Path,
    scope: str = "clicks",
    gap_ms: int = 30_000,
    delay_ms: int = 0,
    batches: Sequence[Sequence[tuple[str, int]]] = EVENTS,
    base_ms: int = BASE_MS,
    requests_topic: str = "purgatory.requests",
    callbacks_topic: str = "purgatory.callbacks",
    wait_s: float = 60.0,
    show: Callable[[str], None] = print,
    connector: bool = False,
    read_connector: bool = False,
) -> InactivityResult:
    """Run both queries until the expected sessions are written (or ``wait_s`` passes).

    Args:
        spark: a session with the bridge's data sources registered.
        bootstrap_servers: the broker of the service.
        work_dir: the event files, the checkpoints and the sessions table go here.
        scope: the scope of the timers (and the callbacks read back).
        gap_ms: the inactivity that closes a session, in event time.
        delay_ms: the watermark's allowance for late events.
        batches: the events, one micro-batch per item (``(entity, seconds after base_ms)``).
        base_ms: event time zero of ``batches``.
        requests_topic: the service's requests topic.
        callbacks_topic: the service's callbacks topic.
        wait_s: how long to wait for the sessions after the last batch.
        show: where the progress lines go.
        connector: write the timers and watermarks through Spark's Kafka connector
            (``operations_to_kafka``, ``watermarks_to_kafka``) instead of the
            ``purgatory-operations`` sink.
        read_connector: read the callbacks through the connector (``callbacks_from_kafka``)
            instead of the ``purgatory-callbacks`` source (not on the embedded broker, whose
            end offsets lag a batched produce).

    Returns:
        The sessions the second query wrote (sorted), and the callbacks it read.
    """
    events_dir = work_dir / "events"
    write_event_files(events_dir, batches, base_ms)
    expected = expected_sessions(batches, gap_ms=gap_ms, delay_ms=delay_ms, base_ms=base_ms)
    sessions_query = _sessions_query(
        spark, work_dir, bootstrap_servers=bootstrap_servers, callbacks_topic=callbacks_topic,
        scope=scope, gap_ms=gap_ms, connector=read_connector,
    )  # fmt: skip
    try:
        rearm = _rearm_query(
            spark, events_dir, work_dir, bootstrap_servers=bootstrap_servers,
            requests_topic=requests_topic, scope=scope, gap_ms=gap_ms, delay_ms=delay_ms,
            connector=connector,
        )  # fmt: skip
        rearm.awaitTermination()
        show(f"inactivity: {len(batches)} micro-batches re-armed timers in scope {scope!r}")
        table = work_dir / "sessions"
        deadline = time.perf_counter() + wait_s
        rows: list[Any] = []
        while time.perf_counter() < deadline:
            sessions_query.processAllAvailable()
            if any(table.glob("*.parquet")):
                rows = spark.read.parquet(str(table)).collect()
                if len(rows) >= len(expected):
                    break
            sessions_query.awaitTermination(0.5)
    finally:
        sessions_query.stop()
    written = sorted(Session(r["entity"], r["last_event_ms"], r["session_end_ms"]) for r in rows)
    for session in written:
        show(
            f"inactivity: session {session.entity} closed, last event at "
            f"+{(session.last_event_ms - base_ms) // 1000} s"
        )
    callbacks = [r.asDict() for r in rows]
    return InactivityResult(written, callbacks)


def main(argv: Sequence[str] | None = None) -> int:
    """The example from the command line; exit status 0 when the sessions match the rule."""
    parser = argparse.ArgumentParser(prog="python -m spark_bridge.examples.inactivity")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--scope", default="clicks")
    parser.add_argument("--gap-ms", type=int, default=30_000)
    args = parser.parse_args(argv)
    from spark_bridge._session import local_session  # noqa: PLC0415 - starts the JVM

    spark = local_session()
    with tempfile.TemporaryDirectory(prefix="purgatory-inactivity-") as work:
        result = run_inactivity(
            spark, bootstrap_servers=args.bootstrap_servers, work_dir=Path(work),
            scope=args.scope, gap_ms=args.gap_ms,
        )  # fmt: skip
    expected = expected_sessions(EVENTS, gap_ms=args.gap_ms, delay_ms=0, base_ms=BASE_MS)
    return 0 if result.sessions == expected else 1


if __name__ == "__main__":
    raise SystemExit(main())
