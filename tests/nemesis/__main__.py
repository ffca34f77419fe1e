"""The nemesis's command line: ``python -m tests.nemesis --seeds 1,2,3 --delivery both``.

Runs one nemesis run per seed per delivery mode, one after the other (each in a lab of its own,
about three minutes with the default seven rounds), prints a table (seed, mode, ops,
acknowledged, lost, conflicting, re-decided, identical copies, extra committed, early,
contradicting, unexpected exits, then availability per fault kind) and writes ``results.json``
beside every run's directory (history, callbacks, logs, ``verdict.json``) under ``--out``.
``--check DIR`` checks a run's directory again without running anything. Exits 0 when every run
passed, 1 when one found something, 2 when one could not run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.nemesis.config import DELIVERIES
from tests.nemesis.plan import KINDS, Shape
from tests.nemesis.report import check_run, log_events, table, verdict_json
from tests.nemesis.run import prerequisites, run_one

_SHAPE = Shape()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.nemesis", description=__doc__)
    parser.add_argument("--seeds", default="1", help="comma-separated seeds (default: 1)")
    parser.add_argument(
        "--delivery", choices=(*DELIVERIES, "both"), default="both", help="default: both"
    )
    parser.add_argument(
        "--rounds", type=int, default=_SHAPE.rounds, help=f"fault rounds ({_SHAPE.rounds})"
    )
    parser.add_argument(
        "--faults",
        default="",
        help=f"fault kinds in order, comma-separated (default: a seeded order of all: {KINDS})",
    )
    parser.add_argument("--rate", type=float, default=_SHAPE.rate_per_s, help="registrations/s")
    parser.add_argument("--out", type=Path, help="output directory (default: a new one in /tmp)")
    parser.add_argument("--check", type=Path, metavar="DIR", help="check a run's directory again")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.check is not None:
        doc = verdict_json(check_run(args.check), log_events(args.check))
        print(json.dumps(doc, indent=2))
        return 0 if doc["passed"] else 1
    problems = prerequisites()
    if problems:
        print("nemesis: cannot run:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    modes = DELIVERIES if args.delivery == "both" else (args.delivery,)
    kinds = tuple(k for k in args.faults.split(",") if k.strip())
    shape = dataclasses.replace(Shape(), rounds=args.rounds, rate_per_s=args.rate)
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="nemesis-"))
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for seed in seeds:
        for delivery in modes:
            print(f"nemesis: seed {seed}, {delivery} ...", flush=True)
            result = run_one(
                seed, delivery, shape=shape, kinds=kinds, out=out / f"{seed}-{delivery}"
            )
            row = json.loads((result.out / "verdict.json").read_text())
            rows.append(row)
            (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
            print("  " + "\n  ".join(table([row]).splitlines()[:2]), flush=True)
    print(table(rows))
    print(f"\nnemesis: results in {out}/results.json")
    if any(not row.get("verdict") for row in rows):
        return 2
    return 0 if all(row["verdict"]["passed"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
