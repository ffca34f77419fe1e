"""The service's transport over kafka-python (service layer: the Kafka seam's implementation).

:class:`KafkaTransport` implements :class:`~purgatory.service.kafka.transport.Transport`. Every
kafka-python client is owned by one thread started with ``trio.to_thread.run_sync`` and talks
to trio through bounded memory channels: the source (``source``) hands batches of
``ConsumedRecord`` in and commits offsets only when asked, the sink (``sink``) takes records
out and reports delivery failures at ``flush``. ``KafkaClientConfig`` (``config``) is how
both reach the brokers; :meth:`KafkaTransport.from_settings` is the transport the settings
describe.
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.reader import KafkaLogReader, open_kafka_reader
from purgatory.service.kafka.sink import KafkaSink, open_kafka_sink
from purgatory.service.kafka.source import KafkaSource, open_kafka_source
from purgatory.service.kafka.transactions import KafkaTransactions, open_kafka_transactions
from purgatory.service.settings import Settings

__all__ = ["KafkaTransport"]


@dataclass(frozen=True, slots=True)
class KafkaTransport:
    """The service's :class:`~purgatory.service.kafka.transport.Transport` over kafka-python.

    Args:
        config: how to reach the brokers.
        linger_ms: how long the producer waits to fill a batch.
        max_request_bytes: the largest record the producer sends.
        fetch_max_wait_ms: how long the broker may hold a fetch with no new data.
        advertised_url: this replica's URL, shared with the group (group mode).
        group_instance_id: static group membership.
        close_timeout_ms: how long closing the sink waits for its last flush (None: up to
            the producer's delivery timeout); the service passes its ``shutdown_grace_ms``.
        read_committed: the source reads only committed records (a transactional service).
        transaction_timeout_ms: how long the broker lets a transaction stay open.
    """

    config: KafkaClientConfig
    linger_ms: int = 0
    max_request_bytes: int = 1_048_576
    fetch_max_wait_ms: int = 10
    advertised_url: str | None = None
    group_instance_id: str | None = None
    close_timeout_ms: int | None = None
    read_committed: bool = False
    transaction_timeout_ms: int = 60_000

    @classmethod
    def from_settings(cls, settings: Settings, *, read_committed: bool = False) -> KafkaTransport:
        """The transport of ``settings``: the brokers, the producer's batching and record size,
        group membership, the close's bound (``PURGATORY_SHUTDOWN_GRACE_MS``).

        Args:
            settings: the service's settings.
            read_committed: whether the source reads committed records only; the delivery
                mode's choice (transactional delivery), made where the mode is chosen.
        """
        return cls(
            KafkaClientConfig.from_settings(settings),
            linger_ms=settings.kafka_linger_ms,
            # The largest record value, plus room for its key and the batch's framing.
            max_request_bytes=settings.max_record_bytes + 4096,
            fetch_max_wait_ms=settings.kafka_fetch_max_wait_ms,
            advertised_url=settings.advertised_url,
            group_instance_id=settings.kafka_group_instance_id,
            close_timeout_ms=settings.shutdown_grace_ms,
            read_committed=read_committed,
            transaction_timeout_ms=settings.transaction_timeout_ms,
        )

    def open_source(
        self, *, topics: list[str], group_id: str, assignment: list[tuple[str, int]] | None
    ) -> AbstractAsyncContextManager[KafkaSource]:
        """A consumer thread over ``topics`` (group or explicit ``assignment``) that holds each
        partition it is given until the service resumes it."""
        return open_kafka_source(
            self.config,
            topics=topics,
            group_id=group_id,
            assignment=assignment,
            fetch_max_wait_ms=self.fetch_max_wait_ms,
            hold=True,
            advertised_url=self.advertised_url,
            group_instance_id=self.group_instance_id,
            read_committed=self.read_committed,
        )

    def open_sink(self) -> AbstractAsyncContextManager[KafkaSink]:
        """A producer thread."""
        return open_kafka_sink(
            self.config,
            linger_ms=self.linger_ms,
            max_request_bytes=self.max_request_bytes,
            close_timeout_ms=self.close_timeout_ms,
        )

    def open_reader(
        self, *, read_committed: bool = False
    ) -> AbstractAsyncContextManager[KafkaLogReader]:
        """A reader of whole partitions (the changelog, at restore)."""
        return open_kafka_reader(self.config, read_committed=read_committed)

    def open_transactions(
        self, *, id_prefix: str, group_id: str
    ) -> AbstractAsyncContextManager[KafkaTransactions]:
        """One transactional producer per partition (transactional delivery)."""
        return open_kafka_transactions(
            self.config,
            id_prefix=id_prefix,
            group_id=group_id,
            transaction_timeout_ms=self.transaction_timeout_ms,
            max_request_bytes=self.max_request_bytes,
        )
