"""The Kafka source: one consumer thread bridged to trio (service layer).

The kafka-python consumer is created, polled, committed and closed by one thread only (it is not
thread-safe), started with ``trio.to_thread.run_sync``. Each poll (at most ``max_batch`` records,
100 ms timeout so the thread sees its stop flag quickly) becomes one list of
``ConsumedRecord`` sent into a bounded memory channel. When the channel is full the thread stops
polling and waits: back-pressure reaches the broker instead of piling up in memory.

Offsets are never committed automatically: the service applies a record, makes the change durable,
then calls ``commit``, which hands the offsets to the consumer thread and waits for the broker's
answer. The thread starts commits between polls, and also while it waits for room in the channel,
so a task that reads the channel and commits can never deadlock against it. It starts them with
``commit_async``: a commit's round trip never holds up the next poll (a blocking commit per
batch added its round trip to every signal's latency). The answer reaches the waiting trio task
through the run's ``TrioToken``, from whichever kafka-python thread delivers it; commits still in
flight when the consumer closes fail, so nobody waits forever.

The topics' partition counts are published too, read from the consumer's own metadata every
few polls (a cached lookup: no request of its own). That metadata is refreshed every
``metadata_max_age_ms`` (a few seconds, not Kafka's five minutes), so a partition added to an
input topic shows within seconds (see :mod:`purgatory.service.ownership.layout`).
"""

from __future__ import annotations

import functools
import queue
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal

import trio
from kafka import (
    AsyncConsumerRebalanceListener,
    ConsumerRebalanceListener,
    KafkaConsumer,
    OffsetAndMetadata,
    TopicPartition,
)
from kafka.errors import KafkaError

from purgatory._core import TransportError, UsageError
from purgatory.service.kafka.assignor import CoPartitionedAssignor
from purgatory.service.kafka.config import (
    KafkaClientConfig,
    no_client_metrics,
    no_topic_creation,
    raising_single_errors,
)
from purgatory.service.kafka.transport import ConsumedRecord
from purgatory.service.telemetry.logging import get_logger

__all__ = ["KafkaSource", "StartPosition", "open_kafka_source"]

_log = get_logger()

StartPosition = Literal["earliest", "committed"]
_POLL_TIMEOUT_MS = 100
_CHANNEL_BATCHES = 4
_FULL_CHANNEL_WAIT_S = 0.01
_COMMIT_TIMEOUT_MS = 30_000
#: the longest the consumer thread waits for the broker to say where a partition is read from
#: (unbounded, ``committed`` would hold the thread, and every commit, through an outage)
_ASK_TIMEOUT_MS = 5_000
_POLL_RETRY_S = 0.5  # after a poll that failed for a retriable reason (the broker away)
_HAND_OVER_POLL_S = 0.01  # how often a rebalance listener looks whether its hand-over is done
#: The most between two heartbeats: a member learns of a rebalance another began (a member
#: that left or joined) at its next heartbeat, and until every member has rejoined, the
#: partitions that move are served nowhere. Kafka's default is 3 s (a third of the 10 s
#: session); a rollout's every step is two rebalances, so 1 s (one small request a second per
#: member) takes up to 4 s off each step.
_HEARTBEAT_MS = 1_000
_COUNTS_EVERY_POLLS = 10  # at most a second apart while idle (each poll waits at most 100 ms)


@dataclass(slots=True)
class _ResumeRequest:
    positions: dict[tuple[str, int], int | None]
    epochs: dict[tuple[str, int], int]
    done: trio.Event
    token: trio.lowlevel.TrioToken


@dataclass(slots=True)
class _CommitRequest:
    offsets: dict[tuple[str, int], int]
    done: trio.Event
    token: trio.lowlevel.TrioToken
    error: TransportError | None = None
    finished: bool = False


class _SeekToBeginningOnce(ConsumerRebalanceListener):  # type: ignore[misc]
    """``start="earliest"`` under a group: read each partition from its start the first time
    this consumer is given it, whatever the group committed."""

    def __init__(self, consumer: Any) -> None:
        self._consumer = consumer
        self._seen: set[Any] = set()

    def on_partitions_revoked(self, revoked: Collection[Any]) -> None:
        pass

    def on_partitions_assigned(self, assigned: Collection[Any]) -> None:
        new = [tp for tp in assigned if tp not in self._seen]
        self._seen.update(new)
        if new:
            self._consumer.seek_to_beginning(*new)


class _HoldNewPartitions(AsyncConsumerRebalanceListener):  # type: ignore[misc]
    """Pause every partition the group newly gives this consumer, until the service resumes it
    (after restoring its state); with ``earliest``, read it from its start. Hand over every
    partition taken away (or lost with the session) before the rebalance goes on.

    kafka-python runs its rebalance listeners on its own I/O loop, which also sends the
    member's heartbeats: a listener that blocks stops them, and a hand-over that waits for a
    slow broker then costs the member its session and the group a second rebalance. This one
    is a coroutine of that loop: the hand-over runs in trio, and the listener yields to the
    loop (heartbeats included) while it waits for it. Partitions lost with the session (a link
    cut, a pause) take the same path (the base class's ``on_partitions_lost``): another member
    may own them already, but what this replica recorded for them must still settle before it
    releases anything (a record that landed after the new owner's is void).
    """

    def __init__(self, thread: _ConsumerThread, consumer: Any, *, earliest: bool) -> None:
        self._thread = thread
        self._consumer = consumer
        self._earliest = earliest
        self._seen: set[Any] = set()

    async def on_partitions_revoked(self, revoked: Collection[Any]) -> None:
        self._thread.forget(revoked)
        done = self._thread.hand_over(revoked)
        net = self._consumer._net  # kafka-python's I/O loop: its sleep lets it run meanwhile
        while not done.is_set():
            await net.sleep(_HAND_OVER_POLL_S)

    async def on_partitions_assigned(self, assigned: Collection[Any]) -> None:
        new = [tp for tp in assigned if tp not in self._seen]
        self._seen.update(new)
        if new and self._earliest:
            self._consumer.seek_to_beginning(*new)
        self._thread.hold(self._consumer, assigned)
        self._thread.given = True  # published with the assignment, after the poll


class _ConsumerThread:
    """Owns the consumer; everything here except ``run`` and ``request_commit`` runs in it."""

    def __init__(  # noqa: PLR0917 - each part of the consumer it owns
        self,
        config: KafkaClientConfig,
        options: dict[str, Any],
        topics: list[str],
        assignment: list[Any] | None,
        start: StartPosition,
        max_batch: int,
        *,
        hold: bool = False,
        assignor: CoPartitionedAssignor | None = None,
    ) -> None:
        self._hold = hold
        self._assignor = assignor
        self._config = config
        self._options = options  # the consumer's own arguments, beside the connection's
        self._topics = topics
        self._assignment = assignment
        self._start = start
        self._max_batch = max_batch
        self._stop = threading.Event()
        #: set at a graceful stop: every partition paused, nothing handed over any more, but
        #: the consumer still polls (heartbeats, rebalances, commits) until it closes
        self._quiet = threading.Event()
        self.consumer: Any = None  # once connected (its group metadata is read from trio)
        self._commits: queue.SimpleQueue[_CommitRequest] = queue.SimpleQueue()
        self._resumes: queue.SimpleQueue[_ResumeRequest] = queue.SimpleQueue()
        self._deferred_resume: _ResumeRequest | None = None  # its positions were not answered
        self._reading: set[Any] = set()  # assigned and resumed
        self._held: set[Any] = set()  # assigned, paused until resumed
        self._lock = threading.Lock()
        self._closed = False
        self._in_flight_requests: dict[int, _CommitRequest] = {}
        self._next_offsets: dict[Any, int] = {}
        self._epochs: dict[Any, int] = {}  # the epoch of each partition's latest resume
        self._polls = 0
        # Published by the thread, read by trio: each is replaced whole, never mutated.
        self.lag: dict[tuple[str, int], int] = {}
        self.assigned: frozenset[tuple[str, int]] = frozenset()
        self.held: frozenset[tuple[str, int]] = frozenset()
        self.partition_counts: dict[str, int] = {}
        #: given its partitions at least once (an explicit assignment, or a first group join),
        #: and published with the assignment it was given (``given``: not yet published)
        self.joined = False
        self.given = False
        self.on_revoke: Callable[[frozenset[tuple[str, int]]], Awaitable[None]] | None = None
        self._token: trio.lowlevel.TrioToken | None = None

    async def run(
        self,
        send: trio.MemorySendChannel[list[ConsumedRecord]],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        self._token = trio.lowlevel.current_trio_token()  # rebalance callbacks may come from
        # kafka-python's own threads, which trio did not create
        with send:  # closed when the thread ends, so the reader sees the end of the source
            await trio.to_thread.run_sync(
                self._main, send, task_status, limiter=trio.CapacityLimiter(1)
            )

    def stop(self) -> None:
        self._stop.set()

    def stop_reading(self) -> None:
        self._quiet.set()

    def request_resume(self, request: _ResumeRequest) -> None:
        with self._lock:
            if self._closed:
                raise TransportError("the Kafka consumer has stopped")
            self._resumes.put(request)

    # -- in the consumer thread ------------------------------------------------------------------

    def hold(self, consumer: Any, assigned: Collection[Any]) -> None:
        """Pause the assigned partitions not being read already (new ones)."""
        new = [tp for tp in assigned if tp not in self._reading]
        if new:
            consumer.pause(*new)
            self._held.update(new)
        self._publish_held()

    def hand_over(self, revoked: Collection[Any]) -> threading.Event:
        """The group takes ``revoked`` away: before the rebalance goes on (and another member
        is given them), let the service stop applying them and settle what it decided. The
        service's hand-over runs in trio, started from a thread of its own (the caller is
        kafka-python's I/O loop, which must keep running); the event is set when it is done
        (the hand-over bounds its own wait)."""
        done = threading.Event()
        handler = self.on_revoke
        if handler is None or not revoked:
            done.set()
            return done
        partitions = frozenset((tp.topic, tp.partition) for tp in revoked)
        self.assigned = self.assigned - partitions  # no longer ours, from this moment on

        def run() -> None:
            try:
                trio.from_thread.run(handler, partitions, trio_token=self._token)
            except Exception as exc:  # the run is ending, or the hand-over failed: go on
                _log.warning(
                    "partitions_hand_over_failed", partitions=sorted(partitions), error=repr(exc)
                )
            finally:
                done.set()

        threading.Thread(target=run, name="purgatory-hand-over", daemon=True).start()
        return done

    def forget(self, revoked: Collection[Any]) -> None:
        self._reading.difference_update(revoked)
        self._held.difference_update(revoked)
        self._publish_held()

    def _publish_held(self) -> None:
        self.held = frozenset((tp.topic, tp.partition) for tp in self._held)

    def _serve_resumes(self, consumer: Any) -> None:
        while True:
            request = self._deferred_resume
            if request is None:
                try:
                    request = self._resumes.get_nowait()
                except queue.Empty:
                    return
            try:
                positions = self._resume_positions(consumer, request)
            except KafkaError as exc:
                # The broker did not answer where to read from (it is away, or moving its
                # leaders): nothing was resumed yet, so the whole request waits for the next
                # turn of the loop. The partitions stay held; their hand-over still waits.
                self._deferred_resume = request
                _log.warning("consumer_resume_deferred", error=str(exc), retry_in_s=_POLL_RETRY_S)
                return
            self._deferred_resume = None
            for tp, position in positions.items():
                if position is not None:
                    consumer.seek(tp, position)
                    self._next_offsets[tp] = position
                self._epochs[tp] = request.epochs[(tp.topic, tp.partition)]
                consumer.resume(tp)
                self._held.discard(tp)
                self._reading.add(tp)
            self._publish_held()
            request.token.run_sync_soon(request.done.set)

    def _resume_positions(self, consumer: Any, request: _ResumeRequest) -> dict[Any, int | None]:
        """Where each assigned partition of ``request`` is read from (None: where it is). Asks
        the broker only for a partition taken again while it was read; raises its error."""
        assigned = consumer.assignment()
        positions: dict[Any, int | None] = {}
        for (topic, partition), asked in request.positions.items():
            tp = TopicPartition(topic, partition)
            if tp not in assigned:
                continue
            position = asked
            if position is None and tp in self._reading and self._start == "committed":
                # Taken again while it was read (a fence restored it): what was read
                # meanwhile was skipped, so read again from the group's committed offset.
                position = consumer.committed(tp, timeout_ms=_ASK_TIMEOUT_MS)
                if position is None:
                    position = consumer.beginning_offsets([tp], _ASK_TIMEOUT_MS)[tp]
            positions[tp] = position
        return positions

    def request_commit(self, request: _CommitRequest) -> None:
        with self._lock:
            if self._closed:
                raise TransportError("the Kafka consumer has stopped; offsets were not committed")
            self._commits.put(request)

    def _main(
        self, send: trio.MemorySendChannel[list[ConsumedRecord]], task_status: trio.TaskStatus[None]
    ) -> None:
        try:
            consumer = self.consumer = self._connect()
            try:
                self._attach(consumer)
                trio.from_thread.run_sync(task_status.started)
                self._loop(consumer, send)
            finally:
                consumer.close(autocommit=False)
        except KafkaError as exc:
            raise TransportError(f"Kafka consumer of {self._topics} failed: {exc}") from exc
        finally:
            self._fail_pending_commits()

    def _connect(self) -> Any:
        try:
            return KafkaConsumer(**self._config.kafka_kwargs(), **self._options)
        except KafkaError as exc:
            servers = self._config.servers()
            raise TransportError(f"cannot reach Kafka at {servers}: {exc}") from exc

    def _attach(self, consumer: Any) -> None:
        counts: dict[str, int] = {}
        for topic in self._topics:
            partitions = consumer.partitions_for_topic(topic)
            if not partitions:
                raise TransportError(f"topic {topic!r} does not exist (or has no partitions)")
            counts[topic] = len(partitions)
        self.partition_counts = counts
        if self._assignment is not None:
            consumer.assign(self._assignment)
            if self._start == "earliest":
                consumer.seek_to_beginning(*self._assignment)
            if self._hold:
                self.hold(consumer, self._assignment)
            self._publish(consumer)
        elif self._hold:
            listener = _HoldNewPartitions(self, consumer, earliest=self._start == "earliest")
            consumer.subscribe(self._topics, listener=listener)
        elif self._start == "earliest":
            consumer.subscribe(self._topics, listener=_SeekToBeginningOnce(consumer))
        else:
            consumer.subscribe(self._topics)

    def _loop(self, consumer: Any, send: trio.MemorySendChannel[list[ConsumedRecord]]) -> None:
        while not self._stop.is_set():
            self._serve_commits(consumer, wait_s=None)
            if self._quiet.is_set():
                self._pause_all(consumer)
            polled = self.poll(consumer)
            batch: list[ConsumedRecord] = []
            for tp, records in polled.items():
                epoch = self._epochs.get(tp, 0)
                batch.extend(
                    ConsumedRecord(
                        r.topic, r.partition, r.offset, r.key, r.value, r.timestamp, epoch
                    )
                    for r in records
                )
                if records:
                    self._next_offsets[tp] = records[-1].offset + 1
            self._publish(consumer)
            self._polls += 1
            if self._polls % _COUNTS_EVERY_POLLS == 0:
                self._publish_counts(consumer)
            if self._assignor is not None and self._assignor.take_rejoin():
                consumer._coordinator.request_rejoin()  # the next poll joins the second round
            if batch and not self._quiet.is_set() and not self._deliver(consumer, send, batch):
                return

    def _pause_all(self, consumer: Any) -> None:
        """Pause every assigned partition (a rebalance may have given new ones): the stop
        reads nothing more, and what was fetched is dropped (it was not committed)."""
        assigned = consumer.assignment()
        if assigned - consumer.paused():
            consumer.pause(*assigned)

    def poll(self, consumer: Any) -> dict[Any, list[Any]]:
        """One poll of ``consumer``. A retriable error (a refused connection while the broker
        is away: kafka-python 3 lets a failed coordinator lookup escape ``poll``) is logged
        and the poll comes back empty after a short wait, so the service rides out an outage
        as it does when the error stays inside the client; any other error ends the source.
        """
        try:
            polled: dict[Any, list[Any]] = consumer.poll(
                timeout_ms=_POLL_TIMEOUT_MS, max_records=self._max_batch
            )
        except KafkaError as exc:
            if not getattr(exc, "retriable", False):
                raise
            _log.warning("consumer_poll_failed", error=str(exc), retry_in_s=_POLL_RETRY_S)
            self._stop.wait(_POLL_RETRY_S)
            return {}
        return polled

    def _deliver(
        self,
        consumer: Any,
        send: trio.MemorySendChannel[list[ConsumedRecord]],
        batch: list[ConsumedRecord],
    ) -> bool:
        while not self._stop.is_set():
            if self._quiet.is_set():
                return True  # dropped: the stop reads nothing more (see _loop)
            try:
                trio.from_thread.run_sync(send.send_nowait, batch)
                return True
            except trio.WouldBlock:
                self._serve_commits(consumer, wait_s=_FULL_CHANNEL_WAIT_S)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return False
        return False

    def _serve_commits(self, consumer: Any, *, wait_s: float | None) -> None:
        self._serve_resumes(consumer)
        try:
            request = self._commits.get(timeout=wait_s) if wait_s else self._commits.get_nowait()
        except queue.Empty:
            return
        while True:
            offsets = {
                TopicPartition(t, p): OffsetAndMetadata(o, "", -1)
                for (t, p), o in request.offsets.items()
            }
            with self._lock:
                self._in_flight_requests[id(request)] = request
            try:
                consumer.commit_async(offsets, callback=functools.partial(self._answered, request))
            except KafkaError as exc:
                self._answered(request, offsets, exc)
            try:
                request = self._commits.get_nowait()
            except queue.Empty:
                return

    def _answered(self, request: _CommitRequest, _offsets: object, response: object) -> None:
        """The broker's answer to a commit (any kafka-python thread)."""
        with self._lock:
            if request.finished:
                return
            request.finished = True
            self._in_flight_requests.pop(id(request), None)
        if isinstance(response, BaseException):
            group = self._options.get("group_id")
            request.error = TransportError(
                f"commit of {request.offsets} for group {group!r} failed: {response}"
            )
        request.token.run_sync_soon(request.done.set)

    def _publish(self, consumer: Any) -> None:
        lag: dict[tuple[str, int], int] = {}
        assigned = consumer.assignment()
        for tp in assigned:
            highwater = consumer.highwater(tp)  # from the fetch response, not ListOffsets
            if highwater is None:
                continue
            position = self._next_offsets.get(tp)
            if position is None:
                try:
                    position = consumer.position(tp, timeout_ms=0)
                except KafkaError:
                    position = None
            if position is not None:
                lag[(tp.topic, tp.partition)] = max(0, highwater - position)
        self.lag = lag
        self.assigned = frozenset((tp.topic, tp.partition) for tp in assigned)
        self.joined = self.joined or self.given or bool(assigned)

    def _publish_counts(self, consumer: Any) -> None:
        """Each topic's partition count in the consumer's cached metadata; a topic missing from
        it keeps its last count. The cache, not ``consumer.partitions_for_topic``: for a topic
        the cache lacks, that asks the broker for every topic's metadata and waits without a
        bound, and raises whatever ends the wait. A metadata answer with an error for the
        topic drops it from the cache (a broker fencing itself, leaders moving), and the
        broker that gave it may be unreachable next: the thread would hang for the request's
        timeout, then end the source (and the replica) on a retriable error."""
        counts = dict(self.partition_counts)
        for topic in self._topics:
            partitions = consumer._cluster.partitions_for_topic(topic)
            if partitions:
                counts[topic] = len(partitions)
        self.partition_counts = counts

    def _fail_pending_commits(self) -> None:
        with self._lock:
            self._closed = True
            unanswered = list(self._in_flight_requests.values())
        for request in unanswered:
            self._answered(
                request,
                None,
                TransportError("the Kafka consumer stopped before the commit's answer"),
            )
        while True:
            try:
                request = self._commits.get_nowait()
            except queue.Empty:
                break
            request.error = TransportError("the Kafka consumer stopped before the commit")
            trio.from_thread.run_sync(request.done.set)
        while True:  # nobody waits forever for a resume either
            try:
                resume = self._resumes.get_nowait()
            except queue.Empty:
                return
            resume.token.run_sync_soon(resume.done.set)


class KafkaSource:
    """The trio side of a consumer: batches to read, offsets to commit, lag to report.

    Attributes:
        receive: batches of records in poll order (per-partition order is kept); bounded.
    """

    def __init__(
        self,
        receive: trio.MemoryReceiveChannel[list[ConsumedRecord]],
        thread: _ConsumerThread,
        group_id: str | None,
        assignor: CoPartitionedAssignor | None = None,
    ) -> None:
        self.receive = receive
        self._thread = thread
        self._group_id = group_id
        self._assignor = assignor
        self._epochs: dict[tuple[str, int], int] = {}  # resumes so far, per partition

    async def commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Commit ``{(topic, partition): next offset to read}`` for the group and wait for it.

        Raises:
            UsageError: the source has no ``group_id``, or an offset is negative.
            TransportError: the broker refused the commit, or the consumer has stopped.
        """
        if self._group_id is None:
            raise UsageError("commit needs a source opened with a group_id")
        if any(offset < 0 for offset in offsets.values()):
            raise UsageError(f"offsets must be >= 0, got {dict(offsets)}")
        request = _CommitRequest(dict(offsets), trio.Event(), trio.lowlevel.current_trio_token())
        self._thread.request_commit(request)
        await request.done.wait()
        if request.error is not None:
            raise request.error

    def lag(self) -> dict[tuple[str, int], int]:
        """Records behind the partition's end, per assigned partition, as of the last poll.

        Best effort: computed from the highwater mark of the last fetch response, and counts
        records still in the channel as read.
        """
        return self._thread.lag

    def assignment(self) -> frozenset[tuple[str, int]]:
        """The partitions the consumer held at its last poll (changes with group rebalances)."""
        return self._thread.assigned

    def joined(self) -> bool:
        """Whether the consumer was given its partitions at least once: at once with an
        explicit assignment; in a group, at its first join, even one that gave it none."""
        return self._thread.joined

    def held(self) -> frozenset[tuple[str, int]]:
        """The assigned partitions paused until :meth:`resume` (with ``hold=True``)."""
        return self._thread.held

    def owner_urls(self) -> dict[int, str]:
        """``{partition: owner's URL}`` as the group shared it at the last rebalance (empty
        with an explicit assignment)."""
        return self._assignor.owners() if self._assignor is not None else {}

    def warm_wanted(self) -> frozenset[int]:
        """What the group's last assignment asks this member to warm (see the assignor)."""
        return self._assignor.warmups() if self._assignor is not None else frozenset()

    def report_warm(self, partitions: frozenset[int]) -> None:
        """Say in the next subscriptions what this member keeps warm (a rebalance when one it
        was asked for became warm)."""
        if self._assignor is not None:
            self._assignor.report_warm(partitions)

    def leave(self) -> None:
        """Ask the group to move every partition held away, each once warm elsewhere."""
        if self._assignor is not None:
            self._assignor.leave()

    def left_alone(self) -> bool:
        """Whether no other member takes over after :meth:`leave` (true without a group)."""
        return self._assignor is None or self._assignor.left_alone()

    def on_revoke(
        self, handler: Callable[[frozenset[tuple[str, int]]], Awaitable[None]] | None
    ) -> None:
        """Call ``handler`` (in trio) with the partitions a group rebalance takes away, and
        wait for it before the rebalance goes on (with ``hold=True``, in group mode)."""
        self._thread.on_revoke = handler

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has, as of the consumer's latest metadata (read when it
        connected, then every few polls; the metadata is at most ``metadata_max_age_ms`` old).

        Raises:
            UsageError: ``topic`` is not one this source reads.
        """
        try:
            return self._thread.partition_counts[topic]
        except KeyError:
            raise UsageError(f"topic {topic!r} is not read by this source") from None

    async def resume(self, positions: Mapping[tuple[str, int], int | None]) -> None:
        """Start reading held partitions, each at its offset (None: where it stands, the
        group's committed offset or the start; for a partition read already, which a fence had
        the service restore again, the group's committed offset); waits until the consumer
        thread has."""
        epochs = {tp: self.resume_epoch(*tp) for tp in positions}
        self._epochs.update(epochs)
        request = _ResumeRequest(
            dict(positions), epochs, trio.Event(), trio.lowlevel.current_trio_token()
        )
        self._thread.request_resume(request)
        await request.done.wait()

    def resume_epoch(self, topic: str, partition: int) -> int:
        """The epoch the records of a partition carry once it is next resumed (one more than
        its resumes so far); records fetched before that resume carry a lower one."""
        return self._epochs.get((topic, partition), 0) + 1

    def stop_reading(self) -> None:
        """Read nothing more, and keep taking part in the group until closed.

        For a graceful stop: the consumer pauses every partition it holds (and any a
        rebalance gives it) and drops what it fetched, but still polls, so it heartbeats,
        joins a rebalance another member began (running the rebalance listener), and serves
        the last commits. A consumer that stopped polling instead (its channel full, nobody
        reading) left such a rebalance waiting for it, every partition of the group unserved,
        and its own commits refused (``RebalanceInProgressError``) until the stop's grace ran
        out."""
        self._thread.stop_reading()


@asynccontextmanager
async def open_kafka_source(
    config: KafkaClientConfig,
    *,
    topics: list[str],
    group_id: str | None,
    assignment: list[tuple[str, int]] | None = None,
    start: StartPosition = "committed",
    max_batch: int = 500,
    session_timeout_ms: int = 10_000,
    connect_timeout_ms: int = 30_000,
    fetch_max_wait_ms: int = 10,
    hold: bool = False,
    advertised_url: str | None = None,
    group_instance_id: str | None = None,
    metadata_max_age_ms: int = 5_000,
    read_committed: bool = False,
) -> AsyncIterator[KafkaSource]:
    """Consume ``topics`` in a dedicated thread; yield a ``KafkaSource`` while it runs.

    Args:
        config: how to reach the brokers.
        topics: the topics to read (with ``assignment``, every assigned topic must be listed).
        group_id: the consumer group; offsets are committed there. Required for group
            subscription and for ``start="committed"``.
        assignment: explicit ``(topic, partition)`` list instead of a group subscription.
        start: ``"committed"`` resumes after the group's committed offsets (the start of the
            partition when there are none); ``"earliest"`` reads every partition from its start.
        max_batch: records per poll, so per batch handed to trio.
        session_timeout_ms: group session timeout; Tansu completes a join after about half of
            it, so short values make joins fast in development.
        connect_timeout_ms: how long to try to reach a bootstrap server.
        fetch_max_wait_ms: how long the broker may hold a fetch that has no data yet.
        hold: pause every partition when it is assigned, until :meth:`KafkaSource.resume`
            (the service restores a partition's state before it reads its inputs).
        advertised_url: with a group: this member's URL, shared with the group by the
            co-partitioned assignor (:mod:`purgatory.service.kafka.assignor`), which is used
            whenever ``hold`` is set.
        group_instance_id: static membership (KIP-345) in the group.
        metadata_max_age_ms: how old the topics' metadata may get before it is asked for again
            (how soon a partition added to a topic is seen: ``partition_count``).
        read_committed: read only records of committed transactions (and every record written
            outside one), as a transactional service does.

    Raises:
        UsageError: inconsistent arguments (the message names the argument).
        TransportError: the brokers cannot be reached, or the consumer failed.
    """
    _check_source(topics, group_id, assignment, start, max_batch, fetch_max_wait_ms)
    options = _consumer_options(group_id, max_batch, fetch_max_wait_ms)
    options["session_timeout_ms"] = session_timeout_ms
    options["heartbeat_interval_ms"] = max(100, min(session_timeout_ms // 3, _HEARTBEAT_MS))
    options["bootstrap_timeout_ms"] = connect_timeout_ms
    options["metadata_max_age_ms"] = metadata_max_age_ms
    options["isolation_level"] = "read_committed" if read_committed else "read_uncommitted"
    # The co-partitioned assignor whenever partitions are held (see its module).
    assignor = CoPartitionedAssignor(advertised_url) if assignment is None and hold else None
    if assignor is not None:
        options["partition_assignment_strategy"] = [assignor]
    if group_instance_id is not None:
        options["group_instance_id"] = group_instance_id
    partitions = None if assignment is None else [TopicPartition(t, p) for t, p in assignment]
    thread = _ConsumerThread(
        config, options, list(topics), partitions, start, max_batch, hold=hold, assignor=assignor
    )
    send, receive = trio.open_memory_channel[list[ConsumedRecord]](_CHANNEL_BATCHES)
    with raising_single_errors():
        async with trio.open_nursery() as nursery:
            await nursery.start(thread.run, send)
            try:
                yield KafkaSource(receive, thread, group_id, assignor)
            finally:
                thread.stop()
                receive.close()


def _check_source(  # noqa: PLR0917 - the arguments of open_kafka_source, checked together
    topics: list[str],
    group_id: str | None,
    assignment: list[tuple[str, int]] | None,
    start: StartPosition,
    max_batch: int,
    fetch_max_wait_ms: int,
) -> None:
    """Refuse inconsistent arguments of :func:`open_kafka_source` (``UsageError``)."""
    if not topics:
        raise UsageError("topics must not be empty")
    if group_id is None and assignment is None:
        raise UsageError("group subscription needs a group_id (or pass an explicit assignment)")
    if start not in ("earliest", "committed"):
        raise UsageError(f"start must be 'earliest' or 'committed', got {start!r}")
    if start == "committed" and group_id is None:
        raise UsageError("start='committed' needs a group_id to read committed offsets from")
    if assignment is not None and not set(t for t, _ in assignment) <= set(topics):
        raise UsageError(f"assignment {assignment} names topics outside topics={topics}")
    if max_batch < 1:
        raise UsageError(f"max_batch must be >= 1, got {max_batch}")
    if not 0 <= fetch_max_wait_ms <= 60_000:
        raise UsageError(f"fetch_max_wait_ms must be in [0, 60000], got {fetch_max_wait_ms}")


def _consumer_options(
    group_id: str | None, max_batch: int, fetch_max_wait_ms: int
) -> dict[str, Any]:
    """kafka-python's consumer settings for :func:`open_kafka_source`, beside the
    connection's."""
    return {
        **no_topic_creation(),
        **no_client_metrics(),
        "group_id": group_id,
        "enable_auto_commit": False,  # the service commits after a record's effects are applied
        "auto_offset_reset": "earliest",
        "max_poll_records": max_batch,
        # Kafka's 500 ms default lets a broker hold a fetch that long before answering; the
        # embedded broker does, so a short wait is what keeps signal-to-callback latency low.
        "fetch_max_wait_ms": fetch_max_wait_ms,
    }
