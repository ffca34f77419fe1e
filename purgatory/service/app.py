"""The composition root (service layer): builds the stages, connects them, runs them.

An input crosses the stages in one direction (``docs/architecture.md`` tells both paths hop by
hop): ingress (the Kafka :class:`~purgatory.service.ingress.intake.Intake`, the HTTP routes)
hands it to the :class:`~purgatory.service.ingress.flow.Flow`, which has the
:class:`~purgatory.service.dispatch.dispatcher.Dispatcher` decide, gives what it decided to the
delivery mode's ``release`` (journaled first, :mod:`purgatory.service.journal.modes`), and wakes
the reaper; the outbox sends each outcome, and its acknowledgement fans out (``acks``). Each
stage is an attribute of :class:`Service`, so a test can build the service over any
:class:`~purgatory.service.kafka.transport.Transport` (the in-memory fake included) and drive or
inspect one stage alone.

Before anything starts, the topics keyed by scope must share one partition count, and while
the service runs a change of one stops its inputs (:mod:`purgatory.service.ownership.layout`).

Shutdown (SIGTERM, SIGINT, or ``stop`` in tests): not ready; in group mode, the partitions move
to warm next owners first, served here meanwhile (``hand_over_ms``); then, within
``shutdown_grace_ms``, HTTP answers what is in flight (a long poll at once) and takes nothing
new; the consumer reads nothing more but stays in the group; the other inputs stop; what is
due is decided, the journal flushed, everything decided delivered, committed and marked; then
the consumer leaves the group. A stop out of time raises a ``TransportError`` naming what was
left and when each phase ended (the process exits 1), never silently.
"""

from __future__ import annotations

import functools
import random
import signal as signals
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import trio

from purgatory._core import TransportError, UsageError
from purgatory.service.dispatch.dispatcher import Dispatcher
from purgatory.service.dispatch.follow import Follower, FollowerConfig
from purgatory.service.dispatch.reads import Reads
from purgatory.service.dispatch.reply_to import ReplyToPolicy
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.dispatch.waiters import Waiters
from purgatory.service.egress.acknowledgements import Acknowledgements
from purgatory.service.egress.outbox import Outbox
from purgatory.service.ingress.flow import Flow
from purgatory.service.ingress.http.app import HttpConfig, build_app
from purgatory.service.ingress.http.auth import Authenticator
from purgatory.service.ingress.http.openapi import load_openapi
from purgatory.service.ingress.http.server import serve_app, server_config
from purgatory.service.ingress.intake import Intake
from purgatory.service.journal.modes import Over, delivery_mode, own_topics
from purgatory.service.kafka.clients import KafkaTransport
from purgatory.service.kafka.transport import (
    LogReader,
    RecordSink,
    RecordSource,
    Transactions,
    Transport,
)
from purgatory.service.ops.overview import Overview
from purgatory.service.ops.readiness import Readiness
from purgatory.service.ops.recent import Recent
from purgatory.service.ownership.forward import Forwarder, new_forwarder
from purgatory.service.ownership.layout import TopicLayout
from purgatory.service.ownership.life import LifeTable
from purgatory.service.ownership.owners import owners_for
from purgatory.service.settings import Settings
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.metrics import Metrics
from purgatory.service.telemetry.stop_phases import StopPhases
from reaper import Clock, CompletionExecutor

__all__ = ["Service", "kafka_transport", "run_service", "topics_of"]

_log = get_logger()

#: Every topic the service reads or writes (reply_to topics aside).
topics_of = own_topics


async def _stop_on_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signals.SIGTERM, signals.SIGINT) as received:
        async for _ in received:
            stop.set()
            return


def kafka_transport(settings: Settings) -> KafkaTransport:
    """The kafka-python transport configured by ``settings``, reading the changelog as its
    delivery mode does."""
    mode = delivery_mode(settings)
    return KafkaTransport.from_settings(settings, read_committed=mode.read_committed)


@dataclass
class Service:
    """The service's parts over one source and one sink, wired; :meth:`run` runs them.

    Args:
        settings: the configuration.
        clock: the time source.
        source: where requests and signals come from.
        sink: where callbacks, dead letters and the journal go.
        reader: reads the changelog at restore (None: partitions start empty; required with
            ``settings.journal``).
        transactions: the partitions' transactional producers (required with transactional
            delivery).
    """

    settings: Settings
    clock: Clock
    source: RecordSource
    sink: RecordSink
    reader: LogReader | None = None
    transactions: Transactions | None = None
    metrics: Metrics = field(default_factory=Metrics)
    jitter: random.Random = field(default_factory=random.Random)  # of the back-off after a fence
    stop_phases: StopPhases = field(default_factory=StopPhases)

    def __post_init__(self) -> None:
        settings, clock, source = self.settings, self.clock, self.source
        if settings.journal and self.reader is None:
            raise UsageError("a journaled service needs a reader of the changelog")
        self.input_topics = inputs = (settings.topic_requests, settings.topic_signals)
        outputs = (settings.topic_callbacks, settings.topic_dead_letters)
        self.metrics.expect_dead_letters(inputs)
        self.metrics.expect_records(consumed=inputs, produced=outputs)
        self.metrics.expect_dead_letters(outputs[:1], reasons=("undeliverable",))
        self.executor = CompletionExecutor(clock, capacity=settings.executor_capacity)
        self.recent = Recent(clock.now_ms)
        # The stages, in the order an outcome crosses them: dispatch, journal, egress, acks.
        self.table, self.dispatcher, self.reads = self._build_dispatch()
        self.acks = Acknowledgements()
        self.acks.listen(self.reads.delivered)
        self.acks.listen(self.recent.outcome)
        self.outbox = self._build_outbox()
        journal = delivery_mode(settings).journal(
            Over(self.sink, self.transactions, self.outbox, self.table.acked, self._fenced)
        )
        self.changelog, self.gate, self.release = journal.changelog, journal.gate, journal.release
        if self.changelog is not None:
            self.table.journals = self.changelog.journal_for
        self.flow = Flow(
            self.dispatcher,
            self.release,
            clock,
            egress=self.outbox,
            max_sleep_ms=settings.reaper_max_sleep_ms,
        )
        self.reaper = self.flow.reaper
        self.follower = self._build_follower()
        source.on_revoke(self.follower.hand_over)
        # Who owns which partition (static ordinals, or the group's), and a forwarder to it.
        self.owners = owners_for(settings, source, self.table.partitions)
        self.forwarder: Forwarder | None = None
        if self.owners is not None:
            self.forwarder = new_forwarder(me=self.owners.me, wait_ms=settings.journal_wait_ms)
        self.layout = TopicLayout(settings, source, self.reader, on_change=self.table.stop_inputs)
        self.status = Readiness(self.follower, self.table, self.layout, self.changelog)
        self.metrics.bind(
            engines=self.table,
            executor=self.executor,
            reaper=self.reaper,
            outbox=self.outbox,
            source=source,
            status=self.status,
            journal=self.changelog,
        )
        self.metrics.bind_layout(self.layout)
        self.overview = Overview(self.table, clock=clock, status=self.status, recent=self.recent)
        self.http_config = self._build_http_config()
        self.app = build_app(self, self.http_config)
        self.hypercorn = server_config(
            f"{settings.http_host}:{settings.http_port}",
            max_wait_ms=settings.max_wait_ms,
            graceful_timeout_s=settings.shutdown_grace_ms / 1000,
        )

    def _build_dispatch(self) -> tuple[PartitionTable, Dispatcher, Reads]:
        settings = self.settings
        self.life = LifeTable(self.jitter)
        table = PartitionTable(
            settings.to_engine_config(),
            # Checked against the other topics' when the service runs (TopicLayout.check).
            partitions=self.source.partition_count(settings.topic_requests),
            life=self.life,
            max_pending_per_client=settings.max_pending_per_client,
            max_pending_bytes_per_client=settings.max_pending_bytes_per_client,
            max_memory_bytes=settings.max_memory_bytes,
        )
        waiters = Waiters()
        dispatcher = Dispatcher(
            table,
            waiters,
            now_ms=self.clock.now_ms,
            max_deadline_ahead_ms=settings.max_deadline_ahead_ms,
            metrics=self.metrics,
            reply_to=ReplyToPolicy.from_settings(settings),
        )
        return table, dispatcher, Reads(table, waiters)

    def _build_outbox(self) -> Outbox:
        settings = self.settings
        return Outbox(
            self.sink,
            self.executor,
            self.clock,
            callbacks_topic=settings.topic_callbacks,
            dead_letters_topic=settings.topic_dead_letters,
            max_record_bytes=settings.max_record_bytes,
            commit=self.source.commit,
            on_delivered=self.acks.delivered,
            on_dead_lettered=self.recent.dead_letter,
            metrics=self.metrics,
            reply_to_timeout_ms=settings.reply_to_timeout_ms,
        )

    def _build_follower(self) -> Follower:
        """The owner of every partition's life here: taken, restored, served, fenced, handed
        over (:mod:`purgatory.service.dispatch.follow`)."""
        settings = self.settings
        return Follower(
            self.source,
            self.dispatcher,
            self.reader if settings.journal else None,
            changelog=self.changelog,
            gate=self.gate,
            outbox=self.outbox,
            release=self.release,
            metrics=self.metrics,
            clock=self.clock,
            config=FollowerConfig.from_settings(settings),
            table=self.life,
            reaper=self.reaper,
        )

    def _fenced(self, partition: int) -> None:
        # Late-bound: the journal is built before the follower it tells.
        self.follower.fenced(partition)

    def _build_http_config(self) -> HttpConfig:
        settings = self.settings
        return HttpConfig(
            limits=settings.to_limits(),
            max_request_bytes=settings.max_request_bytes,
            max_batch=settings.max_batch,
            max_wait_ms=settings.max_wait_ms,
            authenticator=Authenticator(settings.client_tokens()),
            status=self.status,
            metrics=self.metrics,
            openapi=load_openapi(),
            forwarder=self.forwarder,
            owners=self.owners,
            overview=self.overview,
        )

    async def run(
        self,
        stop: trio.Event,
        *,
        own_signals: bool = False,
        serve_http: bool = True,
        task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until ``stop`` (or SIGTERM/SIGINT with ``own_signals``), then shut down.

        ``serve_http=False`` runs everything but the HTTP server (tests of the Kafka path).

        Raises:
            ConfigError: the topics keyed by scope do not all have one partition count (or
                not ``PURGATORY_TOPIC_PARTITIONS``'s): nothing is started.
            TransportError: the stop ran out of ``shutdown_grace_ms`` (the message says where).
        """
        await self.layout.check()  # before anything starts: a ConfigError refuses the start
        async with trio.open_nursery() as nursery:
            if own_signals:
                nursery.start_soon(_stop_on_signals, stop)
            done = await self._start_outputs(nursery)
            ends_at = await self._serve_inputs(stop, serve_http=serve_http, task_status=task_status)
            due = await self._drain(nursery, done, ends_at)
        delivered = self.outbox.statistics().delivered
        phases = self.stop_phases.seconds()
        _log.info("service_stopped", expired_at_stop=due, delivered=delivered, **phases)

    async def _start_outputs(self, nursery: trio.Nursery) -> _Outputs:
        """Start what delivers (the completion executor, the outbox, the journal's writer),
        each marking its event when it ends."""
        done = _Outputs(trio.Event(), trio.Event())

        async def run_until_done(
            part: Any, ended: trio.Event, *, task_status: trio.TaskStatus[None]
        ) -> None:
            try:
                await part.run(task_status=task_status)
            finally:
                ended.set()

        await nursery.start(self.executor.run)
        await nursery.start(run_until_done, self.outbox, done.outbox)
        if self.changelog is not None:
            await nursery.start(run_until_done, self.changelog, done.changelog)
        else:
            done.changelog.set()
        return done

    async def _serve_inputs(
        self, stop: trio.Event, *, serve_http: bool, task_status: trio.TaskStatus[list[str]]
    ) -> float:
        """Take inputs (the reaper, the assignment, the layout watch, the intake, HTTP) until
        ``stop``, ready once every partition held is restored; then stop them as the module
        docstring says. Returns when the whole stop must be over (trio time)."""
        http_stopped, http_done = trio.Event(), trio.Event()
        async with trio.open_nursery() as inputs:
            await inputs.start(self.reaper.run)
            inputs.start_soon(self.follower.run)
            inputs.start_soon(self.layout.run)
            inputs.start_soon(self._intake().run)
            bound: list[str] = []
            if serve_http:
                serving = functools.partial(serve_app, self.app, self.hypercorn)
                bound = await inputs.start(serving, http_done, http_stopped)
            else:
                http_done.set()
            # HTTP answers meanwhile: /readyz 503, the restoring partitions' inputs 503.
            while not self.follower.caught_up() and not stop.is_set():
                await trio.sleep(0.01)
            self.status.started = True
            _log.info("service_ready", http=bound)
            self.http_config.authenticator.warn_if_open(bound)
            task_status.started(bound)
            await stop.wait()
            self.status.started = False
            _log.info("service_stopping")
            await self.follower.leave(within_s=self.settings.hand_over_ms / 1000)
            ends_at = self.stop_phases.begin(self.settings.shutdown_grace_ms / 1000)
            http_stopped.set()
            self.reads.waiters.release()
            with trio.move_on_at(ends_at):
                await http_done.wait()
            self.stop_phases.end("http")
            self.source.stop_reading()
            inputs.cancel_scope.cancel()
        self.stop_phases.end("inputs")
        return ends_at

    def _intake(self) -> Intake:
        settings = self.settings
        return Intake(
            self.source,
            self.flow,
            self.release,
            self.gate,
            requests_topic=settings.topic_requests,
            signals_topic=settings.topic_signals,
            limits=settings.to_limits(),
            egress=self.outbox,
            metrics=self.metrics,
        )

    async def _drain(self, nursery: trio.Nursery, done: _Outputs, ends_at: float) -> int:
        """The inputs are stopped: decide what is due, deliver everything decided by ``ends_at``
        (or raise ``TransportError``); how many expired at the stop."""
        grace_s = self.settings.shutdown_grace_ms / 1000
        due = self.flow.catch_up(self.clock.now_ms())
        with trio.move_on_at(ends_at):
            if self.changelog is not None:
                self.changelog.close()
                await done.changelog.wait()
            self.stop_phases.end("journal")
            self.outbox.close()
            await done.outbox.wait()
        if not done.outbox.is_set():
            left = self.outbox.statistics()
            self.outbox.close()  # a hand-over at the consumer's close waits for nothing of it
            nursery.cancel_scope.cancel()
            unsent = left.queued + left.in_flight
            what = f"{unsent} record(s) decided before the stop were not acknowledged"
            what = what if unsent else "the last input offsets were not committed"
            what = what if done.changelog.is_set() else "the journal was not flushed"
            raise TransportError(
                f"shutdown: {what} within shutdown_grace_ms ({self.settings.shutdown_grace_ms}"
                f" ms); phases ended at {self.stop_phases.seconds()}"
            )
        if self.changelog is not None:
            with trio.move_on_after(grace_s):
                await self.changelog.mark_delivered(self.table.serving())
        await self.executor.aclose()
        if self.forwarder is not None:
            await self.forwarder.aclose()
        return due


class _Outputs(NamedTuple):
    """Set when each output stage has ended."""

    outbox: trio.Event
    changelog: trio.Event


async def run_service(
    settings: Settings,
    *,
    clock: Clock | None = None,
    stop: trio.Event | None = None,
    transport: Transport | None = None,
    metrics: Metrics | None = None,
    checked: bool = False,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the service until SIGTERM/SIGINT (or ``stop``), then shut down gracefully.

    Args:
        settings: the configuration.
        clock: the time source (epoch ms from the wall clock by default).
        stop: set it to stop (tests); otherwise SIGTERM and SIGINT stop the service.
        transport: the broker seam (kafka-python by default; an in-memory fake in tests).
        metrics: the metrics to serve (new ones by default; ``serve`` adds the snapshotter's).
        checked: the broker was checked for the delivery mode already (``serve`` does it
            before it starts the snapshotter).
        task_status: receives the HTTP addresses once the service is ready.

    Raises:
        ConfigError: the topics' partition counts disagree (see
        :mod:`purgatory.service.ownership.layout`).
        TransportError: the broker cannot be reached, or records decided before the stop were
            not acknowledged within ``shutdown_grace_ms``.
    """
    clock = clock if clock is not None else Clock.from_wall_clock()
    own_signals = stop is None
    stop = stop if stop is not None else trio.Event()
    transport = transport if transport is not None else kafka_transport(settings)
    inputs = [settings.topic_requests, settings.topic_signals]
    static = settings.kafka_static_partitions
    assignment = [(t, p) for t in inputs for p in static] if static else None
    mode = delivery_mode(settings)
    if not checked:  # before anything starts: a broker the mode cannot use
        await mode.check(transport)
    async with (
        transport.open_sink() as sink,
        transport.open_reader(read_committed=mode.read_committed) as reader,
        transport.open_source(
            topics=inputs, group_id=settings.kafka_group_id, assignment=assignment
        ) as source,
        mode.transactions(transport, source) as transactions,
    ):
        metrics = metrics if metrics is not None else Metrics()
        service = Service(
            settings, clock, source, sink, reader, transactions=transactions, metrics=metrics
        )
        await service.run(stop, own_signals=own_signals, task_status=task_status)
    _log.info("service_closed")
