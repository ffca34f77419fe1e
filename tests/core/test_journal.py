"""The journal: replaying an engine's recorded inputs rebuilds it, outcomes and sequences included.

Every call that decides outcomes returns them, so the original run's outcomes are simply the
concatenation of what its calls returned; a replay must return the same list.
"""

from __future__ import annotations

import contextlib
import json
import zlib
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from purgatory._core import (
    AdvanceEntry,
    BadRecordError,
    Condition,
    ConflictError,
    Engine,
    EngineConfig,
    JournalEntry,
    LimitError,
    OperationSpec,
    Outcome,
    OutcomeKind,
    RegisterEntry,
    Registration,
    RegistrationStatus,
    SignalEntry,
    TimeDomain,
    TtlConfig,
)
from purgatory._core.durability.entries import ResumeEntry
from purgatory._core.durability.journal import (
    JournalRecorder,
    decode_entry,
    encode_entry,
    replay_journal,
)
from purgatory._core.durability.snapshot import _pending_rows, restore_engine, snapshot_engine

_SCOPES = st.sampled_from(["s1", "s2"])
_KEYNAMES = st.sampled_from(["a", "b", "c"])
_SPECS = st.tuples(
    st.sampled_from(["o1", "o2", "o3", "o4"]),
    _SCOPES,
    st.lists(_KEYNAMES, unique=True, max_size=3).map(tuple),
    st.integers(0, 500),
    st.sampled_from(["all", "any"]),
    st.sampled_from(list(TimeDomain)),
    st.booleans(),  # sent with a relative timeout_ms
    st.booleans(),  # sent as a retry (purgatory._codec._retry)
)
_ACTION = st.one_of(
    st.tuples(st.just("register"), _SPECS),
    st.tuples(st.just("signal"), st.tuples(_SCOPES, _KEYNAMES, st.integers(0, 900))),
    st.tuples(st.just("watermark"), st.tuples(_SCOPES, st.integers(0, 900))),
    st.tuples(st.just("cancel"), st.tuples(_SCOPES, st.sampled_from(["o1", "o2"]))),
    st.tuples(st.just("advance"), st.integers(0, 200)),
)
_ACTIONS = st.lists(_ACTION, max_size=50)
# Longer runs, registrations twice as likely, and resumes (at the clock plus up to 300 ms): the
# late flags they set are journaled.
_ACTIONS_WITH_RESUMES = st.lists(
    st.one_of(
        st.tuples(st.just("register"), _SPECS),
        _ACTION,
        st.tuples(st.just("resume"), st.integers(0, 300)),
    ),
    min_size=10,
    max_size=50,
)
CONFIG = EngineConfig(signal_ttl=TtlConfig(ttl_ms=300), outcome_ttl_ms=400, max_pending=6)


class Original:
    """An engine recording its journal, and every outcome its calls returned."""

    def __init__(self, partition: int = 0) -> None:
        self.journal = JournalRecorder()
        self.engine = Engine(CONFIG, start_ms=1_000, journal=self.journal, partition=partition)
        self.now = 1_000
        self.outcomes: list[Outcome] = []
        # The registrations the engine accepted: (their journal index, spec, answer).
        self.accepted: list[tuple[int, OperationSpec, Registration]] = []

    def apply(self, action: tuple[str, Any]) -> None:
        kind, arg = action
        engine = self.engine
        if kind == "register":
            op_id, scope, keys, delay, cond, domain, relative, retry = arg
            spec = OperationSpec(
                op_id=op_id, scope=scope, keys=keys, deadline_ms=self.now + delay,
                condition=Condition(cond) if keys else Condition.ALL, time_domain=domain,
                timeout_ms=delay if relative else None,
            )  # fmt: skip
            with contextlib.suppress(ConflictError, LimitError):
                registration = engine.register(spec, now_ms=self.now, retry=retry)
                self.accepted.append((len(self.journal.entries) - 1, spec, registration))
                if registration.status is RegistrationStatus.COMPLETED:
                    assert registration.outcome is not None
                    self.outcomes.append(registration.outcome)
        elif kind == "signal":
            scope, key, event_time = arg
            self.outcomes += engine.signal(
                scope, key, now_ms=self.now, event_time_ms=event_time, payload='"p"'
            )
        elif kind == "watermark":
            engine.advance_watermark(*arg)
        elif kind == "cancel":
            cancelled = engine.cancel(*arg, now_ms=self.now)
            self.outcomes += [cancelled] if cancelled is not None else []
        elif kind == "resume":
            engine.resume(self.now + arg)
        else:
            self.now += arg
            self.outcomes += engine.advance_clock(self.now)


def _without_late(outcomes: list[Outcome]) -> list[tuple[Any, ...]]:
    return [(o.op_id, o.scope, o.outcome, o.outcome_ms, o.sequence, o.keys) for o in outcomes]


@settings(max_examples=300, deadline=None)
@given(actions=_ACTIONS)
def test_replaying_the_whole_journal_rebuilds_the_engine_and_its_outcomes(
    actions: list[tuple[str, Any]],
) -> None:
    original = Original()
    for action in actions:
        original.apply(action)
    entries = json.loads(json.dumps(original.journal.entries))  # as stored: JSON

    rebuilt = Engine(CONFIG, start_ms=1_000)
    replayed = replay_journal(rebuilt, entries)

    assert replayed == original.outcomes
    assert snapshot_engine(rebuilt) == snapshot_engine(original.engine)
    assert rebuilt.pending() == original.engine.pending()
    event(f"outcomes: {min(len(replayed), 3)}")
    # Going on behaves as the original does.
    later = original.now + 10_000
    assert rebuilt.advance_clock(later) == original.engine.advance_clock(later)


@settings(max_examples=300, deadline=None)
@given(actions=_ACTIONS, data=st.data())
def test_a_snapshot_and_the_journal_after_it_rebuild_the_engine(
    actions: list[tuple[str, Any]], data: st.DataObject
) -> None:
    original = Original()
    cut = data.draw(st.integers(0, len(actions)), label="snapshot after action")
    for action in actions[:cut]:
        original.apply(action)
    snapshot = snapshot_engine(original.engine)
    at_snapshot, clock = len(original.journal.entries), original.engine.clock_ms
    before = len(original.outcomes)
    for action in actions[cut:]:
        original.apply(action)

    rebuilt = restore_engine(snapshot, now_ms=clock, config=CONFIG)
    replayed = replay_journal(rebuilt, original.journal.entries[at_snapshot:])

    after = original.outcomes[before:]
    assert _without_late(replayed) == _without_late(after)
    assert rebuilt.pending() == original.engine.pending()
    event(f"outcomes before the snapshot: {min(before, 2)}, after: {min(len(after), 2)}")


def test_an_engine_without_a_journal_records_nothing_and_a_replay_records_nothing_twice() -> None:
    recorder = JournalRecorder()
    engine = Engine(CONFIG, start_ms=0, journal=recorder)
    engine.register(OperationSpec("o", "s", ("k",), deadline_ms=100), now_ms=0)
    engine.signal("s", "k", now_ms=5)
    assert [row[0] for row in recorder.entries] == ["register", "signal"]
    again = JournalRecorder()
    replay_journal(Engine(CONFIG, start_ms=0, journal=again), recorder.entries)
    assert again.entries == []


def test_the_sink_gets_every_entry_as_json_and_an_advance_decides_the_expiry() -> None:
    rows: list[str] = []
    engine = Engine(
        CONFIG, start_ms=0, journal=JournalRecorder(lambda r: rows.append(json.dumps(r)))
    )
    engine.register(OperationSpec("o", "s", (), deadline_ms=10), now_ms=0)
    [expired] = engine.advance_clock(10)
    assert [json.loads(r)[0] for r in rows] == ["register", "advance"]
    assert json.loads(rows[1]) == ["advance", 10]
    rebuilt = Engine(CONFIG, start_ms=0)
    assert replay_journal(rebuilt, [json.loads(r) for r in rows]) == [expired]


def test_typed_entries_replay_like_their_rows() -> None:
    spec = OperationSpec("o", "s", ("k",), deadline_ms=100, timeout_ms=100)
    typed: list[JournalEntry] = [
        RegisterEntry(0, spec),
        SignalEntry(5, "s", "k", None, '"p"'),
        AdvanceEntry(200),
    ]
    from_typed = replay_journal(Engine(CONFIG, start_ms=0), typed)
    recorder = JournalRecorder()
    for entry in typed:
        recorder(entry)
    from_rows = replay_journal(Engine(CONFIG, start_ms=0), recorder.entries)
    assert from_typed == from_rows and [o.op_id for o in from_rows] == ["o"]
    assert [decode_entry(r) for r in recorder.entries] == typed


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (["bogus", 1], "journal entry 0: .*unknown entry or wrong length: 'bogus'"),
        (["advance"], "journal entry 0: .*unknown entry or wrong length: 'advance'"),
        (["advance", -5], "journal entry 0: now_ms"),
        (["expire", "s", "o"], "journal entry 0: .*unknown entry or wrong length: 'expire'"),
        (["register", 0, ["o", "s"]], "journal entry 0: "),
    ],
)
def test_a_malformed_entry_is_rejected_naming_its_index(row: list[Any], message: str) -> None:
    with pytest.raises(BadRecordError, match=r"^" + message.replace("(", r"\(")):
        replay_journal(Engine(CONFIG, start_ms=0), [row])


@settings(max_examples=300, deadline=None)
@given(actions=_ACTIONS, data=st.data())
def test_a_crash_after_any_acknowledged_prefix_keeps_every_released_outcome(
    actions: list[tuple[str, Any]], data: st.DataObject
) -> None:
    """Write-ahead: an outcome is released only once the journal entry that decided it is
    acknowledged. Crash after any acknowledged prefix of the journal; restore from a snapshot
    taken at any journal offset at or before it, plus the entries between. Every outcome released
    before the crash is decided again, identically (sequence included; ``late`` aside), and no
    acknowledged registration or signal is lost."""
    original = Original()
    snapshots: dict[int, tuple[bytes, int]] = {0: (snapshot_engine(original.engine), 1_000)}
    released: list[tuple[int, Outcome]] = []  # (journal length that decided it, outcome)
    for action in actions:
        before = len(original.outcomes)
        original.apply(action)
        at = len(original.journal.entries)
        released += [(at, o) for o in original.outcomes[before:]]
        snapshots[at] = (snapshot_engine(original.engine), original.engine.clock_ms)
    entries = json.loads(json.dumps(original.journal.entries))
    acknowledged = data.draw(st.integers(0, len(entries)), label="journal entries acknowledged")
    taken = data.draw(
        st.sampled_from(sorted(k for k in snapshots if k <= acknowledged)), label="snapshot at"
    )
    snapshot, clock = snapshots[taken]

    rebuilt = restore_engine(snapshot, now_ms=clock, config=CONFIG)
    replayed = replay_journal(rebuilt, entries[taken:acknowledged])

    expected = [o for at, o in released if taken < at <= acknowledged]
    assert _without_late(replayed) == _without_late(expected)
    # The state is the original's at that prefix: what it held pending, the rebuilt holds.
    prefix = Engine(CONFIG, start_ms=1_000)
    replay_journal(prefix, entries[:acknowledged])
    assert rebuilt.pending() == prefix.pending()
    event(f"entries replayed after the snapshot: {min(acknowledged - taken, 3)}")


# -- resume: journaled, so a replay flags the same operations late ------------------------------


def test_a_resume_is_journaled_as_a_row_and_a_replay_reproduces_its_late_flags() -> None:
    recorder = JournalRecorder()
    engine = Engine(CONFIG, start_ms=0, journal=recorder, partition=4)
    engine.register(OperationSpec("o", "s", (), deadline_ms=100), now_ms=0)
    engine.register(OperationSpec("p", "s", ("k",), deadline_ms=200), now_ms=0)
    assert engine.resume(150) == 1
    assert recorder.entries[-1] == ["resume", 150]
    assert encode_entry(ResumeEntry(150)) == ["resume", 150]
    assert decode_entry(json.loads(json.dumps(recorder.entries[-1]))) == ResumeEntry(150)
    at_resume = snapshot_engine(engine)
    outcomes = engine.advance_clock(200)
    assert [(o.op_id, o.late, o.partition) for o in outcomes] == [("o", True, 4), ("p", False, 4)]

    rows = json.loads(json.dumps(recorder.entries))
    until_resume = Engine(CONFIG, start_ms=0, partition=4)
    assert replay_journal(until_resume, rows[:3]) == []
    assert snapshot_engine(until_resume) == at_resume  # the flag included
    assert replay_journal(Engine(CONFIG, start_ms=0, partition=4), rows) == outcomes
    typed = [decode_entry(row) for row in rows]
    assert replay_journal(Engine(CONFIG, start_ms=0, partition=4), typed) == outcomes


@pytest.mark.parametrize("row", [["resume"], ["resume", 1, 2], ["resume", 1, 2, 3]])
def test_a_resume_row_of_the_wrong_length_is_rejected(row: list[Any]) -> None:
    with pytest.raises(BadRecordError, match=r"^journal entry 0: .*wrong length: 'resume'"):
        replay_journal(Engine(CONFIG, start_ms=0), [row])


@pytest.mark.parametrize("now_ms", [-5, True, 1.5, "150", None, 2**80])
def test_a_resume_row_with_a_bad_time_is_rejected_like_an_advance(now_ms: Any) -> None:
    with pytest.raises(BadRecordError, match=r"^journal entry 0: now_ms"):
        replay_journal(Engine(CONFIG, start_ms=0), [["resume", now_ms]])


def _document(snapshot: bytes) -> dict[str, Any]:
    """The JSON document of a snapshot (magic, 2 bytes of version, zlib body)."""
    header = len(b"PURGATORY-SNAPSHOT\n") + 2
    doc: dict[str, Any] = json.loads(zlib.decompress(snapshot[header:]))
    return doc


def _replayed_to(entries: list[list[Any]], end: int) -> Engine:
    engine = Engine(CONFIG, start_ms=1_000, partition=3)
    replay_journal(engine, entries[:end])
    return engine


def _state(engine: Engine) -> dict[str, Any]:
    """The snapshot document, remembered signals and outcomes in a canonical order.

    A snapshot holds only unexpired entries, but a live engine keeps an expired one in place
    until its next ``advance_clock`` (a resume moves the clock without one), so a write to that
    key keeps its old position there and takes a new one in a restored engine.
    """
    doc = _document(snapshot_engine(engine))
    doc["signals"] = sorted(doc["signals"], key=json.dumps)
    doc["finished"] = sorted(doc["finished"], key=json.dumps)
    return doc


def _counts(engine: Engine) -> tuple[int, ...]:
    """The statistics a restore keeps: not the sizes of the watch lists and of the signal store,
    which count entries done with (completed watchers, expired signals) until they are purged."""
    s = engine.statistics()
    return (
        s.pending, s.scopes_with_watermark, s.completed, s.expired, s.cancelled, s.late,
        s.sequence, s.clock_ms,
    )  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(actions=_ACTIONS_WITH_RESUMES, data=st.data())
def test_a_crash_restores_from_a_snapshot_and_the_journal_then_resumes_late_exactly(
    actions: list[tuple[str, Any]], data: st.DataObject
) -> None:
    """The crash model with partitions, exact late flags and a resume.

    Crash after an acknowledged prefix of ``k`` entries; restore the snapshot of the engine
    replayed to ``j <= k`` at ``now_ms=0`` (its own clock) and replay ``entries[j:k]``. Every
    outcome released within the prefix is decided again with exactly the same fields (or kept in
    the snapshot), no accepted registration is lost, the state is a replay of the prefix, and a
    resume at a wall clock past every deadline expires what is pending there, flagged late."""
    original = Original(partition=3)
    released: list[tuple[int, Outcome]] = []  # (journal length that decided it, outcome)
    for action in actions:
        before = len(original.outcomes)
        original.apply(action)
        released += [(len(original.journal.entries), o) for o in original.outcomes[before:]]
    entries: list[list[Any]] = json.loads(json.dumps(original.journal.entries))
    assert len(entries) == len(actions)  # one entry per input, refused ones included
    assert all(o.partition == 3 for _, o in released)
    k = data.draw(
        st.integers(0, len(entries)) | st.just(len(entries)), label="journal entries acknowledged"
    )
    j = data.draw(st.integers(0, k), label="snapshot after entry")
    at_snapshot = _replayed_to(entries, j)
    snapshot = snapshot_engine(at_snapshot)

    restored = restore_engine(snapshot, now_ms=0, config=CONFIG)
    assert restored.partition == 3
    assert snapshot_engine(restored) == snapshot  # exactly the saved state, late flags included
    replayed = replay_journal(restored, entries[j:k])

    # (1) What was released after the snapshot is decided again, identically; what was released
    # before it is in the snapshot's finished operations (unless its TTL ran out, as it did in
    # the original), identically too.
    assert replayed == [o for at, o in released if j < at <= k]
    latest: dict[tuple[str, str], Outcome] = {}
    for at, o in released:
        if at <= j:
            latest[o.scope, o.op_id] = o
    kept = restore_engine(snapshot, now_ms=0, config=CONFIG)  # lookups, apart from `restored`
    for (scope, op_id), outcome in latest.items():
        found = kept.lookup(scope, op_id)
        assert found == at_snapshot.lookup(scope, op_id)
        if found is not None and found[1] is not None:
            assert found[1] == outcome
            event("a released outcome is looked up in the snapshot")

    # (2) Every accepted registration is pending, or was answered by an outcome decided at or
    # after it (or, a duplicate, by the outcome it repeats).
    pending = {(spec.scope, spec.op_id) for spec in restored.pending()}
    for index, spec, registration in original.accepted:
        if index >= k:
            continue
        ident = (spec.scope, spec.op_id)
        decided = [(at, o) for at, o in released if at <= k and (o.scope, o.op_id) == ident]
        answered = registration.outcome is not None and registration.outcome in [
            o for _, o in decided
        ]
        assert ident in pending or answered or any(at > index for at, _ in decided)

    # (3) The state is the one a replay of the whole prefix reaches.
    prefix = _replayed_to(entries, k)
    assert _state(restored) == _state(prefix)
    assert restored.pending() == prefix.pending()
    assert _counts(restored) == _counts(prefix)

    # (4) Resumed at a wall clock past every deadline: every processing-time operation pending
    # expires, flagged late; an event-time one only if its watermark passed, never late.
    doc = _document(snapshot_engine(restored))
    watermarks: dict[str, int] = doc["watermarks"]
    processing = TimeDomain.PROCESSING_TIME.value
    wall = restored.clock_ms + 10_000
    rows = _operation_rows(doc["pending"])
    unflagged = [r for r in rows if r[6] == processing and r[11] is False]
    in_prefix = [o for at, o in released if at <= k]
    assert restored.resume(wall) == len(unflagged)
    assert restored.clock_ms == wall  # the clock moves to the restart's time
    after: list[Outcome] = []
    for _ in range(10):
        after += restored.advance_clock(wall)
        nxt = restored.next_expiration_ms()
        if nxt is None or nxt > wall:
            break
    expected = {
        (r[1], r[0]): r[6] == processing
        for r in rows
        if r[6] == processing or watermarks.get(r[1], -1) >= r[3]
    }
    assert {(o.scope, o.op_id): o.late for o in after} == expected
    assert all(o.outcome is OutcomeKind.EXPIRED and o.partition == 3 for o in after)
    assert [o.sequence for o in after] == list(
        range(prefix.statistics().sequence + 1, prefix.statistics().sequence + 1 + len(after))
    )
    # Only operations pending at the crash are decided: no released outcome is decided again.
    assert not {(o.scope, o.op_id, o.sequence) for o in after} & {
        (o.scope, o.op_id, o.sequence) for o in in_prefix
    }
    still = [(spec.scope, spec.op_id) for spec in restored.pending()]
    assert sorted(still) == sorted((r[1], r[0]) for r in rows if (r[1], r[0]) not in expected)
    # No released outcome changed: the replay of the prefix, resumed alike, agrees.
    assert prefix.resume(wall) == len(unflagged)
    again: list[Outcome] = []
    for _ in range(10):
        again += prefix.advance_clock(wall)
        nxt = prefix.next_expiration_ms()
        if nxt is None or nxt > wall:
            break
    assert again == after
    event(f"expired late on resume: {min(sum(o.late for o in after), 3)}")
    event(f"outcomes decided again by the replay: {min(len(replayed), 3)}")
    event(f"late outcomes decided again by the replay: {min(sum(o.late for o in replayed), 2)}")
    flagged = len(_document(snapshot)["pending"]["late_at"])
    event(f"operations flagged late in the snapshot: {min(flagged, 2)}")


def _operation_rows(pending: dict[str, Any]) -> list[list[Any]]:
    """The pending operations of a snapshot's document, a row each (op_id, scope, keys,
    deadline_ms, condition, count, time_domain, payload, reply_to, timeout_ms, registered_ms,
    late), as version 1 wrote them."""
    rows = []
    for scope, op_id, keys, deadline, registered, timeout, payload, late, rest in _pending_rows(
        pending
    ):
        spec = rest
        rows.append([
            op_id, scope, list(keys), deadline,
            "all" if spec is None else spec.condition.value,
            None if spec is None else spec.count,
            TimeDomain.PROCESSING_TIME.value if spec is None else spec.time_domain.value,
            payload, None if spec is None else spec.reply_to, timeout, registered, late,
        ])  # fmt: skip
    return rows
