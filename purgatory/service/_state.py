"""The service's state machine (service layer): decoded inputs in, engine calls, outcomes out.

Every input path ends in one synchronous method here: a record consumed from Kafka, an HTTP
request, a CLI call through HTTP. So the engine changes in one place, in one order, and never
across an ``await`` (trio needs no locks for that). The clock is read once per input, through
the injected ``now_ms``, so virtual-time tests control all of it.

Every engine call returns the outcomes it decided; this module hands them, in that order, to
``deliver`` (the outbox, which sends them by acknowledgement). An operation's outcome counts as
delivered only when :meth:`ServiceState.delivered` is called, after the broker acknowledged its
callback: only then do ``wait`` callers get it. What waits for delivery cannot grow without bound:
each operation has one outcome and the engine caps pending operations (``max_pending``).

Limits that need the clock are checked here (a deadline too far ahead); the rest live in the
codec (sizes, shapes) and the engine (pending per scope and in total).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    RegistrationStatus,
    SizeLimitError,
    TimeDomain,
    UsageError,
)
from purgatory.service._logging import get_logger, logs_enabled
from purgatory.service._metrics import Metrics

__all__ = ["Input", "ServiceState", "ServiceStatistics"]

_log = get_logger()

Input = RegisterRequest | CancelRequest | SignalRecord | WatermarkRecord


@dataclass(frozen=True, slots=True)
class ServiceStatistics:
    """Counts of the state machine at one instant."""

    undelivered: int
    waiters: int
    registrations: int
    signals: int
    watermarks: int
    cancels: int


class ServiceState:
    """Applies inputs to the engine and routes its outcomes.

    Args:
        engine: the engine (new, or restored from a snapshot).
        now_ms: the clock (epoch ms).
        max_deadline_ahead_ms: how far in the future a processing-time deadline may be.
        wake: called with a new deadline, so a sleeping reaper wakes in time for it.
        wake_now: called when something may be due at once (a watermark moved).
        metrics: where registrations and signals are counted (None: nowhere).
        deliver: takes each batch of decided outcomes, in order (the outbox's ``put``).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        now_ms: Callable[[], int],
        max_deadline_ahead_ms: int,
        wake: Callable[[int], None] = lambda _deadline_ms: None,
        wake_now: Callable[[], None] = lambda: None,
        metrics: Metrics | None = None,
        deliver: Callable[[Sequence[Outcome]], None] = lambda _outcomes: None,
    ) -> None:
        self._metrics = metrics
        self._now_ms = now_ms
        self._max_ahead_ms = max_deadline_ahead_ms
        self._wake = wake
        self._wake_now = wake_now
        self._deliver = deliver
        self._undelivered: set[tuple[str, str]] = set()
        self._waiters: dict[tuple[str, str], trio.Event] = {}
        self._counts = {"registrations": 0, "signals": 0, "watermarks": 0, "cancels": 0}
        self.engine = engine

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
        except SizeLimitError:
            self._count_registration("invalid")
            raise
        except LimitError:
            self._count_registration("limited")
            raise
        self._counts["registrations"] += 1
        status = registration.status
        self._count_registration(status.value)
        if status is RegistrationStatus.COMPLETED and registration.outcome is not None:
            self._decided([registration.outcome])
        if logs_enabled("debug"):
            _log.debug(
                "operation_registered",
                op_id=spec.op_id,
                scope=spec.scope,
                status=status.value,
                deadline_ms=spec.deadline_ms,
            )
        if spec.time_domain is TimeDomain.PROCESSING_TIME:
            if (
                spec.deadline_ms <= now
                and status is RegistrationStatus.PENDING
                and self._metrics is not None
            ):
                self._metrics.registration_overdue()
            self._wake(spec.deadline_ms)
        else:
            self._wake_now()  # a deadline behind the watermark is due at the next step
        return registration

    def cancel(self, request: CancelRequest) -> Outcome | None:
        """Cancel a pending operation; None if it is not pending."""
        self._counts["cancels"] += 1
        outcome = self.engine.cancel(request.scope, request.op_id, now_ms=self._now_ms())
        if outcome is not None:
            self._decided([outcome])
        if logs_enabled("debug"):
            _log.debug(
                "operation_cancel_requested",
                op_id=request.op_id,
                scope=request.scope,
                found=outcome is not None,
            )
        return outcome

    def signal(self, record: SignalRecord) -> int:
        """Remember a signal and complete what it satisfies; returns how many completed.

        Raises:
            LimitError: the payload would make a watching operation's callback too large.
        """
        self._counts["signals"] += 1
        completed = self.engine.signal(
            record.scope,
            record.key,
            now_ms=self._now_ms(),
            event_time_ms=record.event_time_ms,
            payload=record.payload,
        )
        self._decided(completed)
        if self._metrics is not None:
            self._metrics.signals()
        if logs_enabled("debug"):
            _log.debug(
                "signal_received", scope=record.scope, key=record.key, completed=len(completed)
            )
        return len(completed)

    def watermark(self, record: WatermarkRecord) -> bool:
        """Move a scope's watermark; True if it moved forward."""
        self._counts["watermarks"] += 1
        moved = self.engine.advance_watermark(record.scope, record.watermark_ms)
        if moved:
            self._wake_now()
        if logs_enabled("debug"):
            _log.debug(
                "watermark_advanced",
                scope=record.scope,
                watermark_ms=record.watermark_ms,
                moved=moved,
            )
        return moved

    # -- the clock ----------------------------------------------------------------------------

    def advance_clock(self, now_ms: int) -> list[Outcome]:
        """Advance the engine (the reaper calls this); the expirations it decided are delivered.

        Returns:
            The ``expired`` outcomes, in order.
        """
        expired = self.engine.advance_clock(now_ms)
        self._decided(expired)
        return expired

    def next_expiration_ms(self) -> int | None:
        """When the engine has work next."""
        return self.engine.next_expiration_ms()

    def catch_up(self, now_ms: int) -> int:
        """Decide every expiration due by ``now_ms`` (at shutdown); returns how many."""
        total = 0
        while True:  # each step is bounded by max_fire_per_step
            expired = self.advance_clock(now_ms)
            if not expired:
                return total
            total += len(expired)

    # -- outcomes -----------------------------------------------------------------------------

    def _decided(self, outcomes: Sequence[Outcome]) -> None:
        if outcomes:
            for outcome in outcomes:
                self._undelivered.add((outcome.scope, outcome.op_id))
            self._deliver(outcomes)

    def delivered(self, outcome: Outcome) -> None:
        """Called once the outcome's callback is acknowledged: wake whoever waits for it."""
        ident = (outcome.scope, outcome.op_id)
        self._undelivered.discard(ident)
        event = self._waiters.pop(ident, None)
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
        ident = (scope, op_id)
        if found[1] is not None and ident not in self._undelivered:
            return found[1]  # decided and delivered
        event = self._waiters.setdefault(ident, trio.Event())
        with trio.move_on_after(timeout_ms / 1000):
            await event.wait()
        if ident in self._undelivered:
            return None
        again = self.engine.lookup(scope, op_id)
        return again[1] if again is not None else None

    def statistics(self) -> ServiceStatistics:
        """A frozen record of the state machine's counts."""
        return ServiceStatistics(
            undelivered=len(self._undelivered), waiters=len(self._waiters), **self._counts
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
