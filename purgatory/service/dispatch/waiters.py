"""Who waits for an outcome to be delivered (service layer: dispatch).

A long poll (``GET /v1/operation/wait``) waits until its operation's outcome is not only decided
but delivered (its callback acknowledged), so that what it returns is also on the callbacks
topic. :class:`Waiters` keeps the operations decided and not yet delivered, and one event per
operation somebody waits for; the acknowledgements (egress) tell it of each delivery.

At a graceful stop every long poll is answered at once, as if its time were up (the operation
still pending, or its outcome if delivered): the stop does not wait out a poll of a minute
before it hands its partitions over, and the client polls again, at the next owner.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

__all__ = ["Waiters"]

Ident = tuple[str, str]  # (scope, op_id)


class Waiters:
    """Operations decided and not yet delivered, and the events their waiters wait on."""

    def __init__(self) -> None:
        self._undelivered: set[Ident] = set()
        self._events: dict[Ident, trio.Event] = {}
        self._released = False

    def decided(self, idents: Iterable[Ident]) -> None:
        """These operations' outcomes are decided (or re-sent): not delivered until told."""
        self._undelivered.update(idents)

    def delivered(self, ident: Ident) -> None:
        """The operation's callback was acknowledged: wake whoever waits for it."""
        self._undelivered.discard(ident)
        event = self._events.pop(ident, None)
        if event is not None:
            event.set()

    def undelivered(self, ident: Ident) -> bool:
        """Whether the operation's outcome is decided and not delivered yet."""
        return ident in self._undelivered

    async def wait(self, ident: Ident, timeout_s: float) -> None:
        """Until the operation's outcome is delivered, ``timeout_s`` has passed, or the
        waits were released (:meth:`release`)."""
        if self._released:
            await trio.lowlevel.checkpoint()
            return
        event = self._events.setdefault(ident, trio.Event())
        with trio.move_on_after(timeout_s):
            await event.wait()

    def release(self) -> None:
        """A graceful stop: every wait returns now, and every later one at once."""
        self._released = True
        for event in self._events.values():
            event.set()
        self._events.clear()

    def counts(self) -> tuple[int, int]:
        """How many outcomes are undelivered, and how many operations are waited for."""
        return len(self._undelivered), len(self._events)
