"""Process entry points (service layer): ``purgatory serve`` and ``purgatory snapshotter``.

``serve`` reads the settings once, configures logging and runs the service until SIGTERM or
SIGINT; with the journal and snapshots on, it starts ``purgatory snapshotter`` as its child
(which dies with it), so snapshots are built in another process than the serving loop. A
:class:`~purgatory.service.supervisors.supervisor.Supervisor` reaps that child when it exits
and starts it again, and a :class:`~purgatory.service.snapshots.snapshot_watch.SnapshotWatch`
reads how fresh each partition's latest snapshot is; both show in the service's metrics. At
the stop, the child is stopped after the service. (``purgatory dev`` is
:mod:`purgatory.devtools.dev`.)
"""

from __future__ import annotations

import functools
import gc
import os
import signal as signals
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import httpx
import trio

from purgatory.service.app import kafka_transport, run_service
from purgatory.service.journal.modes import delivery_mode
from purgatory.service.kafka.config import raising_single_errors
from purgatory.service.ownership.layout import check_counts, read_counts
from purgatory.service.settings import Settings, env_name
from purgatory.service.snapshots.snapshot_watch import SnapshotWatch
from purgatory.service.snapshots.snapshotter import LAST_SNAPSHOTS_S, Snapshotter
from purgatory.service.supervisors.supervisor import (
    Child,
    Supervisor,
    start_process,
    with_pdeathsig,
)
from purgatory.service.telemetry.logging import configure_logging, get_logger
from purgatory.service.telemetry.metrics import Metrics
from reaper import Clock

__all__ = ["env_value", "run_serve", "run_snapshotter", "serve_with_snapshotter"]

_log = get_logger()


def _tune_gc() -> None:
    """Fewer, cheaper collections for a process that holds many long-lived operations.

    The service allocates a few objects per signal and keeps operations for minutes to days;
    CPython's default thresholds then spend a sixth of the interpreter's time in collections
    that find little garbage. Freezing what start-up allocated keeps it out of every scan.
    """
    gc.set_threshold(100_000, 50, 1_000)
    gc.freeze()
    # CPython's thread switch interval stays at its 5 ms. A shorter one (0.5 ms) was measured
    # to make the serving loop answer sooner beside a thread that rebuilds an engine, but it
    # hands the interpreter lock between the loop and the Kafka clients' threads ten times as
    # often, and on a busy machine each hand-over waits for the OS to run the thread: in the
    # rollout test, 29 % of writes were answered within 2 s (99.3 % with the default).


def run_serve(environ: Mapping[str, str], overrides: Mapping[str, Any]) -> int:
    """Run the service as configured; returns the exit status (0 after a graceful stop).

    Raises:
        ConfigError: a setting is invalid (the message names its variable).
    """
    settings = Settings.from_env(environ, **overrides)
    configure_logging(settings.log_level, settings.log_format)
    _tune_gc()
    if not settings.journal or not settings.snapshot_interval_ms:
        trio.run(run_service, settings)
        return 0
    child_env = {**environ, **{env_name(k): env_value(v) for k, v in overrides.items()}}
    start = "import sys; from purgatory.service import main; sys.exit(main(['snapshotter']))"
    # Built on the main thread: the kernel kills the child when this thread (the process) dies.
    command = with_pdeathsig([sys.executable, "-c", start])
    trio.run(serve_with_snapshotter, settings, functools.partial(start_process, command, child_env))
    return 0


#: The longest pause between two looks at the snapshots (a shorter interval looks as often).
SNAPSHOT_WATCH_MAX_S = 30.0


async def serve_with_snapshotter(settings: Settings, start: Callable[[], Child]) -> None:
    """Run the service with a supervised snapshotter beside it, until SIGTERM or SIGINT.

    What can refuse the start is checked before anything starts, in the service's order: in
    transactional delivery, that the broker does transactions; then the topics' partition
    counts. Only then is the snapshotter started, before the service; it is stopped (SIGTERM,
    then a kill, and reaped) once the service has stopped; meanwhile every exit of it is
    logged, counted and followed by a restart (see
    :mod:`purgatory.service.supervisors.supervisor`).

    Args:
        settings: the configuration (journal and snapshots on).
        start: starts the snapshotter process.

    Raises:
        ConfigError: the broker cannot do the transactions the delivery needs, or the topics'
            partition counts disagree (nothing is started).
        TransportError: as :func:`~purgatory.service.app.run_service` does (the broker did not
            answer the transactions check: nothing is started).
    """
    transport = kafka_transport(settings)
    clock = Clock.from_wall_clock()
    metrics = Metrics()
    supervisor = Supervisor(start)
    mode = delivery_mode(settings)
    # Before the snapshotter: a broker that cannot do the mode's transactions (the embedded
    # one) refuses the start with nothing started (the service is told not to probe again).
    await mode.check(transport)
    async with transport.open_reader(read_committed=mode.read_committed) as reader:
        # Topics of other partition counts refuse the start before the snapshotter starts
        # (the service checks again, its input topics as its consumer sees them).
        counts = await read_counts(settings, reader.partition_count)
        check_counts(counts, settings.topic_partitions)
        watch = SnapshotWatch(
            reader,
            snapshots_topic=settings.topic_snapshots,
            changelog_topic=settings.topic_changelog,
            partitions=settings.kafka_static_partitions,
            now_ms=clock.now_ms,
            every_s=min(SNAPSHOT_WATCH_MAX_S, (settings.snapshot_interval_ms or 60_000) / 1000),
        )
        metrics.bind_snapshots(snapshots=watch.statistics, snapshotter=supervisor.statistics)
        with raising_single_errors():  # the service's own error, not a group of one
            async with trio.open_nursery() as nursery:
                await nursery.start(supervisor.run)
                nursery.start_soon(watch.run)
                await run_service(
                    settings, clock=clock, transport=transport, metrics=metrics, checked=True
                )
                nursery.cancel_scope.cancel()


def run_snapshotter(environ: Mapping[str, str], overrides: Mapping[str, Any]) -> int:
    """Tail the journal and write snapshots until SIGTERM or SIGINT (see ``snapshotter``).

    The process lowers its own priority: a standby catches up in the service's idle time, and
    under load the serving process and the broker get the CPU first.
    """
    os.nice(10)
    settings = Settings.from_env(environ, **overrides)
    configure_logging(settings.log_level, settings.log_format)
    _tune_gc()
    trio.run(_snapshot_until_stopped, settings)
    return 0


async def _snapshot_until_stopped(settings: Settings) -> None:
    transport = kafka_transport(settings)
    async with (
        transport.open_reader(read_committed=delivery_mode(settings).read_committed) as reader,
        transport.open_sink() as sink,
    ):
        # Group mode: none at first, then those the service beside holds (each once it stays:
        # a start that rebuilt every partition, to drop most of them a few seconds later, took
        # the CPU of every restart in a rollout from the replicas that carried the load).
        static = settings.kafka_static_partitions
        partitions = static or ()
        snapshotter = Snapshotter(
            reader,
            sink,
            changelog_topic=settings.topic_changelog,
            snapshots_topic=settings.topic_snapshots,
            config=settings.to_engine_config(),
            partitions=sorted(partitions),
            interval_ms=settings.snapshot_interval_ms or 60_000,
            max_record_bytes=settings.max_record_bytes,
            # In group mode the partitions move: follow those the service beside holds.
            wanted=None if static else functools.partial(_held_by_service, settings),
        )
        with trio.open_signal_receiver(signals.SIGTERM, signals.SIGINT) as received:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(snapshotter.run)
                async for _ in received:
                    nursery.cancel_scope.cancel()
                    break
            # A graceful stop: the service beside has stopped; hand its successor the latest
            # state. A second signal, or the bound, ends it at once.
            with trio.move_on_after(LAST_SNAPSHOTS_S) as bounded:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_cancel_on_signal, received, nursery.cancel_scope)
                    began, before = trio.current_time(), len(snapshotter.written)
                    await snapshotter.last_snapshots()
                    _log.info(
                        "last_snapshots_written",
                        seconds=round(trio.current_time() - began, 3),
                        partitions=len(snapshotter.written) - before,
                    )
                    nursery.cancel_scope.cancel()
            if bounded.cancelled_caught:
                _log.warning("last_snapshots_timed_out", after_s=LAST_SNAPSHOTS_S)


async def _cancel_on_signal(received: AsyncIterator[int], scope: trio.CancelScope) -> None:
    async for _ in received:
        scope.cancel()
        return


async def _held_by_service(settings: Settings) -> list[int] | None:
    """The partitions the service beside this snapshotter holds (from its ``/readyz``), or None
    when it cannot say (starting, stopping)."""
    host = "127.0.0.1" if settings.http_host in ("0.0.0.0", "::") else settings.http_host
    try:
        async with httpx.AsyncClient(timeout=2.0) as client:
            answer = await client.get(f"http://{host}:{settings.http_port}/readyz")
        partitions = answer.json().get("partitions")
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    if not isinstance(partitions, dict) or not partitions:
        return None  # none held (a rebalance under way): keep the standbys until it settles
    return sorted(int(p) for p in partitions if str(p).isdigit())


def env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
