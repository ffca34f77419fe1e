"""What the engine's parts share (core concept: shared state; sans-IO, stdlib only).

The :class:`~purgatory._core.engine.engine.Engine` is composed of parts, its lifecycle, its
budget and its views, and this module holds what they share, so that each reads it from what it
was given at construction and none reaches into another:

* ``_Progress``: the engine's clock (the latest time it was told) and its outcome counters. The
  engine moves the clock, the lifecycle counts outcomes, the views read both, and a snapshot
  saves and restores them.
* :class:`Tally`: what the engine holds, per scope and in total: its pending operations (how
  many, and their estimated bytes), its remembered signals (how many, and their bytes) and its
  finished operations (their bytes), estimated by :mod:`purgatory._core.engine.footprint`. The
  lifecycle tells it of each operation held and finished; the two TTL stores tell it of every
  change of a remembered signal or of a finished operation (their ``on_change``), expiries and
  restores included. It reads nothing, so it is built before the stores; the budget and the
  views read it.
* :class:`EngineState`: one frozen record of references to the live state: the pending
  operations and their page index, the progress and the tally, the purgatory (with its timing
  wheel), the keyed timers and the two TTL stores. The engine builds it once and hands it to
  each part; a part keeps the references it uses, so reading them costs no more than reading
  its own attributes.
"""

from __future__ import annotations

from dataclasses import dataclass

from purgatory._core.engine.engine_types import _Finished, _Op
from purgatory._core.engine.footprint import finished_bytes, signal_bytes
from purgatory._core.engine.model import OutcomeKind, SignalFact
from purgatory._core.engine.sorted_ids import _SortedIds
from purgatory._core.flink.keyed_timers import KeyedTimers
from purgatory._core.flink.ttl_state import TtlState
from purgatory._core.wheel.purgatory import DelayedOperationPurgatory

__all__ = ["EngineState", "Tally"]


class _Progress:
    """How far the engine has got: the latest time it was told, the sequence of its last
    outcome, its outcomes by kind and the late ones among them."""

    __slots__ = ("counts", "late", "now_ms", "sequence")

    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms
        self.sequence = 0
        self.counts = dict.fromkeys(OutcomeKind, 0)
        self.late = 0


class Tally:
    """What the engine holds, counted and in estimated bytes, per scope and in total."""

    __slots__ = (
        "finished_bytes",
        "pending_by_scope",
        "pending_bytes",
        "pending_bytes_by_scope",
        "remembered_by_scope",
        "remembered_bytes",
    )

    def __init__(self) -> None:
        self.pending_by_scope: dict[str, int] = {}  # scope -> pending operations
        self.pending_bytes = 0
        self.pending_bytes_by_scope: dict[str, int] = {}
        self.remembered_bytes = 0
        self.remembered_by_scope: dict[str, list[int]] = {}  # scope -> [count, bytes]
        self.finished_bytes = 0

    @property
    def memory_bytes(self) -> int:
        """The estimated bytes held: pending, remembered and finished state."""
        return self.pending_bytes + self.remembered_bytes + self.finished_bytes

    def hold_pending(self, scope: str, count: int, size: int) -> None:
        """Count ``count`` pending operations (negative: finished) of ``size`` bytes in all."""
        by_scope = self.pending_by_scope
        held = by_scope.get(scope, 0) + count
        if held:
            by_scope[scope] = held
        else:
            del by_scope[scope]
        self.pending_bytes += size
        bytes_by_scope = self.pending_bytes_by_scope
        held = bytes_by_scope.get(scope, 0) + size
        if held:
            bytes_by_scope[scope] = held
        else:
            del bytes_by_scope[scope]

    def remembered_changed(
        self, ident: tuple[str, str], old: SignalFact | None, new: SignalFact | None
    ) -> None:
        """The signal store's ``on_change``: a remembered signal was added, replaced or
        dropped."""
        scope, key = ident
        count = (new is not None) - (old is not None)
        size = (0 if new is None else signal_bytes(scope, key, new)) - (
            0 if old is None else signal_bytes(scope, key, old)
        )
        self.remembered_bytes += size
        held = self.remembered_by_scope.get(scope)
        if held is None:
            self.remembered_by_scope[scope] = [count, size]
            return
        held[0] += count
        held[1] += size
        if not held[0]:
            del self.remembered_by_scope[scope]

    def finished_changed(
        self, _ident: tuple[str, str], old: _Finished | None, new: _Finished | None
    ) -> None:
        """The finished store's ``on_change``: a finished operation was kept or dropped."""
        if new is not None:
            self.finished_bytes += finished_bytes(new.spec)
        if old is not None:
            self.finished_bytes -= finished_bytes(old.spec)


@dataclass(frozen=True, slots=True)
class EngineState:
    """The live state the engine's parts share, by reference.

    Attributes:
        ops: the pending operations, by ``(scope, op_id)``, in the order they were (re)added.
        op_ids: each scope's pending op_ids, sorted (the pages' index).
        progress: the engine's clock and outcome counters.
        tally: what is held, counted and in estimated bytes.
        purgatory: the watch lists and, as its timer, the timing wheel (processing-time
            deadlines).
        keyed: the event-time deadlines and the scopes' watermarks.
        signals: the remembered signals.
        finished: the finished operations, remembered with their outcomes for idempotency.
    """

    ops: dict[tuple[str, str], _Op]
    op_ids: dict[str, list[str] | _SortedIds]
    progress: _Progress
    tally: Tally
    purgatory: DelayedOperationPurgatory
    keyed: KeyedTimers
    signals: TtlState[tuple[str, str], SignalFact]
    finished: TtlState[tuple[str, str], _Finished]
