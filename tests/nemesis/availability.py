"""Availability per fault kind: how many requests were answered ``ok`` while a fault was on, and
in the :data:`AFTER_HEAL_MS` (10 s) after its heal (or until the next fault, if that comes
sooner), and how long the answers took (pure).

A request belongs to the window its invocation falls in. Requests outside every fault's two
windows make the ``none`` row, the baseline. Latency is from invocation to whatever answer came
(a timeout included), as nearest-rank p50 and p99; ``hung`` counts the HTTP requests that got
no answer at all within :data:`HUNG_MS` (a replica must answer 503 within its journal wait,
5 s, even when the owner it forwards to is away, unless it is itself cut off or frozen);
readiness is the fraction of ``/readyz`` probes answered 200 in the same windows.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from tests.nemesis.history import Event, Fault, Probe, Request

__all__ = ["AFTER_HEAL_MS", "HUNG_MS", "Availability", "Window", "availability"]

AFTER_HEAL_MS = 10_000
HUNG_MS = 9_500  # the workload's HTTP timeout is 10 s


@dataclass(slots=True)
class Window:
    """Requests and probes of one window kind, summed over the faults of one kind."""

    requests: int = 0
    ok: int = 0
    hung: int = 0
    latencies_ms: list[int] = field(default_factory=list)
    probes: int = 0
    ready: int = 0

    def summary(self) -> dict[str, float | int | None]:
        """``n``, the ``ok`` fraction, ``hung``, ``p50_ms``/``p99_ms`` and the ``ready``
        fraction."""
        return {
            "n": self.requests,
            "ok": round(self.ok / self.requests, 3) if self.requests else None,
            "hung": self.hung,
            "p50_ms": _rank(self.latencies_ms, 0.50),
            "p99_ms": _rank(self.latencies_ms, 0.99),
            "ready": round(self.ready / self.probes, 3) if self.probes else None,
        }


@dataclass(slots=True)
class Availability:
    """One fault kind: how many times it was set, then its two windows."""

    faults: int = 0
    during: Window = field(default_factory=Window)
    after: Window = field(default_factory=Window)

    def summary(self) -> dict[str, object]:
        return {
            "faults": self.faults,
            "during": self.during.summary(),
            "after": self.after.summary(),
        }


def _rank(values: list[int], q: float) -> int | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def availability(events: Sequence[Event]) -> dict[str, Availability]:
    """Availability per fault kind (and ``none``, outside every fault's windows)."""
    faults = [e for e in events if isinstance(e, Fault)]
    end_ms = max((_at(e) for e in events), default=0) + 1
    windows: list[tuple[int, int, Window]] = []
    table: dict[str, Availability] = defaultdict(Availability)
    starts = sorted(fault.start_ms for fault in faults)
    for fault in faults:
        row = table[fault.kind]
        row.faults += 1
        heal_ms = fault.heal_ms if fault.heal_ms is not None else end_ms
        windows.append((fault.start_ms, heal_ms, row.during))
        # The after window ends where the next fault begins: what that fault costs is its own.
        later = [start for start in starts if start >= heal_ms]
        after_ms = min([heal_ms + AFTER_HEAL_MS, *later[:1]])
        windows.append((heal_ms, after_ms, row.after))
    baseline = table["none"].during
    for event in events:
        if not isinstance(event, Request | Probe):
            continue
        at_ms = _at(event)
        hits = [w for start, stop, w in windows if start <= at_ms < stop] or [baseline]
        for window in hits:
            if isinstance(event, Request):
                window.requests += 1
                window.ok += event.result == "ok"
                took_ms = event.complete_ms - event.invoke_ms
                window.hung += event.via == "http" and event.status is None and took_ms >= HUNG_MS
                window.latencies_ms.append(took_ms)
            else:
                window.probes += 1
                window.ready += event.status == 200
    return dict(table)


def _at(event: Event) -> int:
    if isinstance(event, Request):
        return event.invoke_ms
    if isinstance(event, Fault):
        return event.heal_ms or event.start_ms
    return event.at_ms
