"""The outbox's committer (service layer: egress): input offsets to the group, coalesced.

The acknowledger tells it of each commit marker it reaches (:meth:`Committer.reached`); by then
every record before the marker is settled, so what it commits never runs ahead of a callback or
dead letter. It commits the latest offset per partition, at most once per ``interval_ms``,
coalescing every marker that arrived meanwhile: commits never block the intake or any callback,
and their cost does not grow with the number of small batches a low rate makes (a crash
redelivers at most that interval's inputs, whose callbacks were already sent: duplicates, never
losses). A commit the broker refuses is tried again after a back-off, merged with whatever
arrived meanwhile (a later marker's offset wins). Once closed it commits at once, without
waiting out the interval; once told everything is settled (:meth:`Committer.finish`) it returns
after the last commit.

Worked example (``interval_ms`` 100): markers ``{s/0: 3}`` at 0 ms and ``{s/0: 7}``,
``{s/1: 2}`` at 40 ms. The first is committed at 0 ms; the other two wait out the interval and
go together at 100 ms as ``{s/0: 7, s/1: 2}``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import trio

from purgatory._core import TransportError
from purgatory._core._backoff import Backoff
from purgatory.service.egress.records import Offsets
from purgatory.service.telemetry.logging import get_logger
from reaper import Clock

__all__ = ["Committer"]

_log = get_logger()


class Committer:
    """Commits the offsets the acknowledger reached, coalesced to one commit per interval.

    Args:
        commit: commits consumed offsets (None: nothing is committed, e.g. without Kafka).
        clock: for the interval.
        interval_ms: the least time between two commits (until closed).
        backoff: the pause before a refused commit is tried again.
    """

    def __init__(
        self,
        commit: Callable[[Mapping[tuple[str, int], int]], Awaitable[None]] | None,
        clock: Clock,
        *,
        interval_ms: int,
        backoff: Backoff,
    ) -> None:
        self._commit = commit
        self._clock = clock
        self._interval_ms = interval_ms
        self._backoff = backoff
        self._pending: Offsets = {}
        self._wakeup = trio.Event()
        self._closing = trio.Event()
        self._finished = False
        #: commits done, and refused (each refused one is tried again)
        self.commits = 0
        self.failures = 0

    def reached(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Everything before these offsets' marker is settled: commit them (soon)."""
        self._pending.update(offsets)
        self._wakeup.set()

    def finish(self) -> None:
        """Nothing more will be reached: :meth:`run` returns after the last commit."""
        self._finished = True
        self._wakeup.set()

    def close(self) -> None:
        """Shutting down: from now on, commit at once instead of waiting out the interval."""
        self._closing.set()

    async def run(self) -> None:
        """Commit what is reached until :meth:`finish` was called and nothing is pending."""
        attempt = 0
        next_ms = 0
        clock = self._clock
        while True:
            if not self._pending:
                if self._finished:
                    return
                self._wakeup = trio.Event()
                await self._wakeup.wait()
                continue
            if not self._closing.is_set() and clock.now_ms() < next_ms:
                with trio.move_on_at(clock.to_trio_seconds(next_ms)):
                    await self._closing.wait()  # wait out the interval, unless shutting down
            next_ms = clock.now_ms() + self._interval_ms
            offsets, self._pending = self._pending, {}
            if self._commit is None:
                continue
            try:
                await self._commit(offsets)
            except TransportError as exc:
                # Not a loss: the inputs are redelivered at worst. Retry with the later offsets.
                self.failures += 1
                _log.warning("offset_commit_failed", error=str(exc))
                self._pending = offsets | self._pending
                await trio.sleep(self._backoff.delay_s(attempt))
                attempt += 1
                continue
            attempt = 0
            self.commits += 1
