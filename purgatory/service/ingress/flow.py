"""One input's way through the stages (service layer: ingress).

Every input, from whichever path (a consumed record, an HTTP request, the reaper's clock),
crosses the stages in one order, here and nowhere else::

    decision = dispatcher.signal(record)   # dispatch: the engine decides (and journals first)
    release.decided(decision.outcomes)     # journal, then egress: held until durable
    reaper.wake...(decision)               # the next deadline

The dispatcher (:mod:`purgatory.service.dispatch.dispatcher`) returns what it decided and
calls nothing back; the release (:mod:`purgatory.service.journal.release`) holds each outcome
until the journal has the entries that decided it, then hands it to the outbox; the reaper
(:class:`reaper.Reaper`, owned here as Kafka's ``SystemTimer`` owns its reaper thread) sleeps
until the next deadline and brings the clock's decisions back through the same path.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

from purgatory._codec import CancelRequest, RegisterRequest, SignalRecord, WatermarkRecord
from purgatory._core import Outcome, Registration
from purgatory.service.dispatch.dispatcher import Decision, Dispatcher, Input
from purgatory.service.journal.release import Release
from reaper import Clock, Reaper

__all__ = ["Flow", "Room"]

R = TypeVar("R")


class Room(Protocol):
    """Egress's back-pressure: what waits while too much is queued to send."""

    async def wait_for_room(self) -> None: ...


class Flow:
    """Applies inputs and the clock: dispatch, then release, then wake the reaper.

    Args:
        dispatcher: decides what each input does.
        release: takes the outcomes decided (the journal holds them until durable).
        clock: the time source of the reaper.
        egress: where the outcomes end up: the reaper waits for room there after it hands over
            expirations (back-pressure).
        max_sleep_ms: the longest the reaper sleeps without re-reading the clock.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        release: Release,
        clock: Clock,
        *,
        egress: Room,
        max_sleep_ms: int = 200,
    ) -> None:
        self.dispatcher = dispatcher
        self._release = release
        self._egress = egress
        self.reaper = Reaper(self, self._handed_over, clock, max_sleep_ms=max_sleep_ms)

    # -- inputs ---------------------------------------------------------------------------------

    def apply(
        self, item: Input, *, client: str | None = None
    ) -> Registration | Outcome | int | bool | None:
        """Apply one decoded input (see :meth:`Dispatcher.apply`); its result."""
        return self._follow(self.dispatcher.apply(item, client=client))

    def register(
        self, request: RegisterRequest, *, client: str | None = None, retry: bool = False
    ) -> Registration:
        """Register an operation (see :meth:`Dispatcher.register`)."""
        return self._follow(self.dispatcher.register(request, client=client, retry=retry))

    def cancel(self, request: CancelRequest) -> Outcome | None:
        """Cancel a pending operation; its outcome, or None if it was not pending."""
        return self._follow(self.dispatcher.cancel(request))

    def signal(self, record: SignalRecord, *, client: str | None = None) -> int:
        """Apply a signal; how many operations it completed."""
        return self._follow(self.dispatcher.signal(record, client=client))

    def watermark(self, record: WatermarkRecord) -> bool:
        """Move a scope's watermark; whether it moved forward."""
        return self._follow(self.dispatcher.watermark(record))

    # -- the clock (the reaper's source) --------------------------------------------------------

    def advance_clock(self, now_ms: int) -> list[Outcome]:
        """Advance every engine with work due; the ``expired`` outcomes, released in order."""
        expired: list[Outcome] = []
        for decision in self.dispatcher.advance_clock(now_ms):
            self._release.decided(decision.outcomes)
            expired += decision.outcomes
        return expired

    def next_expiration_ms(self) -> int | None:
        """When an engine has work next."""
        return self.dispatcher.next_expiration_ms()

    def catch_up(self, now_ms: int) -> int:
        """Decide every expiration due by ``now_ms`` (at shutdown); returns how many."""
        total = 0
        while True:  # each step is bounded by max_fire_per_step
            expired = self.advance_clock(now_ms)
            if not expired:
                return total
            total += len(expired)

    async def _handed_over(self, _expired: list[Any]) -> None:
        await self._egress.wait_for_room()  # the release already took them

    def _follow(self, decision: Decision[R]) -> R:
        if decision.outcomes:
            self._release.decided(decision.outcomes)
        if decision.wake_now:
            self.reaper.wake()
        elif decision.wake_ms is not None:
            self.reaper.wake_if_earlier(decision.wake_ms)
        return decision.result
