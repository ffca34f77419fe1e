"""purgatory: durable delayed operations for data pipelines.

The public engine API (Kafka's purgatory names in snake_case). ``import purgatory`` imports
only the sans-IO core: no trio, no Kafka, no I/O.
"""

from purgatory._core import (
    MAX_TIME_MS,
    BadRecordError,
    ConfigError,
    DelayedOperation,
    DelayedOperationPurgatory,
    InvariantError,
    PurgatoryError,
    PurgatoryStatistics,
    Timer,
    TimerStatistics,
    TimerTask,
    TransportError,
    UsageError,
)

__all__ = [
    "MAX_TIME_MS",
    "BadRecordError",
    "ConfigError",
    "DelayedOperation",
    "DelayedOperationPurgatory",
    "InvariantError",
    "PurgatoryError",
    "PurgatoryStatistics",
    "Timer",
    "TimerStatistics",
    "TimerTask",
    "TransportError",
    "UsageError",
]
