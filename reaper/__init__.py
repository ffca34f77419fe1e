"""reaper: the clock layer between the trio service and the sans-IO core.

:class:`Clock` converts trio's time to the core's integer milliseconds (the only place that
does); :class:`Reaper` sleeps until the next bucket of the timing wheel is due, advances the
wheel and hands the expired tasks to the :class:`CompletionExecutor`, the single trio task that
runs expirations and callbacks in order, one at a time. This package imports trio, structlog and
``purgatory._core``, never the service.

Public names:

* :class:`Clock` -- trio's float seconds to the core's integer milliseconds and back;
* :class:`Reaper` -- advances an :class:`Expirable` at its next deadline (``run``,
  ``wake_if_earlier``) and hands what expired to the executor;
* :class:`Expirable` -- what a reaper advances: a ``Timer``, a purgatory, an ``Engine``;
* :class:`CompletionExecutor` -- runs zero-argument callables in order, one at a time, from a
  bounded channel (awaiting what they return when it is awaitable);
* :class:`ReaperStatistics` -- what ``Reaper.statistics()`` returns;
* :class:`ExecutorStatistics` -- what ``CompletionExecutor.statistics()`` returns.
"""

from reaper._clock import Clock
from reaper._executor import CompletionExecutor, ExecutorStatistics
from reaper._reaper import Expirable, Reaper, ReaperStatistics

__all__ = [
    "Clock",
    "CompletionExecutor",
    "ExecutorStatistics",
    "Expirable",
    "Reaper",
    "ReaperStatistics",
]
