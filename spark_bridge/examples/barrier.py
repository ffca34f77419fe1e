"""Example: a nightly barrier over three upstream Spark batch jobs.

The downstream job (a report) must start only once ``orders``, ``users`` and ``stock`` have
been ingested for the run, and must not wait past its deadline. Without purgatory this is a
polling sensor or a sleep; here:

1. the downstream driver registers the barrier: operation ``report@<run>`` in scope ``nightly``
   watching ``ingest/<name>@<run>`` for the three names, with a deadline;
2. each upstream job writes its output, then publishes its signal from Spark through the
   ``purgatory-signals`` sink, with the output's path and row count as payload;
3. the downstream driver blocks in ``wait_for`` (a barrier with its own timeout). On
   ``completed`` it reads the three outputs, found in the callback's signal payloads, and
   proceeds; on ``expired`` it reports the keys that never came and stops.

Keys carry the run, so yesterday's signal never satisfies today's barrier.

Run it against a service and its broker::

    python -m spark_bridge.examples.barrier --bootstrap-servers 127.0.0.1:9092 \\
        --service-url http://127.0.0.1:8080 --run 2026-11-22 [--fail stock]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spark_bridge._driver import Driver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["UPSTREAMS", "BarrierResult", "deadline_after", "main", "run_barrier"]

#: The upstream jobs of the example.
UPSTREAMS = ("orders", "users", "stock")
_SCOPE = "nightly"


@dataclass(frozen=True, slots=True)
class BarrierResult:
    """What the downstream job saw and did."""

    run: str
    outcome: dict[str, Any]  # the callback record
    proceeded: bool
    report_rows: int | None  # rows of the report when it proceeded
    upstream_s: float = 0.0  # from the registration to the last upstream job's signal


def deadline_after(previous: BarrierResult, *, floor_ms: int = 8_000) -> int:
    """A barrier deadline (ms from its registration) that upstream jobs as slow as
    ``previous``'s meet three times over, and never under ``floor_ms``: a run meant to expire
    for want of one job's signal then expires for that reason alone, however busy the
    machine (Spark's writes take seconds on a quiet one, many more on a loaded one)."""
    return max(floor_ms, round(3_000 * previous.upstream_s))


def _key(name: str, run: str) -> str:
    return f"ingest/{name}@{run}"


def upstream_job(
    spark: SparkSession,
    name: str,
    run: str,
    *,
    work_dir: Path,
    bootstrap_servers: str,
    topic: str,
    connector: bool = False,
) -> None:
    """One upstream batch job: ingest (here: generate) its data, then signal that it is done
    (through Spark's Kafka connector with ``connector``, else the ``purgatory-signals`` sink)."""
    path = work_dir / run / name
    data = spark.range(0, 1_000 * (1 + UPSTREAMS.index(name)), numPartitions=2).selectExpr(
        f"'{name}' AS source", "id", "id % 7 AS bucket"
    )
    data.write.mode("overwrite").parquet(str(path))
    rows = spark.read.parquet(str(path)).count()
    done = spark.createDataFrame(
        [(_SCOPE, _key(name, run), json.dumps({"path": str(path), "rows": rows}))],
        "scope string, key string, payload string",
    )
    if connector:
        from spark_bridge._connector import signals_to_kafka  # noqa: PLC0415 - loads pyspark

        signals_to_kafka(done, payload_column="payload").write.format("kafka") \
            .option("kafka.bootstrap.servers", bootstrap_servers).option("topic", topic) \
            .save()  # fmt: skip
        return
    done.write.format("purgatory-signals").mode("append") \
        .option("bootstrap_servers", bootstrap_servers).option("topic", topic) \
        .option("payload_column", "payload").save()  # fmt: skip


def downstream_job(
    spark: SparkSession, driver: Driver, run: str, wait_s: float, show: Callable[[str], None]
) -> BarrierResult:
    """Wait on the barrier, then proceed (completed) or report what is missing (expired)."""
    outcome = driver.wait_for(_SCOPE, f"report@{run}", timeout_s=wait_s)
    if outcome["outcome"] != "completed":
        show(f"barrier report@{run}: {outcome['outcome']}; missing {outcome['missing']}")
        return BarrierResult(run, outcome, proceeded=False, report_rows=None)
    paths = [payload["path"] for payload in outcome["signals"].values()]
    report = spark.read.parquet(*paths).groupBy("source").count()
    rows = {row["source"]: row["count"] for row in report.collect()}
    show(f"barrier report@{run}: completed; report over {json.dumps(rows, sort_keys=True)}")
    return BarrierResult(run, outcome, proceeded=True, report_rows=sum(rows.values()))


def run_barrier(
    spark: SparkSession,
    *,
    bootstrap_servers: str,
    service_url: str,
    run: str,
    work_dir: Path,
    fail: Sequence[str] = (),
    deadline_in_ms: int = 60_000,
    signals_topic: str = "purgatory.signals",
    show: Callable[[str], None] = print,
    connector: bool = False,
) -> BarrierResult:
    """Register the barrier, run the upstream jobs (except ``fail``), wait downstream.

    Args:
        spark: a session with the bridge's data sources registered.
        bootstrap_servers: the broker of the service.
        service_url: the service's HTTP API.
        run: the run's name (a date), part of every key.
        work_dir: where the upstream jobs write their outputs.
        fail: upstream jobs that fail (they never signal), to see the barrier expire.
        deadline_in_ms: the barrier's deadline, from now.
        signals_topic: the service's signals topic.
        show: where the progress lines go.
        connector: signal through Spark's Kafka connector (``signals_to_kafka``) instead of
            the ``purgatory-signals`` sink.
    """
    unknown = sorted(set(fail) - set(UPSTREAMS))
    if unknown:
        raise ValueError(f"fail: unknown upstream jobs {unknown}; known: {list(UPSTREAMS)}")
    with Driver(service_url) as driver:
        driver.register(
            scope=_SCOPE,
            op_id=f"report@{run}",
            keys=[_key(name, run) for name in UPSTREAMS],
            timeout_ms=deadline_in_ms,
            payload={"job": "report", "run": run},
        )
        show(f"barrier report@{run}: registered, deadline in {deadline_in_ms} ms")
        registered_s = time.monotonic()  # noqa: TID251 - a Spark driver: no trio here
        for name in UPSTREAMS:
            if name in fail:
                show(f"upstream {name}@{run}: failed, no signal")
                continue
            upstream_job(
                spark, name, run, work_dir=work_dir, bootstrap_servers=bootstrap_servers,
                topic=signals_topic, connector=connector,
            )  # fmt: skip
            show(f"upstream {name}@{run}: done, signalled {_key(name, run)}")
        upstream_s = time.monotonic() - registered_s  # noqa: TID251 - as above
        result = downstream_job(spark, driver, run, deadline_in_ms / 1000 + 30, show)
        return dataclasses.replace(result, upstream_s=upstream_s)


def main(argv: Sequence[str] | None = None) -> int:
    """The example from the command line; exit status 0 when the report ran, 1 when not."""
    parser = argparse.ArgumentParser(prog="python -m spark_bridge.examples.barrier")
    parser.add_argument("--bootstrap-servers", required=True)
    parser.add_argument("--service-url", required=True)
    parser.add_argument("--run", required=True, help="the run, part of every key (a date)")
    parser.add_argument("--fail", action="append", default=[], choices=UPSTREAMS)
    parser.add_argument("--deadline-in-ms", type=int, default=60_000)
    args = parser.parse_args(argv)
    from spark_bridge._session import local_session  # noqa: PLC0415 - starts the JVM

    spark = local_session()
    with tempfile.TemporaryDirectory(prefix="purgatory-barrier-") as work:
        result = run_barrier(
            spark,
            bootstrap_servers=args.bootstrap_servers,
            service_url=args.service_url,
            run=args.run,
            work_dir=Path(work),
            fail=args.fail,
            deadline_in_ms=args.deadline_in_ms,
        )
    return 0 if result.proceeded else 1


if __name__ == "__main__":
    raise SystemExit(main())
