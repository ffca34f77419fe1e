"""The service's state machine (service layer): decoded inputs in, engine calls, outcomes out.

Every input path ends in one synchronous method here: a record consumed from Kafka, an HTTP
request, a CLI call through HTTP. So the engine changes in one place, in one order, and never
across an ``await`` (trio needs no locks for that). The clock is read once per input, through
the injected ``now_ms``, so virtual-time tests control all of it.

Outcomes leave the engine through :meth:`ServiceState.emit` into a small outbox; the shell's
outbox pump hands them to the completion executor, which delivers each one (callback record to
Kafka, HTTP waiters, metrics, a log line) in order, one at a time. The outbox cannot grow without
bound: each operation has one outcome and the engine caps pending operations (``max_pending``).

Limits that need the clock are checked here (a deadline too far ahead); the rest live in the
codec (sizes, shapes) and the engine (pending per scope and in total).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import trio

from purgatory._codec import CancelRequest, RegisterRequest, SignalRecord, WatermarkRecord
from purgatory._core import (
    ConflictError,
    Engine,
    LimitError,
    OperationSpec,
    Outcome,
    Registration,
    TimeDomain,
    UsageError,
)
from purgatory.service._logging import get_logger
from purgatory.service._metrics import Metrics

__all__ = ["Input", "ServiceState", "ServiceStatistics"]

_log = get_logger()

Input = RegisterRequest | CancelRequest | SignalRecord | WatermarkRecord


@dataclass(frozen=True, slots=True)
class ServiceStatistics:
    """Counts of the state machine at one instant."""

    outbox: int
    waiters: int
    registrations: int
    signals: int
    watermarks: int
    cancels: int


class ServiceState:
    """Applies inputs to the engine and routes its outcomes.

    Args:
        make_engine: builds the engine (new, or restored from a snapshot) given the ``emit``
            it must send outcomes to.
        now_ms: the clock (epoch ms).
        max_deadline_ahead_ms: how far in the future a processing-time deadline may be.
        wake: called with a new deadline, so a sleeping reaper wakes in time for it.
        wake_now: called when something may be due at once (a watermark moved).
        metrics: where registrations and signals are counted (None: nowhere).
    """

    def __init__(
        self,
        make_engine: Callable[[Callable[[Outcome], None]], Engine],
        *,
        now_ms: Callable[[], int],
        max_deadline_ahead_ms: int,
        wake: Callable[[int], None] = lambda _deadline_ms: None,
        wake_now: Callable[[], None] = lambda: None,
        metrics: Metrics | None = None,
    ) -> None:
        self._metrics = metrics
        self._now_ms = now_ms
        self._max_ahead_ms = max_deadline_ahead_ms
        self._wake = wake
        self._wake_now = wake_now
        self._outbox: deque[Outcome] = deque()
        self._outbox_ready = trio.Event()
        self._waiters: dict[tuple[str, str], trio.Event] = {}
        self._counts = {"registrations": 0, "signals": 0, "watermarks": 0, "cancels": 0}
        self.engine = make_engine(self.emit)

    # -- inputs -------------------------------------------------------------------------------

    def apply(self, item: Input) -> Registration | Outcome | int | bool | None:
        """Apply one decoded input; the result depends on its kind (see the typed methods).

        Raises:
            UsageError: the input is valid as a record but not here (ConflictError, LimitError,
                a deadline too far ahead).
        """
        if isinstance(item, SignalRecord):
            return self.signal(item)
        if isinstance(item, RegisterRequest):
            return self.register(item)
        if isinstance(item, WatermarkRecord):
            return self.watermark(item)
        return self.cancel(item)

    def register(self, request: RegisterRequest) -> Registration:
        """Register an operation (idempotent; a timer re-arms).

        Raises:
            ConflictError: the id is taken by another body.
            LimitError: a pending limit, or the deadline is too far ahead.
        """
        now = self._now_ms()
        spec = request.to_spec(now)
        try:
            self._check_deadline(spec, now)
            registration = self.engine.register(spec, now_ms=now)
        except ConflictError:
            self._count_registration("conflict")
            raise
        except LimitError:
            self._count_registration("limited")
            raise
        self._counts["registrations"] += 1
        self._count_registration(registration.status.value)
        _log.debug(
            "operation_registered",
            op_id=spec.op_id,
            scope=spec.scope,
            status=registration.status.value,
            deadline_ms=spec.deadline_ms,
        )
        if spec.time_domain is TimeDomain.PROCESSING_TIME:
            self._wake(spec.deadline_ms)
        else:
            self._wake_now()  # a deadline behind the watermark is due at the next step
        return registration

    def cancel(self, request: CancelRequest) -> Outcome | None:
        """Cancel a pending operation; None if it is not pending."""
        self._counts["cancels"] += 1
        outcome = self.engine.cancel(request.scope, request.op_id, now_ms=self._now_ms())
        _log.debug(
            "operation_cancel_requested",
            op_id=request.op_id,
            scope=request.scope,
            found=outcome is not None,
        )
        return outcome

    def signal(self, record: SignalRecord) -> int:
        """Remember a signal and complete what it satisfies; returns how many completed."""
        self._counts["signals"] += 1
        completed = self.engine.signal(
            record.scope,
            record.key,
            now_ms=self._now_ms(),
            event_time_ms=record.event_time_ms,
            payload=record.payload,
        )
        if self._metrics is not None:
            self._metrics.signals()
        _log.debug("signal_received", scope=record.scope, key=record.key, completed=completed)
        return completed

    def watermark(self, record: WatermarkRecord) -> bool:
        """Move a scope's watermark; True if it moved forward."""
        self._counts["watermarks"] += 1
        moved = self.engine.advance_watermark(record.scope, record.watermark_ms)
        if moved:
            self._wake_now()
        _log.debug(
            "watermark_advanced", scope=record.scope, watermark_ms=record.watermark_ms, moved=moved
        )
        return moved

    # -- outcomes -----------------------------------------------------------------------------

    def emit(self, outcome: Outcome) -> None:
        """The engine's outcome sink: queue it for delivery through the executor."""
        self._outbox.append(outcome)
        self._outbox_ready.set()

    async def next_outcomes(self) -> list[Outcome]:
        """Wait until outcomes are queued, then take them all (for the outbox pump)."""
        while not self._outbox:
            await self._outbox_ready.wait()
            self._outbox_ready = trio.Event()
        return self.take_outcomes()

    def take_outcomes(self) -> list[Outcome]:
        """Take every queued outcome now (possibly none)."""
        taken = list(self._outbox)
        self._outbox.clear()
        return taken

    def delivered(self, outcome: Outcome) -> None:
        """Called by the delivery step: wake whoever waits for this operation."""
        event = self._waiters.pop((outcome.scope, outcome.op_id), None)
        if event is not None:
            event.set()

    async def wait(self, scope: str, op_id: str, timeout_ms: int) -> Outcome | None:
        """Wait up to ``timeout_ms`` for an operation's outcome to be delivered (long poll).

        Returns:
            The outcome, or None if it is still pending when the time is up.

        Raises:
            UsageError: the operation is unknown.
        """
        found = self.engine.lookup(scope, op_id)
        if found is None:
            raise UsageError(f"op_id {op_id!r} is not known in scope {scope!r}")
        if found[1] is not None:
            return found[1]  # decided (delivery may still be on its way)
        event = self._waiters.setdefault((scope, op_id), trio.Event())
        with trio.move_on_after(timeout_ms / 1000):
            await event.wait()
        again = self.engine.lookup(scope, op_id)
        return again[1] if again is not None else None

    def statistics(self) -> ServiceStatistics:
        """A frozen record of the state machine's counts."""
        return ServiceStatistics(
            outbox=len(self._outbox), waiters=len(self._waiters), **self._counts
        )

    def _count_registration(self, result: str) -> None:
        if self._metrics is not None:
            self._metrics.registration(result)

    def _check_deadline(self, spec: OperationSpec, now: int) -> None:
        if (
            spec.time_domain is TimeDomain.PROCESSING_TIME
            and spec.deadline_ms - now > self._max_ahead_ms
        ):
            raise LimitError(
                f"deadline_ms: more than max_deadline_ahead_ms ({self._max_ahead_ms} ms) ahead"
            )
