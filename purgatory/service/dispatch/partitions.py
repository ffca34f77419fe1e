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
codec (sizes, shapes) and the engine (pending per scope and in total, in operations and in
estimated bytes; remembered signals per scope). Limits across scopes and partitions, per client
and the replica's memory budget, are :mod:`purgatory.service.dispatch.admission`' (its docstring
says who
the client of an input is, and what happens to restored operations and refused Kafka records);
they are decided before the engine is called, so what they refuse is never journaled.

One engine per input partition: a scope's partition is Kafka's murmur2 of it
(:func:`~purgatory.service.ownership.partitioning.partition_for`), so its operations, signals and
watermarks, and the partition's outcome sequence, live in one engine that is restored and moved
as a unit. A partition this replica does not serve, or is still restoring, refuses the input
with :class:`NotServingError` (HTTP 503 with Retry-After). With a journal (``journal_for``), every
input is journaled before it is applied and ``deliver`` is the journal's gate: the outcomes reach
the outbox only once the entries that decided them are acknowledged.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from purgatory._codec import CancelRequest, RegisterRequest, SignalRecord, WatermarkRecord
from purgatory._core import (
    ConflictError,
    Engine,
    EngineConfig,
    EngineStatistics,
    JournalEntry,
    LimitError,
    OperationSpec,
    Outcome,
    Registration,
    RegistrationStatus,
    SizeLimitError,
    TimeDomain,
    UsageError,
)
from purgatory.service.dispatch.admission import ANONYMOUS_CLIENT, Admission
from purgatory.service.dispatch.reply_to import ReplyToPolicy
from purgatory.service.dispatch.waiters import Waiters
from purgatory.service.errors import NotServingError
from purgatory.service.ownership.life import LifeTable, PartitionState
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.telemetry.logging import get_logger, logs_enabled
from purgatory.service.telemetry.metrics import Metrics

__all__ = ["Input", "NotServingError", "ServiceState", "ServiceStatistics"]

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
        config: the configuration of every partition's engine.
        partitions: how many partitions the input topics have.
        now_ms: the clock (epoch ms).
        max_deadline_ahead_ms: how far in the future a processing-time deadline may be.
        wake: called with a new deadline, so a sleeping reaper wakes in time for it.
        wake_now: called when something may be due at once (a watermark moved).
        metrics: where registrations and signals are counted (None: nowhere).
        deliver: takes each batch of decided outcomes, in order (the outbox's ``put``, or the
            journal's gate in front of it).
        journal_for: the journal of a partition's engine (None: nothing is journaled).
        resend: takes outcomes already journaled, to send again after a restore (the outbox's
            ``put``; ``deliver`` by default).
        reply_to: which ``reply_to`` topics a registration may name (None: any).
        max_pending_per_client: operations one client may hold pending, across scopes and
            partitions (0: no limit; see :mod:`purgatory.service.dispatch.admission`).
        max_pending_bytes_per_client: estimated bytes of them (0: no limit).
        max_memory_bytes: the replica's memory budget in estimated bytes, base included (0:
            none); registrations and signals nobody awaits are refused beyond it.
        life: the partitions' lives (read only: a partition held and not serving answers
            503 as restoring).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        partitions: int,
        now_ms: Callable[[], int],
        max_deadline_ahead_ms: int,
        wake: Callable[[int], None] = lambda _deadline_ms: None,
        wake_now: Callable[[], None] = lambda: None,
        metrics: Metrics | None = None,
        deliver: Callable[[Sequence[Outcome]], None] = lambda _outcomes: None,
        journal_for: Callable[[int], Callable[[JournalEntry], None]] | None = None,
        resend: Callable[[Sequence[Outcome]], None] | None = None,
        reply_to: ReplyToPolicy | None = None,
        max_pending_per_client: int = 0,
        max_pending_bytes_per_client: int = 0,
        max_memory_bytes: int = 0,
        life: LifeTable | None = None,
    ) -> None:
        if partitions < 1:
            raise UsageError(f"partitions must be >= 1, got {partitions}")
        self.config = config
        self.partitions = partitions
        self._journal_for = journal_for
        self._engines: dict[int, Engine] = {}
        self._life = life
        self._acked: dict[int, int] = {}  # partition -> highest acknowledged outcome sequence
        self._positions: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset
        self._epochs: dict[tuple[str, int], int] = {}  # (topic, partition) -> least epoch
        self._metrics = metrics
        self._now_ms = now_ms
        self._max_ahead_ms = max_deadline_ahead_ms
        self._wake = wake
        self._wake_now = wake_now
        self._deliver = deliver
        self._resend = resend if resend is not None else deliver
        self._reply_to = reply_to
        self.waiters = Waiters()
        self._counts = {"registrations": 0, "signals": 0, "watermarks": 0, "cancels": 0}
        self.inputs_stopped: str | None = None  # why no input is taken (None: they are)
        self.admission = Admission(
            self._engines.values,
            max_pending_per_client=max_pending_per_client,
            max_pending_bytes_per_client=max_pending_bytes_per_client,
            max_memory_bytes=max_memory_bytes,
        )

    # -- partitions ---------------------------------------------------------------------------

    def partition_of(self, scope: str) -> int:
        """The input partition of ``scope``."""
        return partition_for(scope, self.partitions)

    def new_engine(self, partition: int, *, start_ms: int) -> Engine:
        """A new, empty engine for ``partition``, journaled if the state has a journal."""
        return Engine(
            self.config, start_ms=start_ms, partition=partition, journal=self.journal(partition)
        )

    def journal(self, partition: int) -> Callable[[JournalEntry], None] | None:
        """The journal of ``partition``'s engine (None: not journaled)."""
        return None if self._journal_for is None else self._journal_for(partition)

    def serve(
        self,
        partition: int,
        engine: Engine,
        *,
        acked: int = 0,
        positions: Mapping[str, int] | None = None,
        epochs: Mapping[str, int] | None = None,
    ) -> None:
        """Serve ``partition`` with ``engine`` (new, or restored).

        Args:
            acked: the highest outcome sequence known to be delivered.
            positions: per input topic, the next offset to apply (the journal's); records
                before it were applied already and are skipped.
            epochs: per input topic, the least record ``epoch`` to apply: records fetched
                before the source's seek to ``positions`` carry a lower one and are skipped
                (they may lie past records the seek reads again).
        """
        for topic, offset in (positions or {}).items():
            self._positions[(topic, partition)] = offset
        for topic, epoch in (epochs or {}).items():
            self._epochs[(topic, partition)] = epoch
        self._engines[partition] = engine
        self._acked[partition] = acked
        self.admission.served(partition, engine)
        self._wake_now()

    def drop(self, partition: int, *, keep_acked: bool = False) -> None:
        """Stop serving ``partition`` (it was revoked); its engine is forgotten.

        Args:
            keep_acked: go on following its delivered outcomes (while it is handed over) until
                :meth:`forget_acked`.
        """
        self._engines.pop(partition, None)
        self.admission.dropped(partition)
        if not keep_acked:
            self._acked.pop(partition, None)
        for tp in [tp for tp in self._positions if tp[1] == partition]:
            del self._positions[tp]
        for tp in [tp for tp in self._epochs if tp[1] == partition]:
            del self._epochs[tp]

    def forget_acked(self, partition: int) -> None:
        """Stop following ``partition``'s delivered outcomes (unless it is served again)."""
        if partition not in self._engines:
            self._acked.pop(partition, None)

    def expects(self, topic: str, partition: int, offset: int, epoch: int = 0) -> bool:
        """Whether a consumed record is to be applied: its partition is served here, the
        record is not before the position reached (not applied already), and it was fetched
        after the source's latest seek of the partition (``epoch``)."""
        tp = (topic, partition)
        return (
            partition in self._engines
            and offset >= self._positions.get(tp, 0)
            and epoch >= self._epochs.get(tp, 0)
        )

    def reached(self, topic: str, partition: int, offset: int) -> None:
        """The intake applied ``topic``'s records of ``partition`` up to ``offset`` (next)."""
        self._positions[(topic, partition)] = offset

    def serving(self) -> frozenset[int]:
        """The partitions served now."""
        return frozenset(self._engines)

    def restoring_now(self) -> frozenset[int]:
        """The partitions held here and not serving yet (restoring, or waiting to)."""
        if self._life is None:
            return frozenset()
        return self._life.in_state(
            PartitionState.TAKEN, PartitionState.RESTORING, PartitionState.FENCED
        )

    def engine_of(self, scope: str) -> Engine:
        """The engine of ``scope``'s partition.

        Raises:
            NotServingError: the partition is not served here (or not yet).
        """
        partition = partition_for(scope, self.partitions)
        engine = self._engines.get(partition)
        if engine is None:
            raise NotServingError(partition, restoring=partition in self.restoring_now())
        return engine

    def stop_inputs(self, why: str) -> None:
        """Take no input any more (the topics' partition counts changed while running, see
        :mod:`purgatory.service.ownership.layout`): every write raises :class:`NotServingError`
        saying
        ``why``, and the intake applies nothing; reads, expirations and deliveries go on."""
        self.inputs_stopped = why

    def check_inputs(self, partition: int) -> None:
        """Raise :class:`NotServingError` if inputs are stopped (``partition``: the scope's)."""
        if self.inputs_stopped is not None:
            raise NotServingError(partition, restoring=False, stopped=self.inputs_stopped)

    def _engine_for_input(self, scope: str) -> Engine:
        """The engine of ``scope``'s partition, to apply an input to.

        Raises:
            NotServingError: the partition is not served here, or inputs are stopped.
        """
        engine = self.engine_of(scope)
        self.check_inputs(engine.partition)
        return engine

    def engines(self) -> Iterator[Engine]:
        """The engines of the partitions served now."""
        return iter(list(self._engines.values()))

    def acked(self, partition: int) -> int:
        """The highest outcome sequence of ``partition`` whose callback was acknowledged."""
        return self._acked.get(partition, 0)

    def lookup(self, scope: str, op_id: str) -> tuple[OperationSpec, Outcome | None] | None:
        """An operation's spec and outcome (None: unknown)."""
        return self.engine_of(scope).lookup(scope, op_id)

    def pending(self, scope: str) -> list[OperationSpec]:
        """The pending operations of ``scope``."""
        return self.engine_of(scope).pending(scope)

    def pending_page(self, scope: str, *, after: str | None, limit: int) -> list[OperationSpec]:
        """Up to ``limit`` pending operations of ``scope`` in ``op_id`` order, after the op_id
        ``after`` (None: from the first); O(log n + limit), see :meth:`Engine.pending_page`."""
        return self.engine_of(scope).pending_page(scope, after, limit)

    def engine_statistics(self) -> EngineStatistics:
        """The engines' counts, summed (the clock: the latest of them)."""
        stats = [engine.statistics() for engine in self._engines.values()]
        if not stats:
            return Engine(self.config).statistics()
        summed = {
            name: sum(getattr(s, name) for s in stats)
            for name in EngineStatistics.__dataclass_fields__
        }
        summed["clock_ms"] = max(s.clock_ms for s in stats)
        summed["sequence"] = max(s.sequence for s in stats)
        summed["timer_levels"] = max(s.timer_levels for s in stats)
        return EngineStatistics(**summed)

    # -- inputs -------------------------------------------------------------------------------

    def apply(
        self, item: Input, *, client: str | None = None
    ) -> Registration | Outcome | int | bool | None:
        """Apply one decoded input; the result depends on its kind (see the typed methods).

        Args:
            client: who sent it (``kafka`` for a consumed record; None: ``anonymous``).

        Raises:
            UsageError: the input is valid as a record but not here (ConflictError, LimitError,
                a deadline too far ahead).
        """
        if isinstance(item, SignalRecord):
            return self.signal(item, client=client)
        if isinstance(item, RegisterRequest):
            return self.register(item, client=client)
        if isinstance(item, WatermarkRecord):
            return self.watermark(item)
        return self.cancel(item)

    def register(
        self, request: RegisterRequest, *, client: str | None = None, retry: bool = False
    ) -> Registration:
        """Register an operation (idempotent; a timer re-arms).

        Args:
            request: the registration.
            client: who registers it (None: ``anonymous``); it holds the operation, against
                its quotas, until the outcome is decided.
            retry: the request is a retry of one that may have been applied (see
                :mod:`purgatory._codec._retry`): a timer it finds is not armed again.

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
        try:
            engine = self._engine_for_input(spec.scope)
            self._check_deadline(spec, now)
            who = ANONYMOUS_CLIENT if client is None else client
            size = self.admission.check_registration(engine, spec, who)
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
            self.admission.registered(engine.partition, spec, size, who)
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
        self._wake_for(spec, status, now)
        return registration

    def _wake_for(self, spec: OperationSpec, status: RegistrationStatus, now: int) -> None:
        """Wake the reaper for a registration's deadline (counted if already overdue)."""
        if spec.time_domain is not TimeDomain.PROCESSING_TIME:
            self._wake_now()  # a deadline behind the watermark is due at the next step
            return
        overdue = spec.deadline_ms <= now and status is RegistrationStatus.PENDING
        if overdue and self._metrics is not None:
            self._metrics.registration_overdue()
        self._wake(spec.deadline_ms)

    def cancel(self, request: CancelRequest) -> Outcome | None:
        """Cancel a pending operation; None if it is not pending."""
        engine = self._engine_for_input(request.scope)
        self._counts["cancels"] += 1
        outcome = engine.cancel(request.scope, request.op_id, now_ms=self._now_ms())
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

    def signal(self, record: SignalRecord, *, client: str | None = None) -> int:
        """Remember a signal and complete what it satisfies; returns how many completed.

        Args:
            record: the signal.
            client: who sent it (None: ``anonymous``); a signal is a fact shared by every
                operation that watches its key, so it is not charged to its client.

        Raises:
            LimitError: the payload would make a watching operation's callback too large; or
                no pending operation awaits the key and remembering it would cross a limit of
                remembered signals or the memory budget (its ``field`` names the limit).
        """
        engine = self._engine_for_input(record.scope)
        self.admission.check_signal(engine, record.scope, record.key, record.payload)
        self._counts["signals"] += 1
        completed = engine.signal(
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
                "signal_received",
                scope=record.scope,
                key=record.key,
                completed=len(completed),
                client=ANONYMOUS_CLIENT if client is None else client,
            )
        return len(completed)

    def watermark(self, record: WatermarkRecord) -> bool:
        """Move a scope's watermark; True if it moved forward."""
        engine = self._engine_for_input(record.scope)
        self._counts["watermarks"] += 1
        moved = engine.advance_watermark(record.scope, record.watermark_ms)
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
        """Advance every engine that has work due (the reaper calls this); the expirations
        they decided are delivered.

        An engine with nothing due is not advanced (its journal stays quiet).

        Returns:
            The ``expired`` outcomes, in order.
        """
        expired: list[Outcome] = []
        for engine in self.engines():
            due = engine.next_expiration_ms()
            if due is not None and due <= now_ms:
                decided = engine.advance_clock(now_ms)
                self._decided(decided)
                expired += decided
        return expired

    def next_expiration_ms(self) -> int | None:
        """When an engine has work next."""
        due = [d for e in self._engines.values() if (d := e.next_expiration_ms()) is not None]
        return min(due) if due else None

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
            self.admission.finished(outcomes)
            self.waiters.decided((o.scope, o.op_id) for o in outcomes)
            self._deliver(outcomes)

    def redeliver(self, outcomes: Sequence[Outcome]) -> None:
        """Send again outcomes a restore found journaled but maybe never delivered (they are
        already durable, so they go straight to the outbox's order)."""
        self.waiters.decided((o.scope, o.op_id) for o in outcomes)
        if outcomes:
            self._resend(outcomes)

    def delivered(self, outcome: Outcome) -> None:
        """Called once the outcome's callback is acknowledged: wake whoever waits for it."""
        acked = self._acked.get(outcome.partition)
        if acked is not None and outcome.sequence > acked:  # a served partition's, in order
            self._acked[outcome.partition] = outcome.sequence
        self.waiters.delivered((outcome.scope, outcome.op_id))

    async def wait(self, scope: str, op_id: str, timeout_ms: int) -> Outcome | None:
        """Wait up to ``timeout_ms`` for an operation's outcome to be delivered (long poll).

        Returns:
            The outcome, or None if it is still pending when the time is up.

        Raises:
            UsageError: the operation is unknown.
        """
        found = self.lookup(scope, op_id)
        if found is None:
            raise UsageError(f"op_id {op_id!r} is not known in scope {scope!r}")
        ident = (scope, op_id)
        if found[1] is not None and not self.waiters.undelivered(ident):
            return found[1]  # decided and delivered
        await self.waiters.wait(ident, timeout_ms / 1000)
        if self.waiters.undelivered(ident):
            return None
        try:
            again = self.lookup(scope, op_id)
        except NotServingError:
            return None
        return again[1] if again is not None else None

    def statistics(self) -> ServiceStatistics:
        """A frozen record of the partitions' counts."""
        undelivered, waiting = self.waiters.counts()
        return ServiceStatistics(undelivered=undelivered, waiters=waiting, **self._counts)

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
