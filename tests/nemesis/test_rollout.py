"""The rollout, short form: Apache Kafka, three replicas in one group, 20,000 pending, each
replica in turn SIGTERMed and started again under HTTP and Kafka load (45-80 s).

What must hold, as in the full run (``make rollout``: 300,000 pending, 150 writes/s):

* nothing acknowledged is lost and nothing conflicts; every stop exits 0;
* every partition that changes owner during the rollout moves **warm**: its next owner takes
  over a standby it rebuilt while the old owner still served it, and no partition is restored
  cold after the replicas first started;
* writes answered 2xx within 2 s of their first send: at least 97 % here (the full run's
  target is 99 %; this one shares the machine with the suite's other workers, and its fewer
  writes make each slow one count more).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nemesis.rollout import main

# One xdist group with the other tests that load the whole machine: never side by side.
pytestmark = [pytest.mark.kafka, pytest.mark.xdist_group("whole-machine")]

MIN_SHARE = 0.97


def test_a_rollout_moves_every_partition_warm_and_loses_nothing(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    args = ["--pending", "20000", "--write-rate", "60", "--signal-rate", "40"]
    args += ["--before-s", "3", "--after-s", "3", "--out", str(out), "--work", str(work)]
    code = main(args)
    report = out / "rollout.json"
    assert report.exists(), f"the rollout did not finish (exit {code}); logs in {work}"
    doc = json.loads(report.read_text())
    correctness = doc["correctness"]
    assert correctness["lost"] == 0, correctness
    assert correctness["conflicting"] == 0, correctness
    assert [step["exit_code"] for step in doc["steps"]] == [0, 0, 0], doc["steps"]
    assert doc["stop_codes"] == [0, 0, 0], doc["stop_codes"]
    began_ms = doc["steps"][0]["sigterm_ms"]
    moves = [
        e
        for e in json.loads((work / "log-events.json").read_text())
        if e["event"] == "partition_restoring" and e["at_ms"] >= began_ms
    ]
    assert len(moves) >= 3, moves  # three replicas rolled: partitions moved
    cold = [e for e in moves if not e.get("standby")]
    assert cold == [], cold
    writes = doc["writes"]
    assert writes["share_ok_within_2s"] >= MIN_SHARE, writes
