"""The journal: replaying an engine's recorded inputs rebuilds it, outcomes and sequences included.

Every call that decides outcomes returns them, so the original run's outcomes are simply the
concatenation of what its calls returned; a replay must return the same list.
"""

from __future__ import annotations

import contextlib
import json
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
    RegisterEntry,
    RegistrationStatus,
    SignalEntry,
    TimeDomain,
    TtlConfig,
)
from purgatory._core._journal import JournalRecorder, decode_entry, replay_journal
from purgatory._core._snapshot import restore_engine, snapshot_engine

_SCOPES = st.sampled_from(["s1", "s2"])
_KEYNAMES = st.sampled_from(["a", "b", "c"])
_SPECS = st.tuples(
    st.sampled_from(["o1", "o2", "o3", "o4"]),
    _SCOPES,
    st.lists(_KEYNAMES, unique=True, max_size=3).map(tuple),
    st.integers(0, 500),
    st.sampled_from(["all", "any"]),
    st.sampled_from(list(TimeDomain)),
)
_ACTIONS = st.lists(
    st.one_of(
        st.tuples(st.just("register"), _SPECS),
        st.tuples(st.just("signal"), st.tuples(_SCOPES, _KEYNAMES, st.integers(0, 900))),
        st.tuples(st.just("watermark"), st.tuples(_SCOPES, st.integers(0, 900))),
        st.tuples(st.just("cancel"), st.tuples(_SCOPES, st.sampled_from(["o1", "o2"]))),
        st.tuples(st.just("advance"), st.integers(0, 200)),
    ),
    max_size=50,
)
CONFIG = EngineConfig(signal_ttl=TtlConfig(ttl_ms=300), outcome_ttl_ms=400, max_pending=6)


class Original:
    """An engine recording its journal, and every outcome its calls returned."""

    def __init__(self) -> None:
        self.journal = JournalRecorder()
        self.engine = Engine(CONFIG, start_ms=1_000, journal=self.journal)
        self.now = 1_000
        self.outcomes: list[Outcome] = []

    def apply(self, action: tuple[str, Any]) -> None:
        kind, arg = action
        engine = self.engine
        if kind == "register":
            op_id, scope, keys, delay, cond, domain = arg
            spec = OperationSpec(
                op_id=op_id, scope=scope, keys=keys, deadline_ms=self.now + delay,
                condition=Condition(cond) if keys else Condition.ALL, time_domain=domain,
            )  # fmt: skip
            with contextlib.suppress(ConflictError, LimitError):
                registration = engine.register(spec, now_ms=self.now)
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
