"""The rollout's verdict and report (pure: no I/O, no clock).

**Correctness** is the nemesis's checker (:func:`tests.nemesis.checker.check`) on the rollout's
history, plus what only a read of the replicas can say: operations with far deadlines are
meant to be still pending at the end. So the checker judges every operation but those the
replicas' read API lists as pending with no callback (it would count each of those lost), and:

- **lost**: a registration answered 2xx that is neither pending nor decided (the checker's
  lost), and a signal the broker acknowledged whose operation has no ``completed`` callback;
- **conflicting**: the checker's conflicting (two outcomes for one operation, one sequence or
  one ``id`` naming two) and re-decided (one outcome, different bytes), and an operation still
  listed pending although a callback decided it;
- **phantom**: an operation listed pending that no request registered.

**Availability** is the writes' own record: the share answered 2xx within 2 s of their first
send, over the whole load and over the rollout (first SIGTERM to last ready), the latency from
the first send to the final answer (nearest-rank percentiles), and what the attempts met (503,
no answer, no ready replica); the same per replica, over its step (its SIGTERM to its ready).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from tests.nemesis.checker import check
from tests.nemesis.history import Callback, Request
from tests.nemesis.rollout_load import SignalSent, Write, result_of

__all__ = [
    "WITHIN_MS",
    "Step",
    "correctness",
    "in_window",
    "passed",
    "readiness_seconds",
    "table",
    "write_figures",
]

WITHIN_MS = 2_000
_CUT = ("RemoteProtocolError", "ReadError")  # httpx: the server closed the connection
Op = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Step:
    """One replica's turn in the rollout (times in epoch ms; ``ready_ms`` None: never ready)."""

    replica: int
    sigterm_ms: int
    stop_s: float
    exit_code: int | None
    started_ms: int
    ready_ms: int | None
    ready_s: float | None
    error: str = ""


def _rank(values: Sequence[int], q: float) -> int | None:
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)] if ordered else None


def write_figures(writes: Sequence[Write]) -> dict[str, Any]:
    """The writes' availability figures (see the module's docstring)."""
    latencies = [w.latency_ms for w in writes]
    results = [result_of(w.status) for w in writes]
    attempts = [a for w in writes for a in w.attempts]
    fast = sum(
        r == "ok" and w.latency_ms <= WITHIN_MS for w, r in zip(writes, results, strict=True)
    )
    return {
        "writes": len(writes),
        "ok": results.count("ok"),
        "refused_4xx": results.count("fail"),
        "unanswered": results.count("unknown"),
        "ok_within_2s": fast,
        "share_ok_within_2s": round(fast / len(writes), 5) if writes else None,
        "p50_ms": _rank(latencies, 0.50),
        "p99_ms": _rank(latencies, 0.99),
        "max_ms": max(latencies, default=None),
        "answers_503": sum(a.status == 503 for a in attempts),
        "writes_with_503": sum(any(a.status == 503 for a in w.attempts) for w in writes),
        "applied_maybe": sum(w.applied_maybe for w in writes),
        "other_5xx": sum(
            a.status is not None and a.status >= 500 and a.status != 503 for a in attempts
        ),
        "no_answer": sum(a.status is None and a.replica is not None for a in attempts),
        "no_ready_replica": sum(a.replica is None for a in attempts),
        "retried_writes": sum(len(w.attempts) > 1 for w in writes),
    }


def dropped_at_stop(writes: Iterable[Write], replica: int, sigterm_ms: int) -> int:
    """Attempts sent to ``replica`` before its SIGTERM that got no answer: the connection
    was closed or reset under them (not those still waiting for a connection, which then
    found the port closed)."""
    dropped = 0
    for w in writes:
        ends = [a.at_ms for a in w.attempts[1:]] + [w.final_ms]
        dropped += sum(
            a.replica == replica
            and a.status is None
            and a.note.startswith(_CUT)
            and a.at_ms < sigterm_ms < end
            for a, end in zip(w.attempts, ends, strict=True)
        )
    return dropped


def in_window(writes: Iterable[Write], start_ms: int, end_ms: int) -> list[Write]:
    """The writes first sent in ``[start_ms, end_ms)``."""
    return [w for w in writes if start_ms <= w.first_ms < end_ms]


def readiness_seconds(
    changes: Sequence[tuple[float, int]], start_s: float, end_s: float, replicas: int
) -> tuple[float, float]:
    """Seconds of ``[start_s, end_s)`` with no replica routable, and with fewer than all.

    Args:
        changes: (monotonic seconds, routable replicas from then on), in order.
    """
    none_s = fewer_s = 0.0
    count, at_s = 0, start_s
    for when_s, now in [*changes, (end_s, -1)]:
        if when_s > at_s:
            span_s = min(when_s, end_s) - at_s
            none_s += span_s if count == 0 else 0.0
            fewer_s += span_s if count < replicas else 0.0
            at_s = min(when_s, end_s)
        count = now
    return round(none_s, 2), round(fewer_s, 2)


def _outcomes(callbacks: Sequence[Callback]) -> dict[Op, set[str]]:
    found: dict[Op, set[str]] = defaultdict(set)
    for cb in callbacks:
        doc = cb.doc()
        found[(doc["scope"], doc["op_id"])].add(doc["outcome"])
    return found


def correctness(
    registrations: Sequence[Request],
    signals: Sequence[SignalSent],
    pending: set[Op],
    callbacks: Sequence[Callback],
    delivery: str,
) -> dict[str, Any]:
    """Lost, conflicting and the checker's other counts, with up to 8 examples of each.

    Args:
        registrations: every registration (preloaded and written), one request each.
        signals: every signal produced.
        pending: the operations the replicas list as pending at the end.
        callbacks: the callbacks topic read from its start to its end, as a consumer of
            ``delivery`` reads it.
        delivery: ``acknowledged`` or ``transactional``.
    """
    outcomes = _outcomes(callbacks)
    judged = [
        r
        for r in registrations
        if (r.scope, r.op_id) not in pending or (r.scope, r.op_id) in outcomes
    ]
    verdict = check([*judged, *(s.request() for s in signals)], callbacks, callbacks, delivery)
    registered = {(r.scope, r.op_id) for r in registrations}
    lost_signals = [
        s
        for s in signals
        if s.acked and "completed" not in outcomes.get((s.target.scope, s.target.op_id), ())
    ]
    decided_pending = sorted(op for op in pending if op in outcomes)
    examples = {
        "lost_registrations": [f.subject for f in verdict.lost[:8]],
        "lost_signals": [asdict(s.target) for s in lost_signals[:8]],
        "conflicting": [asdict(f) for f in [*verdict.conflicting, *verdict.re_decided][:8]],
        "pending_but_decided": [list(op) for op in decided_pending[:8]],
        "early": [asdict(f) for f in verdict.early[:8]],
        "contradicting": [asdict(f) for f in verdict.contradicting[:8]],
    }
    return {
        "lost": len(verdict.lost) + len(lost_signals),
        "lost_registrations": len(verdict.lost),
        "lost_signals": len(lost_signals),
        "conflicting": len(verdict.conflicting) + len(verdict.re_decided) + len(decided_pending),
        "conflicting_outcomes": len(verdict.conflicting),
        "re_decided": len(verdict.re_decided),
        "pending_but_decided": len(decided_pending),
        "phantom_pending": len(pending - registered),
        "early": len(verdict.early),
        "contradicting": len(verdict.contradicting),
        "identical_copies": verdict.identical_copies,
        "extra_committed": len(verdict.extra_committed),
        "callbacks": len(callbacks),
        "decided_operations": len(outcomes),
        "pending": len(pending),
        "signals": len(signals),
        "signals_acked": sum(s.acked for s in signals),
        "notes": verdict.notes,
        "examples": examples,
    }


def passed(doc: dict[str, Any]) -> list[str]:
    """What failed in a run's document (empty: it passed)."""
    c, w = doc["correctness"], doc["writes"]
    failed = [
        f"{name} {c[name]}"
        for name in ("lost", "conflicting", "phantom_pending", "early", "contradicting")
        if c[name]
    ]
    if doc["delivery"] == "transactional" and c["extra_committed"]:
        failed.append(f"extra_committed {c['extra_committed']}")
    if doc.get("stalled"):
        failed.append(f"the rollout stalled: {doc['stalled']}")
    share = w["share_ok_within_2s"]
    if share is None or share < doc["target_share"]:
        failed.append(f"2xx within 2 s: {share} < {doc['target_share']}")
    return failed


def _ms(value: int | None) -> str:
    return "-" if value is None else f"{value:,}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.2f} %"


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(doc: dict[str, Any]) -> str:
    """The run as markdown: the machine and the command, the figures, then a row per step."""
    m, w, r, c = doc["machine"], doc["writes"], doc["rollout_writes"], doc["correctness"]
    load = doc["loadavg"]
    rows = [
        ("machine", f"{m['cpu_model']}, {m['cpus']} CPUs, {m['implementation']} {m['python']}"),
        (
            "load average (1 min) at start / max / end",
            f"{load['start']:.2f} / {load['max']:.2f} / {load['end']:.2f}",
        ),
        ("command", f"`{doc['command']}`"),
        (
            "setup",
            f"{doc['replicas']} replicas in one group, {doc['partitions']} partitions, "
            f"{doc['delivery']} delivery, Apache Kafka",
        ),
        ("pending operations preloaded", f"{doc['pending_preloaded']:,} in {doc['preload_s']} s"),
        (
            "steady load",
            f"{doc['write_rate']:g} HTTP registrations/s + {doc['signal_rate']:g} "
            f"Kafka signals/s for {doc['load_s']} s",
        ),
        (
            "writes: 2xx / 4xx / unanswered in 30 s",
            f"{w['ok']:,} / {w['refused_4xx']:,} / {w['unanswered']:,} of {w['writes']:,}",
        ),
        (
            "**2xx within 2 s of first send** (target ≥ 99 %)",
            f"**{_pct(w['share_ok_within_2s'])}** (during the rollout: "
            f"{_pct(r['share_ok_within_2s'])} of {r['writes']:,})",
        ),
        (
            "latency p50 / p99 / max (ms)",
            f"{_ms(w['p50_ms'])} / {_ms(w['p99_ms'])} / {_ms(w['max_ms'])}",
        ),
        ("503 answers (writes that met one)", f"{w['answers_503']:,} ({w['writes_with_503']:,})"),
        (
            "attempts with no answer / no ready replica",
            f"{w['no_answer']:,} / {w['no_ready_replica']:,}",
        ),
        (
            "CPU share during the load (of all CPUs)",
            ", ".join(f"{k} {v * 100:.0f} %" for k, v in doc["cpu_share_during_load"].items()),
        ),
        (
            "seconds with no ready replica / fewer than all",
            f"{doc['no_ready_s']} / {doc['not_all_ready_s']}",
        ),
        ("signals acknowledged (sent)", f"{c['signals_acked']:,} ({c['signals']:,})"),
        (
            "pending at the end (HTTP read) / decided",
            f"{c['pending']:,} / {c['decided_operations']:,}",
        ),
        (
            "**lost** (registrations, signals)",
            f"**{c['lost']}** ({c['lost_registrations']}, {c['lost_signals']})",
        ),
        (
            "**conflicting** (outcomes, re-decided, pending yet decided)",
            f"**{c['conflicting']}** ({c['conflicting_outcomes']}, {c['re_decided']}, "
            f"{c['pending_but_decided']})",
        ),
        (
            "early / contradicting / phantom pending",
            f"{c['early']} / {c['contradicting']} / {c['phantom_pending']}",
        ),
        ("identical callback copies", f"{c['identical_copies']:,}"),
    ]
    lines = ["| | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows), ""]
    lines += [
        "| replica | SIGTERM → gone (s) | exit | restart → /readyz 200 (s) | writes in its step"
        " | 2xx within 2 s | p99 (ms) | max (ms) | 503s | in flight at SIGTERM, dropped"
        " | partitions restored |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for step in doc["steps"]:
        f = step["writes"]
        lines.append(
            f"| r{step['replica']} | {_s(step['stop_s'])} | {step['exit_code']} | "
            f"{_s(step['ready_s'])} | {f['writes']:,} | {_pct(f['share_ok_within_2s'])} | "
            f"{_ms(f['p99_ms'])} | {_ms(f['max_ms'])} | {f['answers_503']:,} | "
            f"{step['dropped_at_stop']} | {len(step['restored'])} |"
        )
    return "\n".join(lines)
