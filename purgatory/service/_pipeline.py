"""The main job (service layer): the whole pipeline on embedded defaults, from one command.

``purgatory demo`` starts the embedded broker (Tansu) and creates the topics, starts the service
as its own process against it (``purgatory serve``, as in production), starts a local Spark
(``local[2]``), and runs the two example jobs of :mod:`spark_bridge.examples`:

* the **barrier**, twice: run ``2026-11-22`` where the three upstream jobs signal and the report
  proceeds, and run ``2026-11-23`` where ``stock`` fails, so the barrier expires at its
  deadline and names the missing key;
* the **inactivity** sessions over event-time clicks, checked against the plain rule.

It then reads every callback of the run into Spark through the ``purgatory-callbacks`` source,
prints them with a short summary, stops everything, and exits 0 only if every check held.
Nothing outside a temporary directory and loopback ports is touched.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from purgatory._core import ConfigError
from purgatory.service._broker import EmbeddedBroker, free_port, with_pdeathsig
from purgatory.service._settings import Settings

__all__ = ["ServiceChild", "run_pipeline", "service_process"]

_PARTITIONS = 2
_READY_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class ServiceChild:
    """A running ``purgatory serve`` child: its API's URL and its process id."""

    url: str
    pid: int


@contextlib.contextmanager
def service_process(
    bootstrap_servers: str,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    *,
    partitions: int = _PARTITIONS,
    static_partitions: Sequence[int] | None = None,
    port: int | None = None,
    die_with_parent: bool = False,
) -> Iterator[ServiceChild]:
    """``purgatory serve`` as a child process, ready; SIGTERM (then a kill) on leaving.

    The child sees this process's environment without its ``PURGATORY_*`` variables, then
    ``env``, then the broker, the loopback port and the static partitions set here.

    Args:
        bootstrap_servers: the broker.
        log_path: where the service's output goes.
        env: more ``PURGATORY_*`` settings (topic names, ...).
        partitions: the child owns partitions ``0 .. partitions - 1`` (static assignment)...
        static_partitions: ... or exactly these (a replica of several).
        port: the HTTP port (a free one by default; a replica's peers must know it first).
        die_with_parent: on Linux, the kernel kills the child when this process dies, even by
            SIGKILL; call from the main thread then (see :mod:`purgatory.service._broker`).

    Raises:
        ConfigError: the service exited, or was not ready within 60 s (with its log's tail).
        UsageError: ``die_with_parent`` is set and this is not the main thread.
    """
    port = port if port is not None else free_port()
    owned = static_partitions if static_partitions is not None else range(partitions)
    child_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")},
        **(env or {}),
        "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": bootstrap_servers,
        "PURGATORY_KAFKA_STATIC_PARTITIONS": ",".join(str(p) for p in owned),
        "PURGATORY_HTTP_HOST": "127.0.0.1",
        "PURGATORY_HTTP_PORT": str(port),
    }
    url = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "purgatory.service._cli", "serve"]
    if die_with_parent:
        command = with_pdeathsig(command)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            _wait_ready(proc, url, log_path)
            yield ServiceChild(url, proc.pid)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log_path: Path) -> None:
    with httpx.Client(timeout=2.0) as client:
        for _ in range(int(_READY_TIMEOUT_S / 0.25)):
            with contextlib.suppress(httpx.HTTPError):
                if client.get(f"{url}/readyz").status_code == 200:
                    return
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=0.25)  # the pause, and it notices an early exit
            if proc.returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise ConfigError(f"the service exited with {proc.returncode}:\n{tail}")
    raise ConfigError(f"the service was not ready within {_READY_TIMEOUT_S} s (log: {log_path})")


def _callback_line(row: Any) -> str:
    missing = f" missing={list(row['missing'])}" if row["missing"] else ""
    return (
        f"  {row['outcome']:<9} {row['scope']}/{row['op_id']} signalled={len(row['keys'])}"
        f"{missing} time={row['time_domain']} deadline_ms={row['deadline_ms']}"
    )


def run_pipeline(show: Callable[[str], None] = print) -> int:
    """Run the whole pipeline once; returns the exit status (0 when every check held)."""
    try:
        from spark_bridge import local_session  # noqa: PLC0415 - the spark extra
        from spark_bridge.examples.barrier import run_barrier  # noqa: PLC0415
        from spark_bridge.examples.inactivity import (  # noqa: PLC0415
            BASE_MS,
            EVENTS,
            expected_sessions,
            run_inactivity,
        )
    except ImportError as exc:
        show(
            f"purgatory demo needs the Spark bridge: pip install 'purgatory[service,spark]' ({exc})"
        )
        return 2
    topics = Settings()
    checks: dict[str, bool] = {}
    counts: Counter[str] = Counter()
    # The command line runs this on the main thread, so the broker and the service may die with
    # this process even when it is SIGKILLed (see purgatory.service._broker); the local Spark's
    # JVM already exits when its Python driver goes (it reads the driver's pipe until EOF).
    with (
        tempfile.TemporaryDirectory(prefix="purgatory-demo-") as tmp,
        EmbeddedBroker(die_with_parent=True) as broker,
    ):
        work = Path(tmp)
        broker.create_topics(
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
        show(f"broker: Tansu at {broker.bootstrap_servers}")
        with service_process(
            broker.bootstrap_servers, work / "service.log", die_with_parent=True
        ) as child:
            url = child.url
            show(f"service: {url} (log {work / 'service.log'})")
            spark = local_session(app_name="purgatory-demo")
            show(f"spark: {spark.sparkContext.master}, Spark {spark.version}")
            try:
                show("\n== barrier: three upstream jobs, one downstream report ==")
                ok = run_barrier(spark, bootstrap_servers=broker.bootstrap_servers,
                                 service_url=url, run="2026-11-22", work_dir=work / "barrier",
                                 show=show)  # fmt: skip
                late = run_barrier(spark, bootstrap_servers=broker.bootstrap_servers,
                                   service_url=url, run="2026-11-23", work_dir=work / "barrier",
                                   fail=("stock",), deadline_in_ms=8_000, show=show)  # fmt: skip
                checks["barrier completed, report ran"] = ok.proceeded
                checks["barrier expired, stock named"] = not late.proceeded and late.outcome[
                    "missing"
                ] == ["ingest/stock@2026-11-23"]

                show("\n== inactivity: event-time sessions closed by re-armed timers ==")
                gap_ms = 30_000
                result = run_inactivity(
                    spark, bootstrap_servers=broker.bootstrap_servers, work_dir=work / "clicks",
                    gap_ms=gap_ms, show=show,
                )  # fmt: skip
                expected = expected_sessions(EVENTS, gap_ms=gap_ms, delay_ms=0, base_ms=BASE_MS)
                checks["sessions match the inactivity rule"] = result.sessions == expected

                show("\n== the callbacks Spark consumed (purgatory-callbacks, batch read) ==")
                rows = (
                    spark.read.format("purgatory-callbacks")
                    .option("bootstrap_servers", broker.bootstrap_servers)
                    .option("topic", topics.topic_callbacks)
                    .load()
                    .orderBy("outcome_ms", "scope", "op_id")
                    .collect()
                )
                for row in rows:
                    show(_callback_line(row))
                counts.update(row["outcome"] for row in rows)
                checks["every callback read back"] = len(rows) == 2 + len(expected)
            finally:
                spark.stop()
    show("\nsummary: " + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())))
    for name, held in checks.items():
        show(f"  [{'ok' if held else 'FAILED'}] {name}")
    return 0 if checks and all(checks.values()) else 1
