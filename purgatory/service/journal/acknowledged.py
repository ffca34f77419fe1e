"""The journal's writer in acknowledged delivery (service layer: journal).

``PURGATORY_DELIVERY=acknowledged``: each batch is one record per partition, sent through the
service's producer and retried while retriable; what the entries caused is released once the
broker acknowledged them (:class:`~purgatory.service.journal.release.JournaledRelease`).

One writer per partition, checked at every acknowledgement: the writer knows the offset its
next record of a partition should get (the end it restored to, then each of its own records),
and writes it into the record (``at``, :mod:`purgatory.service.journal.format`). A record
acknowledged at another offset means someone else wrote to the partition meanwhile (a zombie
that kept writing after the partition moved, the new owner seen by a zombie, a replica cut
from the broker whose record in flight landed after the new owner's, or two replicas
configured onto the same partitions): the record is void for every replay, and the
partition is fenced (:mod:`purgatory.service.journal.changelog` says what that voids). The
check is the record's own, so it holds for a record in flight when its partition is handed
over or forgotten.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set

import trio

from purgatory._core import TransportError
from purgatory.service.journal.batch import RETRY, Batch, Part, Stall, journal_record
from purgatory.service.kafka.transport import Delivery, RecordSink, SendFailure
from purgatory.service.telemetry.logging import get_logger

__all__ = ["AcknowledgedWriter"]

_log = get_logger()


class AcknowledgedWriter:
    """Writes a batch as one changelog record per partition, each checked where it landed.

    Args:
        sink: the service's producer.
        topic: the changelog topic (partition p holds input partition p's journal).
        delivered: the partition's highest outcome sequence acknowledged on the callbacks
            topic (each record carries it as its delivered mark).
    """

    def __init__(
        self,
        sink: RecordSink,
        *,
        topic: str,
        delivered: Callable[[int], int] = lambda _partition: 0,
    ) -> None:
        self._sink = sink
        self._topic = topic
        self._delivered = delivered
        self._expected: dict[int, int] = {}  # partition -> offset its next record should get
        self.batches = 0
        self.records = 0
        self.bytes = 0
        self.retries = 0

    def expect(self, partition: int, offset: int) -> None:
        """This writer takes ``partition`` over at ``offset``: its next record there must
        land at that offset."""
        self._expected[partition] = offset

    def forget(self, partition: int) -> None:
        """This writer no longer owns ``partition``: its records are no longer checked."""
        self._expected.pop(partition, None)

    async def open_partition(self, partition: int) -> None:
        """Nothing to take before a restore reads the changelog."""
        await trio.lowlevel.checkpoint()

    async def close_partition(self, partition: int) -> None:
        """Nothing to let go."""
        await trio.lowlevel.checkpoint()

    async def mark_delivered(self, partitions: Iterable[int], fenced: Set[int]) -> dict[int, bool]:
        """Write each partition's delivered mark (at a clean stop), so the next owner re-sends
        nothing; only where this writer expects an offset (a partition fenced meanwhile gets
        none: its marks count in a numbering the log does not have)."""
        batch = Batch(parts={p: Part() for p in partitions if p in self._expected})
        if not batch.parts:
            return {}
        return await self.write(batch, fenced, None)

    async def write(self, batch: Batch, fenced: Set[int], stall: Stall | None) -> dict[int, bool]:
        """Write the batch, retrying what the broker refused for a retriable reason; the
        partitions whose record is void, each with whether its current owner here wrote it.

        Raises:
            TransportError: the broker refused a journal record for good.
        """
        order = sorted(batch.parts)
        ats = [self._expected.get(p) for p in order]  # where each must land (None: unchecked)
        records = [
            journal_record(self._topic, p, batch.parts[p], self._delivered(p), at)
            for p, at in zip(order, ats, strict=True)
        ]
        written: list[int | None] = [None] * len(records)
        todo = list(range(len(records)))
        attempt = 0
        while todo:
            delivery = await self._sink.send_batch([records[i] for i in todo])
            results = await _results(delivery, batch, stall)
            for i, offset in zip(todo, await delivery.offsets(), strict=True):
                written[i] = offset
            failed = [(i, f) for i, f in zip(todo, results, strict=True) if f is not None]
            for _i, failure in failed:
                if not failure.retriable:
                    raise TransportError(
                        f"changelog topic {self._topic!r} refused a journal record:"
                        f" {failure.reason}"
                    )
            todo = [i for i, _f in failed]
            if todo:
                self.retries += 1
                _log.warning("changelog_retry", records=len(todo), reason=failed[0][1].reason)
                await trio.sleep(RETRY.delay_s(attempt))
                attempt += 1
        self.batches += 1
        self.records += len(records)
        self.bytes += sum(len(r.value) for r in records)
        return self._check_offsets(order, written, ats, fenced)

    def _check_offsets(
        self, order: list[int], written: list[int | None], ats: list[int | None], fenced: Set[int]
    ) -> dict[int, bool]:
        """The partitions whose record did not land where it had to (void), each with whether
        the partition's current owner here wrote it; the next offset expected for the others.
        """
        void: dict[int, bool] = {}
        for partition, offset, at in zip(order, written, ats, strict=True):
            current = at is not None and self._expected.get(partition) == at
            if partition in fenced:
                void[partition] = True  # written before the fence was seen: void as well
                continue
            if offset is None or at is None:
                continue  # not known (a sink that does not say), or not taken over
            if offset == at:
                if current:
                    self._expected[partition] = offset + 1
                continue
            void[partition] = current
            if current:
                del self._expected[partition]
            _log.error(
                "partition_fenced",
                partition=partition,
                expected_offset=at,
                written_offset=offset,
                owned=current,
                detail="another writer appended to this partition's changelog: a replica"
                " that kept writing after the partition moved, a replica cut from the"
                " broker whose record landed after the new owner's, or two replicas"
                " configured onto the same partitions (the same ordinal or static"
                " partitions); the record is void, nothing this writer decided since is"
                " released, and it restores the partition from the changelog if it still"
                " owns it",
            )
        return void


async def _results(
    delivery: Delivery, batch: Batch, stall: Stall | None
) -> list[SendFailure | None]:
    """The delivery's results; reports the stall once the batch's oldest entry has waited
    ``wait_ms`` for them (once per stall)."""
    if stall is None or stall.since_s is not None:
        return await delivery.results()
    since_s = batch.since_s if batch.since_s is not None else trio.current_time()
    with trio.move_on_at(since_s + stall.wait_ms / 1000):
        return await delivery.results()
    stall.report(since_s, batch, "the broker has not acknowledged a changelog record")
    return await delivery.results()
