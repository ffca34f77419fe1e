"""The composition root (service layer): builds the stages, connects them, runs them.

A signal or a registration crosses the stages in one direction::

    ingress                dispatch              journal               egress
    Kafka intake --+                                                  Outbox --> callbacks,
    HTTP routes ---+--> ServiceState ------> Release ----------------->   dead letters,
                        (an engine per       (held until the          |   offset commits
    reaper: the next     partition; its      Changelog acknowledged   v
      deadline --------> entries to the      the entries that      Acknowledgements --> waiters,
                         Changelog)          decided it)              recent outcomes

Two objects carry the flows between stages: every decided outcome goes to ``release``
(:mod:`purgatory.service.journal.release`: journaled first, then the outbox), and every
acknowledged one to ``acks`` (:mod:`purgatory.service.egress.acknowledgements`). Each stage is
an attribute of :class:`Service` (``state``, ``changelog``, ``release``, ``outbox``, ``acks``,
``executor``, ``reaper``, ``app``; ``recent`` and ``overview`` for the operator's page), so a test
can build the service over any :class:`~purgatory.service.kafka.transport.Transport` (the
in-memory fake included) and drive or inspect one stage alone. ``docs/architecture.md`` tells
both paths hop by hop.

Before anything starts, the topics keyed by scope must share one partition count, and while
the service runs a change of one stops its inputs (:mod:`purgatory.service.ownership.layout`).

Shutdown (SIGTERM, SIGINT, or the ``stop`` event in tests): stop the inputs (Kafka intake, HTTP,
the reaper); decide every expiration already due; flush the journal; close the outbox and let it
send, await the acknowledgement of, and commit everything decided before the stop, within
``shutdown_grace_ms``; then close the producer. A stop that could not deliver everything in time
raises :class:`~purgatory._core.TransportError` naming how many records were left (the process
exits 1), never silently.
"""

from __future__ import annotations

import contextlib
import functools
import random
import signal as signals
from dataclasses import dataclass, field
from typing import Any

import trio
from hypercorn.trio import serve

from purgatory._codec import Limits
from purgatory._core import Outcome, TransportError, UsageError
from purgatory.service.dispatch.follow import Follower, FollowerConfig
from purgatory.service.dispatch.partitions import ServiceState
from purgatory.service.dispatch.reply_to import ReplyToPolicy
from purgatory.service.egress.acknowledgements import Acknowledgements
from purgatory.service.egress.outbox import Outbox
from purgatory.service.ingress.http.app import HttpConfig, build_app
from purgatory.service.ingress.http.auth import Authenticator
from purgatory.service.ingress.http.openapi import load_openapi
from purgatory.service.ingress.http.server import server_config
from purgatory.service.ingress.intake import run_intake
from purgatory.service.journal.changelog import Changelog, Gate, NoJournal
from purgatory.service.journal.release import release_for
from purgatory.service.journal.transactional import TransactionalChangelog
from purgatory.service.kafka.clients import KafkaTransport
from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.transactions import check_transactions
from purgatory.service.kafka.transport import (
    LogReader,
    RecordSink,
    RecordSource,
    Transactions,
    Transport,
)
from purgatory.service.ops.overview import Overview
from purgatory.service.ops.recent import Recent
from purgatory.service.ownership.forward import Forwarder, new_forwarder
from purgatory.service.ownership.layout import TopicLayout
from purgatory.service.ownership.life import LifeTable, PartitionState
from purgatory.service.ownership.owners import StaticOwners
from purgatory.service.settings import Delivery, Settings
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.metrics import Metrics, PartitionStatus
from reaper import Clock, CompletionExecutor, Reaper

__all__ = ["Service", "kafka_config", "kafka_transport", "limits_of", "run_service", "topics_of"]

_log = get_logger()


def limits_of(settings: Settings) -> Limits:
    """The record limits configured in ``settings``."""
    return Limits(
        max_keys_per_operation=settings.max_keys_per_operation,
        max_key_bytes=settings.max_key_bytes,
        max_scope_bytes=settings.max_scope_bytes,
        max_op_id_bytes=settings.max_op_id_bytes,
        max_payload_bytes=settings.max_payload_bytes,
        max_record_bytes=settings.max_record_bytes,
    )


def kafka_config(settings: Settings) -> KafkaClientConfig:
    """The Kafka client settings (TLS and SASL included) from ``settings``."""
    return KafkaClientConfig(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        client_id=settings.kafka_client_id,
        security_protocol=settings.kafka_security_protocol,
        sasl_mechanism=settings.kafka_sasl_mechanism,
        sasl_username=settings.kafka_sasl_username,
        sasl_password=settings.kafka_sasl_password,
        ssl_cafile=settings.kafka_ssl_cafile,
        ssl_certfile=settings.kafka_ssl_certfile,
        ssl_keyfile=settings.kafka_ssl_keyfile,
    )


async def _stop_on_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signals.SIGTERM, signals.SIGINT) as received:
        async for _ in received:
            stop.set()
            return


def topics_of(settings: Settings) -> tuple[str, ...]:
    """Every topic the service reads or writes (reply_to topics aside)."""
    return (
        settings.topic_requests,
        settings.topic_signals,
        settings.topic_callbacks,
        settings.topic_dead_letters,
        settings.topic_changelog,
        settings.topic_snapshots,
    )


def kafka_transport(settings: Settings) -> KafkaTransport:
    """The kafka-python transport configured by ``settings``."""
    return KafkaTransport(
        kafka_config(settings),
        linger_ms=settings.kafka_linger_ms,
        max_request_bytes=settings.max_record_bytes + 4096,
        fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
        advertised_url=settings.advertised_url,
        group_instance_id=settings.kafka_group_instance_id,
        close_timeout_ms=settings.shutdown_grace_ms,
        read_committed=settings.delivery is Delivery.TRANSACTIONAL,
        transaction_timeout_ms=settings.transaction_timeout_ms,
    )


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
    ready: bool = False
    jitter: random.Random = field(default_factory=random.Random)  # of the back-off after a fence

    def __post_init__(self) -> None:
        settings, clock = self.settings, self.clock
        if settings.journal and self.reader is None:
            raise UsageError("a journaled service needs a reader of the changelog")
        if settings.delivery is Delivery.TRANSACTIONAL and self.transactions is None:
            raise UsageError("a transactional service needs its transactional producers")
        self.input_topics = (settings.topic_requests, settings.topic_signals)
        # Checked against the other topics' when the service runs (TopicLayout.check).
        partitions = self.source.partition_count(settings.topic_requests)
        self._expect_metrics()
        self.executor = CompletionExecutor(clock, capacity=settings.executor_capacity)
        self.recent = Recent(clock.now_ms)
        # The stages, in the order a decided outcome crosses them: the partitions' engines
        # decide (dispatch), the journal holds each outcome until its entries are durable
        # (release), the outbox sends it, and its acknowledgement fans out.
        self.acks = Acknowledgements()
        self.outbox = self._build_outbox()
        self.changelog = self._build_changelog()
        self.gate: Gate = self.changelog if self.changelog is not None else NoJournal()
        self.release = release_for(self.changelog, self.outbox)
        self.life = LifeTable(self.jitter)
        self.state = self._build_state(partitions)
        self.acks.listen(self.state.delivered)
        self.acks.listen(self.recent.outcome)
        self.follower = self._build_follower()
        self.source.on_revoke(self.follower.hand_over)
        self.owners, self.forwarder = self._build_ownership(partitions)
        self.reaper = Reaper(
            self.state, self._room, clock, max_sleep_ms=settings.reaper_max_sleep_ms
        )
        self.layout = TopicLayout(
            settings, self.source, self.reader, on_change=self.state.stop_inputs
        )
        self._bind_metrics()
        self.overview = Overview(
            self.state, now_ms=clock.now_ms, readiness=self.readiness, recent=self.recent
        )
        self.http_config = self._build_http_config()
        self.app = build_app(self.state, self.http_config, self.gate)

    @property
    def fences(self) -> dict[int, int]:
        """Partition -> times it was fenced (another writer appended to its changelog)."""
        return self.follower.fences()

    def _expect_metrics(self) -> None:
        settings = self.settings
        inputs, outputs = self.input_topics, (settings.topic_callbacks, settings.topic_dead_letters)
        self.metrics.expect_dead_letters(inputs)
        self.metrics.expect_records(consumed=inputs, produced=outputs)
        self.metrics.expect_dead_letters((settings.topic_callbacks,), reasons=("undeliverable",))

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

    def _build_changelog(self) -> Changelog | None:
        settings = self.settings
        if not settings.journal:
            return None
        common: dict[str, Any] = {
            "topic": settings.topic_changelog,
            "max_record_bytes": settings.max_record_bytes,
            "delivered": self._acked,
            "on_fenced": self._fenced,
            "wait_ms": settings.journal_wait_ms,
        }
        if self.transactions is not None and settings.delivery is Delivery.TRANSACTIONAL:
            return TransactionalChangelog(
                self.transactions,
                undeliverable=self.outbox.undeliverable,
                own_topics=topics_of(settings),
                **common,
            )
        return Changelog(self.sink, **common)

    def _build_state(self, partitions: int) -> ServiceState:
        settings = self.settings
        return ServiceState(
            settings.to_engine_config(),
            partitions=partitions,
            now_ms=self.clock.now_ms,
            max_deadline_ahead_ms=settings.max_deadline_ahead_ms,
            wake=self._wake,
            wake_now=self._wake_now,
            metrics=self.metrics,
            deliver=self.release.decided,
            journal_for=self.changelog.journal_for if self.changelog is not None else None,
            resend=self.release.resent,
            reply_to=ReplyToPolicy.from_settings(settings),
            max_pending_per_client=settings.max_pending_per_client,
            max_pending_bytes_per_client=settings.max_pending_bytes_per_client,
            max_memory_bytes=settings.max_memory_bytes,
            life=self.life,
        )

    def _build_follower(self) -> Follower:
        """The owner of every partition's life here: taken, restored, served, fenced, handed
        over (:mod:`purgatory.service.dispatch.follow`)."""
        settings = self.settings
        config = FollowerConfig(
            changelog_topic=settings.topic_changelog,
            snapshots_topic=settings.topic_snapshots if settings.snapshot_interval_ms else None,
            input_topics=self.input_topics,
            grace_s=settings.shutdown_grace_ms / 1000,
        )
        return Follower(
            self.source,
            self.state,
            self.reader if settings.journal else None,
            changelog=self.changelog,
            gate=self.gate,
            outbox=self.outbox,
            release=self.release,
            metrics=self.metrics,
            clock=self.clock,
            config=config,
            table=self.life,
        )

    def _build_ownership(self, partitions: int) -> tuple[StaticOwners | None, Forwarder | None]:
        """Who owns which partition (static ordinals), and the forwarder to the owner."""
        settings = self.settings
        if settings.peer_urls is not None and settings.replica_ordinal is not None:
            owners = StaticOwners(settings.peer_urls, settings.replica_ordinal, partitions)
            if settings.kafka_static_partitions is None or sorted(
                settings.kafka_static_partitions
            ) != list(owners.own()):
                raise UsageError(
                    f"PURGATORY_KAFKA_STATIC_PARTITIONS must be the partitions replica"
                    f" {settings.replica_ordinal} of {len(settings.peer_urls)} owns by"
                    f" PURGATORY_PEER_URLS ({','.join(map(str, owners.own()))}), got"
                    f" {settings.kafka_static_partitions}"
                )
            return owners, new_forwarder(
                me=str(settings.replica_ordinal), wait_ms=settings.journal_wait_ms
            )
        if settings.advertised_url is not None and settings.kafka_static_partitions is None:
            return None, new_forwarder(me=settings.advertised_url, wait_ms=settings.journal_wait_ms)
        return None, None

    def _bind_metrics(self) -> None:
        self.metrics.bind(
            engine_stats=self.state.engine_statistics,
            executor_stats=self.executor.statistics,
            reaper_stats=self.reaper.statistics,
            outbox_stats=self.outbox.statistics,
            consumer_lag=self.source.lag,
            ready=self.is_ready,
            partitions=self.partition_status,
            journal=self.changelog.statistics if self.changelog is not None else None,
        )
        self.metrics.bind_layout(self.layout.statistics)

    def _build_http_config(self) -> HttpConfig:
        settings = self.settings
        return HttpConfig(
            limits=limits_of(settings),
            max_request_bytes=settings.max_request_bytes,
            max_batch=settings.max_batch,
            max_wait_ms=settings.max_wait_ms,
            authenticator=Authenticator(settings.client_tokens()),
            ready=self.is_ready,
            readiness=self.readiness,
            metrics=self.metrics.render,
            openapi=load_openapi(),
            observe=self.metrics.http_request,
            count_registration=self.metrics.registration,
            forwarder=self.forwarder,
            owner_url=self._owner_url,
            overview=self.overview.snapshot,
        )

    def is_ready(self) -> bool:
        """Serving, taking inputs (the topics' partition counts did not change), holding
        partitions (a group may not have assigned any yet), and every one of them restored."""
        return (
            self.ready
            and self.state.inputs_stopped is None
            and bool(self.follower.held())
            and self.follower.caught_up()
        )

    def partition_status(self) -> list[PartitionStatus]:
        """The input partitions held now, each in its state (``/readyz``, the metrics)."""
        now = trio.current_time()
        statuses = []
        for life in self.life.held():
            progress = self.follower.progress.get(life.partition)
            records, seconds = 0, 0.0
            if progress is not None:
                records = progress.records
                done = progress.seconds
                seconds = done if done is not None else now - progress.started_s
            statuses.append(
                PartitionStatus(
                    life.partition,
                    life.state is PartitionState.SERVING,
                    records,
                    seconds,
                    state=life.state.value,
                    fenced=life.fences,
                    reason=life.reason if life.state is not PartitionState.SERVING else None,
                )
            )
        return statuses

    def readiness(self) -> dict[str, object]:
        """``/readyz``: whether the service serves, each held partition's restore, the topics'
        partition counts, once a count changed why no input is taken, and the journal's state
        (a stalled journal does not make the replica unready: see :meth:`journal_status`)."""
        layout = self.layout.statistics()
        return {
            "ready": self.is_ready(),
            "journal": self.journal_status(),
            "topics": dict(layout.counts),
            "inputs_stopped": layout.inputs_stopped,
            "partitions": {
                str(s.partition): {
                    "state": s.state,
                    "restore_records": s.records,
                    "restore_seconds": round(s.seconds, 3),
                    "fenced": s.fenced,
                    **({"reason": s.reason} if s.reason else {}),
                }
                for s in self.partition_status()
            },
        }

    def journal_status(self) -> dict[str, object]:
        """The journal in ``/readyz``: ``ok``, ``stalled`` (its oldest unacknowledged entry has
        waited ``PURGATORY_JOURNAL_WAIT_MS`` or longer) or ``off``, and that wait in seconds.

        A stalled journal leaves the replica ready (``/readyz`` 200): the broker is usually
        unreachable for every replica at once, and a failing readiness probe would take them
        all out of the Service, turning the writes' 503 with Retry-After, which clients retry,
        into refused connections; and no other replica could take this one's partitions
        anyway. The body and ``purgatory_journal_stalled`` say it instead.
        """
        if self.changelog is None:
            return {"state": "off", "unacknowledged_seconds": 0.0}
        stats = self.changelog.statistics()
        return {
            "state": "stalled" if stats.stalled else "ok",
            "unacknowledged_seconds": round(stats.unacknowledged_s, 3),
        }

    def _owner_url(self, partition: int) -> str | None:
        """Where to forward a request for ``partition`` (None: nowhere)."""
        if self.owners is not None:
            return self.owners.url_of(partition)
        url = self.source.owner_urls().get(partition)
        return None if url is None or url == self.settings.advertised_url else url.rstrip("/")

    # Late-bound: the changelog and the state are built before the parts these reach.
    def _acked(self, partition: int) -> int:
        return self.state.acked(partition)

    def _fenced(self, partition: int) -> None:
        self.follower.fenced(partition)

    def _wake(self, deadline_ms: int) -> None:
        self.reaper.wake_if_earlier(deadline_ms)

    def _wake_now(self) -> None:
        self.reaper.wake()

    async def _room(self, _expired: list[Outcome]) -> None:
        await self.outbox.wait_for_room()  # the state already queued them

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
            TransportError: records decided before the stop were not acknowledged within
                ``shutdown_grace_ms``.
        """
        await self.layout.check()  # before anything starts: a ConfigError refuses the start
        async with trio.open_nursery() as nursery:
            if own_signals:
                nursery.start_soon(_stop_on_signals, stop)
            done = await self._start_outputs(nursery)
            await self._serve_inputs(stop, serve_http=serve_http, task_status=task_status)
            due = await self._drain(nursery, done)
        stats = self.outbox.statistics()
        _log.info("service_stopped", expired_at_stop=due, delivered=stats.delivered)

    async def _start_outputs(self, nursery: trio.Nursery) -> _Outputs:
        """Start what delivers (the completion executor, the outbox, the journal's writer),
        each marking its event when it ends."""
        done = _Outputs(outbox=trio.Event(), changelog=trio.Event())

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
    ) -> None:
        """Take inputs (the reaper, the assignment, the layout watch, the intake, HTTP) until
        ``stop``; ready (and started, for the caller) once every partition held is restored."""
        settings = self.settings
        http_stopped = trio.Event()
        async with trio.open_nursery() as inputs:
            await inputs.start(self.reaper.run)
            inputs.start_soon(self.follower.run)
            inputs.start_soon(self.layout.run)
            inputs.start_soon(self._run_intake)
            bound: list[str] = []
            if serve_http:
                hypercorn = server_config(
                    f"{settings.http_host}:{settings.http_port}",
                    max_wait_ms=settings.max_wait_ms,
                    graceful_timeout_s=settings.shutdown_grace_ms / 1000,
                )
                asgi: Any = self.app  # hypercorn's framework type does not name Starlette
                serving = functools.partial(
                    serve, asgi, hypercorn, shutdown_trigger=http_stopped.wait
                )
                bound = await inputs.start(serving)
            # HTTP answers meanwhile: /readyz 503, the restoring partitions' inputs 503.
            while not self.follower.caught_up() and not stop.is_set():
                await trio.sleep(0.01)
            self.ready = True
            _log.info("service_ready", http=bound)
            if not settings.client_tokens():
                _log.warning(
                    "api_open",
                    http=bound,
                    detail="no API token is set: anyone who reaches these addresses can"
                    " register and cancel any operation",
                )
            task_status.started(bound)
            await stop.wait()
            self.ready = False
            _log.info("service_stopping")
            http_stopped.set()
            inputs.cancel_scope.cancel()

    async def _run_intake(self) -> None:
        settings = self.settings
        await run_intake(
            self.source,
            self.state,
            self.release,
            requests_topic=settings.topic_requests,
            signals_topic=settings.topic_signals,
            limits=limits_of(settings),
            metrics=self.metrics,
            gate=self.gate,
            room=self.outbox.wait_for_room,
        )

    async def _drain(self, nursery: trio.Nursery, done: _Outputs) -> int:
        """The inputs are stopped: decide what is due, then deliver everything decided, within
        ``shutdown_grace_ms``; how many expired at the stop.

        Raises:
            TransportError: what was decided was not all acknowledged in time.
        """
        grace_s = self.settings.shutdown_grace_ms / 1000
        due = self.state.catch_up(self.clock.now_ms())
        with trio.move_on_after(grace_s):
            if self.changelog is not None:
                self.changelog.close()
                await done.changelog.wait()
            self.outbox.close()
            await done.outbox.wait()
        if not done.outbox.is_set():
            left = self.outbox.statistics()
            nursery.cancel_scope.cancel()
            raise TransportError(
                f"shutdown: {left.queued + left.in_flight} record(s) decided before the stop"
                f" were not acknowledged within shutdown_grace_ms"
                f" ({self.settings.shutdown_grace_ms} ms)"
            )
        if self.changelog is not None:
            with trio.move_on_after(grace_s):
                await self.changelog.mark_delivered(self.state.serving())
        await self.executor.aclose()
        if self.forwarder is not None:
            await self.forwarder.aclose()
        return due


@dataclass(frozen=True, slots=True)
class _Outputs:
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
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the service until SIGTERM/SIGINT (or ``stop``), then shut down gracefully.

    Args:
        settings: the configuration.
        clock: the time source (epoch ms from the wall clock by default).
        stop: set it to stop (tests); otherwise SIGTERM and SIGINT stop the service.
        transport: the broker seam (kafka-python by default; an in-memory fake in tests).
        metrics: the metrics to serve (new ones by default; ``serve`` adds the snapshotter's).
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
    assignment = (
        [
            (t, p)
            for t in (settings.topic_requests, settings.topic_signals)
            for p in settings.kafka_static_partitions
        ]
        if settings.kafka_static_partitions
        else None
    )
    transactional = settings.delivery is Delivery.TRANSACTIONAL
    if transactional and isinstance(transport, KafkaTransport):
        await check_transactions(
            transport.config, transactional_id=f"{settings.kafka_group_id}-probe"
        )
    async with (
        transport.open_sink() as sink,
        transport.open_reader(read_committed=transactional) as reader,
        transport.open_source(
            topics=[settings.topic_requests, settings.topic_signals],
            group_id=settings.kafka_group_id,
            assignment=assignment,
        ) as source,
        contextlib.AsyncExitStack() as stack,
    ):
        transactions = None
        if transactional:
            transactions = await stack.enter_async_context(
                transport.open_transactions(
                    id_prefix=settings.kafka_group_id, group_metadata=source.group_metadata
                )
            )
        metrics = metrics if metrics is not None else Metrics()
        service = Service(
            settings, clock, source, sink, reader, transactions=transactions, metrics=metrics
        )
        await service.run(stop, own_signals=own_signals, task_status=task_status)
    _log.info("service_closed")
