"""One nemesis run from the root namespace: make the lab, run the orchestration inside it, check.

:func:`run_one` makes a :class:`~tests.nemesis.lab.Lab`, writes the run's configuration, starts
``python -m tests.nemesis.inside`` in the lab's client namespace (``ip netns exec``; it dies with
this process), waits for it within a bound that follows from the plan, and removes the lab
whatever happened. Then it checks the run's directory (:func:`tests.nemesis.report.check_run`)
and writes ``verdict.json`` there. :func:`prerequisites` says what the machine lacks: root,
``ip``/``bridge``/``tc``, Java, Kafka's jars.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from purgatory.devtools.kafka_broker import default_libs
from purgatory.service.supervisors.supervisor import with_pdeathsig
from tests.nemesis._clock import elapsed_s
from tests.nemesis.checker import Verdict
from tests.nemesis.config import RunConfig
from tests.nemesis.lab import Lab, lab_problems
from tests.nemesis.plan import Shape, make_plan
from tests.nemesis.report import check_run, log_events, verdict_json

__all__ = ["RunResult", "prerequisites", "run_one"]

ROOT = Path(__file__).resolve().parents[2]
# Beyond the plan: the broker's and the replicas' starts, the wait for callbacks, the stops
# and the two reads, each bounded in the orchestration.
_OVERHEAD_S = 600.0
_KILL_WAIT_S = 10.0


def prerequisites() -> list[str]:
    """What this machine lacks for a nemesis run (empty: nothing)."""
    problems = lab_problems()
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        problems.append("Java is missing: Apache Kafka needs Java 17 or later")
    if not any(any(libs.glob("kafka_2.13-*.jar")) for libs in default_libs()):
        problems.append("Apache Kafka's jars are missing: run `make kafka`")
    return problems


@dataclass(frozen=True, slots=True)
class RunResult:
    """One run: what it was, how it went, and the checker's verdict (None: no history)."""

    seed: int
    delivery: str
    out: Path
    code: int | None
    seconds: float
    verdict: Verdict | None
    error: str = ""


def run_one(
    seed: int, delivery: str, *, shape: Shape, kinds: Sequence[str] = (), out: Path
) -> RunResult:
    """Run seed ``seed`` in ``delivery`` mode with its output in ``out`` (made here).

    Raises:
        ValueError: an unknown fault kind.
        LabError: the lab could not be made.
    """
    plan = make_plan(seed, shape, kinds)  # raises on an unknown kind before anything starts
    out.mkdir(parents=True, exist_ok=False)
    began = elapsed_s()
    code: int | None = None
    with Lab() as lab:
        config = RunConfig(lab.net.prefix, seed, delivery, tuple(kinds), shape, out)
        inside = [sys.executable, "-m", "tests.nemesis.inside", str(config.save())]
        argv = [*lab.net.exec_prefix("client"), *with_pdeathsig(inside)]
        with (out / "inside.log").open("wb") as log:
            proc = subprocess.Popen(
                argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
            try:
                code = proc.wait(plan.settle_s + _OVERHEAD_S)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(_KILL_WAIT_S)
    seconds = round(elapsed_s() - began, 1)
    error = "" if code == 0 else _error(out, code)
    verdict = check_run(out) if (out / "callbacks-committed.jsonl").exists() else None
    doc = {"seed": seed, "delivery": delivery, "code": code, "seconds": seconds, "error": error}
    if verdict is not None:
        doc["verdict"] = verdict_json(verdict, log_events(out))
    (out / "verdict.json").write_text(json.dumps(doc, indent=2) + "\n")
    return RunResult(seed, delivery, out, code, seconds, verdict, error)


def _error(out: Path, code: int | None) -> str:
    if code is None:
        return "the orchestration did not finish in time (killed)"
    summary = out / "inside.json"
    if summary.exists():
        error = json.loads(summary.read_text()).get("error")
        if error:
            return str(error).strip().splitlines()[-1]
    log = out / "inside.log"
    tail = log.read_text(errors="replace")[-500:] if log.exists() else ""
    return f"the orchestration exited {code}: {tail}"
