"""The engine's inputs as a replayable journal (core concept: journal; sans-IO, stdlib only).

The engine is deterministic: told the same inputs at the same milliseconds, it reaches the
same state and decides the same outcomes with the same sequence numbers. So the inputs are
enough to rebuild it. An :class:`Engine` built with ``journal=recorder`` calls the recorder
with every input, as a typed entry (:mod:`purgatory._core.durability.entries`), before applying it:

============================================  ==============================================
entry (JSON array)                            the input
============================================  ==============================================
``["register", now_ms, spec_row]``            :meth:`Engine.register`
``["signal", now_ms, scope, key, et, pl]``    :meth:`Engine.signal` (event time, payload)
``["watermark", scope, watermark_ms]``        :meth:`Engine.advance_watermark`
``["cancel", now_ms, scope, op_id]``          :meth:`Engine.cancel`
``["advance", now_ms]``                       :meth:`Engine.advance_clock` (and the
                                              expirations it decides)
``["resume", now_ms]``                        :meth:`Engine.resume` (after a restore: what
                                              is overdue then is flagged late)
============================================  ==============================================

``spec_row`` is the snapshot's row of an :class:`OperationSpec`. :func:`replay_journal` applies
entries to an engine (a new one, or one restored from a snapshot taken where the entries
start); inputs the engine refused the first time (a conflict, a limit) are refused again and
change nothing. Expirations are decided inside ``advance``, so a replay decides them at the same
points, interleaved with the other inputs exactly as they happened.

:func:`replay_journal` returns the outcomes decided during the replay, in sequence order, as they
were decided the first time: the caller decides which to deliver again (callbacks are
at-least-once, and a repeat carries the same identity). An outcome's ``late`` flag is the one
exception to "the same outcomes": after a restore from a snapshot, an operation that was overdue
at the snapshot is flagged late.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from purgatory._core._errors import BadRecordError, ConflictError, LimitError, UsageError
from purgatory._core.durability.entries import (
    AdvanceEntry,
    CancelEntry,
    JournalEntry,
    RegisterEntry,
    ResumeEntry,
    SignalEntry,
    WatermarkEntry,
)
from purgatory._core.durability.snapshot import _spec, _spec_row
from purgatory._core.engine.engine import Engine
from purgatory._core.engine.engine_types import RegistrationStatus
from purgatory._core.engine.model import Outcome

__all__ = ["JournalRecorder", "decode_entry", "encode_entry", "replay_journal"]

_ARITY = {
    "register": (3, 4),
    "signal": (6,),
    "watermark": (3,),
    "cancel": (4,),
    "advance": (2,),
    "resume": (2,),
}


def encode_entry(entry: JournalEntry) -> list[Any]:
    """The JSON-able form of one input the engine reported to its journal."""
    if isinstance(entry, RegisterEntry):
        if entry.retry:  # a fourth element, only then: older journals read the same
            return ["register", entry.now_ms, _spec_row(entry.spec), True]
        return ["register", entry.now_ms, _spec_row(entry.spec)]
    if isinstance(entry, SignalEntry):
        e = entry
        return ["signal", e.now_ms, e.scope, e.key, e.event_time_ms, e.payload]
    if isinstance(entry, WatermarkEntry):
        return ["watermark", entry.scope, entry.watermark_ms]
    if isinstance(entry, CancelEntry):
        return ["cancel", entry.now_ms, entry.scope, entry.op_id]
    if isinstance(entry, ResumeEntry):
        return ["resume", entry.now_ms]
    return ["advance", entry.now_ms]


def decode_entry(row: list[Any]) -> JournalEntry:
    """The typed entry of a row written by :func:`encode_entry`.

    Raises:
        BadRecordError: the row is malformed (the reason in the message).
    """
    try:
        kind = row[0]
        if len(row) not in _ARITY.get(kind, ()):
            raise ValueError(f"unknown entry or wrong length: {kind!r}")
        if kind == "register":
            if len(row) == 4 and row[3] is not True:
                raise ValueError(f"register: retry must be true when present: {row[3]!r}")
            return RegisterEntry(row[1], _spec(row[2]), retry=len(row) == 4)
        if kind == "signal":
            return SignalEntry(row[1], row[2], row[3], row[4], row[5])
        if kind == "watermark":
            return WatermarkEntry(row[1], row[2])
        if kind == "cancel":
            return CancelEntry(row[1], row[2], row[3])
        if kind == "resume":
            return ResumeEntry(row[1])
        return AdvanceEntry(row[1])
    except (KeyError, TypeError, ValueError, IndexError, UsageError) as exc:
        raise BadRecordError(f"journal entry: {exc} ({row!r:.200})") from exc


class JournalRecorder:
    """A journal in memory: pass it as ``Engine(journal=...)``; ``entries`` are JSON-able.

    Args:
        sink: also called with each encoded entry (to append it to a log), if given.
    """

    def __init__(self, sink: Callable[[list[Any]], None] | None = None) -> None:
        self.entries: list[list[Any]] = []
        self._sink = sink

    def __call__(self, entry: JournalEntry) -> None:
        row = encode_entry(entry)
        self.entries.append(row)
        if self._sink is not None:
            self._sink(row)


def replay_journal(engine: Engine, entries: Iterable[list[Any] | JournalEntry]) -> list[Outcome]:
    """Apply journal entries (rows or typed) to ``engine``; return the outcomes they decided.

    The engine's own journal, if any, does not record the replayed entries.

    Raises:
        BadRecordError: an entry is malformed (its index and the reason in the message).
    """
    saved, engine._journal = engine._journal, None
    decided: list[Outcome] = []
    try:
        for index, item in enumerate(entries):
            try:
                entry = decode_entry(item) if isinstance(item, list) else item
                decided.extend(_apply(engine, entry))
            except (ConflictError, LimitError):
                pass  # refused the first time too: nothing changed then, nothing changes now
            except (KeyError, TypeError, ValueError, IndexError, UsageError) as exc:
                raise BadRecordError(f"journal entry {index}: {exc} ({item!r:.200})") from exc
            except BadRecordError as exc:
                raise BadRecordError(f"journal entry {index}: {exc}") from exc
    finally:
        engine._journal = saved
    return decided


def _apply(engine: Engine, entry: JournalEntry) -> list[Outcome]:
    if isinstance(entry, RegisterEntry):
        registration = engine.register(entry.spec, now_ms=entry.now_ms, retry=entry.retry)
        decided = registration.status is RegistrationStatus.COMPLETED
        return [registration.outcome] if decided and registration.outcome is not None else []
    if isinstance(entry, SignalEntry):
        return engine.signal(
            entry.scope,
            entry.key,
            now_ms=entry.now_ms,
            event_time_ms=entry.event_time_ms,
            payload=entry.payload,
        )
    if isinstance(entry, WatermarkEntry):
        engine.advance_watermark(entry.scope, entry.watermark_ms)
        return []
    if isinstance(entry, CancelEntry):
        outcome = engine.cancel(entry.scope, entry.op_id, now_ms=entry.now_ms)
        return [outcome] if outcome is not None else []
    if isinstance(entry, AdvanceEntry):
        return engine.advance_clock(entry.now_ms)
    if isinstance(entry, ResumeEntry):
        engine.resume(entry.now_ms)
        return []
    raise TypeError(f"not a journal entry: {type(entry).__name__}")
