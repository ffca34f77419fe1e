"""The nemesis, short form: one seed per delivery mode, three rounds of faults, about 75 s each.

Apache Kafka and three ``purgatory serve`` replicas (consumer-group mode) run in network
namespaces of their own while the workload registers, signals and cancels over HTTP and Kafka;
the nemesis cuts the broker from everyone (registrations then reach their owners after their
deadlines), pauses a replica past its session timeout, and cuts one replica from the broker;
then everything heals and settles, and the checker reads the callbacks topic against the
history. (A SIGKILL and a restart are the long form's, and ``tests/service/test_sigkill*``'s.)
What must hold, "one outcome per operation" under those faults:

* nothing acknowledged is lost, nothing conflicts, nothing contradicts its inputs, nothing is
  early, and no replica exits on its own;
* acknowledged delivery: every copy of a callback is byte-identical (nothing re-decided);
* transactional delivery: a ``read_committed`` reader sees exactly one record per operation.

Both modes share one ``xdist_group`` (with the other tests that load the whole machine), so
they never run at once on a two-core machine (each already runs a JVM, three replicas with
their snapshotters, and the load). It needs root and
``ip``/``bridge``/``tc`` (CI runs as root); without them it fails and says why. Run the long
form with ``make nemesis``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.nemesis.config import DELIVERIES
from tests.nemesis.plan import Shape
from tests.nemesis.report import log_events, verdict_json
from tests.nemesis.run import prerequisites, run_one

# One xdist group with the other tests that load the whole machine (a fresh Kafka beside busy
# loops): they run one after another, never side by side.
pytestmark = [pytest.mark.nemesis, pytest.mark.xdist_group("whole-machine")]

SEED = 1
KINDS = ("cut-broker", "pause", "cut-replica-broker")
# Short enough for every gate (about 80 s a mode), long enough to bite: each cut outlasts the
# journal wait (5 s), the pause the session (10 s), and deadlines fall inside the faults.
SHORT = Shape(
    rounds=len(KINDS),
    warmup_s=2.0,
    fault_s=(7.0, 9.0),
    pause_s=(12.5, 13.5),
    gap_s=4.0,
    deadline_s=(3.0, 9.0),
    late_s=(0.3, 2.5),
    settle_margin_s=4.0,
)


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_one_outcome_per_operation_under_pauses_cuts_and_kills(
    delivery: str, tmp_path: Path
) -> None:
    problems = prerequisites()
    if problems:
        pytest.fail("the nemesis cannot run here: " + "; ".join(problems))
    result = run_one(SEED, delivery, shape=SHORT, kinds=KINDS, out=tmp_path / "run")
    assert result.verdict is not None, f"the run did not finish: {result.error} ({result.out})"
    verdict = result.verdict
    report = json.dumps(verdict_json(verdict, log_events(result.out)), indent=1)[:20_000]
    counts = verdict.counts()
    print(f"\nnemesis {delivery}: {result.seconds} s, {counts}, notes {verdict.notes}")
    assert counts["acknowledged"] > 50, report
    assert counts["lost"] == 0, report
    assert counts["conflicting"] == 0, report
    assert counts["contradicting"] == 0, report
    assert counts["early"] == 0, report
    assert counts["unexpected_exits"] == 0, report
    if delivery == "acknowledged":
        assert counts["re_decided"] == 0, report  # every copy byte-identical
    else:
        assert counts["extra_committed"] == 0, report  # one committed record each
