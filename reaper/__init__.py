"""reaper: the clock layer between the trio service and the sans-IO core.

:class:`Clock` converts trio's time to the core's integer milliseconds (the only place that
does); :class:`Reaper` sleeps until the next bucket of the timing wheel is due, advances the
wheel and hands the expired tasks to the :class:`CompletionExecutor`, the single trio task that
runs expirations and callbacks in order, one at a time. This package imports trio, structlog and
``purgatory._core``, never the service.
"""

from reaper._clock import Clock
from reaper._executor import CompletionExecutor, ExecutorStatistics, Work
from reaper._reaper import Expirable, Reaper, ReaperStatistics

__all__ = [
    "Clock",
    "CompletionExecutor",
    "ExecutorStatistics",
    "Expirable",
    "Reaper",
    "ReaperStatistics",
    "Work",
]
