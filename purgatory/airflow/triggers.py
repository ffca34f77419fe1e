"""The triggerer's side of a wait (airflow integration: the trigger).

:class:`PurgatoryTrigger` runs in Airflow's triggerer, an asyncio loop holding many waits at
once. It holds the service's long poll open (:func:`purgatory.client._await.await_outcome`)
until the operation's outcome, then fires once with it. Its serialized form holds the
connection's *id*, never the token, and the wall-clock moment the wait gives up, so a trigger
re-created after a triggerer restart waits only for what is left. Waiting again is safe: the
wait reads the outcome, it changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from purgatory.airflow.hooks import PurgatoryHook
from purgatory.client._await import await_outcome

__all__ = ["PurgatoryTrigger"]


class PurgatoryTrigger(BaseTrigger):  # type: ignore[misc]
    """Fires once with the outcome of ``scope``/``op_id``, or with why there is none.

    Args:
        scope: the operation's scope.
        op_id: the operation's id.
        until_s: the wall-clock time (UNIX seconds) after which it fires ``timeout``.
        purgatory_conn_id: the connection of the service.
        wait_for_registration: an unknown operation is waited for (someone else registers
            it) instead of failing at once.
        poll_ms: one long poll's length (at most the service's ``max_wait_ms``).
    """

    def __init__(
        self,
        scope: str,
        op_id: str,
        until_s: float,
        *,
        purgatory_conn_id: str = PurgatoryHook.default_conn_name,
        wait_for_registration: bool = False,
        poll_ms: int = 30_000,
    ) -> None:
        super().__init__()
        self.scope = scope
        self.op_id = op_id
        self.until_s = until_s
        self.purgatory_conn_id = purgatory_conn_id
        self.wait_for_registration = wait_for_registration
        self.poll_ms = poll_ms

    def serialize(self) -> tuple[str, dict[str, Any]]:
        """The class path and the fields that re-create this trigger."""
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "scope": self.scope,
                "op_id": self.op_id,
                "until_s": self.until_s,
                "purgatory_conn_id": self.purgatory_conn_id,
                "wait_for_registration": self.wait_for_registration,
                "poll_ms": self.poll_ms,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        """Wait for the outcome; fire once with :func:`await_outcome`'s event."""
        self.log.info("waiting for the outcome of %s/%s", self.scope, self.op_id)
        client = await PurgatoryHook(self.purgatory_conn_id).get_async_conn()
        async with client:
            event = await await_outcome(
                client,
                self.scope,
                self.op_id,
                limit_s=max(0.0, self.until_s - time.time()),
                poll_ms=self.poll_ms,
                wait_for_registration=self.wait_for_registration,
            )
        yield TriggerEvent(event)
