"""The journal: replaying an engine's recorded inputs rebuilds it, outcomes and sequences included.

The original engine runs under a model executor that runs the expiry tasks it is handed only
when told to, so expirations interleave with other inputs as they do in the service.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from purgatory._core import (
    BadRecordError,
    Condition,
    ConflictError,
    Engine,
    EngineConfig,
    LimitError,
    OperationSpec,
    Outcome,
    TimeDomain,
    TtlConfig,
)
from purgatory._core._journal import JournalRecorder, replay_journal
from purgatory._core._snapshot import restore_engine, snapshot_engine
from purgatory._core._timer import TimerTask

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
        st.tuples(st.just("run"), st.integers(0, 3)),
    ),
    max_size=50,
)
CONFIG = EngineConfig(signal_ttl=TtlConfig(ttl_ms=300), outcome_ttl_ms=400, max_pending=6)


class Original:
    """An engine recording its journal, with a model executor holding handed-out tasks."""

    def __init__(self) -> None:
        self.journal = JournalRecorder()
        self.engine = Engine(CONFIG, start_ms=1_000, journal=self.journal)
        self.now = 1_000
        self.queue: list[TimerTask] = []

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
                engine.register(spec, now_ms=self.now)
        elif kind == "signal":
            scope, key, event_time = arg
            engine.signal(scope, key, now_ms=self.now, event_time_ms=event_time, payload='"p"')
        elif kind == "watermark":
            engine.advance_watermark(*arg)
        elif kind == "cancel":
            engine.cancel(*arg, now_ms=self.now)
        elif kind == "advance":
            self.now += arg
            self.queue.extend(engine.advance_clock(self.now))
        else:
            for task in self.queue[:arg]:
                task.run()
            del self.queue[:arg]


def _without_late(outcomes: list[Outcome]) -> list[tuple[Any, ...]]:
    return [(o.op_id, o.scope, o.outcome, o.outcome_ms, o.sequence, o.keys) for o in outcomes]


def _idents(tasks: list[TimerTask]) -> set[tuple[str, str]]:
    return {(t.spec.scope, t.spec.op_id) for t in tasks if not t.is_done}  # type: ignore[attr-defined]


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
    not_run = replay_journal(rebuilt, entries)

    assert rebuilt.drain_outcomes() == original.engine.drain_outcomes()
    assert snapshot_engine(rebuilt) == snapshot_engine(original.engine)
    assert rebuilt.pending() == original.engine.pending()
    assert _idents(not_run) == _idents(original.queue)
    event(f"tasks handed out, not run: {min(len(_idents(not_run)), 2)}")
    # Running them and going on behaves as the original does.
    for task in not_run:
        task.run()
    for task in original.queue:
        task.run()
    for engine in (rebuilt, original.engine):
        for task in engine.advance_clock(original.now + 10_000):
            task.run()
    assert rebuilt.drain_outcomes() == original.engine.drain_outcomes()


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
    before = original.engine.drain_outcomes()
    for action in actions[cut:]:
        original.apply(action)

    rebuilt = restore_engine(snapshot, now_ms=clock, config=CONFIG)
    not_run = replay_journal(rebuilt, original.journal.entries[at_snapshot:])

    after = original.engine.drain_outcomes()
    assert _without_late(rebuilt.drain_outcomes()) == _without_late(after)
    assert rebuilt.pending() == original.engine.pending()
    # The tasks still to run: the original's queue, and what the snapshot held overdue.
    assert _idents(original.queue) <= _idents(not_run) | {
        (s.scope, s.op_id) for s in rebuilt.pending()
    }
    event(f"outcomes before the snapshot: {min(len(before), 2)}, after: {min(len(after), 2)}")


def test_an_engine_without_a_journal_records_nothing_and_a_replay_records_nothing_twice() -> None:
    recorder = JournalRecorder()
    engine = Engine(CONFIG, start_ms=0, journal=recorder)
    engine.register(OperationSpec("o", "s", ("k",), deadline_ms=100), now_ms=0)
    engine.signal("s", "k", now_ms=5)
    assert [row[0] for row in recorder.entries] == ["register", "signal"]
    again = JournalRecorder()
    replay_journal(Engine(CONFIG, start_ms=0, journal=again), recorder.entries)
    assert again.entries == []


def test_the_sink_gets_every_entry_as_json() -> None:
    rows: list[str] = []
    engine = Engine(
        CONFIG, start_ms=0, journal=JournalRecorder(lambda r: rows.append(json.dumps(r)))
    )
    engine.register(OperationSpec("o", "s", (), deadline_ms=10), now_ms=0)
    for task in engine.advance_clock(10):
        task.run()
    assert [json.loads(r)[0] for r in rows] == ["register", "advance", "expire"]
    assert json.loads(rows[2]) == ["expire", "s", "o"]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (["bogus", 1], "journal entry 0: unknown entry or wrong length: 'bogus'"),
        (["advance"], "journal entry 0: unknown entry or wrong length: 'advance'"),
        (["advance", -5], "journal entry 0: now_ms"),
        (["register", 0, ["o", "s"]], "journal entry 0: "),
    ],
)
def test_a_malformed_entry_is_rejected_naming_its_index(row: list[Any], message: str) -> None:
    with pytest.raises(BadRecordError, match=r"^" + message.replace("(", r"\(")):
        replay_journal(Engine(CONFIG, start_ms=0), [row])
