"""The dispatcher (service layer: dispatch): a decoded input in, what it decided out.

Every input path ends in one synchronous method here: a record consumed from Kafka, an HTTP
request, a CLI call through HTTP. So the engines change in one place, in one order, and never
across an ``await`` (trio needs no locks for that). The clock is read once per input, through
the injected ``now_ms``, so virtual-time tests control all of it.

Each method returns a :class:`Decision`: its result for the caller (a registration, a
cancelled outcome, how many a signal completed, whether a watermark moved), the outcomes it
decided, in order, and when the reaper must wake for what it changed. The dispatcher does no
I/O and calls nothing back: the caller (:mod:`purgatory.service.ingress.flow`) hands the
outcomes to the release and wakes the reaper.

The journal entries are the one thing an engine hands on during the call rather than in the
decision: write-ahead, an engine reports each input to its partition's journal *before* it
applies it (``Engine(journal=...)``), so that an entry too large for a changelog record, or a
partition fenced meanwhile, refuses the input before it changes anything, and so that an input
the engine then refuses (a conflict, a limit) is journaled all the same (it moved the engine's
clock, and a replay must refuse it at the same instant).

Limits that need the clock are checked here (a deadline too far ahead); the rest live in the
codec (sizes, shapes) and the engine (pending per scope and in total, in operations and in
estimated bytes; remembered signals per scope). Limits across scopes and partitions, per client
and the replica's memory budget, are :mod:`purgatory.service.dispatch.admission`'s (its
docstring says who the client of an input is); they are decided before the engine is called, so
what they refuse is never journaled.

An outcome is decided here and *delivered* only once the broker acknowledged its callback; in
between it is undelivered (:class:`~purgatory.service.dispatch.waiters.Waiters`), so a long
poll never answers ahead of the callback. What waits for delivery cannot grow without bound:
each operation has one outcome and the engine caps pending operations (``max_pending``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from purgatory._codec import CancelRequest, RegisterRequest, SignalRecord, WatermarkRecord
from purgatory._core import (
    ConflictError,
    LimitError,
    OperationSpec,
    Outcome,
    Registration,
    RegistrationStatus,
    SizeLimitError,
    TimeDomain,
)
from purgatory.service.dispatch.admission import ANONYMOUS_CLIENT
from purgatory.service.dispatch.reply_to import ReplyToPolicy
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.dispatch.waiters import Waiters
from purgatory.service.telemetry.logging import get_logger, logs_enabled
from purgatory.service.telemetry.metrics import Metrics

__all__ = ["Decision", "DispatchStatistics", "Dispatcher", "Input"]

_log = get_logger()

Input = RegisterRequest | CancelRequest | SignalRecord | WatermarkRecord
R = TypeVar("R")


@dataclass(frozen=True, slots=True)
class Decision(Generic[R]):
    """What one input (or one engine's step of the clock) decided.

    Attributes:
        result: the answer to the caller (see each method of :class:`Dispatcher`).
        outcomes: the outcomes decided, in order, all of one partition (empty: none).
        wake_ms: a deadline the reaper must wake by (None: no new one).
        wake_now: something may be due at once (a watermark moved, an event-time deadline
            behind its watermark): the reaper must look now.
    """

    result: R
    outcomes: Sequence[Outcome] = ()
    wake_ms: int | None = None
    wake_now: bool = False


@dataclass(frozen=True, slots=True)
class DispatchStatistics:
    """Counts of the dispatcher at one instant."""

    undelivered: int
    waiters: int
    registrations: int
    signals: int
    watermarks: int
    cancels: int


class Dispatcher:
    """Applies each input to the engine of its scope's partition and says what it decided.

    Args:
        table: the engines of the partitions served here.
        waiters: the outcomes decided and not yet delivered (long polls wait on them).
        now_ms: the clock (epoch ms).
        max_deadline_ahead_ms: how far in the future a processing-time deadline may be.
        metrics: where registrations and signals are counted (None: nowhere).
        reply_to: which ``reply_to`` topics a registration may name (None: any).
    """

    def __init__(
        self,
        table: PartitionTable,
        waiters: Waiters,
        *,
        now_ms: Callable[[], int],
        max_deadline_ahead_ms: int,
        metrics: Metrics | None = None,
        reply_to: ReplyToPolicy | None = None,
    ) -> None:
        self.table = table
        self.waiters = waiters
        self._now_ms = now_ms
        self._max_ahead_ms = max_deadline_ahead_ms
        self._metrics = metrics
        self._reply_to = reply_to
        self._counts = {"registrations": 0, "signals": 0, "watermarks": 0, "cancels": 0}

    def apply(
        self, item: Input, *, client: str | None = None
    ) -> Decision[Registration | Outcome | int | bool | None]:
        """Apply one decoded input; the result depends on its kind (see the typed methods).

        Args:
            client: who sent it (``kafka`` for a consumed record; None: ``anonymous``).

        Raises:
            UsageError: the input is valid as a record but not here (ConflictError, LimitError,
                a deadline too far ahead).
        """
        if isinstance(item, SignalRecord):
            return self.signal(item, client=client)  # type: ignore[return-value]
        if isinstance(item, RegisterRequest):
            return self.register(item, client=client)  # type: ignore[return-value]
        if isinstance(item, WatermarkRecord):
            return self.watermark(item)  # type: ignore[return-value]
        return self.cancel(item)  # type: ignore[return-value]

    def register(
        self, request: RegisterRequest, *, client: str | None = None, retry: bool = False
    ) -> Decision[Registration]:
        """Register an operation (idempotent; a timer re-arms).

        Args:
            request: the registration.
            client: who registers it (None: ``anonymous``); it holds the operation, against
                its quotas, until the outcome is decided.
            retry: the request is a retry of one that may have been applied (see
                :mod:`purgatory._codec._retry`): a timer it finds is not armed again.

        Returns:
            The registration; its outcome if it completed at once; its deadline to wake for.

        Raises:
            ConflictError: the id is taken by another body.
            LimitError: a pending limit (per scope, per client, the memory budget: its
                ``field`` names it), or the deadline is too far ahead.
            RecordError: ``reply_to`` names a topic the policy refuses (a journaled
                registration replayed at restore never comes here: it is not checked again).
        """
        if self._reply_to is not None:
            self._reply_to.check(request.reply_to)
        now = self._now_ms()
        spec = request.to_spec(now)
        admission = self.table.admission
        try:
            engine = self.table.engine_for_input(spec.scope)
            self._check_deadline(spec, now)
            who = ANONYMOUS_CLIENT if client is None else client
            size = admission.check_registration(engine, spec, who)
            registration = engine.register(spec, now_ms=now, retry=retry)
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
        if status is RegistrationStatus.PENDING:
            admission.registered(engine.partition, spec, size, who)
        self._count_registration(status.value)
        decided: Sequence[Outcome] = ()
        if status is RegistrationStatus.COMPLETED and registration.outcome is not None:
            decided = self._decided([registration.outcome])
        if logs_enabled("debug"):
            _log.debug(
                "operation_registered",
                op_id=spec.op_id,
                scope=spec.scope,
                status=status.value,
                deadline_ms=spec.deadline_ms,
            )
        if spec.time_domain is not TimeDomain.PROCESSING_TIME:
            # A deadline behind the watermark is due at the next step.
            return Decision(registration, decided, wake_now=True)
        overdue = spec.deadline_ms <= now and status is RegistrationStatus.PENDING
        if overdue and self._metrics is not None:
            self._metrics.registration_overdue()
        return Decision(registration, decided, wake_ms=spec.deadline_ms)

    def cancel(self, request: CancelRequest) -> Decision[Outcome | None]:
        """Cancel a pending operation; its ``cancelled`` outcome, or None if not pending."""
        engine = self.table.engine_for_input(request.scope)
        self._counts["cancels"] += 1
        outcome = engine.cancel(request.scope, request.op_id, now_ms=self._now_ms())
        if logs_enabled("debug"):
            _log.debug(
                "operation_cancel_requested",
                op_id=request.op_id,
                scope=request.scope,
                found=outcome is not None,
            )
        if outcome is None:
            return Decision(None)
        return Decision(outcome, self._decided([outcome]))

    def signal(self, record: SignalRecord, *, client: str | None = None) -> Decision[int]:
        """Remember a signal and complete what it satisfies; the result is how many completed.

        Args:
            record: the signal.
            client: who sent it (None: ``anonymous``); a signal is a fact shared by every
                operation that watches its key, so it is not charged to its client.

        Raises:
            LimitError: the payload would make a watching operation's callback too large; or
                no pending operation awaits the key and remembering it would cross a limit of
                remembered signals or the memory budget (its ``field`` names the limit).
        """
        engine = self.table.engine_for_input(record.scope)
        self.table.admission.check_signal(engine, record.scope, record.key, record.payload)
        self._counts["signals"] += 1
        completed = engine.signal(
            record.scope,
            record.key,
            now_ms=self._now_ms(),
            event_time_ms=record.event_time_ms,
            payload=record.payload,
        )
        if self._metrics is not None:
            self._metrics.signals()
        if logs_enabled("debug"):
            _log.debug(
                "signal_received",
                scope=record.scope,
                key=record.key,
                completed=len(completed),
                client=ANONYMOUS_CLIENT if client is None else client,
            )
        return Decision(len(completed), self._decided(completed))

    def watermark(self, record: WatermarkRecord) -> Decision[bool]:
        """Move a scope's watermark; the result is whether it moved forward."""
        engine = self.table.engine_for_input(record.scope)
        self._counts["watermarks"] += 1
        moved = engine.advance_watermark(record.scope, record.watermark_ms)
        if logs_enabled("debug"):
            _log.debug(
                "watermark_advanced",
                scope=record.scope,
                watermark_ms=record.watermark_ms,
                moved=moved,
            )
        return Decision(moved, wake_now=moved)

    def advance_clock(self, now_ms: int) -> list[Decision[None]]:
        """Advance every engine that has work due by ``now_ms``: one decision per engine
        advanced, with the ``expired`` outcomes it decided, in order.

        An engine with nothing due is not advanced (its journal stays quiet).
        """
        decisions: list[Decision[None]] = []
        for engine in self.table.engines():
            due = engine.next_expiration_ms()
            if due is not None and due <= now_ms:
                decided = self._decided(engine.advance_clock(now_ms))
                if decided:
                    decisions.append(Decision(None, decided))
        return decisions

    def next_expiration_ms(self) -> int | None:
        """When an engine has work next."""
        due = [d for e in self.table.engines() if (d := e.next_expiration_ms()) is not None]
        return min(due) if due else None

    def resent(self, outcomes: Sequence[Outcome]) -> None:
        """Outcomes a restore found journaled and maybe never delivered: undelivered again
        until their callbacks are acknowledged."""
        self.waiters.decided((o.scope, o.op_id) for o in outcomes)

    def statistics(self) -> DispatchStatistics:
        """A frozen record of the inputs applied, and of the outcomes awaited."""
        undelivered, waiting = self.waiters.counts()
        return DispatchStatistics(undelivered=undelivered, waiters=waiting, **self._counts)

    def _decided(self, outcomes: Sequence[Outcome]) -> Sequence[Outcome]:
        if outcomes:
            self.table.admission.finished(outcomes)
            self.waiters.decided((o.scope, o.op_id) for o in outcomes)
        return outcomes

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
