"""The engine's byte budget (core concept: estimated bytes and their limits; sans-IO, stdlib only).

What the engine holds, in estimated bytes (:mod:`purgatory._core.engine.footprint`), and the limits
on it: :class:`_Budget`, a mixin of :class:`~purgatory._core.engine.engine.Engine`, keeps the totals
of pending operations, remembered signals and finished operations, per scope and per engine, up
to date on every change, and refuses with a :class:`LimitError` the input that would cross
``max_pending_bytes_per_scope``, ``max_remembered_signals_per_scope``,
``max_remembered_bytes_per_scope`` or ``max_signal_bytes_per_operation``, before it changes
anything.
"""

from __future__ import annotations

from collections.abc import Callable

from purgatory._core._errors import LimitError, SizeLimitError
from purgatory._core.engine.engine_types import _NO_LIMIT, EngineConfig, _Finished, _Op
from purgatory._core.engine.footprint import finished_bytes, operation_bytes, signal_bytes
from purgatory._core.engine.model import OperationSpec, SignalFact
from purgatory._core.flink.ttl_state import TtlState
from purgatory._core.wheel.purgatory import DelayedOperationPurgatory


class _Budget:
    """The engine's estimated bytes and the limits on them (a mixin of the Engine)."""

    # The Engine's state these methods read and update (set by Engine.__init__).
    config: EngineConfig
    purgatory: DelayedOperationPurgatory
    signals: TtlState[tuple[str, str], SignalFact]
    _now: int
    _pending_bytes: int
    _pending_bytes_by_scope: dict[str, int]
    _remembered_bytes: int
    _remembered_by_scope: dict[str, list[int]]  # scope -> [count, bytes]
    _finished_bytes: int
    awaits: Callable[[str, str], bool]  # the Engine's query (purgatory._core.engine.views)

    def operation_bytes(self, spec: OperationSpec) -> int:
        """The estimated bytes ``spec`` would hold while pending."""
        return operation_bytes(spec)

    def signal_growth_bytes(self, scope: str, key: str, payload: str | None) -> int:
        """The estimated bytes remembering this signal would add (negative: it would free
        some, replacing a larger payload); no side effect."""
        return self._remembered_growth((scope, key), SignalFact(self._now, None, payload))[1]

    def _hold_pending_bytes(self, scope: str, size: int) -> None:
        self._pending_bytes += size
        held = self._pending_bytes_by_scope.get(scope, 0) + size
        if held:
            self._pending_bytes_by_scope[scope] = held
        else:
            del self._pending_bytes_by_scope[scope]

    def _remembered_changed(
        self, ident: tuple[str, str], old: SignalFact | None, new: SignalFact | None
    ) -> None:
        scope, key = ident
        count = (new is not None) - (old is not None)
        size = (0 if new is None else signal_bytes(scope, key, new)) - (
            0 if old is None else signal_bytes(scope, key, old)
        )
        self._remembered_bytes += size
        held = self._remembered_by_scope.get(scope)
        if held is None:
            self._remembered_by_scope[scope] = [count, size]
            return
        held[0] += count
        held[1] += size
        if not held[0]:
            del self._remembered_by_scope[scope]

    def _finished_changed(
        self, _ident: tuple[str, str], old: _Finished | None, new: _Finished | None
    ) -> None:
        if new is not None:
            self._finished_bytes += finished_bytes(new.spec)
        if old is not None:
            self._finished_bytes -= finished_bytes(old.spec)

    def _check_pending_bytes(self, spec: OperationSpec) -> None:
        limit = self.config.max_pending_bytes_per_scope
        if limit >= _NO_LIMIT:
            return  # nothing held in memory comes near it: spare the hot path the estimate
        size = operation_bytes(spec)
        held = self._pending_bytes_by_scope.get(spec.scope, 0)
        if held + size > limit:
            raise LimitError(
                f"max_pending_bytes_per_scope ({limit}) would be exceeded in scope "
                f"{spec.scope!r}: its pending operations hold about {held} bytes, this one "
                f"{size}",
                field="max_pending_bytes_per_scope",
            )

    def _remembered_growth(self, ident: tuple[str, str], fact: SignalFact) -> tuple[int, int]:
        """What remembering ``fact`` under ``ident`` adds: (signals, bytes) to its scope."""
        scope, key = ident
        old = self.signals.peek(ident)
        if old is None:
            return 1, signal_bytes(scope, key, fact)
        return 0, signal_bytes(scope, key, fact) - signal_bytes(scope, key, old)

    def _remembered_over(self, ident: tuple[str, str], fact: SignalFact) -> str | None:
        """The remembered-signal limit that remembering ``fact`` would cross, if any."""
        config = self.config
        count, size = self._remembered_growth(ident, fact)
        held_count, held_bytes = self._remembered_by_scope.get(ident[0], (0, 0))
        if count > 0 and held_count + count > config.max_remembered_signals_per_scope:
            return "max_remembered_signals_per_scope"
        if size > 0 and held_bytes + size > config.max_remembered_bytes_per_scope:
            return "max_remembered_bytes_per_scope"
        return None

    def _check_remembered(self, ident: tuple[str, str], fact: SignalFact) -> None:
        config = self.config
        if (
            config.max_remembered_signals_per_scope >= _NO_LIMIT
            and config.max_remembered_bytes_per_scope >= _NO_LIMIT
        ):
            return  # no limit set: spare the hot path the estimate
        if self._remembered_over(ident, fact) is None or self.awaits(*ident):
            return
        # What is stored may include signals expired but not yet cleaned up, which a snapshot
        # does not hold: count only the live ones, so a restored engine decides the same.
        self.signals.remove_expired(self._now)
        over = self._remembered_over(ident, fact)
        if over is None:
            return
        scope = ident[0]
        count, size = self._remembered_by_scope.get(scope, (0, 0))
        limit = getattr(self.config, over)
        raise LimitError(
            f"{over} ({limit}) would be exceeded in scope {scope!r}: it remembers {count} "
            f"signals of about {size} bytes, and no pending operation awaits key {ident[1]!r}",
            field=over,
        )

    def _signal_bytes(self, scope: str, keys: tuple[str, ...], skip: str | None) -> int:
        total = 0
        get, now = self.signals.get, self._now
        for key in keys:
            if key != skip:
                fact = get((scope, key), now_ms=now)
                if fact is not None and fact.payload is not None:
                    total += _utf8_len(fact.payload)
        return total

    def _check_signal_bytes(self, spec: OperationSpec) -> None:
        limit = self.config.max_signal_bytes_per_operation
        if spec.keys and self._signal_bytes(spec.scope, spec.keys, None) > limit:
            raise SizeLimitError(
                "keys",
                f"the signals already received for these keys carry more than "
                f"max_signal_bytes_per_operation ({limit}) bytes of payload, more than one "
                f"callback may report",
            )

    def _check_watchers_signal_bytes(self, ident: tuple[str, str], size: int) -> None:
        limit = self.config.max_signal_bytes_per_operation
        if size > limit:
            raise SizeLimitError(
                "payload", f"{size} bytes, over max_signal_bytes_per_operation ({limit})"
            )
        watchers = self.purgatory._watchers.get(ident)
        if not watchers:
            return
        scope, key = ident
        for op in watchers:
            if op.is_done or not isinstance(op, _Op):  # a cancelled one lingers too
                continue
            spec = op.spec
            if len(spec.keys) > 1 and self._signal_bytes(scope, spec.keys, key) + size > limit:
                raise SizeLimitError(
                    "payload",
                    f"with this signal, op_id {spec.op_id!r} in scope {scope!r} would report "
                    f"more than max_signal_bytes_per_operation ({limit}) bytes of signal "
                    f"payloads, more than one callback may carry",
                )


def _utf8_len(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
