"""The checker: a run's history against what the callbacks topic holds (pure: no I/O, no clock).

It reads like Jepsen's checkers: a client saw requests answered ``ok``, ``fail`` or
``unknown`` (:mod:`tests.nemesis.history`), and the callbacks topic says what the service
decided; the checker reports every way the two disagree. One reader decides, the one a
consumer of the delivery mode uses: ``read_uncommitted`` (everything) in acknowledged delivery,
``read_committed`` in transactional delivery; the other reader's counts are reported beside.

- **lost**: a registration answered ``ok`` has no callback (``unknown`` ones may or may not);
- **conflicting**: one operation with two outcome kinds; one ``(partition, sequence)`` naming
  two operations or outcomes; one ``id`` with two bodies;
- **re-decided**: one operation, one outcome kind, different bytes (``late``, ``outcome_ms``);
- **identical copies**: byte-identical repeats (allowed in acknowledged delivery; a
  transactional ``read_committed`` reader must see one record per operation: **extra
  committed** counts the operations with more);
- **early**: ``completed`` while a needed key had no signal sent by ``outcome_ms`` (needed: all
  keys, one for ``any``, ``count`` for ``count``); ``expired`` before its deadline, by
  ``outcome_ms`` or by the record's Kafka timestamp;
- **contradicting**: an outcome its inputs rule out: ``expired`` with nothing ``missing``;
  ``registered_ms`` after ``outcome_ms``; a key reported missing although its signal was
  answered ``ok`` over HTTP before the deadline, for a registration answered ``ok`` before it;
  ``completed`` by signals sent only after the deadline; ``cancelled`` with no cancel sent;
  ``expired`` or ``completed`` although an HTTP cancel was answered ``ok``; a deadline other
  than the one asked; a callback for an operation nobody registered.

Only an HTTP ``ok`` proves that the owner applied a signal (its journal entry was acknowledged
before the answer); the broker's acknowledgement of a Kafka signal does not say when the owner
read it, so Kafka signals count as sent (for **early**), never as applied. Times from the
harness and from the service are compared with :data:`SLACK_MS` (50 ms) of slack: the service
reads the wall clock once at its start and then follows the monotonic clock.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.nemesis.availability import Availability, availability
from tests.nemesis.history import Callback, Event, Exit, Request

__all__ = ["SLACK_MS", "Finding", "Verdict", "check"]

SLACK_MS = 50
Op = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Finding:
    """One anomaly: the operation (or the id) it is about, why, and the evidence."""

    subject: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the checker found in one run (lists of findings; counts are their lengths)."""

    delivery: str
    ops: int
    acknowledged: int
    unknown: int
    failed: int
    records: int
    lost: list[Finding]
    conflicting: list[Finding]
    re_decided: list[Finding]
    identical_copies: int
    extra_committed: list[Finding]
    early: list[Finding]
    contradicting: list[Finding]
    unexpected_exits: list[Exit]
    availability: dict[str, Availability]
    notes: dict[str, int]

    def counts(self) -> dict[str, int]:
        """The verdict's numbers, for a table and ``results.json``."""
        return {
            "ops": self.ops,
            "acknowledged": self.acknowledged,
            "unknown": self.unknown,
            "failed": self.failed,
            "records": self.records,
            "lost": len(self.lost),
            "conflicting": len(self.conflicting),
            "re_decided": len(self.re_decided),
            "identical_copies": self.identical_copies,
            "extra_committed": len(self.extra_committed),
            "early": len(self.early),
            "contradicting": len(self.contradicting),
            "unexpected_exits": len(self.unexpected_exits),
        }

    def passed(self) -> bool:
        """Nothing lost, conflicting, early or contradicting, no replica exited on its own,
        and the delivery mode's promise: byte-identical copies (acknowledged) or one committed
        record per operation (transactional)."""
        counts = self.counts()
        bad = ("lost", "conflicting", "re_decided", "extra_committed", "early", "contradicting")
        return not any(counts[name] for name in bad) and not self.unexpected_exits


@dataclass(slots=True)
class _Inputs:
    """The history by operation and by (scope, key)."""

    registrations: dict[Op, list[Request]] = field(default_factory=lambda: defaultdict(list))
    signals: dict[tuple[str, str], list[Request]] = field(default_factory=lambda: defaultdict(list))
    cancels: dict[Op, list[Request]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def of(cls, requests: Iterable[Request]) -> _Inputs:
        inputs = cls()
        for r in requests:
            if r.kind == "register":
                inputs.registrations[(r.scope, r.op_id)].append(r)
            elif r.kind == "signal":
                inputs.signals[(r.scope, r.keys[0])].append(r)
            else:
                inputs.cancels[(r.scope, r.op_id)].append(r)
        return inputs


def _by_op(callbacks: Sequence[Callback]) -> dict[Op, list[tuple[Callback, dict[str, Any]]]]:
    found: dict[Op, list[tuple[Callback, dict[str, Any]]]] = defaultdict(list)
    for cb in callbacks:
        doc = cb.doc()
        found[(doc["scope"], doc["op_id"])].append((cb, doc))
    return found


def _name(op: Op) -> str:
    return f"{op[0]}/{op[1]}"


def _brief(r: Request) -> dict[str, Any]:
    return {k: getattr(r, k) for k in ("kind", "via", "replica", "keys", "invoke_ms",
                                       "complete_ms", "result", "status")}  # fmt: skip


def _copies(copies: list[tuple[Callback, dict[str, Any]]]) -> list[dict[str, Any]]:
    seen: dict[bytes, dict[str, Any]] = {}
    for cb, doc in copies:
        entry = seen.setdefault(cb.value, {"doc": doc, "at": []})
        entry["at"].append([cb.partition, cb.offset, cb.timestamp_ms])
    return list(seen.values())


def _needed(reg: Request) -> int:
    if reg.condition == "any":
        return 1
    if reg.condition == "count" and reg.count is not None:
        return reg.count
    return len(reg.keys)


def _sent_by(inputs: _Inputs, scope: str, keys: Iterable[str], at_ms: int) -> set[str]:
    """The keys with a signal sent (any answer) by ``at_ms`` (with the slack)."""
    return {
        key
        for key in keys
        if any(s.invoke_ms <= at_ms + SLACK_MS for s in inputs.signals.get((scope, key), ()))
    }


def _applied_by(inputs: _Inputs, scope: str, keys: Iterable[str], at_ms: int) -> set[str]:
    """The keys with a signal answered ``ok`` over HTTP before ``at_ms`` (less the slack)."""
    return {
        key
        for key in keys
        if any(
            s.via == "http" and s.result == "ok" and s.complete_ms < at_ms - SLACK_MS
            for s in inputs.signals.get((scope, key), ())
        )
    }


def _conflicts(by_op: dict[Op, list[tuple[Callback, dict[str, Any]]]]) -> list[Finding]:
    found = []
    numbers: dict[tuple[int, int], set[tuple[str, str, str]]] = defaultdict(set)
    ids: dict[str, set[bytes]] = defaultdict(set)
    for op, copies in by_op.items():
        kinds = {doc["outcome"] for _, doc in copies}
        if len(kinds) > 1:
            found.append(Finding(_name(op), f"two outcomes: {sorted(kinds)}",
                                 {"copies": _copies(copies)}))  # fmt: skip
        for cb, doc in copies:
            numbers[(doc["partition"], doc["sequence"])].add((*op, doc["outcome"]))
            ids[doc["id"]].add(cb.value)
    for (partition, sequence), named in sorted(numbers.items()):
        if len(named) > 1:
            found.append(Finding(f"{partition}-{sequence}", "one sequence, two outcomes",
                                 {"named": sorted(named)}))  # fmt: skip
    for ident, bodies in sorted(ids.items()):
        if len(bodies) > 1:
            found.append(Finding(ident, "one id, two bodies",
                                 {"bodies": sorted(b.decode() for b in bodies)}))  # fmt: skip
    return found


def _early(op: Op, doc: dict[str, Any], cb: Callback, inputs: _Inputs) -> list[str]:
    reasons = []
    regs = inputs.registrations.get(op)
    if doc["outcome"] == "completed" and regs:
        reg = regs[0]
        sent = _sent_by(inputs, op[0], reg.keys, doc["outcome_ms"])
        if len(sent) < _needed(reg):
            reasons.append(f"completed with {len(sent)} of {_needed(reg)} needed signals sent")
    if doc["outcome"] == "expired":
        if doc["outcome_ms"] < doc["deadline_ms"]:
            reasons.append("expired before its deadline (outcome_ms)")
        if cb.timestamp_ms < doc["deadline_ms"] - SLACK_MS:
            reasons.append("expired record on the topic before its deadline (timestamp)")
    return reasons


def _contradictions(op: Op, doc: dict[str, Any], inputs: _Inputs) -> list[str]:
    regs = inputs.registrations.get(op)
    if not regs:
        return ["a callback for an operation nobody registered"]
    reasons = []
    reg, outcome, deadline_ms = regs[0], doc["outcome"], doc["deadline_ms"]
    if doc["registered_ms"] > doc["outcome_ms"]:
        reasons.append("registered_ms after outcome_ms")
    if doc["registered_ms"] < min(r.invoke_ms for r in regs) - SLACK_MS:
        reasons.append("registered before it was sent")
    if reg.deadline_ms is not None and deadline_ms != reg.deadline_ms:
        reasons.append(f"deadline_ms {deadline_ms}, asked {reg.deadline_ms}")
    if outcome == "expired":
        if not doc["missing"]:
            reasons.append("expired with nothing missing")
        if any(r.result == "ok" and r.complete_ms < deadline_ms - SLACK_MS for r in regs):
            applied = _applied_by(inputs, op[0], doc["missing"], deadline_ms)
            if applied:
                reasons.append(f"missing {sorted(applied)}, signalled ok over HTTP in time")
    if outcome == "completed" and doc["registered_ms"] < deadline_ms:
        in_time = _sent_by(inputs, op[0], reg.keys, deadline_ms)
        if len(in_time) < _needed(reg):
            reasons.append("completed by signals sent after its deadline")
    cancels = inputs.cancels.get(op, [])
    if outcome == "cancelled" and not any(
        c.invoke_ms <= doc["outcome_ms"] + SLACK_MS for c in cancels
    ):
        reasons.append("cancelled with no cancel sent")
    if outcome != "cancelled" and any(c.via == "http" and c.result == "ok" for c in cancels):
        reasons.append(f"{outcome} although an HTTP cancel was answered ok")
    return reasons


def _per_callback(
    by_op: dict[Op, list[tuple[Callback, dict[str, Any]]]], inputs: _Inputs
) -> tuple[list[Finding], list[Finding]]:
    """Early and contradicting outcomes: one finding per operation and reason, whatever the
    number of copies that show it."""
    early: list[Finding] = []
    contradicting: list[Finding] = []
    for op, copies in sorted(by_op.items()):
        found: dict[tuple[str, str], dict[str, Any]] = {}
        for cb, doc in copies:
            reasons = [("early", r) for r in _early(op, doc, cb, inputs)]
            reasons += [("contradicting", r) for r in _contradictions(op, doc, inputs)]
            for reason in reasons:
                found.setdefault(reason, _evidence(op, cb, doc, inputs))
        for (kind, why), evidence in found.items():
            (early if kind == "early" else contradicting).append(Finding(_name(op), why, evidence))
    return early, contradicting


def _evidence(op: Op, cb: Callback, doc: dict[str, Any], inputs: _Inputs) -> dict[str, Any]:
    """The callback, where it was, and every request about its operation and keys."""
    keys = dict.fromkeys([*doc["keys"], *doc["missing"]])
    return {
        "callback": doc,
        "at": [cb.partition, cb.offset, cb.timestamp_ms],
        "requests": [_brief(r) for r in inputs.registrations.get(op, [])]
        + [_brief(r) for r in inputs.cancels.get(op, [])]
        + [_brief(s) for k in keys for s in inputs.signals.get((op[0], k), [])],
    }


def _redecided(by_op: dict[Op, list[tuple[Callback, dict[str, Any]]]]) -> list[Finding]:
    found = []
    for op, copies in sorted(by_op.items()):
        if (
            len({doc["outcome"] for _, doc in copies}) == 1
            and len({cb.value for cb, _ in copies}) > 1
        ):
            docs = [entry["doc"] for entry in _copies(copies)]
            differ = sorted(k for k in docs[0] if len({str(d.get(k)) for d in docs}) > 1)
            found.append(Finding(_name(op), f"re-decided: {', '.join(differ)} differ",
                                 {"copies": _copies(copies)}))  # fmt: skip
    return found


def _reader(callbacks: Sequence[Callback], inputs: _Inputs) -> dict[str, Any]:
    """Every per-reader verdict of ``callbacks`` (lists of findings, and the copies)."""
    by_op = _by_op(callbacks)
    acked = {op for op, regs in inputs.registrations.items() if any(r.result == "ok" for r in regs)}
    early, contradicting = _per_callback(by_op, inputs)
    return {
        "by_op": by_op,
        "lost": [
            Finding(
                _name(op),
                "acknowledged, no callback",
                {"requests": [_brief(r) for r in inputs.registrations[op]]},
            )
            for op in sorted(acked - set(by_op))
        ],
        "conflicting": _conflicts(by_op),
        "re_decided": _redecided(by_op),
        "identical_copies": sum(
            len(copies) - len({cb.value for cb, _ in copies}) for copies in by_op.values()
        ),
        "extra_committed": [
            Finding(_name(op), f"{len(copies)} records", {"copies": _copies(copies)})
            for op, copies in sorted(by_op.items())
            if len(copies) > 1
        ],
        "early": early,
        "contradicting": contradicting,
    }


def check(
    events: Sequence[Event],
    committed: Sequence[Callback],
    uncommitted: Sequence[Callback],
    delivery: str,
) -> Verdict:
    """Check a run's history against both readings of its callbacks topic.

    Args:
        events: the run's history, in order.
        committed: the callbacks topic read ``read_committed`` from its start to its end.
        uncommitted: the same read ``read_uncommitted``.
        delivery: ``acknowledged`` or ``transactional``: which reader decides.

    Returns:
        The verdict; ``extra_committed`` is only judged in transactional delivery.
    """
    requests = [e for e in events if isinstance(e, Request)]
    inputs = _Inputs.of(requests)
    transactional = delivery == "transactional"
    primary, other = (committed, uncommitted) if transactional else (uncommitted, committed)
    mine, theirs = _reader(primary, inputs), _reader(other, inputs)
    regs = inputs.registrations
    results = Counter(
        "ok" if any(r.result == "ok" for r in rs)
        else "unknown" if any(r.result == "unknown" for r in rs)
        else "fail"
        for rs in regs.values()
    )  # fmt: skip
    unknown_ops = [op for op, rs in regs.items() if all(r.result != "ok" for r in rs)]
    notes = {
        "unknown_with_callback": sum(op in mine["by_op"] for op in unknown_ops),
        "refused_503_but_decided": sum(
            op in mine["by_op"]
            for op in unknown_ops
            if all(r.status == 503 and not r.applied_maybe for r in regs[op])
        ),
        "late_outcomes": sum(
            any(doc["late"] for _, doc in copies) for copies in mine["by_op"].values()
        ),
        **{f"other_reader_{k}": _size(theirs[k]) for k in _COUNTED},
        "other_reader_records": len(other),
    }
    return Verdict(
        delivery=delivery,
        ops=len(regs),
        acknowledged=results["ok"],
        unknown=results["unknown"],
        failed=results["fail"],
        records=len(primary),
        lost=mine["lost"],
        conflicting=mine["conflicting"],
        re_decided=mine["re_decided"],
        identical_copies=mine["identical_copies"],
        extra_committed=mine["extra_committed"] if transactional else [],
        early=mine["early"],
        contradicting=mine["contradicting"],
        unexpected_exits=[
            e for e in events if isinstance(e, Exit) and not e.by_nemesis and not e.final_stop
        ],
        availability=availability(events),
        notes=notes,
    )


_COUNTED = ("lost", "conflicting", "re_decided", "identical_copies", "early", "contradicting")


def _size(value: Any) -> int:
    return value if isinstance(value, int) else len(value)
