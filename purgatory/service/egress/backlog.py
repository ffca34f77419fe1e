"""The outbox's backlog (service layer: egress): what is decided and not yet handed to the sink,
in decision order, with back-pressure.

Puts are synchronous (the release and the intake call them with no ``await`` in between),
so the backlog's order is the order in which things were decided. It holds :data:`Entry` items:
callbacks and dead letters (*records*, which count against ``capacity``), commit markers and
barriers (which do not: they are tiny, and a producer waiting for room must not wait on them).

The sender takes chunks of at most ``chunk`` records from the front (:meth:`Backlog.take`); a
producer that must not run ahead of the broker waits in :meth:`Backlog.wait_for_room` while more
than ``capacity`` records are queued. :meth:`Backlog.close` refuses further puts and wakes
everyone; the sender drains what is left, then :meth:`Backlog.ready` says so.

States: *open* (puts accepted) and *closed* (puts raise :class:`trio.ClosedResourceError`,
except empty ones, which are no-ops in either state; :meth:`~Backlog.wait_for_room` returns at
once; :meth:`~Backlog.ready` is False once the backlog is also empty).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import trio

from purgatory._core import Outcome
from purgatory.service.egress.records import Entry, Ref

__all__ = ["Backlog"]


class Backlog:
    """The ordered queue of what the outbox must write.

    Args:
        capacity: records queued before :meth:`wait_for_room` makes producers wait.
        chunk: the most records one :meth:`take` returns.
    """

    def __init__(self, *, capacity: int, chunk: int) -> None:
        self._capacity = capacity
        self._chunk = chunk
        self._queue: deque[Entry] = deque()
        self._records = 0
        self._wakeup = trio.Event()
        self._room = trio.Event()
        self._closed = False

    @property
    def queued(self) -> int:
        """Records (callbacks and dead letters) queued, not yet taken."""
        return self._records

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (no more puts)."""
        return self._closed

    @property
    def has_room(self) -> bool:
        """Whether a producer may go on: at most ``capacity`` records queued, or closed."""
        return self._records <= self._capacity or self._closed

    # -- puts (synchronous, in decision order) -------------------------------------------------

    def put(self, outcomes: Sequence[Outcome]) -> None:
        """Queue the callbacks of ``outcomes``, in order.

        Raises:
            trio.ClosedResourceError: the backlog was closed (and ``outcomes`` is not empty).
        """
        if outcomes:
            self._check_open()
            self._queue.extend(outcomes)
            self._records += len(outcomes)
            self._wakeup.set()

    def put_letter(self, letter: Ref) -> None:
        """Queue a dead letter.

        Raises:
            trio.ClosedResourceError: the backlog was closed.
        """
        self._check_open()
        self._queue.append(letter)
        self._records += 1
        self._wakeup.set()

    def put_commit(self, offsets: Mapping[tuple[str, int], int]) -> None:
        """Queue a commit marker: ``offsets``, to commit once everything before is settled.

        Raises:
            trio.ClosedResourceError: the backlog was closed (and ``offsets`` is not empty).
        """
        if offsets:
            self._check_open()
            self._queue.append(dict(offsets))
            self._wakeup.set()

    def put_barrier(self, barrier: trio.Event) -> None:
        """Queue ``barrier``, to set once everything before it is settled.

        Raises:
            trio.ClosedResourceError: the backlog was closed.
        """
        self._check_open()
        self._queue.append(barrier)
        self._wakeup.set()

    # -- the sender's side ---------------------------------------------------------------------

    async def ready(self) -> bool:
        """Wait until something is queued (True) or the backlog is closed and empty (False)."""
        while not self._queue:
            if self._closed:
                return False
            self._wakeup = trio.Event()
            await self._wakeup.wait()
        return True

    def take(self) -> list[Entry]:
        """Take entries from the front, up to ``chunk`` records (and the markers and barriers
        among them); wake the producers waiting for room if there is room now."""
        queue, taken = self._queue, []
        records, chunk = 0, self._chunk
        while queue and records < chunk:
            entry = queue.popleft()
            taken.append(entry)
            records += not isinstance(entry, dict | trio.Event)
        self._records -= records
        if self._records <= self._capacity:
            self._room.set()
        return taken

    # -- the producers' side -------------------------------------------------------------------

    async def wait_for_room(self) -> None:
        """Wait while more than ``capacity`` records are queued (back-pressure for producers)."""
        while self._records > self._capacity and not self._closed:
            self._room = trio.Event()
            await self._room.wait()
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """Refuse further puts; wake the sender (to drain) and every producer waiting for room."""
        self._closed = True
        self._wakeup.set()
        self._room.set()

    def _check_open(self) -> None:
        if self._closed:
            raise trio.ClosedResourceError("the outbox is closed")
