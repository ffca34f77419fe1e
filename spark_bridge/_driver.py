"""Driver-side helpers (Spark bridge concept: the job's driver talks to the service over HTTP).

A Spark job's driver registers the operation it will wait for, signals what it finished, and
blocks on a barrier until the outcome, with a deadline of its own:

    with Driver("http://purgatory:8080") as purgatory:
        purgatory.register(scope=run, op_id="report", keys=["ingest/orders", "ingest/users"],
                           deadline_ms=six_am_ms)
        outcome = purgatory.wait_for(run, "report", timeout_s=3600)
        if outcome["outcome"] == "expired":
            raise SystemExit(f"missing: {outcome['missing']}")

``wait_for`` long-polls in slices no longer than the service's ``max_wait_ms`` (60 s by
default) until its own ``timeout_s`` runs out, then raises :class:`BarrierTimeoutError` naming the
operation: a driver never hangs forever on a service that is down or an operation that is not
due yet. Executors never call these (they publish through the ``purgatory-signals`` sink).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from purgatory._core import PurgatoryError
from purgatory.client import PurgatoryClient

__all__ = ["BarrierTimeoutError", "Driver"]

_SLICE_MS = 55_000  # under the service's default max_wait_ms (60 s)


class BarrierTimeoutError(PurgatoryError, TimeoutError):
    """The operation had no outcome when the driver's own timeout ran out."""


class Driver:
    """The service seen from a Spark driver.

    Args:
        url: the service's HTTP API.
        token: the API token, when the service requires one.
        client: an already built client (tests); ``url`` and ``token`` are then ignored.
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:8080",
        *,
        token: str | None = None,
        client: PurgatoryClient | None = None,
    ) -> None:
        self._client = client if client is not None else PurgatoryClient(url, token=token)

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        self._client.close()

    def register(self, **spec: Any) -> Any:
        """Register an operation (arguments as :func:`purgatory.client.operation`)."""
        return self._client.register(**spec)

    def signal(self, scope: str, key: str, *, payload: Any = None) -> Any:
        """Publish one signal from the driver (e.g. "this upstream job is done")."""
        return self._client.signal(scope, key, payload=payload)

    def signals(self, items: Iterable[dict[str, Any]]) -> Any:
        """Publish several signals in one request."""
        return self._client.signals(items)

    def wait_for(self, scope: str, op_id: str, *, timeout_s: float) -> dict[str, Any]:
        """Block until the operation's outcome, at most ``timeout_s`` seconds.

        Returns:
            The callback record (``outcome``, ``keys``, ``missing``, ``payload``, ...).

        Raises:
            BarrierTimeoutError: still pending when ``timeout_s`` ran out (names the operation).
            ApiError: the service does not know the operation (404) or refused the call.
        """
        if timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {timeout_s}")
        end = time.perf_counter() + timeout_s
        while True:
            left_ms = max(0, int((end - time.perf_counter()) * 1000))
            answer = self._client.wait(scope, op_id, timeout_ms=min(left_ms, _SLICE_MS))
            if answer.get("status") != "pending":
                outcome: dict[str, Any] = answer["outcome"]
                return outcome
            if left_ms == 0 or time.perf_counter() >= end:
                raise BarrierTimeoutError(
                    f"op_id {op_id!r} in scope {scope!r} is still pending after {timeout_s} s"
                )
