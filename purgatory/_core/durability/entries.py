"""Typed journal entries (core concept: the inputs of an engine, as values; sans-IO, stdlib only).

An :class:`Engine` built with ``journal=`` reports every input it is about to apply as one of
these frozen records, before applying it. They are what a write-ahead journal stores and what
:func:`~purgatory._core.durability.journal.replay_journal` applies again. Expirations are not
inputs: an
:class:`AdvanceEntry` decides them, the same way every time it is replayed.
"""

from __future__ import annotations

from dataclasses import dataclass

from purgatory._core.engine.model import OperationSpec

__all__ = [
    "AdvanceEntry",
    "CancelEntry",
    "JournalEntry",
    "RegisterEntry",
    "ResumeEntry",
    "SignalEntry",
    "WatermarkEntry",
]


@dataclass(frozen=True, slots=True)
class RegisterEntry:
    """:meth:`Engine.register` was called with ``spec`` at ``now_ms`` (``retry``: as a retry)."""

    now_ms: int
    spec: OperationSpec
    retry: bool = False


@dataclass(frozen=True, slots=True)
class SignalEntry:
    """:meth:`Engine.signal` was called."""

    now_ms: int
    scope: str
    key: str
    event_time_ms: int | None
    payload: str | None


@dataclass(frozen=True, slots=True)
class WatermarkEntry:
    """:meth:`Engine.advance_watermark` was called."""

    scope: str
    watermark_ms: int


@dataclass(frozen=True, slots=True)
class CancelEntry:
    """:meth:`Engine.cancel` was called at ``now_ms``."""

    now_ms: int
    scope: str
    op_id: str


@dataclass(frozen=True, slots=True)
class AdvanceEntry:
    """:meth:`Engine.advance_clock` was called: it decides the expirations due by ``now_ms``."""

    now_ms: int


@dataclass(frozen=True, slots=True)
class ResumeEntry:
    """:meth:`Engine.resume` was called: after a restore, what is overdue at ``now_ms`` is late."""

    now_ms: int


JournalEntry = (
    RegisterEntry | SignalEntry | WatermarkEntry | CancelEntry | AdvanceEntry | ResumeEntry
)
