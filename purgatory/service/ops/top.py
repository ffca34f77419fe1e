"""``purgatory top`` (service layer): the operator page's data, as text in a terminal.

It reads ``GET /v1/overview`` of one replica (the same data as the page at ``/ui``) and prints
it as a few short tables: the partitions and their restore state, the busiest scopes, the next
deadlines, and the latest outcomes (late ones marked) and dead letters. ``--once`` prints one
frame and exits; otherwise the frame is redrawn every ``--interval-s`` until interrupted.
Times are shown relative to the replica's clock (``now_ms`` of the same answer), so a frame
reads the same whatever the terminal's own clock says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["render_top"]

_ROWS = 10  # per section: a frame fits a terminal


def _partition_note(partition: str, status: Mapping[str, Any]) -> str:
    """A line for a partition that is not simply serving (or was fenced): else empty."""
    state, fenced = status.get("state"), int(status.get("fenced", 0))
    if state == "restoring":
        note = (
            f"  partition {partition}: restoring, {status.get('restore_records', 0)} records"
            f" in {status.get('restore_seconds', 0)} s"
        )
    elif state == "fenced":
        note = f"  partition {partition}: FENCED, waiting to restore"
    elif state == "taken":
        why = status.get("reason")
        note = f"  partition {partition}: waiting to restore" + (f" ({why})" if why else "")
    elif state == "handing_over":
        note = f"  partition {partition}: handing over to its next owner"
    elif fenced:
        note = f"  partition {partition}: serving"
    else:
        return ""
    if fenced:
        note += f" (fenced {fenced}x: another writer appended to its changelog)"
    return note


def render_top(overview: Mapping[str, Any], *, rows: int = _ROWS) -> str:
    """One frame of ``purgatory top`` from an overview answer."""
    now = int(overview.get("now_ms", 0))
    partitions = overview.get("partitions") or {}
    serving = sum(1 for p in partitions.values() if p.get("state") == "serving")
    lines = [
        f"purgatory  ready={'yes' if overview.get('ready') else 'NO'}"
        f"  partitions={serving}/{len(partitions)} serving"
        f"  pending={overview.get('pending', 0)}  scopes={overview.get('scope_count', 0)}"
        f"  outcomes={overview.get('outcomes_total', 0)}"
        f"  dead letters={overview.get('dead_letters_total', 0)}",
        "",
    ]
    notes = [
        _partition_note(p, s) for p, s in sorted(partitions.items(), key=lambda kv: int(kv[0]))
    ]
    notes = [note for note in notes if note]
    lines += notes + ([""] if notes else [])
    lines += _table(
        "busiest scopes",
        ("pending", "partition", "scope"),
        [(s["pending"], s["partition"], s["scope"]) for s in _list(overview, "scopes", rows)],
    )
    lines += _table(
        "next deadlines",
        ("in", "scope", "op_id"),
        [
            (_relative(d["deadline_ms"] - now), d["scope"], d["op_id"])
            for d in _list(overview, "deadlines", rows)
        ],
    )
    lines += _table(
        "latest outcomes",
        ("ago", "outcome", "scope", "op_id", "missing"),
        [
            (
                _relative(now - o["at_ms"]),
                o["outcome"] + (" LATE" if o.get("late") else ""),
                o["scope"],
                o["op_id"],
                ",".join(o.get("missing") or ()),
            )
            for o in _list(overview, "outcomes", rows)
        ],
    )
    lines += _table(
        "latest dead letters",
        ("ago", "topic", "reason"),
        [
            (_relative(now - d["at_ms"]), f"{d['topic']}/{d['partition']}@{d['offset']}",
             d["reason"])
            for d in _list(overview, "dead_letters", rows)
        ],
    )  # fmt: skip
    return "\n".join(lines).rstrip() + "\n"


def _list(overview: Mapping[str, Any], name: str, rows: int) -> list[Mapping[str, Any]]:
    """The first ``rows`` items: scopes busiest first, deadlines soonest first, outcomes and
    dead letters newest first (as the overview lists them)."""
    return list((overview.get(name) or [])[:rows])


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    if not rows:
        return [f"{title}: none", ""]
    cells = [[str(c) for c in header], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    out = [f"{title}:"]
    for row in cells:
        out.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return [*out, ""]


def _relative(ms: int) -> str:
    """``ms`` as a short duration: 850ms, 12.3s, 4m05s, 2h10m."""
    sign = "-" if ms < 0 else ""
    ms = abs(ms)
    if ms < 1_000:
        return f"{sign}{ms}ms"
    if ms < 60_000:
        return f"{sign}{ms / 1000:.1f}s"
    if ms < 3_600_000:
        return f"{sign}{ms // 60_000}m{ms // 1000 % 60:02d}s"
    return f"{sign}{ms // 3_600_000}h{ms // 60_000 % 60:02d}m"
