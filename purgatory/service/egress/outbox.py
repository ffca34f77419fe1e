"""The outbox (service layer): outcomes out to the broker by acknowledgement, offsets after them.

Theory of operation
-------------------
Everything the service must write goes through one ordered queue: the callback of each decided
outcome, the dead letter of each refused input record, and, after the records of each consumed
batch, a *commit marker* with the offsets that batch reached. Puts are synchronous (the state
machine and the intake call them with no ``await`` in between), so the queue's order is the order
in which things were decided.

Three tasks drain it:

1. the *sender* takes what is queued (up to ``chunk`` entries) and submits one work per chunk to
   the :class:`~reaper.CompletionExecutor`, the single lane where callbacks run in order; the work
   encodes the chunk, hands its records to the sink in one hop and passes the sink's
   :class:`Delivery` to
2. the *acknowledger*, which awaits deliveries strictly in order. A record the broker
   acknowledged is *delivered*: only now are the metrics counted, the ``op wait`` waiters woken
   and the log line written. A refused record is settled alone, never affecting another: retried
   with backoff while retrying can help (forever for the configured topics, for at most
   ``reply_to_timeout_ms`` for a client's ``reply_to`` topic), otherwise dead-lettered with the
   reason. A dead letter always fits ``max_record_bytes`` (it keeps only prefixes of what it
   wraps, with their sizes and hashes); one a broker with a lower limit refuses as too large is
   sent again without the prefixes (the "no-value fallback"). A commit marker reached by
   the acknowledger therefore has every record before it acknowledged, and goes to
3. the *committer*, which commits the latest offsets per partition, at most once per
   ``commit_interval_ms`` and coalescing every marker that arrived meanwhile: commits never block
   the intake or any callback, and their cost does not grow with the number of small batches a
   low rate makes (a crash redelivers at most that interval's inputs, whose callbacks were
   already sent: duplicates, never losses). Shutdown commits at once.

So an input offset is committed only after every outcome and dead letter it caused is
acknowledged by the broker: a crash at any point loses nothing acknowledged, and at worst makes
the broker redeliver inputs whose outcomes were already sent (at-least-once).

Shutdown: :meth:`Outbox.close` refuses further puts; :meth:`Outbox.run` drains the queue, every
delivery and the last commit, then returns. The caller bounds that with a deadline: what is not
acknowledged by then is reported by :meth:`Outbox.statistics` (``queued + in_flight``).

Worked example: a batch of two signals completes operation A and holds a malformed record R.
The queue is ``[callback(A), dead_letter(R), commit({signals/0: 12})]``. The sender hands
callback(A) and dead_letter(R) to the sink in one batch; the broker acknowledges the dead letter
but refuses callback(A) as too large; the acknowledger dead-letters callback(A) alone (reason
``MessageSizeTooLargeError``), and once that dead letter is acknowledged, the committer commits
offset 12.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

import trio

from purgatory._codec import (
    DEFAULT_MAX_DEAD_LETTER_KEY_BYTES,
    DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES,
    dead_letter_key,
    encode_callback,
    encode_dead_letter,
)
from purgatory._core import Outcome, OutcomeKind, TimeDomain, TransportError
from purgatory._core._backoff import Backoff
from purgatory.service.kafka.transport import (
    ConsumedRecord,
    Delivery,
    OutRecord,
    RecordSink,
    SendFailure,
)
from purgatory.service.telemetry.logging import get_logger, logs_enabled
from purgatory.service.telemetry.metrics import Metrics
from purgatory.service.telemetry.stats import OutboxStatistics
from reaper import Clock, CompletionExecutor

__all__ = ["Outbox", "OutboxStatistics", "due_ms"]

_log = get_logger()

#: The pause before a callback, dead letter or offset commit is tried again.
RETRY = Backoff(first_s=0.1, max_s=5.0)
_IN_FLIGHT_CHUNKS = 64


def due_ms(outcome: Outcome) -> int:
    """When an outcome's callback was due: its outcome time, or its registration if later.

    An operation registered with a deadline already past is due when it arrives, not at its
    deadline: the client's lateness is not the service's lag.
    """
    return max(outcome.outcome_ms, outcome.registered_ms)


@dataclass(slots=True)
class _Ref:
    """One record to send and what to do once it is acknowledged."""

    record: OutRecord
    outcome: Outcome | None = None  # a callback's outcome
    source_topic: str | None = None  # a dead letter's input topic
    reason: str = ""  # a dead letter's metric reason
    fallback: OutRecord | None = None  # the same dead letter without the prefixes


_Entry = Outcome | _Ref | dict[tuple[str, int], int] | trio.Event  # an Event: a barrier


class Outbox:
    """Sends outcomes and dead letters in order, by acknowledgement; commits offsets after them.

    Args:
        sink: where records go.
        executor: the completion lane that hands chunks to the sink, one at a time.
        clock: for lateness, lag and retry backoff.
        callbacks_topic: where a callback goes unless its operation names ``reply_to``.
        dead_letters_topic: where refused records go.
        max_record_bytes: a callback larger than this is dead-lettered without being sent.
        commit: commits consumed offsets (None: nothing is committed, e.g. without Kafka).
        on_delivered: called with each outcome once its callback is acknowledged (or
            dead-lettered).
        on_dead_lettered: called with each dead letter once the broker acknowledged it (the
            record acknowledged: the full one, or the same without the input's key and value).
        metrics: where deliveries are counted (None: nowhere).
        capacity: entries queued before :meth:`wait_for_room` makes producers wait.
        chunk: the most entries one work hands to the sink.
        reply_to_timeout_ms: how long a callback to a client's ``reply_to`` topic is retried
            before it is dead-lettered.
        commit_interval_ms: the least time between two offset commits.
    """

    def __init__(
        self,
        sink: RecordSink,
        executor: CompletionExecutor,
        clock: Clock,
        *,
        callbacks_topic: str,
        dead_letters_topic: str,
        max_record_bytes: int,
        commit: Callable[[Mapping[tuple[str, int], int]], Awaitable[None]] | None = None,
        on_delivered: Callable[[Outcome], None] = lambda _outcome: None,
        on_dead_lettered: Callable[[OutRecord], None] = lambda _record: None,
        metrics: Metrics | None = None,
        capacity: int = 10_000,
        chunk: int = 1_000,
        reply_to_timeout_ms: int = 30_000,
        commit_interval_ms: int = 100,
    ) -> None:
        self._sink = sink
        self._executor = executor
        self._clock = clock
        self._callbacks_topic = callbacks_topic
        self._dead_letters_topic = dead_letters_topic
        self._max_record_bytes = max_record_bytes
        self._commit = commit
        self._on_delivered = on_delivered
        self._on_dead_lettered = on_dead_lettered
        self._metrics = metrics
        self._capacity = capacity
        self._chunk = chunk
        self._reply_to_timeout_ms = reply_to_timeout_ms
        self._commit_interval_ms = commit_interval_ms
        self._queue: deque[_Entry] = deque()
        self._queued_records = 0
        self._wakeup = trio.Event()
        self._room = trio.Event()
        self._closed = False
        self._closing = trio.Event()
        self._in_flight_send, self._in_flight_receive = trio.open_memory_channel[
            tuple[Delivery, list[_Ref], dict[tuple[str, int], int], list[trio.Event]]
        ](_IN_FLIGHT_CHUNKS)
        self._in_flight = 0
        self._delivered = 0
        self._dead_lettered = 0
        self._retries = 0
        self._pending_commit: dict[tuple[str, int], int] = {}
        self._commit_wakeup = trio.Event()
        self._commits = 0
        self._commit_failures = 0
        self._acknowledged_all = False

    # -- puts (synchronous, in decision order) -------------------------------------------------

    def put(self, outcomes: Sequence[Outcome]) -> None:
        """Queue the callbacks of ``outcomes``, in order.

        Raises:
            trio.ClosedResourceError: the outbox was closed.
        """
        if outcomes:
            self._check_open()
            self._queue.extend(outcomes)
            self._queued_records += len(outcomes)
            self._wakeup.set()

    def put_dead_letter(
        self,
        record: ConsumedRecord,
        *,
        reason: str,
        field: str | None,
        label: str,
        scope: str | None = None,
    ) -> None:
        """Queue the dead letter of a consumed ``record``, with why it was refused.

        Args:
            record: the input record.
            reason: what was wrong with it.
            field: the offending field, or None.
            label: the metric's reason label (``invalid`` or ``refused``).
            scope: the record's scope, when it decoded (the letter's Kafka key).
        """
        self._check_open()
        full, bare = self._record_letters(record, reason=reason, field=field, scope=scope)
        self._queue.append(_Ref(full, None, record.topic, label, bare))
        self._queued_records += 1
        self._wakeup.set()

    def put_commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit ``offsets`` once everything queued before them is acknowledged."""
        if offsets:
            self._check_open()
            self._queue.append(dict(offsets))
            self._wakeup.set()

    # -- records written elsewhere (transactional delivery) -------------------------------------

    def records_for(self, outcomes: Sequence[Outcome]) -> list[OutRecord]:
        """The callbacks of ``outcomes`` as records to write in a transaction, in order; one
        larger than ``max_record_bytes`` is replaced by its dead letter (as the outbox does)."""
        records: list[OutRecord] = []
        for outcome in outcomes:
            topic = outcome.reply_to or self._callbacks_topic
            record = OutRecord(topic, outcome.scope.encode(), encode_callback(outcome))
            if len(record.value) > self._max_record_bytes:
                reason = (
                    f"{len(record.value)} bytes, over max_record_bytes ({self._max_record_bytes})"
                )
                _log.error(
                    "callback_dead_lettered",
                    op_id=outcome.op_id,
                    scope=outcome.scope,
                    topic=topic,
                    reason=reason,
                )
                record = self.undeliverable(record, SendFailure(reason, retriable=False))
            records.append(record)
        return records

    def undeliverable(self, record: OutRecord, failure: SendFailure) -> OutRecord:
        """The dead letter of a callback that cannot be delivered (reason ``undeliverable``)."""
        if self._metrics is not None:
            self._metrics.callback_error()
        full, _bare = self._letters(
            scope=record.key.decode("utf-8", "replace") if record.key is not None else None,
            reason=f"callback not delivered to topic {record.topic!r}: {failure.reason}",
            field=None,
            topic=record.topic,
            partition=-1,
            offset=-1,
            timestamp_ms=None,
            key=record.key,
            value=record.value,
        )
        return full

    def settled(self, outcomes: Sequence[Outcome]) -> None:
        """``outcomes``' callbacks were committed elsewhere (in a transaction): count them and
        tell the listeners, as an acknowledgement does."""
        for outcome in outcomes:
            topic = outcome.reply_to or self._callbacks_topic
            self._acknowledged(_Ref(OutRecord(topic, None, b""), outcome))

    def letter_for(
        self, record: ConsumedRecord, *, reason: str, field: str | None, scope: str | None
    ) -> OutRecord:
        """The dead letter of a refused input record, to write in a transaction."""
        return self._record_letters(record, reason=reason, field=field, scope=scope)[0]

    def _record_letters(
        self, record: ConsumedRecord, *, reason: str, field: str | None, scope: str | None
    ) -> tuple[OutRecord, OutRecord]:
        """The dead letters of a refused input record (see :meth:`_letters`)."""
        return self._letters(
            scope=scope,
            reason=reason,
            field=field,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp_ms,
            key=record.key,
            value=record.value,
        )

    def letter_settled(self, letter: OutRecord, *, source_topic: str, label: str) -> None:
        """``letter`` was committed elsewhere (in a transaction): count it as acknowledged."""
        self._acknowledged(_Ref(letter, None, source_topic, label))

    async def acknowledged(self) -> None:
        """Return once everything queued so far is acknowledged (or settled)."""
        self._check_open()
        barrier = trio.Event()
        self._queue.append(barrier)
        self._wakeup.set()
        await barrier.wait()

    async def wait_for_room(self) -> None:
        """Wait while more than ``capacity`` records are queued (back-pressure for producers)."""
        while self._queued_records > self._capacity and not self._closed:
            self._room = trio.Event()
            await self._room.wait()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Refuse further puts; :meth:`run` drains what is queued and returns."""
        self._closed = True
        self._closing.set()
        self._wakeup.set()
        self._room.set()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (no more puts)."""
        return self._closed

    def statistics(self) -> OutboxStatistics:
        """A frozen record of the outbox's counts."""
        return OutboxStatistics(
            queued=self._queued_records,
            in_flight=self._in_flight,
            delivered=self._delivered,
            dead_lettered=self._dead_lettered,
            retries=self._retries,
            commits=self._commits,
            commit_failures=self._commit_failures,
        )

    # -- the tasks ---------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send, acknowledge and commit until closed and drained."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._run_sender)
            nursery.start_soon(self._run_acknowledger)
            nursery.start_soon(self._run_committer)
            task_status.started()

    async def _run_sender(self) -> None:
        while True:
            if not self._queue:
                if self._closed:
                    break
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            chunk = self._take_chunk()
            due = min((due_ms(e) for e in chunk if isinstance(e, Outcome)), default=None)
            await self._executor.submit(
                functools.partial(self._hand_over, chunk),
                due_ms=due if due is not None else self._clock.now_ms(),
            )
        # Runs after every hand-over before it, on the same lane.
        await self._executor.submit(self._in_flight_send.close, due_ms=self._clock.now_ms())

    def _take_chunk(self) -> list[_Entry]:
        queue, chunk = self._queue, []
        records = 0
        while queue and records < self._chunk:
            entry = queue.popleft()
            chunk.append(entry)
            records += not isinstance(entry, dict | trio.Event)
        self._queued_records -= records
        if self._queued_records <= self._capacity:
            self._room.set()
        return chunk

    async def _hand_over(self, chunk: list[_Entry]) -> None:
        """The executor's work: encode a chunk and hand its records to the sink in one hop."""
        refs: list[_Ref] = []
        records: list[OutRecord] = []
        offsets: dict[tuple[str, int], int] = {}
        barriers: list[trio.Event] = []
        oversized: list[tuple[_Ref, SendFailure]] = []
        for entry in chunk:
            if isinstance(entry, dict):
                offsets.update(entry)
                continue
            if isinstance(entry, trio.Event):
                barriers.append(entry)
                continue
            if isinstance(entry, Outcome):
                topic = entry.reply_to or self._callbacks_topic
                value = encode_callback(entry)
                ref = _Ref(OutRecord(topic, entry.scope.encode(), value), entry)
                if len(value) > self._max_record_bytes:
                    reason = f"{len(value)} bytes, over max_record_bytes ({self._max_record_bytes})"
                    oversized.append((ref, SendFailure(reason, retriable=False)))
                    continue
            else:
                ref = entry
            refs.append(ref)
            records.append(ref.record)
        self._in_flight += len(refs) + len(oversized)
        delivery = await self._sink.send_batch(records)
        if oversized:
            await self._in_flight_send.send((delivery, refs, offsets, []))
            for ref, failure in oversized:  # settled after the chunk, in the acknowledger's order
                await self._in_flight_send.send((_Settled([failure]), [ref], {}, []))
            await self._in_flight_send.send((_Settled([]), [], {}, barriers))
        else:
            await self._in_flight_send.send((delivery, refs, offsets, barriers))

    async def _run_acknowledger(self) -> None:
        async with self._in_flight_receive:
            async for delivery, refs, offsets, barriers in self._in_flight_receive:
                results = await delivery.results()
                # Callbacks acknowledged in a row are reported together, in order, and
                # before anything else is settled (a refused record may wait for a retry).
                delivered: list[_Ref] = []
                for ref, failure in zip(refs, results, strict=True):
                    if failure is None and ref.outcome is not None:
                        delivered.append(ref)
                    else:
                        self._delivered_all(delivered)
                        delivered = []
                        if failure is None:
                            self._acknowledged(ref)
                        else:
                            await self._settle(ref, failure)
                    self._in_flight -= 1
                self._delivered_all(delivered)
                if offsets:
                    self._pending_commit.update(offsets)
                    self._commit_wakeup.set()
                for barrier in barriers:
                    barrier.set()
        self._acknowledged_all = True
        self._commit_wakeup.set()

    async def _run_committer(self) -> None:
        attempt = 0
        next_ms = 0
        while True:
            if not self._pending_commit:
                if self._acknowledged_all:
                    return
                self._commit_wakeup = trio.Event()
                await self._commit_wakeup.wait()
                continue
            if not self._closed and self._clock.now_ms() < next_ms:
                with trio.move_on_at(self._clock.to_trio_seconds(next_ms)):
                    await self._closing.wait()  # wait out the interval, unless shutting down
            next_ms = self._clock.now_ms() + self._commit_interval_ms
            offsets, self._pending_commit = self._pending_commit, {}
            if self._commit is None:
                continue
            try:
                await self._commit(offsets)
            except TransportError as exc:
                # Not a loss: the inputs are redelivered at worst. Retry with the later offsets.
                self._commit_failures += 1
                _log.warning("offset_commit_failed", error=str(exc))
                self._pending_commit = offsets | self._pending_commit
                await trio.sleep(RETRY.delay_s(attempt))
                attempt += 1
                continue
            attempt = 0
            self._commits += 1

    # -- acknowledgement and settlement ---------------------------------------------------------

    def _acknowledged(self, ref: _Ref, record: OutRecord | None = None) -> None:
        """``ref`` is acknowledged (as ``record`` when that is not ``ref.record``: a dead
        letter sent again without the input's key and value)."""
        outcome, metrics = ref.outcome, self._metrics
        if outcome is None:  # a dead letter
            self._dead_lettered += 1
            if metrics is not None and ref.source_topic is not None:
                metrics.dead_lettered(ref.source_topic, ref.reason)
            self._on_dead_lettered(record if record is not None else ref.record)
            return
        self._delivered_all([ref])

    def _delivered_all(self, refs: list[_Ref]) -> None:
        """The callbacks of ``refs`` (outcomes, in order) are acknowledged: count them, wake
        their waiters. Metrics are counted per call, not per callback (the acknowledger calls
        this once per delivery)."""
        if not refs:
            return
        self._delivered += len(refs)
        metrics = self._metrics
        if metrics is not None:
            now_ms = self._clock.now_ms()
            topics: dict[str, int] = {}
            for ref in refs:
                topic = ref.record.topic
                topics[topic] = topics.get(topic, 0) + 1
            for topic, count in topics.items():
                metrics.records_produced(topic, count)
            sent = [ref.outcome for ref in refs if ref.outcome is not None]
            metrics.outcomes(sent, now_ms=now_ms)
            for done in sent:
                if (
                    done.outcome is OutcomeKind.EXPIRED
                    and done.time_domain is TimeDomain.PROCESSING_TIME
                ):
                    metrics.reaper_lateness(max(0, now_ms - due_ms(done)))
        debug = logs_enabled("debug")
        for ref in refs:
            outcome = ref.outcome
            assert outcome is not None
            self._on_delivered(outcome)
            if not debug:
                continue
            _log.debug(
                "operation_" + outcome.outcome.value,
                op_id=outcome.op_id,
                scope=outcome.scope,
                sequence=outcome.sequence,
                late=outcome.late,
            )
            if outcome.outcome is OutcomeKind.EXPIRED and outcome.late:
                # After a restore they come by the thousand: the restore logs their count
                # (partition_serving, overdue=...) and purgatory_late_expirations counts them.
                _log.debug("operation_expired_late", op_id=outcome.op_id, scope=outcome.scope)

    async def _settle(self, ref: _Ref, failure: SendFailure) -> None:
        """Retry a refused record while that can help; otherwise dead-letter it, alone."""
        topic = ref.record.topic
        configured = topic in (self._callbacks_topic, self._dead_letters_topic)
        give_up_ms = None if configured else self._clock.now_ms() + self._reply_to_timeout_ms
        attempt = 0
        record = ref.record
        while True:
            if not failure.retriable:
                if ref.outcome is None and ref.fallback is not None and record is not ref.fallback:
                    record = ref.fallback  # the same letter, without the input's key and value
                elif ref.outcome is not None:
                    await self._dead_letter_callback(ref, failure)
                    return
                else:
                    _log.error("dead_letter_lost", topic=topic, reason=failure.reason)
                    return
            elif give_up_ms is not None and self._clock.now_ms() >= give_up_ms:
                await self._dead_letter_callback(ref, failure)
                return
            else:
                await trio.sleep(RETRY.delay_s(attempt))
                attempt += 1
            self._retries += 1
            [failure_or_none] = await (await self._sink.send_batch([record])).results()
            if failure_or_none is None:
                self._acknowledged(ref, record)
                return
            failure = failure_or_none

    async def _dead_letter_callback(self, ref: _Ref, failure: SendFailure) -> None:
        outcome = ref.outcome
        assert outcome is not None
        record = ref.record
        _log.error(
            "callback_dead_lettered",
            op_id=outcome.op_id,
            scope=outcome.scope,
            topic=record.topic,
            reason=failure.reason,
        )

        if self._metrics is not None:
            self._metrics.callback_error()
        full, bare = self._letters(
            scope=outcome.scope,
            reason=f"callback not delivered to topic {record.topic!r}: {failure.reason}",
            field=None,
            topic=record.topic,
            partition=-1,
            offset=-1,
            timestamp_ms=outcome.outcome_ms,
            key=record.key,
            value=record.value,
        )
        dead = _Ref(full, None, record.topic, "undeliverable", bare)
        [failure_or_none] = await (await self._sink.send_batch([dead.record])).results()
        if failure_or_none is None:
            self._acknowledged(dead)
        else:
            await self._settle(dead, failure_or_none)
        self._on_delivered(outcome)

    def _letters(
        self,
        *,
        scope: str | None,
        reason: str,
        field: str | None,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int | None,
        key: bytes | None,
        value: bytes | None,
    ) -> tuple[OutRecord, OutRecord]:
        """A dead letter, and the same without the refused record's key and value prefixes
        (sent if the broker refuses the first as too large: its limit is below ours). Both fit
        ``max_record_bytes`` whatever the refused record holds (see ``_codec._dead_letters``);
        their Kafka key is the scope when known, else the record's key, bounded."""
        limit = self._max_record_bytes
        letter_key = dead_letter_key(scope, key, max_record_bytes=limit)

        def letter(max_key_bytes: int, max_value_bytes: int) -> OutRecord:
            encoded = encode_dead_letter(
                reason=reason,
                field=field,
                topic=topic,
                partition=partition,
                offset=offset,
                timestamp_ms=timestamp_ms,
                key=key,
                value=value,
                max_key_bytes=max_key_bytes,
                max_value_bytes=max_value_bytes,
                max_record_bytes=limit,
            )
            return OutRecord(self._dead_letters_topic, letter_key, encoded)

        full = letter(DEFAULT_MAX_DEAD_LETTER_KEY_BYTES, DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES)
        return full, letter(0, 0)

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the outbox is closed")


class _Settled:
    """A delivery already decided (a callback refused before it was sent)."""

    def __init__(self, results: list[SendFailure | None]) -> None:
        self._results = results

    async def results(self) -> list[SendFailure | None]:
        await trio.lowlevel.checkpoint()
        return self._results

    async def offsets(self) -> list[int | None]:
        await trio.lowlevel.checkpoint()
        return [None] * len(self._results)
