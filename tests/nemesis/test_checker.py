"""The checker on hand-built histories: a clean run passes, and each anomaly is caught once.

No network and no process: each test writes the few requests a client made and the callback
records a topic would hold, as :mod:`tests.nemesis.history` records them, and reads the verdict.
The plan and the history's JSON lines are checked here too (a seed makes the same run).
"""

from __future__ import annotations

import json
from dataclasses import replace
from hashlib import blake2b
from pathlib import Path
from typing import Any

from tests.nemesis.checker import SLACK_MS, Verdict, check
from tests.nemesis.history import (
    Callback,
    Event,
    Exit,
    Fault,
    HistoryWriter,
    Probe,
    Request,
    Result,
    read_callbacks,
    read_history,
    write_callbacks,
)
from tests.nemesis.plan import KINDS, PARTITIONS, Shape, make_plan, scopes

T = 1_800_000_000_000  # an epoch millisecond: every time below is relative to it
DEADLINE = T + 10_000


def reg(
    op: str,
    keys: tuple[str, ...] = ("a",),
    *,
    at: int = T,
    result: Result = "ok",
    via: str = "http",
    deadline: int = DEADLINE,
    condition: str = "all",
    count: int | None = None,
) -> Request:
    replica = 0 if via == "http" else None
    status = 201 if result == "ok" else 503
    return Request(
        "register", via, replica, "s", op, keys, condition, count, deadline, at, at + 20, result,
        status,
    )  # fmt: skip


def sig(key: str, at: int, *, result: Result = "ok", via: str = "http", op: str = "") -> Request:
    return Request("signal", via, 1 if via == "http" else None, "s", op, (key,), "all", None,
                   None, at, at + 20, result, 200 if result == "ok" else 503)  # fmt: skip


def cancel(op: str, at: int, *, result: Result = "ok", via: str = "http") -> Request:
    return Request("cancel", via, 2 if via == "http" else None, "s", op, (), "all", None, None,
                   at, at + 20, result, 200 if result == "ok" else 409)  # fmt: skip


def cb(
    op: str,
    outcome: str,
    *,
    outcome_ms: int,
    keys: tuple[str, ...] = ("a",),
    missing: tuple[str, ...] = (),
    registered_ms: int = T + 10,
    deadline_ms: int = DEADLINE,
    sequence: int = 1,
    partition: int = 0,
    late: bool = False,
    offset: int = 0,
    timestamp_ms: int | None = None,
) -> Callback:
    doc: dict[str, Any] = {
        "v": 1, "type": "callback", "op_id": op, "scope": "s", "outcome": outcome,
        "registered_ms": registered_ms, "outcome_ms": outcome_ms, "deadline_ms": deadline_ms,
        "time_domain": "processing_time", "sequence": sequence, "partition": partition,
        "id": f"{partition}-{sequence}-{blake2b(op.encode(), digest_size=8).hexdigest()}",
        "keys": list(keys), "missing": list(missing), "signals": {}, "payload": None, "late": late,
    }  # fmt: skip
    value = json.dumps(doc, separators=(",", ":")).encode()
    return Callback(partition, offset, timestamp_ms or outcome_ms + 2, value)


def verdict(
    events: list[Event], callbacks: list[Callback], delivery: str = "acknowledged"
) -> Verdict:
    return check(events, callbacks, callbacks, delivery)


def clean() -> tuple[list[Event], list[Callback]]:
    """Four operations: completed, expired, cancelled, one never acknowledged, no anomaly."""
    events: list[Event] = [
        reg("done", ("a", "b")),
        sig("a", T + 1_000),
        sig("b", T + 2_000, via="kafka"),
        reg("gone", ("c",), via="kafka"),
        reg("off", ("d",)),
        cancel("off", T + 3_000),
        reg("maybe", ("e",), result="unknown"),
    ]
    callbacks = [
        cb("done", "completed", outcome_ms=T + 2_010, keys=("a", "b"), sequence=1),
        cb("gone", "expired", outcome_ms=DEADLINE, keys=(), missing=("c",), sequence=2),
        cb("off", "cancelled", outcome_ms=T + 3_005, keys=(), missing=("d",), sequence=3),
    ]
    return events, callbacks


def test_a_clean_history_passes_with_its_counts() -> None:
    events, callbacks = clean()
    found = verdict(events, callbacks)
    assert found.passed(), found
    assert found.counts() == {
        "ops": 4, "acknowledged": 3, "unknown": 1, "failed": 0, "records": 3, "lost": 0,
        "conflicting": 0, "re_decided": 0, "identical_copies": 0, "extra_committed": 0,
        "early": 0, "contradicting": 0, "unexpected_exits": 0,
    }  # fmt: skip


def test_identical_copies_are_counted_and_allowed_when_acknowledged() -> None:
    events, callbacks = clean()
    copy = replace(callbacks[0], offset=7, timestamp_ms=callbacks[0].timestamp_ms + 900)
    found = verdict(events, [*callbacks, copy])
    assert found.passed()
    assert found.identical_copies == 1
    assert found.extra_committed == []


def test_a_second_committed_record_is_extra_in_transactional_delivery() -> None:
    events, callbacks = clean()
    copy = replace(callbacks[0], offset=7)
    found = check(events, [*callbacks, copy], [*callbacks, copy], "transactional")
    assert [f.subject for f in found.extra_committed] == ["s/done"]
    assert not found.passed()


def test_transactional_delivery_is_judged_on_what_is_committed() -> None:
    events, callbacks = clean()
    aborted = cb("done", "expired", outcome_ms=DEADLINE, keys=("a",), missing=("b",), offset=9)
    found = check(events, callbacks, [*callbacks, aborted], "transactional")
    assert found.passed(), found.conflicting
    # two outcomes; one sequence, two outcomes; one id, two bodies
    assert found.notes["other_reader_conflicting"] == 3
    assert found.notes["other_reader_records"] == 4


def test_an_acknowledged_registration_without_a_callback_is_lost() -> None:
    events, callbacks = clean()
    found = verdict(events, callbacks[1:])
    assert [(f.subject, f.reason) for f in found.lost] == [("s/done", "acknowledged, no callback")]
    assert found.counts()["lost"] == 1


def test_an_unknown_registration_may_have_a_callback_or_none() -> None:
    events, callbacks = clean()
    decided = cb("maybe", "expired", outcome_ms=DEADLINE, keys=(), missing=("e",), sequence=4)
    with_it = verdict(events, [*callbacks, decided])
    assert with_it.passed()
    assert with_it.notes["unknown_with_callback"] == 1
    assert with_it.notes["refused_503_but_decided"] == 1  # a 503 without Applied: maybe
    assert verdict(events, callbacks).passed()


def test_two_outcome_kinds_for_one_operation_conflict() -> None:
    events, callbacks = clean()
    other = cb("done", "expired", outcome_ms=DEADLINE, keys=("a",), missing=("b",), sequence=5)
    found = verdict(events, [*callbacks, other])
    reasons = sorted(f.reason for f in found.conflicting)
    assert reasons == ["two outcomes: ['completed', 'expired']"]
    assert not found.passed()


def test_one_sequence_naming_two_operations_conflicts() -> None:
    events, callbacks = clean()
    clash = replace(
        callbacks[1], value=callbacks[1].value.replace(b'"sequence":2', b'"sequence":1')
    )
    found = verdict(events, [callbacks[0], clash, callbacks[2]])
    assert [f.reason for f in found.conflicting] == ["one sequence, two outcomes"]
    assert found.conflicting[0].subject == "0-1"


def test_one_id_with_two_bodies_conflicts_and_the_operation_is_re_decided() -> None:
    events, callbacks = clean()
    again = cb("gone", "expired", outcome_ms=DEADLINE, keys=(), missing=("c",), sequence=2,
               late=True, offset=4)  # fmt: skip
    found = verdict(events, [*callbacks, again])
    assert [f.reason for f in found.conflicting] == ["one id, two bodies"]
    assert [(f.subject, f.reason) for f in found.re_decided] == [
        ("s/gone", "re-decided: late differ")
    ]
    assert found.identical_copies == 0


def test_a_completion_before_its_signals_were_sent_is_early() -> None:
    events, _ = clean()
    found = verdict(events, [cb("done", "completed", outcome_ms=T + 1_500, keys=("a", "b"))])
    assert [f.reason for f in found.early] == ["completed with 1 of 2 needed signals sent"]
    # within the slack, the second signal counts as sent
    at_slack = T + 2_000 - SLACK_MS
    ok = verdict(events, [cb("done", "completed", outcome_ms=at_slack, keys=("a", "b"))])
    assert ok.early == []


def test_any_and_count_need_fewer_signals() -> None:
    events: list[Event] = [
        reg("either", ("a", "b"), condition="any"),
        reg("two", ("c", "d", "e"), condition="count", count=2),
        sig("a", T + 1_000),
        sig("c", T + 1_000),
        sig("d", T + 1_100),
    ]
    callbacks = [
        cb("either", "completed", outcome_ms=T + 1_010, keys=("a",), sequence=1),
        cb("two", "completed", outcome_ms=T + 1_110, keys=("c", "d"), sequence=2),
    ]
    assert verdict(events, callbacks).passed()


def test_an_expiry_before_the_deadline_is_early_by_outcome_or_by_timestamp() -> None:
    events, callbacks = clean()
    before = cb("gone", "expired", outcome_ms=DEADLINE - 1, keys=(), missing=("c",), sequence=2)
    found = verdict(events, [callbacks[0], before, callbacks[2]])
    assert [f.reason for f in found.early] == ["expired before its deadline (outcome_ms)"]
    stamped = replace(callbacks[1], timestamp_ms=DEADLINE - SLACK_MS - 1)
    found = verdict(events, [callbacks[0], stamped, callbacks[2]])
    assert [f.reason for f in found.early] == [
        "expired record on the topic before its deadline (timestamp)"
    ]


def test_outcomes_that_contradict_their_inputs() -> None:
    events: list[Event] = [
        reg("empty", ("a",)),
        reg("backwards", ("b",)),
        reg("ignored", ("c", "d")),
        sig("c", T + 1_000),  # applied over HTTP in time: never missing
        sig("d", T + 1_000, via="kafka"),  # the broker has it: not proof it was applied
        reg("after", ("e",)),
        sig("e", DEADLINE + 500),
        reg("uncalled", ("f",)),
        reg("kept", ("g",)),
        cancel("kept", T + 2_000),
        reg("moved", ("h",)),
    ]
    callbacks = [
        cb("empty", "expired", outcome_ms=DEADLINE, keys=("a",), missing=(), sequence=1),
        cb("backwards", "expired", outcome_ms=DEADLINE, registered_ms=DEADLINE + 1,
           missing=("b",), sequence=2),
        cb("ignored", "expired", outcome_ms=DEADLINE, keys=(), missing=("c", "d"), sequence=3),
        cb("after", "completed", outcome_ms=DEADLINE + 510, keys=("e",), sequence=4),
        cb("uncalled", "cancelled", outcome_ms=T + 3_000, keys=(), missing=("f",), sequence=5),
        cb("kept", "expired", outcome_ms=DEADLINE, keys=(), missing=("g",), sequence=6),
        cb("moved", "expired", outcome_ms=DEADLINE + 1, deadline_ms=DEADLINE + 1, keys=(),
           missing=("h",), sequence=7),
        cb("nobody", "expired", outcome_ms=DEADLINE, keys=(), missing=("z",), sequence=8),
    ]  # fmt: skip
    found = verdict(events, callbacks)
    reasons = sorted((f.subject, f.reason) for f in found.contradicting)
    assert reasons == [
        ("s/after", "completed by signals sent after its deadline"),
        ("s/backwards", "registered_ms after outcome_ms"),
        ("s/empty", "expired with nothing missing"),
        ("s/ignored", "missing ['c'], signalled ok over HTTP in time"),
        ("s/kept", "expired although an HTTP cancel was answered ok"),
        ("s/moved", f"deadline_ms {DEADLINE + 1}, asked {DEADLINE}"),
        ("s/nobody", "a callback for an operation nobody registered"),
        ("s/uncalled", "cancelled with no cancel sent"),
    ]
    assert found.early == []


def test_a_signal_answered_within_the_slack_of_the_deadline_is_not_proof() -> None:
    events: list[Event] = [reg("edge", ("a",)), sig("a", DEADLINE - SLACK_MS - 10)]
    # answered 20 ms after it was sent: 30 ms before the deadline, inside the slack
    callbacks = [cb("edge", "expired", outcome_ms=DEADLINE, keys=(), missing=("a",))]
    assert verdict(events, callbacks).contradicting == []


def test_an_expiry_is_contradicted_only_for_a_registration_acknowledged_in_time() -> None:
    events: list[Event] = [reg("slow", ("a",), at=DEADLINE - 10), sig("a", T + 1_000)]
    callbacks = [
        cb("slow", "expired", outcome_ms=DEADLINE, registered_ms=DEADLINE - 5, missing=("a",))
    ]
    assert verdict(events, callbacks).contradicting == []


def test_only_exits_nobody_caused_are_unexpected() -> None:
    events, callbacks = clean()
    exits: list[Event] = [
        Exit(0, 0, T + 5_000, -9, by_nemesis=True),
        Exit(1, 0, T + 6_000, 1, by_nemesis=False, tail="Traceback ..."),
        Exit(2, 0, T + 9_000, 0, by_nemesis=False, final_stop=True),
    ]
    found = verdict([*events, *exits], callbacks)
    assert [(e.replica, e.code) for e in found.unexpected_exits] == [(1, 1)]
    assert not found.passed()


def test_availability_per_fault_kind_during_and_after_the_heal() -> None:
    events: list[Event] = [
        Fault("pause", "r1", T + 1_000, T + 5_000),
        reg("before", at=T),
        reg("during", at=T + 2_000, result="unknown"),
        reg("during2", at=T + 3_000),
        replace(reg("hung", at=T + 4_000, result="unknown"), status=None, complete_ms=T + 14_000),
        reg("after", at=T + 6_000),
        reg("later", at=T + 30_000),
        Probe(T + 2_500, 1, None),
        Probe(T + 2_600, 0, 200),
    ]
    table = verdict(events, []).availability
    assert set(table) == {"pause", "none"}
    during, after = table["pause"].during.summary(), table["pause"].after.summary()
    assert (during["n"], during["ok"], during["ready"]) == (3, 0.333, 0.5)
    assert (during["p50_ms"], during["p99_ms"], during["hung"]) == (20, 10_000, 1)
    assert (after["n"], after["ok"]) == (1, 1.0)
    assert table["none"].during.summary()["n"] == 2
    assert table["pause"].faults == 1


def test_the_window_after_a_heal_ends_where_the_next_fault_begins() -> None:
    events: list[Event] = [
        Fault("pause", "r1", T + 1_000, T + 5_000),
        Fault("kill", "r0", T + 8_000, T + 9_000),  # 3 s after the pause's heal
        reg("after", at=T + 6_000),
        reg("next", at=T + 8_500, result="unknown"),  # the kill's, not the pause's after
    ]
    table = verdict(events, []).availability
    assert table["pause"].after.summary()["n"] == 1
    assert (table["kill"].during.summary()["n"], table["kill"].during.summary()["ok"]) == (1, 0.0)


def test_the_history_and_the_callbacks_round_trip_as_json_lines(tmp_path: Path) -> None:
    events, callbacks = clean()
    events += [
        Fault("kill", "r0", T, T + 4_000, "note"),
        Probe(T, 2, None),
        Exit(0, 1, T, -9, True),
    ]
    writer = HistoryWriter(tmp_path / "history.jsonl")
    for event in events:
        writer.add(event)
    writer.close()
    assert read_history(tmp_path / "history.jsonl") == events
    write_callbacks(tmp_path / "callbacks.jsonl", callbacks)
    assert read_callbacks(tmp_path / "callbacks.jsonl") == callbacks


def test_a_seed_makes_the_same_plan_and_every_kind_of_fault() -> None:
    shape = Shape()
    first, again, other = make_plan(7, shape), make_plan(7, shape), make_plan(8, shape)
    assert first == again
    assert first.actions != other.actions
    assert sorted(step.kind for step in first.steps) == sorted(KINDS)
    ops = {a.op_id for a in first.actions if a.kind == "register"}
    assert len(ops) == sum(a.kind == "register" for a in first.actions)
    assert first.settle_s >= max(a.deadline_s or 0 for a in first.actions) + shape.settle_margin_s
    chosen = make_plan(7, replace(shape, rounds=4), ["pause", "kill"])
    assert [s.kind for s in chosen.steps] == ["pause", "kill", "pause", "kill"]


def test_the_scopes_cover_every_partition_evenly() -> None:
    from purgatory.service.ownership.partitioning import partition_for  # noqa: PLC0415

    names = scopes(3)
    counts = [sum(partition_for(n, PARTITIONS) == p for n in names) for p in range(PARTITIONS)]
    assert len(set(counts)) == 1 and counts[0] > 0
