"""The outbox's sender (service layer: egress): the backlog, chunk by chunk, to the sink.

The sender takes what is queued in the backlog (up to ``chunk`` records at a time) and submits
one work per chunk to the :class:`~reaper.CompletionExecutor`, the single lane where callbacks
run in order, due at the earliest of its outcomes' due times (so the executor's lag is the
callbacks' lag). The work encodes the chunk (:meth:`~purgatory.service.egress.records.Records.
encode`), hands its records to the sink in one hop and passes the sink's :class:`Delivery` on
to the acknowledger, through a bounded channel: a broker slow to acknowledge holds the lane,
which holds the backlog, which holds the producers.

A callback over ``max_record_bytes`` is not sent: it follows its chunk to the acknowledger as
already refused (:class:`Refused`), then the chunk's barriers, so it is settled in the
acknowledger's order. Once the backlog is closed and drained, the sender closes the channel, on
the same lane, after every hand-over before it.
"""

from __future__ import annotations

import functools

import trio

from purgatory._core import Outcome
from purgatory.service.egress.acknowledger import InFlight
from purgatory.service.egress.backlog import Backlog
from purgatory.service.egress.records import Entry, Records, due_ms
from purgatory.service.kafka.transport import RecordSink, SendFailure
from reaper import Clock, CompletionExecutor

__all__ = ["Refused", "Sender"]


class Sender:
    """Hands the backlog to the sink, one chunk per work on the completion lane.

    Args:
        backlog: what to send.
        records: encodes each chunk.
        sink: where records go.
        executor: the completion lane that hands chunks to the sink, one at a time.
        clock: a chunk without an outcome is due now.
        in_flight: where each delivery goes, to be acknowledged in order (closed at the end).
    """

    def __init__(
        self,
        backlog: Backlog,
        records: Records,
        sink: RecordSink,
        *,
        executor: CompletionExecutor,
        clock: Clock,
        in_flight: trio.MemorySendChannel[InFlight],
    ) -> None:
        self._backlog = backlog
        self._records = records
        self._sink = sink
        self._executor = executor
        self._clock = clock
        self._in_flight = in_flight
        #: records handed to the sink (or refused before it) since the start
        self.handed = 0

    async def run(self) -> None:
        """Hand chunks over until the backlog is closed and drained; then close the channel."""
        backlog, executor, clock = self._backlog, self._executor, self._clock
        while await backlog.ready():
            chunk = backlog.take()
            due = min((due_ms(e) for e in chunk if isinstance(e, Outcome)), default=None)
            await executor.submit(
                functools.partial(self._hand_over, chunk),
                due_ms=due if due is not None else clock.now_ms(),
            )
        # Runs after every hand-over before it, on the same lane.
        await executor.submit(self._in_flight.close, due_ms=clock.now_ms())

    async def _hand_over(self, entries: list[Entry]) -> None:
        """The executor's work: encode a chunk and hand its records to the sink in one hop."""
        chunk = self._records.encode(entries)
        self.handed += len(chunk.refs) + len(chunk.oversized)
        delivery = await self._sink.send_batch(chunk.records)
        in_flight = self._in_flight
        if chunk.oversized:
            await in_flight.send((delivery, chunk.refs, chunk.offsets, []))
            for (
                ref,
                failure,
            ) in chunk.oversized:  # settled after the chunk, in the acknowledger's order
                await in_flight.send((Refused([failure]), [ref], {}, []))
            await in_flight.send((Refused([]), [], {}, chunk.barriers))
        else:
            await in_flight.send((delivery, chunk.refs, chunk.offsets, chunk.barriers))


class Refused:
    """A delivery already decided (a callback refused before it was sent)."""

    def __init__(self, results: list[SendFailure | None]) -> None:
        self._results = results

    async def results(self) -> list[SendFailure | None]:
        """The results, after a checkpoint (as a delivery's wait would be)."""
        await trio.lowlevel.checkpoint()
        return self._results

    async def offsets(self) -> list[int | None]:
        """None for each record: none was written."""
        await trio.lowlevel.checkpoint()
        return [None] * len(self._results)
