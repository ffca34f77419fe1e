"""The composition root (service layer): one nursery owns every long-running task.

::

    Kafka requests/signals --> intake --+                      +--> callbacks topic (or reply_to)
    HTTP (hypercorn) ------------------+--> ServiceState --> outbox --> executor --> HTTP waiters
                                       |      (engine)        ^                 +--> metrics, logs
    reaper: sleeps to the next bucket -+--> advance_clock ----+ (expirations run on the executor)

Intake applies each consumed record, sends malformed or refused ones to the dead-letter topic
with the reason and the source offset, waits until those dead letters are acknowledged, and only
then commits the batch's offsets: a record is never committed before its effect is applied.

Shutdown (SIGTERM, SIGINT, or the ``stop`` event in tests) follows the design: stop intake
(Kafka and HTTP), let the executor drain what it holds, flush the producer, exit 0.
"""

from __future__ import annotations

import functools
import signal as signals
from collections.abc import Callable
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve

from purgatory._codec import (
    Limits,
    RecordError,
    decode_requests_record,
    decode_signal,
    encode_callback,
    encode_dead_letter,
)
from purgatory._core import Engine, Outcome, OutcomeKind, TimeDomain, UsageError
from purgatory.service._http import HttpConfig, build_app
from purgatory.service._kafka import (
    ConsumedRecord,
    KafkaClientConfig,
    KafkaSink,
    KafkaSource,
    open_kafka_sink,
    open_kafka_source,
)
from purgatory.service._logging import get_logger
from purgatory.service._metrics import Metrics
from purgatory.service._openapi import load_openapi
from purgatory.service._settings import Settings
from purgatory.service._state import ServiceState
from reaper import Clock, CompletionExecutor, Reaper

__all__ = ["kafka_config", "limits_of", "run_service"]

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


async def _intake(
    source: KafkaSource,
    state: ServiceState,
    sink: KafkaSink,
    settings: Settings,
    metrics: Metrics,
) -> None:
    limits = limits_of(settings)
    decoders = {
        settings.topic_requests: decode_requests_record,
        settings.topic_signals: decode_signal,
    }
    async for batch in source.receive:
        offsets: dict[tuple[str, int], int] = {}
        dead = 0
        counts: dict[str, int] = {}
        for record in batch:
            offsets[(record.topic, record.partition)] = record.offset + 1
            counts[record.topic] = counts.get(record.topic, 0) + 1
            reason = _apply(record, state, decoders[record.topic], limits)
            if reason is not None:
                message, field = reason
                await sink.send(
                    settings.topic_dead_letters,
                    record.key,
                    encode_dead_letter(
                        reason=message,
                        field=field,
                        topic=record.topic,
                        partition=record.partition,
                        offset=record.offset,
                        timestamp_ms=record.timestamp_ms,
                        key=record.key,
                        value=record.value,
                    ),
                )
                metrics.dead_lettered(record.topic, "invalid" if field else "refused")
                dead += 1
        for topic, count in counts.items():
            metrics.records_consumed(topic, count)
        if dead:
            await sink.flush()  # dead letters are durable before their offsets are committed
        await source.commit(offsets)


def _apply(
    record: ConsumedRecord,
    state: ServiceState,
    decode: Callable[..., object],
    limits: Limits,
) -> tuple[str, str | None] | None:
    """Apply one consumed record; the (reason, field) to dead-letter it with, or None."""
    try:
        item = decode(record.value if record.value is not None else b"", limits)
        scope = getattr(item, "scope", None)
        if record.key is not None and scope is not None and record.key != scope.encode():
            return ("key: the message key must be the record's scope", "key")
        state.apply(item)  # type: ignore[arg-type]
    except RecordError as exc:
        return (str(exc), exc.field)
    except UsageError as exc:  # a conflict, a limit, a deadline out of range
        _log.warning("record_refused", topic=record.topic, offset=record.offset, error=str(exc))
        return (str(exc), None)
    return None


async def _pump_outbox(
    state: ServiceState, executor: CompletionExecutor, deliver: Callable[[Outcome], object]
) -> None:
    while True:
        outcomes = await state.next_outcomes()
        await executor.submit_batch(
            [(functools.partial(deliver, o), o.outcome_ms) for o in outcomes]
        )


async def _stop_on_signals(stop: trio.Event) -> None:
    with trio.open_signal_receiver(signals.SIGTERM, signals.SIGINT) as received:
        async for _ in received:
            stop.set()
            return


async def run_service(
    settings: Settings,
    *,
    clock: Clock | None = None,
    stop: trio.Event | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the service until SIGTERM/SIGINT (or ``stop``), then shut down gracefully.

    Args:
        settings: the configuration.
        clock: the time source (epoch ms from the wall clock by default).
        stop: set it to stop (tests); otherwise SIGTERM and SIGINT stop the service.
        task_status: receives the HTTP addresses once the service is ready.
    """
    clock = clock if clock is not None else Clock.from_wall_clock()
    own_signals = stop is None
    stop = stop if stop is not None else trio.Event()
    metrics = Metrics()
    metrics.expect_dead_letters((settings.topic_requests, settings.topic_signals))
    executor = CompletionExecutor(clock, capacity=settings.executor_capacity)

    def wake(deadline_ms: int) -> None:
        reaper.wake_if_earlier(deadline_ms)  # bound below: the reaper needs the engine first

    def wake_now() -> None:
        reaper.wake()

    state = ServiceState(
        lambda emit: Engine(settings.to_engine_config(), start_ms=clock.now_ms(), emit=emit),
        now_ms=clock.now_ms,
        max_deadline_ahead_ms=settings.max_deadline_ahead_ms,
        wake=wake,
        wake_now=wake_now,
        metrics=metrics,
    )
    reaper = Reaper(state.engine, executor, clock, max_sleep_ms=settings.reaper_max_sleep_ms)
    ready = False
    kafka = kafka_config(settings)
    async with open_kafka_sink(kafka) as sink:

        async def deliver(outcome: Outcome) -> None:
            topic = outcome.reply_to or settings.topic_callbacks
            try:
                await sink.send(topic, outcome.scope.encode(), encode_callback(outcome))
            except Exception:
                metrics.callback_error()
                raise  # the executor logs it (callback_failed) and goes on
            now_ms = clock.now_ms()
            metrics.records_produced(topic)
            metrics.outcome(outcome, now_ms=now_ms)
            if (
                outcome.outcome is OutcomeKind.EXPIRED
                and outcome.time_domain is TimeDomain.PROCESSING_TIME
            ):
                metrics.reaper_lateness(max(0, now_ms - outcome.deadline_ms))
            state.delivered(outcome)
            _log.debug(
                "operation_" + outcome.outcome.value,
                op_id=outcome.op_id,
                scope=outcome.scope,
                sequence=outcome.sequence,
                late=outcome.late,
            )
            if outcome.outcome is OutcomeKind.EXPIRED and outcome.late:
                _log.warning("operation_expired_late", op_id=outcome.op_id, scope=outcome.scope)

        assignment = (
            [
                (t, p)
                for t in (settings.topic_requests, settings.topic_signals)
                for p in settings.kafka_static_partitions
            ]
            if settings.kafka_static_partitions
            else None
        )
        async with open_kafka_source(
            kafka,
            topics=[settings.topic_requests, settings.topic_signals],
            group_id=settings.kafka_group_id,
            assignment=assignment,
        ) as source:

            def is_ready() -> bool:
                # Serving, and holding partitions to consume (a group may not have assigned any
                # yet, or may have revoked them): only then does the replica see its scopes.
                return ready and bool(source.assignment())

            metrics.bind(
                engine_stats=state.engine.statistics,
                executor_stats=executor.statistics,
                reaper_stats=reaper.statistics,
                consumer_lag=source.lag,
                ready=is_ready,
            )
            app = build_app(
                state,
                HttpConfig(
                    limits=limits_of(settings),
                    max_request_bytes=settings.max_request_bytes,
                    max_batch=settings.max_batch,
                    max_wait_ms=settings.max_wait_ms,
                    api_token=settings.api_token,
                    ready=is_ready,
                    metrics=metrics.render,
                    openapi=load_openapi(),
                    observe=metrics.http_request,
                ),
            )
            hypercorn = HypercornConfig()
            hypercorn.bind = [f"{settings.http_host}:{settings.http_port}"]
            hypercorn.accesslog = None
            hypercorn.graceful_timeout = settings.shutdown_grace_ms / 1000
            http_stopped = trio.Event()
            async with trio.open_nursery() as nursery:
                if own_signals:
                    nursery.start_soon(_stop_on_signals, stop)
                await nursery.start(executor.run)
                async with trio.open_nursery() as inputs:
                    await inputs.start(reaper.run)
                    inputs.start_soon(_pump_outbox, state, executor, deliver)
                    inputs.start_soon(_intake, source, state, sink, settings, metrics)
                    asgi: Any = app  # hypercorn's framework type does not name Starlette
                    bound = await inputs.start(
                        functools.partial(
                            serve, asgi, hypercorn, shutdown_trigger=http_stopped.wait
                        )
                    )
                    ready = True
                    _log.info("service_ready", http=bound, kafka=settings.kafka_bootstrap_servers)
                    task_status.started(bound)
                    await stop.wait()
                    ready = False
                    _log.info("service_stopping")
                    http_stopped.set()
                    inputs.cancel_scope.cancel()
                # Intake, HTTP and the reaper are stopped: deliver what is already decided.
                leftovers = state.take_outcomes()
                await executor.submit_batch(
                    [(functools.partial(deliver, o), o.outcome_ms) for o in leftovers]
                )
                await executor.aclose()
            await sink.flush()
    _log.info("service_stopped")
