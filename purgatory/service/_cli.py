"""The command line (service layer): ``purgatory <command>``.

Arguments are validated by argparse, which names the bad argument and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import trio

from purgatory.service._demo import run_demo, summarize
from reaper import Clock

__all__ = ["main"]


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not 0.1 <= value <= 100:
        raise argparse.ArgumentTypeError(f"must be between 0.1 and 100, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="purgatory", description="Durable delayed operations for data pipelines."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo", help="play the typical uses live: barrier, quorum, timers, event time"
    )
    demo.add_argument("--speed", type=_positive_float, default=1.0, help="play faster (>1)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit status."""
    args = _parser().parse_args(argv)
    if args.command == "demo":

        async def demo() -> None:
            result = await run_demo(Clock.from_wall_clock(), speed=args.speed)
            print(summarize(result))

        trio.run(demo)
    return 0


if __name__ == "__main__":
    sys.exit(main())
