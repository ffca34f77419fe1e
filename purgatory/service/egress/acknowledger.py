"""The outbox's acknowledger (service layer: egress): deliveries awaited strictly in order.

The sender hands it each chunk's :class:`Delivery` with the records it holds, the commit
markers and the barriers behind them (:data:`InFlight`). It awaits them one at a time, in the
order they were handed over: the callbacks acknowledged in a row are reported together to the
receipts, before anything else of the chunk is settled (a refused record may wait for a retry);
a refused record goes to the settler, alone, and what the settler settled to the receipts. Only
then do the chunk's offsets reach the committer and its barriers get set: a commit marker
reached here has every record before it acknowledged or settled for good. When the channel
closes (the sender drained the backlog), it tells the committer that nothing more will come.
"""

from __future__ import annotations

import trio

from purgatory.service.egress.committer import Committer
from purgatory.service.egress.receipts import Receipts
from purgatory.service.egress.records import Offsets, Ref
from purgatory.service.egress.settler import Settler
from purgatory.service.kafka.transport import Delivery, SendFailure

__all__ = ["Acknowledger", "InFlight"]

#: A chunk handed to the sink: its delivery, what it sent, the markers and barriers behind it.
InFlight = tuple[Delivery, list[Ref], Offsets, list[trio.Event]]


class Acknowledger:
    """Settles each handed-over chunk in order, then lets its offsets and barriers through.

    Args:
        in_flight: the chunks handed to the sink, in order.
        settler: settles a refused record.
        receipts: counts what is acknowledged and tells the listeners.
        committer: commits the offsets reached.
    """

    def __init__(
        self,
        in_flight: trio.MemoryReceiveChannel[InFlight],
        settler: Settler,
        receipts: Receipts,
        committer: Committer,
    ) -> None:
        self._in_flight = in_flight
        self._settler = settler
        self._receipts = receipts
        self._committer = committer
        #: records acknowledged or settled since the start
        self.settled = 0

    async def run(self) -> None:
        """Acknowledge chunks until the sender closes the channel; then finish the committer."""
        receipts = self._receipts
        async with self._in_flight:
            async for delivery, refs, offsets, barriers in self._in_flight:
                results = await delivery.results()
                # Callbacks acknowledged in a row are reported together, in order, and
                # before anything else is settled (a refused record may wait for a retry).
                delivered: list[Ref] = []
                for ref, failure in zip(refs, results, strict=True):
                    if failure is None and ref.outcome is not None:
                        delivered.append(ref)
                    else:
                        receipts.delivered(delivered)
                        delivered = []
                        if failure is None:
                            receipts.acknowledged(ref)
                        else:
                            await self._settle(ref, failure)
                    self.settled += 1
                receipts.delivered(delivered)
                if offsets:
                    self._committer.reached(offsets)
                for barrier in barriers:
                    barrier.set()
        self._committer.finish()

    async def _settle(self, ref: Ref, failure: SendFailure) -> None:
        for settled in await self._settler.settle(ref, failure):
            if isinstance(settled, Ref):
                self._receipts.acknowledged(settled)
            else:
                self._receipts.undelivered(settled)
