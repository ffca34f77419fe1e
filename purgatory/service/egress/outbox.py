"""The outbox (service layer): outcomes out to the broker by acknowledgement, offsets after them.

Theory of operation
-------------------
Everything the service must write goes through one ordered queue, the *backlog*
(``backlog.py``): the callback of each decided outcome, the dead letter of each refused input
record, and, after the records of each consumed batch, a *commit marker* with the offsets that
batch reached. Puts are synchronous (the release and the intake call them with no
``await`` in between), so the backlog's order is the order in which things were decided; a
producer waits for room while more than ``capacity`` records are queued (back-pressure).

Three tasks drain it:

1. the *sender* (``sender.py``) takes what is queued (up to ``chunk`` records) and submits one
   work per chunk to the :class:`~reaper.CompletionExecutor`, the single lane where callbacks
   run in order; the work encodes the chunk (``records.py``: a callback per outcome, a dead
   letter per refused record), hands its records to the sink in one hop and passes the sink's
   :class:`Delivery` to
2. the *acknowledger* (``acknowledger.py``), which awaits deliveries strictly in order. A
   record the broker acknowledged is *delivered*: only now are the metrics counted, the
   ``op wait`` waiters woken and the log line written (``receipts.py``). A refused record is
   settled alone, never affecting another (``settler.py``): retried with backoff while retrying
   can help (forever for the configured topics, for at most ``reply_to_timeout_ms`` for a
   client's ``reply_to`` topic), otherwise dead-lettered with the reason. A dead letter always
   fits ``max_record_bytes`` (it keeps only prefixes of what it wraps, with their sizes and
   hashes); one a broker with a lower limit refuses as too large is sent again without the
   prefixes (the "no-value fallback"). A commit marker reached by the acknowledger therefore
   has every record before it acknowledged, and goes to
3. the *committer* (``committer.py``), which commits the latest offsets per partition, at most
   once per ``commit_interval_ms`` and coalescing every marker that arrived meanwhile: commits
   never block the intake or any callback, and their cost does not grow with the number of
   small batches a low rate makes (a crash redelivers at most that interval's inputs, whose
   callbacks were already sent: duplicates, never losses). Shutdown commits at once.

So an input offset is committed only after every outcome and dead letter it caused is
acknowledged by the broker: a crash at any point loses nothing acknowledged, and at worst makes
the broker redeliver inputs whose outcomes were already sent (at-least-once).

:class:`Outbox` composes these parts and is the only one the other stages see. In transactional
delivery it also builds the records the changelog writes in its transactions
(:meth:`~Outbox.records_for`, :meth:`~Outbox.letter_for`) and counts them once committed
(:meth:`~Outbox.settled`, :meth:`~Outbox.letter_settled`), as an acknowledgement does.

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

from collections.abc import Awaitable, Callable, Mapping, Sequence

import trio

from purgatory._core import Outcome
from purgatory._core._backoff import Backoff
from purgatory.service.egress.acknowledger import Acknowledger, InFlight
from purgatory.service.egress.backlog import Backlog
from purgatory.service.egress.committer import Committer
from purgatory.service.egress.receipts import Receipts
from purgatory.service.egress.records import Records, Ref, due_ms
from purgatory.service.egress.sender import Sender
from purgatory.service.egress.settler import Settler
from purgatory.service.kafka.transport import OutRecord, RecordSink, Refusal, SendFailure
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.metrics import Metrics
from purgatory.service.telemetry.stats import OutboxStatistics
from reaper import Clock, CompletionExecutor

__all__ = ["Outbox", "OutboxStatistics", "due_ms"]

_log = get_logger()

#: The pause before a callback, dead letter or offset commit is tried again.
RETRY = Backoff(first_s=0.1, max_s=5.0)
_IN_FLIGHT_CHUNKS = 64


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
        self._metrics = metrics
        self._records = Records(
            callbacks_topic=callbacks_topic,
            dead_letters_topic=dead_letters_topic,
            max_record_bytes=max_record_bytes,
        )
        self._backlog = Backlog(capacity=capacity, chunk=chunk)
        self._receipts = Receipts(
            clock, on_delivered=on_delivered, on_dead_lettered=on_dead_lettered, metrics=metrics
        )
        self._committer = Committer(commit, clock, interval_ms=commit_interval_ms, backoff=RETRY)
        self._settler = Settler(
            sink,
            clock,
            self._records,
            backoff=RETRY,
            reply_to_timeout_ms=reply_to_timeout_ms,
            metrics=metrics,
        )
        handed, in_flight = trio.open_memory_channel[InFlight](_IN_FLIGHT_CHUNKS)
        self._sender = Sender(
            self._backlog, self._records, sink, executor=executor, clock=clock, in_flight=handed
        )
        self._acknowledger = Acknowledger(in_flight, self._settler, self._receipts, self._committer)

    # -- puts (synchronous, in decision order) -------------------------------------------------

    def put(self, outcomes: Sequence[Outcome]) -> None:
        """Queue the callbacks of ``outcomes``, in order.

        Raises:
            trio.ClosedResourceError: the outbox was closed.
        """
        self._backlog.put(outcomes)

    def put_dead_letter(self, refusal: Refusal) -> None:
        """Queue the dead letter of a consumed record, with why it was refused (its ``label``
        is the metric's reason: ``invalid`` or ``refused``).

        Raises:
            trio.ClosedResourceError: the outbox was closed.
        """
        full, bare = self._records.input_letters(refusal)
        self._backlog.put_letter(Ref(full, None, refusal.record.topic, refusal.label, bare))

    def put_commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit ``offsets`` once everything queued before them is acknowledged."""
        self._backlog.put_commit(offsets)

    # -- records written elsewhere (transactional delivery) -------------------------------------

    def records_for(self, outcomes: Sequence[Outcome]) -> list[OutRecord]:
        """The callbacks of ``outcomes`` as records to write in a transaction, in order; one
        larger than ``max_record_bytes`` is replaced by its dead letter (as the outbox does)."""
        records: list[OutRecord] = []
        for outcome in outcomes:
            record = self._records.callback(outcome)
            reason = self._records.too_large(record)
            if reason is not None:
                _log.error(
                    "callback_dead_lettered",
                    op_id=outcome.op_id,
                    scope=outcome.scope,
                    topic=record.topic,
                    reason=reason,
                )
                record = self.undeliverable(record, SendFailure(reason, retriable=False))
            records.append(record)
        return records

    def undeliverable(self, record: OutRecord, failure: SendFailure) -> OutRecord:
        """The dead letter of a callback that cannot be delivered (reason ``undeliverable``)."""
        if self._metrics is not None:
            self._metrics.callback_error()
        scope = record.key.decode("utf-8", "replace") if record.key is not None else None
        return self._records.callback_letters(record, failure, scope=scope, timestamp_ms=None)[0]

    def settled(self, outcomes: Sequence[Outcome]) -> None:
        """``outcomes``' callbacks were committed elsewhere (in a transaction): count them and
        tell the listeners, as an acknowledgement does."""
        callbacks_topic = self._records.callbacks_topic
        for outcome in outcomes:
            topic = outcome.reply_to or callbacks_topic
            self._receipts.acknowledged(Ref(OutRecord(topic, None, b""), outcome))

    def letter_for(self, refusal: Refusal) -> OutRecord:
        """The dead letter of a refused input record, to write in a transaction."""
        return self._records.input_letters(refusal)[0]

    def letter_settled(self, letter: OutRecord, *, source_topic: str, label: str) -> None:
        """``letter`` was committed elsewhere (in a transaction): count it as acknowledged."""
        self._receipts.acknowledged(Ref(letter, None, source_topic, label))

    # -- waiting, closing, reading -------------------------------------------------------------

    async def acknowledged(self) -> None:
        """Return once everything queued so far is acknowledged (or settled).

        Raises:
            trio.ClosedResourceError: the outbox was closed.
        """
        barrier = trio.Event()
        self._backlog.put_barrier(barrier)
        await barrier.wait()

    async def wait_for_room(self) -> None:
        """Wait while more than ``capacity`` records are queued (back-pressure for producers)."""
        await self._backlog.wait_for_room()

    def close(self) -> None:
        """Refuse further puts; :meth:`run` drains what is queued and returns."""
        self._backlog.close()
        self._committer.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (no more puts)."""
        return self._backlog.closed

    def statistics(self) -> OutboxStatistics:
        """A frozen record of the outbox's counts."""
        return OutboxStatistics(
            queued=self._backlog.queued,
            in_flight=self._sender.handed - self._acknowledger.settled,
            delivered=self._receipts.delivered_count,
            dead_lettered=self._receipts.dead_lettered_count,
            retries=self._settler.retries,
            commits=self._committer.commits,
            commit_failures=self._committer.failures,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Send, acknowledge and commit until closed and drained."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sender.run)
            nursery.start_soon(self._acknowledger.run)
            nursery.start_soon(self._committer.run)
            task_status.started()
