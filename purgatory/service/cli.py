"""The command line (service layer): ``purgatory <command>``.

``serve`` runs the service as configured by ``PURGATORY_*`` variables (flags override them);
``dev`` starts a development broker on a free loopback port (the embedded Tansu, or Apache Kafka
with ``--broker kafka``), creates the topics and serves against it; ``op``, ``signal`` and
``watermark`` call a running service's HTTP API, retrying a 503 (a broker restarting, a
partition restoring) until ``--timeout-s`` (30 s by default) has passed; ``demo --engine`` plays
the typical uses on the engine alone, in-process. The whole-pipeline demo (embedded broker, the
service, Spark jobs) lives on the Spark side, ``purgatory-pipeline``: ``demo`` without
``--engine`` says so and exits with status 2. Bad arguments and settings are answered with a
message that names them and exit status 2, and so is a development broker that cannot start (its
package or jars missing); an error answer from the service prints its field and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from purgatory._core import ConfigError, PurgatoryError
from purgatory.client import ApiError, PurgatoryClient
from purgatory.service.ops.top import render_top
from purgatory.service.run import run_serve, run_snapshotter
from reaper import Clock

__all__ = ["main"]

_DEFAULT_URL = "http://127.0.0.1:8080"
#: How long a client command may take by default, its retries of a 503 included (seconds).
_CLIENT_TIMEOUT_S = 30.0
_MAX_TIMEOUT_S = 3600.0
_PIPELINE = "`purgatory-pipeline` (or `python -m spark_bridge.demo`, `make demo`)"


def _bounded_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0.1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and 100, got {value}")
    return value


def _timeout_s(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0.1 <= value <= _MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and {_MAX_TIMEOUT_S:g}, got {value}")
    return value


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be JSON, got {text!r}") from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="purgatory", description="Durable delayed operations for data pipelines."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    # The development tooling's names, here only (serve never imports it, and importing it
    # first would import the service back half-initialized).
    from purgatory.devtools.dev_broker import DEV_BROKER_ENV, DEV_BROKERS  # noqa: PLC0415

    demo = commands.add_parser(
        "demo",
        help="--engine: the typical uses on the engine, in-process (the whole pipeline "
        f"moved to {_PIPELINE})",
    )
    demo.add_argument(
        "--engine", action="store_true", help="play the typical uses on the engine in-process"
    )
    demo.add_argument("--speed", type=_bounded_float, default=1.0, help="with --engine: faster")

    for name, text in (
        ("serve", "run the service (configured by PURGATORY_* variables)"),
        ("snapshotter", "tail the journal and write snapshots (serve starts one itself)"),
        ("dev", "start a development broker and run the service against it"),
    ):
        cmd = commands.add_parser(name, help=text)
        cmd.add_argument("--host", help="HTTP host (PURGATORY_HTTP_HOST)")
        cmd.add_argument("--port", type=int, help="HTTP port (PURGATORY_HTTP_PORT)")
        if name in ("serve", "snapshotter"):
            cmd.add_argument("--bootstrap-servers", help="PURGATORY_KAFKA_BOOTSTRAP_SERVERS")
        if name == "dev":
            cmd.add_argument(
                "--broker",
                choices=DEV_BROKERS,
                help=f"tansu: embedded, in memory (the default); kafka: Apache Kafka, after "
                f"`make kafka` ({DEV_BROKER_ENV})",
            )
            cmd.add_argument(
                "--data-dir",
                type=Path,
                help="with --broker kafka: keep the broker's log here, so that the next "
                "`purgatory dev` on it restores the pending operations (default: temporary)",
            )

    client_args = argparse.ArgumentParser(add_help=False)
    client_args.add_argument("--url", default=os.environ.get("PURGATORY_URL", _DEFAULT_URL))
    client_args.add_argument("--token", default=os.environ.get("PURGATORY_API_TOKEN"))
    client_args.add_argument(
        "--timeout-s",
        type=_timeout_s,
        default=_CLIENT_TIMEOUT_S,
        help="how long the call may take, its retries of a 503 included (a broker restarting,"
        f" a partition restoring; op wait also waits its --timeout-ms); default"
        f" {_CLIENT_TIMEOUT_S:g}",
    )

    op = commands.add_parser("op", help="register, inspect, wait for or cancel operations")
    ops = op.add_subparsers(dest="op_command", required=True)
    create = ops.add_parser("create", parents=[client_args], help="register an operation")
    create.add_argument("--scope", required=True)
    create.add_argument("--id", dest="op_id", required=True)
    create.add_argument("--key", dest="keys", action="append", default=[], help="repeat per key")
    when = create.add_mutually_exclusive_group(required=True)
    when.add_argument("--timeout-ms", type=int)
    when.add_argument("--deadline-ms", type=int)
    create.add_argument("--condition", choices=["all", "any", "count"], default="all")
    create.add_argument("--count", type=int)
    create.add_argument("--event-time", action="store_true", help="the deadline is event time")
    create.add_argument("--payload", type=_json_value, help="JSON returned in the callback")
    create.add_argument("--reply-to", help="callback topic")
    for name, text in (
        ("get", "show an operation"),
        ("wait", "wait for an outcome"),
        ("cancel", "cancel"),
    ):
        sub = ops.add_parser(name, parents=[client_args], help=text)
        sub.add_argument("--scope", required=True)
        sub.add_argument("--id", dest="op_id", required=True)
        if name == "wait":
            sub.add_argument("--timeout-ms", type=int, default=30_000)
    listing = ops.add_parser("list", parents=[client_args], help="pending operations of a scope")
    listing.add_argument("--scope", required=True)
    listing.add_argument("--limit", type=int, help="at most this many (default 100)")
    listing.add_argument("--cursor", help="the next_cursor of the page before")

    sig = commands.add_parser("signal", parents=[client_args], help="publish a signal")
    sig.add_argument("--scope", required=True)
    sig.add_argument("--key", required=True)
    sig.add_argument("--payload", type=_json_value)
    sig.add_argument("--event-time-ms", type=int)

    top = commands.add_parser(
        "top", parents=[client_args], help="what a replica holds, redrawn (as its page /ui)"
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval-s", type=_bounded_float, default=2.0, help="between frames")

    wm = commands.add_parser("watermark", parents=[client_args], help="advance a watermark")
    wm.add_argument("--scope", required=True)
    wm.add_argument("--watermark-ms", type=int, required=True)
    return parser


def _client_call(args: argparse.Namespace) -> Any:
    with PurgatoryClient(args.url, token=args.token, timeout_s=args.timeout_s) as client:
        if args.command == "signal":
            return client.signal(
                args.scope, args.key, payload=args.payload, event_time_ms=args.event_time_ms
            )
        if args.command == "watermark":
            return client.watermark(args.scope, args.watermark_ms)
        if args.op_command == "create":
            return client.register(
                scope=args.scope,
                op_id=args.op_id,
                keys=args.keys,
                timeout_ms=args.timeout_ms,
                deadline_ms=args.deadline_ms,
                condition=args.condition,
                count=args.count,
                time_domain="event_time" if args.event_time else "processing_time",
                payload=args.payload,
                reply_to=args.reply_to,
            )
        if args.op_command == "list":
            return client.pending(args.scope, limit=args.limit, cursor=args.cursor)
        if args.op_command == "wait":
            return client.wait(args.scope, args.op_id, args.timeout_ms)
        if args.op_command == "cancel":
            return client.cancel(args.scope, args.op_id)
        return client.get(args.scope, args.op_id)


def _top(args: argparse.Namespace) -> int:
    """``purgatory top``: one frame with ``--once``, else a frame every ``--interval-s``."""
    with PurgatoryClient(args.url, token=args.token, timeout_s=args.timeout_s) as client:
        try:
            while True:
                frame = render_top(client.overview())
                if args.once:
                    print(frame, end="")
                    return 0
                print("\x1b[H\x1b[2J" + frame, end="", flush=True)  # home, clear: redraw
                trio.run(trio.sleep, args.interval_s)
        except ApiError as exc:
            print(f"purgatory top: {exc}", file=sys.stderr)
            return 1
        except KeyboardInterrupt:
            return 0


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    values = {"http_host": args.host, "http_port": args.port}
    if getattr(args, "bootstrap_servers", None):
        values["kafka_bootstrap_servers"] = args.bootstrap_servers
    return {k: v for k, v in values.items() if v is not None}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = _parser().parse_args(argv)
    if args.command == "demo" and not args.engine:
        print(
            "purgatory demo: the whole-pipeline demo (embedded broker, the service, Spark jobs) "
            f"moved to the Spark side: run {_PIPELINE}; "
            "`purgatory demo --engine` plays the engine alone, in-process",
            file=sys.stderr,
        )
        return 2
    if args.command == "demo":
        from purgatory.devtools.demo import run_demo, summarize  # noqa: PLC0415 - devtools

        async def demo() -> None:
            result = await run_demo(Clock.from_wall_clock(), speed=args.speed)
            print(summarize(result))

        trio.run(demo)
        return 0
    if args.command == "top":
        return _top(args)
    if args.command in ("serve", "snapshotter", "dev"):
        run = {"serve": run_serve, "snapshotter": run_snapshotter}.get(args.command)
        try:
            if run is None:
                from purgatory.devtools.dev import run_dev  # noqa: PLC0415 - devtools

                return run_dev(
                    dict(os.environ), _overrides(args), broker=args.broker, data_dir=args.data_dir
                )
            return run(dict(os.environ), _overrides(args))
        except ConfigError as exc:
            print(f"purgatory: configuration error: {exc}", file=sys.stderr)
            return 2
    try:
        print(json.dumps(_client_call(args), indent=2, ensure_ascii=False))
    except ApiError as exc:
        print(f"purgatory: {exc}", file=sys.stderr)
        return 1
    except PurgatoryError as exc:
        print(f"purgatory: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
