"""Transactional producers over kafka-python, one per input partition (service layer: Kafka).

:class:`KafkaTransactions` implements :class:`~purgatory.service.kafka.transport.Transactions`.
Partition ``p``'s producer has the transactional id ``{id_prefix}-{p}``: the same on every
replica and across restarts, so whoever takes the partition next fences whoever had it
(``init_transactions`` bumps the id's epoch; the broker refuses every later call of the older
producer with ``ProducerFencedError``, and aborts what it left open).

Each :meth:`KafkaTransactions.commit` runs one transaction in a worker thread: begin, send every
record, ``send_offsets_to_transaction`` for the source's group, commit. kafka-python's
transactional calls block, so each partition's transaction takes a thread while it runs; the
changelog runs the partitions of one group commit side by side.

The offsets go with the group's id alone, not with the member's generation (KIP-447's group
metadata). The transactional id is the partition's, so the epoch already fences every earlier
owner: the next owner's ``init_transactions`` comes before its restore reads the journal, so a
transaction of an earlier owner is either committed before it (and restored) or refused. A
generation check would add no fence and cost every rollout dearly: each rebalance begins a new
generation, and the broker then refused the offsets of every transaction open across it (the
group's warm moves begin several rebalances per replica that leaves); retried, those
transactions held their partitions' writes for a second or more each time. Measured in the
rollout test, transactional, on one day: 28, 38 and 75 % of the writes answered within 2 s
with the generation, 99.80-99.96 % without.

Failures are sorted for the caller: a fenced producer is let go (``ProducerFencedError``); a
record refused for good (larger than the broker takes, a ``reply_to`` topic that does not exist)
aborts the transaction and says which (``RecordRefusedError``); anything else aborts it and may
succeed if tried again (``TransactionAbortedError``). A producer that cannot even abort is
reported fenced: it is never initialized again under the same engine state (that would fence
the partition's new owner and commit what a stale state decided); the partition is restored
first, and its restore takes the transactional id anew.

:func:`check_transactions` is the start-time probe: two producers of one probe id, the older
must be fenced. Only a definite answer stops the start: a broker that accepts a call of the
older producer (the embedded development broker fences nobody) or answers that it cannot
(transactions unsupported, the id not allowed) fails it with a clear error instead of a silent
downgrade. Weather is waited out: a fresh broker creates and loads its transaction
coordinator's topic on the first transactional call, and until it has, the client times out
or hears "not yet" (coordinator loading, not available, not the coordinator); the probe tries
again after a back-off, logging each wait, and only a broker that never answers within its
bound fails the start, as a transport error.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio
from kafka import KafkaProducer, TopicPartition
from kafka.errors import KafkaError, KafkaTimeoutError
from kafka.structs import OffsetAndMetadata

from purgatory._core import ConfigError, TransportError
from purgatory._core._backoff import Backoff
from purgatory.service.kafka.config import KafkaClientConfig, no_client_metrics, no_topic_creation
from purgatory.service.kafka.partitioner import KeyHashPartitioner
from purgatory.service.kafka.transport import (
    OutRecord,
    ProducerFencedError,
    RecordRefusedError,
    SendFailure,
    TransactionAbortedError,
)
from purgatory.service.telemetry.logging import get_logger

__all__ = ["KafkaTransactions", "check_transactions", "open_kafka_transactions"]

_log = get_logger()

#: The start-time probe's pause between attempts: a coordinator still loading is usually
#: ready within seconds, and a broker away gets a look every few seconds, not a flood.
PROBE_RETRY = Backoff(first_s=0.5, max_s=5.0)

#: kafka-python's errors that mean another producer took the transactional id.
_FENCED = frozenset({"ProducerFencedError", "InvalidProducerEpochError"})
#: Errors of one record that no retry can help (the others abort the whole transaction).
_RECORD_REFUSED = frozenset(
    {
        "MessageSizeTooLargeError",
        "RecordTooLargeError",
        "InvalidRecordError",
        "CorruptRecordError",
        "UnknownTopicOrPartitionError",
        "TopicAuthorizationFailedError",
        "InvalidTopicError",
    }
)


class KafkaTransactions:
    """One transactional producer per partition (see the module docstring).

    Args:
        config: how to reach the brokers.
        id_prefix: partition ``p``'s transactional id is ``{id_prefix}-{p}``.
        group_id: the source's consumer group (the offsets are committed for it).
        transaction_timeout_ms: how long the broker lets a transaction stay open before it
            aborts it (a producer that stopped mid-transaction holds readers back this long).
        max_request_bytes: the largest record a producer sends.
        metadata_timeout_ms: how long a send waits for a topic's metadata (a topic that does
            not exist fails the record for good after this).
    """

    def __init__(
        self,
        config: KafkaClientConfig,
        *,
        id_prefix: str,
        group_id: str,
        transaction_timeout_ms: int = 60_000,
        max_request_bytes: int = 1_048_576,
        metadata_timeout_ms: int = 5_000,
    ) -> None:
        self._config = config
        self._id_prefix = id_prefix
        self._group_id = group_id
        self._options = {  # the producers' own arguments, beside the connection's
            **no_topic_creation(),
            **no_client_metrics(),
            "acks": "all",
            "linger_ms": 0,
            # One batch per partition for a commit's callbacks (see open_kafka_sink).
            "batch_size": min(512 * 1024, max_request_bytes),
            "transaction_timeout_ms": transaction_timeout_ms,
            "max_request_size": max_request_bytes,
            "max_block_ms": metadata_timeout_ms,
            # kafka-python waits this long between the coordinator's steps of a transaction
            # (add partitions, add offsets, end): at its default of 100 ms a commit took
            # 120-220 ms, at 10 ms 20-30 ms.
            "retry_backoff_ms": 10,
            "partitioner": KeyHashPartitioner(),
        }
        self._producers: dict[int, Any] = {}
        self._lock = threading.Lock()

    def transactional_id(self, partition: int) -> str:
        """Partition ``partition``'s transactional id."""
        return f"{self._id_prefix}-{partition}"

    async def open(self, partition: int) -> None:
        """Take the partition's transactional id (fencing every earlier producer of it)."""
        old = self._producers.pop(partition, None)
        if old is not None:
            await trio.to_thread.run_sync(_close, old, abandon_on_cancel=True)
        producer = await trio.to_thread.run_sync(
            self._init, self.transactional_id(partition), abandon_on_cancel=True
        )
        self._producers[partition] = producer

    async def commit(
        self,
        partition: int,
        records: Sequence[OutRecord],
        offsets: Mapping[tuple[str, int], int],
    ) -> list[int | None]:
        """One transaction of ``partition``'s producer: ``records``, then ``offsets``."""
        producer = self._producers.get(partition)
        if producer is None:
            raise ProducerFencedError(f"partition {partition} has no open transactional producer")
        try:
            return await trio.to_thread.run_sync(
                self._commit, producer, records, dict(offsets), abandon_on_cancel=True
            )
        except ProducerFencedError:
            self._producers.pop(partition, None)
            await trio.to_thread.run_sync(_close, producer, abandon_on_cancel=True)
            raise

    async def close(self, partition: int) -> None:
        """Let the partition's producer go."""
        producer = self._producers.pop(partition, None)
        if producer is not None:
            await trio.to_thread.run_sync(_close, producer, abandon_on_cancel=True)

    async def aclose(self) -> None:
        """Let every producer go."""
        for partition in sorted(self._producers):
            await self.close(partition)

    # -- in worker threads -----------------------------------------------------------------

    def _init(self, transactional_id: str) -> Any:
        try:
            producer = KafkaProducer(
                **self._config.kafka_kwargs(), **self._options, transactional_id=transactional_id
            )
        except KafkaError as exc:
            raise TransportError(f"cannot reach Kafka at {self._config.servers()}: {exc}") from exc
        try:
            producer.init_transactions()
        except KafkaError as exc:
            _close(producer)
            raise TransportError(
                f"init_transactions for {transactional_id!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
        return producer

    def _commit(
        self, producer: Any, records: Sequence[OutRecord], offsets: dict[tuple[str, int], int]
    ) -> list[int | None]:
        futures: list[Any] = []
        try:
            producer.begin_transaction()
            for index, record in enumerate(records):
                try:
                    futures.append(
                        producer.send(
                            record.topic, record.value, key=record.key, partition=record.partition
                        )
                    )
                except KafkaTimeoutError as exc:  # no metadata: missing, or the broker away
                    reason = f"no metadata for topic {record.topic!r} (does it exist?): {exc}"
                    raise _RefusedError(index, reason, retriable=True) from exc
                except KafkaError as exc:
                    if type(exc).__name__ not in _RECORD_REFUSED:
                        raise
                    raise _RefusedError(index, f"{type(exc).__name__}: {exc}") from exc
            if offsets:  # for the group's id: no generation to check (the module docstring)
                producer.send_offsets_to_transaction(
                    {
                        TopicPartition(t, p): OffsetAndMetadata(o, "", -1)
                        for (t, p), o in offsets.items()
                    },
                    self._group_id,
                )
            # Every record sent, or failed, before the commit: kafka-python 3.0 commits a
            # transaction one of whose records expired unsent (a broker away longer than the
            # delivery timeout) as if it held it, where Java's producer refuses to. A record
            # that failed aborts the transaction instead (retried whole, or its record
            # dead-lettered when the broker refused it for good).
            producer.flush()
            unsent = next((f.exception for f in futures if f.is_done and f.failed()), None)
            if isinstance(unsent, KafkaError):
                raise unsent
            if unsent is not None:
                raise KafkaError(f"a record of the transaction was not sent: {unsent!r}")
            producer.commit_transaction()
        except _RefusedError as refused:
            self._abort(producer, refused)
            raise RecordRefusedError(refused.index, refused.failure) from refused
        except KafkaError as exc:
            if _fenced(exc):
                raise ProducerFencedError(f"{type(exc).__name__}: {exc}") from exc
            refused_at = _refused_index(futures)
            if refused_at is not None:
                self._abort(producer, exc)
                raise RecordRefusedError(refused_at, _future_failure(futures[refused_at])) from exc
            self._abort(producer, exc)
            raise TransactionAbortedError(f"{type(exc).__name__}: {exc}") from exc
        return [future.value.offset if future.succeeded() else None for future in futures]

    @staticmethod
    def _abort(producer: Any, cause: BaseException) -> None:
        """Abort the open transaction. A producer that cannot abort (fenced, or in a fatal
        state) is never initialized again under the same engine state: that would fence the
        partition's new owner and commit decisions made on a stale state. It is reported
        fenced instead, and the partition is restored before it is written again."""
        try:
            producer.abort_transaction()
        except KafkaError as exc:
            raise ProducerFencedError(
                f"the transaction could not be aborted after {type(cause).__name__}:"
                f" {type(exc).__name__}: {exc}"
            ) from exc


def _fenced(exc: BaseException) -> bool:
    """Whether ``exc`` says another producer took the transactional id (kafka-python also
    wraps that in a plain ``KafkaError`` once the producer is in its error state)."""
    if type(exc).__name__ in _FENCED:
        return True
    return any(isinstance(arg, BaseException) and _fenced(arg) for arg in exc.args) or any(
        name in str(exc) for name in _FENCED
    )


class _RefusedError(Exception):
    def __init__(self, index: int, reason: str, *, retriable: bool = False) -> None:
        super().__init__(reason)
        self.index = index
        self.failure = SendFailure(reason, retriable=retriable)


def _refused_index(futures: Sequence[Any]) -> int | None:
    """The first record the broker refused for good (None: none was, or none is known)."""
    for index, future in enumerate(futures):
        failed = future.is_done and future.failed()
        if failed and type(future.exception).__name__ in _RECORD_REFUSED:
            return index
    return None


def _future_failure(future: Any) -> SendFailure:
    exc = future.exception
    return SendFailure(f"{type(exc).__name__}: {exc}", retriable=False)


def _close(producer: Any) -> None:
    try:
        producer.close(timeout=2)
    except Exception as exc:  # a producer that cannot close is let go
        _log.debug("transactional_producer_close_failed", error=repr(exc))


@asynccontextmanager
async def open_kafka_transactions(
    config: KafkaClientConfig,
    *,
    id_prefix: str,
    group_id: str,
    transaction_timeout_ms: int = 60_000,
    max_request_bytes: int = 1_048_576,
) -> AsyncIterator[KafkaTransactions]:
    """:class:`KafkaTransactions`; every producer is closed on leaving."""
    transactions = KafkaTransactions(
        config,
        id_prefix=id_prefix,
        group_id=group_id,
        transaction_timeout_ms=transaction_timeout_ms,
        max_request_bytes=max_request_bytes,
    )
    try:
        yield transactions
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await transactions.aclose()


async def check_transactions(
    config: KafkaClientConfig,
    *,
    transactional_id: str,
    wait_ms: int = 120_000,
    attempt_ms: int = 10_000,
    attempt: Callable[[str], Awaitable[bool]] | None = None,
) -> None:
    """Check that the broker does transactions: two producers of ``transactional_id``, and the
    older one must be fenced. Writes no record (the older one's transaction holds only an
    empty offset commit for the group ``{transactional_id}``, and is never committed).

    A timeout or a retriable error (the coordinator loading or not available yet, not the
    coordinator, a request timed out, no connection) is weather: logged as
    ``transaction_probe_unanswered`` and tried again after :data:`PROBE_RETRY`'s pause,
    until ``wait_ms`` has passed.

    Args:
        config: how to reach the brokers.
        transactional_id: the probe's transactional id (the service's is ``<group>-probe``).
        wait_ms: how long the broker may take to give a definite answer, over every attempt.
            The first transactional call to a fresh Apache Kafka creates its coordinator's
            topic (``__transaction_state``, 50 partitions) and loads it: 2-5 s on a 2-core
            machine with both cores busy, past the client's 5 s when other work shares them
            too (the slowest start seen had its partitions open after about 12 s). Two
            minutes is ten times that, and well inside the chart's startup probe (5 minutes),
            while a wrong broker address still fails the start within two minutes instead of
            hanging it.
        attempt_ms: how long one attempt may take; each blocking call of the client gets
            half of it.
        attempt: one attempt (tests pass a fake): True when the broker fenced the older
            producer, False when it accepted the older producer's call; raises kafka-python's
            errors. Two producers of ``config``'s broker, in a worker thread, by default.

    Raises:
        ConfigError: the broker answered that it cannot do transactions (with what it did).
        TransportError: it gave no definite answer within ``wait_ms`` (with the last error).
    """
    attempt = attempt if attempt is not None else _kafka_attempt(config, attempt_ms)
    started_s = trio.current_time()
    attempts, last = 0, "no answer"  # last: what the last attempt that ended said
    with trio.move_on_after(wait_ms / 1000):
        while True:
            attempts += 1
            with trio.move_on_after(attempt_ms / 1000) as bounded:
                try:
                    fenced = await attempt(transactional_id)
                except KafkaError as exc:
                    if not getattr(exc, "retriable", False):
                        raise _cannot(config, _named(exc)) from exc
                    last = _named(exc)
                else:
                    if fenced:
                        return
                    raise _cannot(
                        config,
                        "it took a call of an older producer of a transactional id after a newer"
                        " one had taken the id (it fences nobody)",
                    )
            if bounded.cancelled_caught:
                last = f"no answer within {attempt_ms} ms"
            pause_s = PROBE_RETRY.delay_s(attempts - 1)
            _log.warning(
                "transaction_probe_unanswered",
                attempt=attempts,
                error=last,
                waited_ms=round((trio.current_time() - started_s) * 1000),
                retry_in_ms=round(pause_s * 1000),
                bootstrap_servers=config.bootstrap_servers,
            )
            await trio.sleep(pause_s)
    raise TransportError(
        f"PURGATORY_DELIVERY=transactional: the broker at {config.bootstrap_servers} did not"
        f" answer the start-time transaction probe within {wait_ms} ms ({attempts} attempts;"
        f" the last: {last}). Nothing says it cannot do transactions: check that it is running"
        " and reachable from here (PURGATORY_KAFKA_BOOTSTRAP_SERVERS, its advertised listeners,"
        " the network) and that its transaction coordinator came up (the __transaction_state"
        " topic, in the broker's log), then start the service again."
    )


def _named(exc: KafkaError) -> str:
    """``exc`` with its type's name, once (kafka-python's messages mostly carry it already)."""
    text = str(exc)
    return text if type(exc).__name__ in text else f"{type(exc).__name__}: {text}"


def _cannot(config: KafkaClientConfig, what: str) -> ConfigError:
    """The start's refusal: the broker answered, and it cannot do transactions."""
    return ConfigError(
        f"PURGATORY_DELIVERY=transactional, but the broker at {config.bootstrap_servers}"
        f" cannot do Kafka transactions: {what}. Use an Apache Kafka broker (2.5 or"
        " later), or PURGATORY_DELIVERY=acknowledged (at-least-once, de-duplicated by id)."
    )


def _kafka_attempt(config: KafkaClientConfig, attempt_ms: int) -> Callable[[str], Awaitable[bool]]:
    """One attempt of the probe against ``config``'s broker, in a worker thread.

    An attempt past its bound is abandoned, not waited for: its thread ends when the client's
    own bounds (``max_block_ms``, ``bootstrap_timeout_ms``) end its call, and closes its
    producers then. Only a broker that accepts a connection and never answers keeps it (some
    of kafka-python's transactional calls wait without a bound); the probe then fails the
    start within ``wait_ms`` anyway, and the process with it.
    """
    options = {
        **no_client_metrics(),
        "max_block_ms": attempt_ms // 2,
        "bootstrap_timeout_ms": attempt_ms // 2,
    }

    async def attempt(transactional_id: str) -> bool:
        return await trio.to_thread.run_sync(
            _probe, config, options, transactional_id, abandon_on_cancel=True
        )

    return attempt


def _probe(config: KafkaClientConfig, options: dict[str, Any], transactional_id: str) -> bool:
    """Two producers of ``transactional_id``: whether the broker fenced the older one."""
    older = newer = None
    try:
        older = KafkaProducer(**config.kafka_kwargs(), **options, transactional_id=transactional_id)
        older.init_transactions()
        newer = KafkaProducer(**config.kafka_kwargs(), **options, transactional_id=transactional_id)
        newer.init_transactions()
        older.begin_transaction()  # local: nothing reaches the broker yet
        # The older producer's first request to the coordinator after the newer one took the
        # id: Apache Kafka refuses it (ProducerFencedError). The verdict is taken here, not at
        # a commit: the embedded broker accepts this call and then never ends the commit.
        older.send_offsets_to_transaction({}, transactional_id)
    except KafkaError as exc:
        if _fenced(exc):
            return True
        raise
    finally:
        for producer in (older, newer):
            if producer is not None:
                _close(producer)
    return False
