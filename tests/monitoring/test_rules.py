"""The chart's alerts run by Prometheus' own ``promtool``: checked, and unit-tested one by one.

``promtool check rules`` parses every rendered rule the way a Prometheus server loads it (PromQL,
templates of the annotations, durations). ``promtool test rules`` replays the files of
``alerts/``: series written as a scrape would see them, and the alerts expected at each
evaluation. Every alert has series that fire it, and series that must not: a restart (counters
reset, gauges start again, a catch-up burst), a quiet service with no traffic, and for the
lateness and lag alerts registrations whose deadline had already passed. An alert with a
``for:`` is shown pending, not firing, one evaluation before its wait ends.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm._chart import SCENARIOS
from tests.monitoring._prometheus import binary
from tests.monitoring.render_rules import (
    ALERT_TESTS,
    RULES_FILE,
    RULES_VALUES,
    main,
    rules_spec,
    write_rules,
)

pytestmark = [pytest.mark.helm, pytest.mark.prometheus]

ALERT_FILES = sorted(ALERT_TESTS.glob("*_test.yaml"))
EVALUATION_S = 60
# Alerts on how late things happen: registrations overdue on arrival must not move them.
LATENESS_ALERTS = ("PurgatoryExecutorLagHigh", "PurgatoryReaperLate")


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary("promtool")), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )


def _rules(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    spec = rules_spec(values)
    return {rule["alert"]: rule for group in spec["groups"] for rule in group["rules"]}


_TUNED = {
    "config": {"max_pending": 20_000_000, "snapshot_interval_ms": 1_500},
    "resources": {"limits": {"memory": "3Gi"}},
    "prometheusRule": {
        "enabled": True,
        "selector": 'service="purgatory",namespace=~"pipelines|batch"',
        "thresholds": {
            "pendingRatio": 0.5,
            "executorLagSeconds": 0.25,
            "memoryFraction": 0.9,
            "snapshotAgeIntervals": 4,
            "snapshotterRestarts": 5,
            "partitionFences": 10,
        },
        "for": "2m",
    },
}


@pytest.mark.parametrize(
    ("values", "count"),
    [
        (RULES_VALUES, 13),
        (SCENARIOS["prometheus-rule"], 13),
        (SCENARIOS["everything"], 13),
        (_TUNED, 13),
        ({"prometheusRule": {"enabled": True}, "resources": {"limits": {"memory": None}}}, 12),
        ({"prometheusRule": {"enabled": True}, "config": {"snapshot_interval_ms": 0}}, 11),
        ({"prometheusRule": {"enabled": True}, "config": {"journal": False}}, 9),
    ],
    ids=[
        "defaults",
        "alert-labels",
        "everything",
        "tuned",
        "no-memory-limit",
        "no-snapshots",
        "no-journal",
    ],
)
def test_promtool_accepts_the_rendered_rules(
    tmp_path: Path, values: dict[str, Any], count: int
) -> None:
    path = write_rules(tmp_path, values)
    done = _promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {count} rules found" in done.stdout


@pytest.fixture(scope="module")
def rules_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default rules rendered beside copies of the unit tests, as the docs tell."""
    out = tmp_path_factory.mktemp("alerts")
    assert main([str(out)]) == 0
    return out


@pytest.mark.parametrize("test_file", ALERT_FILES, ids=lambda path: path.stem)
def test_the_alert_unit_tests_pass(rules_dir: Path, test_file: Path) -> None:
    done = _promtool("test", "rules", test_file.name, cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


# -- what the unit tests cover -------------------------------------------------------------


def _seconds(duration: str) -> int:
    """A Prometheus duration (``1h``, ``5m``, ``40s``, ``4m30s``) in seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts is not None and duration, duration
    hours, minutes, seconds = (int(p or 0) for p in parts.groups())
    return hours * 3600 + minutes * 60 + seconds


@dataclass(frozen=True, slots=True)
class _Group:
    """One test group of a promtool file, reduced to what the coverage rules read."""

    file: str
    name: str
    series: tuple[str, ...]
    fired: dict[tuple[str, int], bool]  # (alert, eval s) -> fires
    pending: frozenset[tuple[str, int]]  # shown pending in ALERTS at (alert, eval s)

    def cases(self, alert: str) -> dict[int, bool]:
        return {t: fires for (name, t), fires in self.fired.items() if name == alert}


def _groups() -> Iterator[_Group]:
    for path in ALERT_FILES:
        loaded = yaml.safe_load(path.read_text())
        assert loaded["rule_files"] == [RULES_FILE], path.name
        assert loaded["evaluation_interval"] == f"{EVALUATION_S // 60}m", path.name
        for group in loaded["tests"]:
            fired = {
                (case["alertname"], _seconds(case["eval_time"])): bool(case["exp_alerts"])
                for case in group.get("alert_rule_test", [])
            }
            pending = set()
            for case in group.get("promql_expr_test", []):
                match = re.fullmatch(r'ALERTS\{alertname="(\w+)"\}', case["expr"])
                samples = case["exp_samples"] or []
                if match and any('alertstate="pending"' in s["labels"] for s in samples):
                    pending.add((match[1], _seconds(case["eval_time"])))
            yield _Group(
                path.name,
                group["name"],
                tuple(s["series"].split("{")[0] for s in group["input_series"]),
                fired,
                frozenset(pending),
            )


def test_every_alert_is_unit_tested_firing_and_quiet() -> None:
    rules = _rules()
    groups = list(_groups())
    assert {alert for g in groups for alert, _ in g.fired} == set(rules)
    for alert in rules:
        tested = [g for g in groups if g.cases(alert)]
        assert any(any(g.cases(alert).values()) for g in tested), f"{alert}: never fires"
        restarts = [g for g in tested if "restart" in g.name]
        assert restarts, f"{alert}: no restart"
        quiet = [g for g in tested if g.name == "a quiet service"]
        assert quiet, f"{alert}: no quiet service"
        for group in restarts + quiet:
            assert not any(group.cases(alert).values()), f"{alert}: fires in {group.name}"
        if alert in LATENESS_ALERTS:
            overdue = [g for g in tested if "purgatory_registrations_overdue_total" in g.series]
            assert overdue, f"{alert}: no registrations overdue on arrival"
            assert not any(any(g.cases(alert).values()) for g in overdue), alert


def test_no_alert_fires_before_its_wait() -> None:
    # Some group shows the alert firing at F and not at the evaluation before; with a for:, F
    # is no earlier than the wait, and the evaluation before shows it pending.
    for alert, rule in _rules().items():
        wait_s = _seconds(rule["for"]) if "for" in rule else 0
        onsets = [
            (group, t)
            for group in _groups()
            for t, fires in group.cases(alert).items()
            if fires and group.cases(alert).get(t - EVALUATION_S) is False
        ]
        assert onsets, f"{alert}: no evaluation just before it fires"
        if wait_s:
            assert any(
                t >= wait_s and (alert, t - EVALUATION_S) in group.pending for group, t in onsets
            ), f"{alert}: not shown pending for its {rule['for']}"
