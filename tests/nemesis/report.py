"""What a run's directory says: the checker's verdict, the replicas' notable log events, a table.

:func:`check_run` reads a run's files (``config.json``, ``history.jsonl`` and both readings of
the callbacks topic) and checks them, so a run can be checked again offline
(``python -m tests.nemesis --check DIR``). :func:`log_events` collects the replicas' log events
that explain a finding (a partition fenced, handed over, restored, served; a journal stalled and
resumed; warnings and errors), and :func:`verdict_json` attaches to each example finding the
events of its partition around its outcome. :func:`table` prints one row per run.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.nemesis.checker import Finding, Verdict, check
from tests.nemesis.config import RunConfig
from tests.nemesis.history import read_callbacks, read_history

__all__ = ["check_run", "log_events", "table", "verdict_json"]

#: The log events that tell a partition's life and the journal's weather.
EVENTS = frozenset(
    (
        "partition_fenced",
        "partitions_handed_over",
        "partition_restoring",
        "partition_serving",
        "partition_dropped",
        "partition_taken_while_restoring",
        "journal_stalled",
        "journal_resumed",
        "operation_expired_late",
        "forward_failed",
        "service_ready",
        "service_stopping",
    )
)
_EXAMPLES = 8
_FINDINGS = ("lost", "conflicting", "re_decided", "extra_committed", "early", "contradicting")
_AROUND_MS = 20_000
_EVENTS_PER_EXAMPLE = 12


def check_run(out: Path) -> Verdict:
    """The checker's verdict on the run whose directory is ``out``."""
    config = RunConfig.load(out / "config.json")
    return check(
        read_history(out / "history.jsonl"),
        read_callbacks(out / "callbacks-committed.jsonl"),
        read_callbacks(out / "callbacks-uncommitted.jsonl"),
        config.delivery,
    )


def log_events(out: Path) -> list[dict[str, Any]]:
    """The notable events of every replica incarnation's log, oldest first, each with its
    ``replica`` and ``incarnation``."""
    found = []
    for log in sorted(out.glob("r*/serve-*.log")):
        incarnation = int(log.stem.split("-")[1])
        for line in log.read_text(errors="replace").splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if not isinstance(doc, dict):
                continue
            if doc.get("event") in EVENTS or doc.get("level") in ("warning", "error", "critical"):
                at_ms = _epoch_ms(doc.get("timestamp"))
                found.append(
                    {"replica": log.parent.name, "incarnation": incarnation, "at_ms": at_ms, **doc}
                )
    found.sort(key=lambda e: e["at_ms"] or 0)
    return found


def _epoch_ms(stamp: object) -> int | None:
    """A structlog ISO timestamp (``2026-11-28T22:17:29.519059Z``) in epoch milliseconds."""
    if not isinstance(stamp, str):
        return None
    try:
        return int(datetime.fromisoformat(stamp).timestamp() * 1000)
    except ValueError:
        return None


def _partition(finding: Finding) -> int | None:
    doc = finding.evidence.get("callback")
    if doc is None and finding.evidence.get("copies"):
        doc = finding.evidence["copies"][0]["doc"]
    return None if doc is None else int(doc["partition"])


def _anchor_ms(finding: Finding) -> int | None:
    """When ``finding`` happened: its outcome, else its first request."""
    doc = finding.evidence.get("callback")
    if doc is None and finding.evidence.get("copies"):
        doc = finding.evidence["copies"][0]["doc"]
    if doc is not None:
        return int(doc["outcome_ms"])
    requests = finding.evidence.get("requests") or []
    return min((int(r["invoke_ms"]) for r in requests), default=None)


def _mentions(event: dict[str, Any], partition: int) -> bool:
    parts = event.get("partitions")
    return event.get("partition") == partition or (isinstance(parts, list) and partition in parts)


def _related(finding: Finding, events: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The events that name ``finding``'s partition (every event when it has none) within
    20 s of it, the closest last."""
    partition, at_ms = _partition(finding), _anchor_ms(finding)
    related = []
    for event in events:
        if partition is not None and not _mentions(event, partition):
            continue
        stamp = event.get("at_ms")
        if at_ms is not None and stamp is not None and abs(stamp - at_ms) > _AROUND_MS:
            continue
        related.append({k: v for k, v in event.items() if k != "positions"})
    if at_ms is not None:
        related.sort(key=lambda e: -abs((e.get("at_ms") or at_ms) - at_ms))
    return related[-_EVENTS_PER_EXAMPLE:]


def verdict_json(verdict: Verdict, events: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """The verdict as JSON: counts, notes, availability, exits, and up to 8 examples of each
    finding (with the log events of its partition when ``events`` are given)."""

    def examples(findings: list[Finding]) -> list[dict[str, Any]]:
        shown = []
        for finding in findings[:_EXAMPLES]:
            doc = dataclasses.asdict(finding)
            if events:
                doc["log_events"] = _related(finding, events)
            shown.append(doc)
        return shown

    return {
        "delivery": verdict.delivery,
        "passed": verdict.passed(),
        "counts": verdict.counts(),
        "notes": verdict.notes,
        "availability": {k: v.summary() for k, v in sorted(verdict.availability.items())},
        "unexpected_exits": [dataclasses.asdict(e) for e in verdict.unexpected_exits],
        "examples": {name: examples(getattr(verdict, name)) for name in _FINDINGS},
    }


_COLUMNS = (
    ("ops", "ops"),
    ("acknowledged", "acked"),
    ("lost", "lost"),
    ("conflicting", "confl"),
    ("re_decided", "redec"),
    ("identical_copies", "copies"),
    ("extra_committed", "extra"),
    ("early", "early"),
    ("contradicting", "contra"),
    ("unexpected_exits", "exits"),
)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per run (``seed``, ``delivery``, ``seconds`` and the verdict's JSON), then each
    run's availability per fault kind: ok fractions during / after, p50 / p99 latencies."""
    head = ["seed", "mode", "secs", *(short for _, short in _COLUMNS), "verdict"]
    lines = [head]
    for row in rows:
        verdict = row.get("verdict")
        counts = verdict["counts"] if verdict else {}
        state = ("pass" if verdict["passed"] else "FAIL") if verdict else f"ERROR {row['error']}"
        lines.append(
            [str(row["seed"]), row["delivery"][:5], f"{row['seconds']:.0f}"]
            + [str(counts.get(name, "-")) for name, _ in _COLUMNS]
            + [state]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["  ".join(cell.rjust(w) for cell, w in zip(line, widths, strict=False))
            for line in lines]  # fmt: skip
    text.append("")
    text.append(
        "availability per fault: ok during/after (10 s), p50/p99 ms during, hung (no answer"
        " in 10 s) during, /readyz 200 during"
    )
    for row in rows:
        verdict = row.get("verdict")
        if not verdict:
            continue
        cells = []
        for kind, summary in verdict["availability"].items():
            during, after = summary["during"], summary["after"]
            cells.append(
                f"    {kind:<19} {_fraction(during['ok'])}/{_fraction(after['ok'])}"
                f"  {during['p50_ms']}/{during['p99_ms']} ms  hung {during.get('hung', '-')}"
                f"  ready {_fraction(during['ready'])}"
            )
        text.append(f"  seed {row['seed']} {row['delivery']}:")
        text.extend(cells)
    return "\n".join(text)


def _fraction(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"
