"""The read model (service layer: dispatch): operations looked up, listed and waited for.

Reads change nothing: they look the scope's engine up in the partition table (a partition not
served here answers :class:`~purgatory.service.errors.NotServingError`, HTTP 503) and ask it.
A long poll (:meth:`Reads.wait`) answers with an outcome only once its callback was
acknowledged (:meth:`Reads.delivered`, an acknowledgement's listener), never when it is merely
decided: a client that saw the answer can count on the callback being in its topic.
"""

from __future__ import annotations

from purgatory._core import OperationSpec, Outcome, UsageError
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.dispatch.waiters import Waiters
from purgatory.service.errors import NotServingError

__all__ = ["Reads"]


class Reads:
    """Answers what the engines hold, and wakes long polls as callbacks are acknowledged.

    Args:
        table: the engines of the partitions served here.
        waiters: the outcomes decided and not yet delivered.
    """

    def __init__(self, table: PartitionTable, waiters: Waiters) -> None:
        self.table = table
        self.waiters = waiters

    def lookup(self, scope: str, op_id: str) -> tuple[OperationSpec, Outcome | None] | None:
        """An operation's spec and outcome (None: unknown)."""
        return self.table.engine_of(scope).lookup(scope, op_id)

    def pending(self, scope: str) -> list[OperationSpec]:
        """The pending operations of ``scope``."""
        return self.table.engine_of(scope).pending(scope)

    def pending_page(self, scope: str, *, after: str | None, limit: int) -> list[OperationSpec]:
        """Up to ``limit`` pending operations of ``scope`` in ``op_id`` order, after the op_id
        ``after`` (None: from the first); O(log n + limit), see ``Engine.pending_page``."""
        return self.table.engine_of(scope).pending_page(scope, after, limit)

    def delivered(self, outcome: Outcome) -> None:
        """Called once the outcome's callback is acknowledged: the partition's delivered mark
        moves, and whoever waits for it wakes."""
        self.table.delivered(outcome)
        self.waiters.delivered((outcome.scope, outcome.op_id))

    async def wait(self, scope: str, op_id: str, timeout_ms: int) -> Outcome | None:
        """Wait up to ``timeout_ms`` for an operation's outcome to be delivered (long poll).

        Returns:
            The outcome, or None if it is still pending when the time is up.

        Raises:
            UsageError: the operation is unknown.
        """
        found = self.lookup(scope, op_id)
        if found is None:
            raise UsageError(f"op_id {op_id!r} is not known in scope {scope!r}")
        ident = (scope, op_id)
        if found[1] is not None and not self.waiters.undelivered(ident):
            return found[1]  # decided and delivered
        await self.waiters.wait(ident, timeout_ms / 1000)
        if self.waiters.undelivered(ident):
            return None
        try:
            again = self.lookup(scope, op_id)
        except NotServingError:
            return None
        return again[1] if again is not None else None
