"""Waiting for one operation's outcome until a time limit (client concept: a patient wait).

:func:`await_outcome` is what a host that waits on purgatory for a long time runs, such as
Airflow's trigger (:mod:`purgatory.airflow`): it holds the service's long poll
(``GET /v1/operation/wait``) open, one call after another, and polls nothing on a fixed
interval. It is loop-neutral like :class:`~purgatory.client.AsyncPurgatoryClient` (trio or
asyncio) and returns a plain dict, the payload of an Airflow ``TriggerEvent``:

``{"status", "scope", "op_id", "outcome", "message"}``
    ``status`` is the outcome's (``completed``, ``expired`` or ``cancelled``, with its callback
    as ``outcome``), or ``timeout`` (the limit passed with no outcome) or ``error`` (an answer
    that waiting longer cannot change, such as a 4xx; ``message`` says which).

What it rides out within its limit, since a wait outlives pods and deploys:

* a 503 (a partition restoring, a replica handing over): the client already retries it as the
  service asks; once the client gives up, the wait pauses and asks again;
* a transport failure (the service restarting, a network blip): pauses that double from
  :data:`FIRST_PAUSE_S` up to :data:`MAX_PAUSE_S`, then again;
* a 404 for an operation that someone else registers (a Spark job, another DAG), when told to
  wait for its registration: the same pauses until it exists. This is the only case that polls,
  and only until the registration arrives.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from purgatory._core import TransportError
from purgatory.client._clients import AsyncPurgatoryClient
from purgatory.client._requests import ApiError

__all__ = ["FIRST_PAUSE_S", "MAX_PAUSE_S", "await_outcome"]

#: The first pause after a failed try; each later one doubles, up to :data:`MAX_PAUSE_S`.
FIRST_PAUSE_S = 0.5
#: The longest pause between two tries.
MAX_PAUSE_S = 10.0
_OUTCOMES = ("completed", "expired", "cancelled")


def _event(
    status: str, scope: str, op_id: str, outcome: Any = None, message: str = ""
) -> dict[str, Any]:
    return {
        "status": status,
        "scope": scope,
        "op_id": op_id,
        "outcome": outcome,
        "message": message or None,
    }


async def await_outcome(
    client: AsyncPurgatoryClient,
    scope: str,
    op_id: str,
    *,
    limit_s: float,
    poll_ms: int = 30_000,
    wait_for_registration: bool = False,
    clock: Callable[[], float] = anyio.current_time,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
) -> dict[str, Any]:
    """Wait up to ``limit_s`` seconds for the outcome of ``scope``/``op_id`` (see the module).

    ``poll_ms`` is one long poll's length (at most the service's ``max_wait_ms``); ``clock`` and
    ``sleep`` are the loop's unless a test passes virtual ones.
    """
    end = clock() + limit_s
    pause = FIRST_PAUSE_S
    while (left_s := end - clock()) > 0:
        try:
            answer = await client.wait(
                scope, op_id, timeout_ms=max(1, min(poll_ms, int(left_s * 1000)))
            )
        except ApiError as exc:
            if not (exc.status == 503 or (exc.status == 404 and wait_for_registration)):
                return _event("error", scope, op_id, message=str(exc))
        except TransportError:
            pass
        else:
            pause = FIRST_PAUSE_S
            if answer.get("status") in _OUTCOMES:
                return _event(answer["status"], scope, op_id, answer.get("outcome"))
            continue  # the long poll ended without an outcome: hold the next one
        await sleep(min(pause, max(0.0, end - clock())))
        pause = min(pause * 2, MAX_PAUSE_S)
    return _event("timeout", scope, op_id, message=f"no outcome within {limit_s:g} s")
