"""The engine's limits (core concept: refusing what would be too much; sans-IO, stdlib only).

:class:`Budget`, a part of the :class:`~purgatory._core.engine.engine.Engine`, refuses the input
that would cross a limit, with a :class:`LimitError` whose ``field`` names it, before the input
changes anything: ``max_pending``, ``max_pending_per_scope``, ``max_pending_bytes_per_scope``,
``max_remembered_signals_per_scope``, ``max_remembered_bytes_per_scope`` and
``max_signal_bytes_per_operation``. What is held, in operations and in estimated bytes, is
counted by the :class:`~purgatory._core.engine.state.Tally` (with
:mod:`purgatory._core.engine.footprint`'s formulas); the budget reads it, with the pending
operations, the remembered signals and the purgatory's watch lists, from the engine's shared
state given at construction, and is told the time by each check. It answers the admission
control of the service too: what an operation or a signal would add, and whether a signal is
awaited.

A part rather than a base class of the engine: its reads are named in its constructor, it
changes nothing but expired signals (cleaned up before a refusal, so that a restored engine
decides the same), and each check is one call from the engine's hot paths; a limit left at its
default (no limit) costs no estimate at all.
"""

from __future__ import annotations

from purgatory._core._errors import LimitError, SizeLimitError
from purgatory._core.engine.engine_types import _NO_LIMIT, EngineConfig, _Op
from purgatory._core.engine.footprint import operation_bytes, signal_bytes, utf8_len
from purgatory._core.engine.model import OperationSpec, SignalFact
from purgatory._core.engine.state import EngineState

__all__ = ["Budget"]


class Budget:
    """The engine's limits, in counts and in estimated bytes.

    Args:
        config: the limits.
        state: the engine's shared state; read here: the tally, the pending operations, the
            remembered signals (expired ones are cleaned up before a refusal) and the
            purgatory's watch lists.
    """

    def __init__(self, config: EngineConfig, state: EngineState) -> None:
        self._config = config
        self._tally = state.tally
        self._ops = state.ops
        self._signals = state.signals
        self._purgatory = state.purgatory
        self._pending_bytes_limited = config.max_pending_bytes_per_scope < _NO_LIMIT
        self._remembered_limited = (
            config.max_remembered_signals_per_scope < _NO_LIMIT
            or config.max_remembered_bytes_per_scope < _NO_LIMIT
        )

    # -- answers (the admission control of the service asks them ahead of an input) -----------

    def operation_bytes(self, spec: OperationSpec) -> int:
        """The estimated bytes ``spec`` would hold while pending."""
        return operation_bytes(spec)

    def signal_growth_bytes(self, scope: str, key: str, payload: str | None) -> int:
        """The estimated bytes remembering this signal would add (negative: it would free
        some, replacing a larger payload); no side effect."""
        return self._remembered_growth((scope, key), SignalFact(0, None, payload))[1]

    def awaits(self, scope: str, key: str) -> bool:
        """Whether a pending operation watches ``key`` in ``scope``: a signal of it is needed
        now, not only kept for later, so the remembered-signal limits do not refuse it."""
        watchers = self._purgatory.watchers_of((scope, key))
        return any(not op.is_done for op in watchers)  # finished ones linger until a purge

    # -- checks: each raises before anything changes ---------------------------------------------

    def check_registration(self, spec: OperationSpec, now_ms: int) -> None:
        """Refuse ``spec`` if holding it would cross a pending limit (in operations or in
        bytes), or if its keys' signals already carry more payload than one callback may.

        Raises:
            LimitError: naming the limit in its ``field``.
        """
        config, scope = self._config, spec.scope
        if len(self._ops) >= config.max_pending:
            raise LimitError(
                f"max_pending ({config.max_pending}) operations are pending", field="max_pending"
            )
        if self._tally.pending_by_scope.get(scope, 0) >= config.max_pending_per_scope:
            limit = config.max_pending_per_scope
            raise LimitError(
                f"max_pending_per_scope ({limit}) reached in scope {scope!r}",
                field="max_pending_per_scope",
            )
        if self._pending_bytes_limited:  # else spare the hot path the estimate
            self._check_pending_bytes(spec)
        limit = config.max_signal_bytes_per_operation
        if spec.keys and self._signal_bytes(scope, spec.keys, None, now_ms) > limit:
            raise SizeLimitError(
                "keys",
                f"the signals already received for these keys carry more than "
                f"max_signal_bytes_per_operation ({limit}) bytes of payload, more than one "
                f"callback may report",
            )

    def check_signal(self, ident: tuple[str, str], fact: SignalFact, now_ms: int) -> None:
        """Refuse the signal ``fact`` of ``ident`` if its payload would make an operation
        watching it report too much, or if remembering it would cross a remembered-signal limit
        while no pending operation awaits it.

        Raises:
            LimitError: naming the limit in its ``field``.
        """
        if fact.payload is not None:
            self._check_payload(ident, utf8_len(fact.payload), now_ms)
        if self._remembered_limited:  # else spare the hot path the estimate
            self._check_remembered(ident, fact, now_ms)

    # -- internals -------------------------------------------------------------------------------

    def _check_pending_bytes(self, spec: OperationSpec) -> None:
        limit = self._config.max_pending_bytes_per_scope
        size = operation_bytes(spec)
        held = self._tally.pending_bytes_by_scope.get(spec.scope, 0)
        if held + size > limit:
            raise LimitError(
                f"max_pending_bytes_per_scope ({limit}) would be exceeded in scope "
                f"{spec.scope!r}: its pending operations hold about {held} bytes, this one "
                f"{size}",
                field="max_pending_bytes_per_scope",
            )

    def _remembered_growth(
        self, ident: tuple[str, str], fact: SignalFact, now_ms: int | None = None
    ) -> tuple[int, int]:
        """What remembering ``fact`` under ``ident`` adds: (signals, bytes) to its scope; with
        ``now_ms``, a stored signal expired then counts as gone (a new one replaces it)."""
        scope, key = ident
        if now_ms is None:
            old = self._signals.peek(ident)
        else:
            old = self._signals.peek_live(ident, now_ms=now_ms)
        if old is None:
            return 1, signal_bytes(scope, key, fact)
        return 0, signal_bytes(scope, key, fact) - signal_bytes(scope, key, old)

    def _remembered_over(self, ident: tuple[str, str], fact: SignalFact, now_ms: int) -> str | None:
        """The remembered-signal limit that remembering ``fact`` at ``now_ms`` would cross, if
        any. What is held may count signals expired but not yet cleaned up (an overestimate);
        the growth never does: a re-signal of an expired key adds a whole signal, not the
        difference of two payloads, however the cleanup goes."""
        config = self._config
        count, size = self._remembered_growth(ident, fact, now_ms)
        held_count, held_bytes = self._tally.remembered_by_scope.get(ident[0], (0, 0))
        if count > 0 and held_count + count > config.max_remembered_signals_per_scope:
            return "max_remembered_signals_per_scope"
        if size > 0 and held_bytes + size > config.max_remembered_bytes_per_scope:
            return "max_remembered_bytes_per_scope"
        return None

    def _check_remembered(self, ident: tuple[str, str], fact: SignalFact, now_ms: int) -> None:
        if self._remembered_over(ident, fact, now_ms) is None or self.awaits(*ident):
            return
        # What is stored may include signals expired but not yet cleaned up, which a snapshot
        # does not hold: count only the live ones, so a restored engine decides the same.
        self._signals.remove_expired(now_ms)
        over = self._remembered_over(ident, fact, now_ms)
        if over is None:
            return
        scope = ident[0]
        count, size = self._tally.remembered_by_scope.get(scope, (0, 0))
        limit = getattr(self._config, over)
        raise LimitError(
            f"{over} ({limit}) would be exceeded in scope {scope!r}: it remembers {count} "
            f"signals of about {size} bytes, and no pending operation awaits key {ident[1]!r}",
            field=over,
        )

    def _signal_bytes(
        self, scope: str, keys: tuple[str, ...], skip: str | None, now_ms: int
    ) -> int:
        total = 0
        get = self._signals.get
        for key in keys:
            if key != skip:
                fact = get((scope, key), now_ms=now_ms)
                if fact is not None and fact.payload is not None:
                    total += utf8_len(fact.payload)
        return total

    def _check_payload(self, ident: tuple[str, str], size: int, now_ms: int) -> None:
        limit = self._config.max_signal_bytes_per_operation
        if size > limit:
            raise SizeLimitError(
                "payload", f"{size} bytes, over max_signal_bytes_per_operation ({limit})"
            )
        watchers = self._purgatory.watchers_of(ident)
        if not watchers:
            return
        scope, key = ident
        for op in watchers:
            if op.is_done or not isinstance(op, _Op):  # a cancelled one lingers too
                continue
            keys = op.keys
            if len(keys) > 1 and (self._signal_bytes(scope, keys, key, now_ms) + size > limit):
                raise SizeLimitError(
                    "payload",
                    f"with this signal, op_id {op.op_id!r} in scope {scope!r} would report "
                    f"more than max_signal_bytes_per_operation ({limit}) bytes of signal "
                    f"payloads, more than one callback may carry",
                )
