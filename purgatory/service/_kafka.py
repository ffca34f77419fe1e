"""Kafka clients of the service (service layer): the names the rest of the shell imports.

Every kafka-python client is owned by one thread started with ``trio.to_thread.run_sync`` and talks
to trio through bounded memory channels: the source (``_kafka_source``) hands batches of
``ConsumedRecord`` in and commits offsets only when asked, the sink (``_kafka_sink``) takes records
out and reports delivery failures at ``flush``. ``KafkaClientConfig`` (``_kafka_config``) is how
both reach the brokers.
"""

from purgatory.service._kafka_config import ConsumedRecord, KafkaClientConfig
from purgatory.service._kafka_sink import KafkaSink, SinkStatistics, open_kafka_sink
from purgatory.service._kafka_source import KafkaSource, StartPosition, open_kafka_source

__all__ = [
    "ConsumedRecord",
    "KafkaClientConfig",
    "KafkaSink",
    "KafkaSource",
    "SinkStatistics",
    "StartPosition",
    "open_kafka_sink",
    "open_kafka_source",
]
