"""The sans-IO core: told the time as int milliseconds, never reads a clock, never does I/O.

Only the standard library is imported here (an import-linter contract checks it).
"""

from purgatory._core._errors import (
    BadRecordError,
    ConfigError,
    InvariantError,
    PurgatoryError,
    TransportError,
    UsageError,
)
from purgatory._core._operation import DelayedOperation
from purgatory._core._purgatory import DelayedOperationPurgatory, PurgatoryStatistics
from purgatory._core._timer import Timer, TimerStatistics, TimerTask
from purgatory._core._validate import MAX_TIME_MS

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
