"""The engine's inputs as a replayable journal (core concept: journal; sans-IO, stdlib only).

The engine is deterministic: told the same inputs at the same milliseconds, it reaches the
same state and decides the same outcomes with the same sequence numbers. So the inputs are
enough to rebuild it. An :class:`Engine` built with ``journal=recorder`` calls the recorder
with every input before applying it:

============================================  ==============================================
entry (JSON array)                            the input
============================================  ==============================================
``["register", now_ms, spec_row]``            :meth:`Engine.register`
``["signal", now_ms, scope, key, et, pl]``    :meth:`Engine.signal` (event time, payload)
``["watermark", scope, watermark_ms]``        :meth:`Engine.advance_watermark`
``["cancel", now_ms, scope, op_id]``          :meth:`Engine.cancel`
``["advance", now_ms]``                       :meth:`Engine.advance_clock`
``["expire", scope, op_id]``                  the executor ran that operation's expiry task
============================================  ==============================================

``spec_row`` is the snapshot's row of an :class:`OperationSpec`. :func:`replay_journal` applies
entries to an engine (a new one, or one restored from a snapshot taken where the entries
start); inputs the engine refused the first time (a conflict, a limit) are refused again and
change nothing. Expiry tasks are recorded where the executor *ran* them, not where the clock
handed them out, so a replay interleaves expirations with the other inputs exactly as they
happened. Tasks handed out but not run when the journal ends (the process died in between)
are returned by :func:`replay_journal`, for the caller to run.

Outcomes decided during a replay go to the engine's ``emit``, as they did the first time: the
caller decides which to deliver again (callbacks are at-least-once; ``(op_id, sequence)``
identifies a repeat). An outcome's ``late`` flag is the one exception to "the same outcomes":
after a restore from a snapshot, an operation that was overdue at the snapshot is flagged late.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from purgatory._core._engine import ConflictError, Engine, LimitError
from purgatory._core._errors import BadRecordError, UsageError
from purgatory._core._operation import DelayedOperation
from purgatory._core._snapshot import _spec, _spec_row
from purgatory._core._timer import TimerTask

__all__ = ["JournalRecorder", "encode_entry", "replay_journal"]

_ARITY = {"register": 3, "signal": 6, "watermark": 3, "cancel": 4, "advance": 2, "expire": 3}


def encode_entry(entry: tuple[Any, ...]) -> list[Any]:
    """The JSON-able form of one input the engine reported to its journal."""
    if entry[0] == "register":
        return ["register", entry[1], _spec_row(entry[2])]
    return list(entry)


class JournalRecorder:
    """A journal in memory: pass it as ``Engine(journal=...)``; ``entries`` are JSON-able.

    Args:
        sink: also called with each encoded entry (to append it to a log), if given.
    """

    def __init__(self, sink: Callable[[list[Any]], None] | None = None) -> None:
        self.entries: list[list[Any]] = []
        self._sink = sink

    def __call__(self, entry: tuple[Any, ...]) -> None:
        row = encode_entry(entry)
        self.entries.append(row)
        if self._sink is not None:
            self._sink(row)


def replay_journal(engine: Engine, entries: Iterable[list[Any]]) -> list[TimerTask]:
    """Apply journal entries to ``engine``; returns the expiry tasks handed out but not run.

    The engine's own journal, if any, does not record the replayed entries.

    Raises:
        BadRecordError: an entry is malformed (its index and the reason in the message).
    """
    saved, engine._journal = engine._journal, None
    due: dict[tuple[str, str], TimerTask] = {}
    try:
        for index, row in enumerate(entries):
            try:
                _apply(engine, row, due)
            except (ConflictError, LimitError):
                pass  # refused the first time too: nothing changed then, nothing changes now
            except (KeyError, TypeError, ValueError, IndexError, UsageError) as exc:
                raise BadRecordError(f"journal entry {index}: {exc} ({row!r:.200})") from exc
    finally:
        engine._journal = saved
    return [task for task in due.values() if not _done(task)]


def _done(task: TimerTask) -> bool:
    return isinstance(task, DelayedOperation) and task.is_done


def _apply(engine: Engine, row: list[Any], due: dict[tuple[str, str], TimerTask]) -> None:
    kind = row[0]
    if _ARITY.get(kind) != len(row):
        raise ValueError(f"unknown entry or wrong length: {kind!r}")
    if kind == "register":
        engine.register(_spec(row[2]), now_ms=row[1])
    elif kind == "signal":
        _, now, scope, key, event_time, payload = row
        engine.signal(scope, key, now_ms=now, event_time_ms=event_time, payload=payload)
    elif kind == "watermark":
        engine.advance_watermark(row[1], row[2])
    elif kind == "cancel":
        engine.cancel(row[2], row[3], now_ms=row[1])
    elif kind == "advance":
        for handed in engine.advance_clock(row[1]):
            spec = getattr(handed, "spec", None)
            if spec is not None:
                due[(spec.scope, spec.op_id)] = handed
    else:  # expire
        ident = (row[1], row[2])
        task: TimerTask | None = due.pop(ident) if ident in due else None
        if task is None:
            # Handed out before the snapshot this replay starts from: the restored engine
            # holds it as an overdue operation.
            task = engine._ops.get(ident)
        if task is not None:
            task.run()
