"""The Python clients of the HTTP API (client concept: a blocking and an async transport).

``PurgatoryClient`` blocks (httpx.Client); ``AsyncPurgatoryClient`` is loop-neutral: it runs
under trio (the service's own tests and tools) and under asyncio (Airflow's triggerer, Jupyter),
because httpx.AsyncClient and the client's own clock and pauses go through anyio, which asks
the running loop. Both send the calls built by
:mod:`purgatory.client._requests`; a transport failure becomes :class:`TransportError`, an error
answer :class:`ApiError` naming the field.

A 503 with Retry-After (the scope's partition is being restored, after a restart or a move, or
the broker did not acknowledge the write's journal entry within the service's
``PURGATORY_JOURNAL_WAIT_MS``) is tried again, pausing as the service asks, until ``timeout_s``
has passed since the first try; then the 503 is raised (:class:`ApiError`, with the service's
message). Every write is idempotent (a retried registration is a duplicate, a retried signal
only refreshes what is remembered), so a retry is safe, even of a write the service had applied
before it answered 503: after a 503 that says ``Purgatory-Applied: maybe``, every later try is
marked ``Purgatory-Retry: 1``, so a timer sent with a relative ``timeout_ms`` is not armed a
second time and a retried cancel finds its own outcome (:mod:`purgatory._codec._retry`).
Keep ``timeout_s`` well above the service's journal wait, or a slow broker exhausts it in one
try.
"""

from __future__ import annotations

import functools
import ssl
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

import anyio
import httpx

from purgatory._core import TransportError
from purgatory.client._requests import (
    Call,
    Tries,
    answer,
    call_cancel,
    call_get,
    call_overview,
    call_pending,
    call_register,
    call_register_many,
    call_signals,
    call_wait,
    call_watermarks,
    operation,
)

__all__ = ["AsyncPurgatoryClient", "PurgatoryClient"]


@functools.cache
def _tls() -> ssl.SSLContext:
    """One TLS context for every client of the process. httpx builds one per client when not
    given one, loading the CA bundle each time (about 840 KiB a client); a host that holds a
    client per wait (Airflow's triggerer: one per deferred task) would spend that per wait."""
    return httpx.create_ssl_context()


def _headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def _signal(scope: str, key: str, payload: Any, event_time_ms: int | None) -> dict[str, Any]:
    item: dict[str, Any] = {"scope": scope, "key": key}
    if payload is not None:
        item["payload"] = payload
    if event_time_ms is not None:
        item["event_time_ms"] = event_time_ms
    return item


class PurgatoryClient:
    """A blocking client.

    Args:
        base_url: the service, e.g. ``http://127.0.0.1:8080``.
        token: the API token, when the service requires one.
        timeout_s: per request (a wait adds its own ``timeout_ms``).
        transport: an httpx transport (tests pass the app's ASGI or a mock transport).
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._clock: Callable[[], float] = time.monotonic  # tests replace both
        self._sleep: Callable[[float], None] = time.sleep
        self._http = httpx.Client(
            base_url=base_url, headers=_headers(token), timeout=timeout_s, transport=transport,
            verify=_tls(),
        )  # fmt: skip

    def __enter__(self) -> PurgatoryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def _run(self, call: Call, *, extra_s: float = 0.0) -> Any:
        tries = Tries(self._clock(), self._timeout_s)
        while True:
            try:
                response = self._http.request(
                    **call.request_args(self._timeout_s + extra_s), headers=tries.headers
                )
            except httpx.HTTPError as exc:
                raise TransportError(f"{call.method} {call.path}: {exc!r}") from exc
            pause = tries.pause(response.status_code, response.headers, self._clock())
            if pause is None:
                return answer(response.status_code, response.content)
            self._sleep(pause)

    def register(self, **spec: Any) -> Any:
        """Register one operation (see :func:`purgatory.client.operation` for the arguments)."""
        return self._run(call_register(operation(**spec)))

    def register_many(self, bodies: Iterable[Mapping[str, Any]]) -> Any:
        """Register many operations in one request (bodies from :func:`operation`)."""
        return self._run(call_register_many(bodies))

    def get(self, scope: str, op_id: str) -> Any:
        """An operation and its outcome, if decided."""
        return self._run(call_get(scope, op_id))

    def wait(self, scope: str, op_id: str, timeout_ms: int = 30_000) -> Any:
        """Wait up to ``timeout_ms`` for an operation's outcome."""
        return self._run(call_wait(scope, op_id, timeout_ms), extra_s=timeout_ms / 1000)

    def cancel(self, scope: str, op_id: str) -> Any:
        """Cancel a pending operation."""
        return self._run(call_cancel(scope, op_id))

    def pending(self, scope: str, *, limit: int | None = None, cursor: str | None = None) -> Any:
        """A page of a scope's pending operations, in op_id order: ``{"operations": [...],
        "next_cursor": ...}``; pass ``next_cursor`` back as ``cursor`` for the next page (it is
        null after the last one)."""
        return self._run(call_pending(scope, limit, cursor))

    def overview(self) -> Any:
        """What this replica holds (the data of its page at ``/ui``): partitions, the busiest
        scopes, the next deadlines, the latest outcomes and dead letters."""
        return self._run(call_overview())

    def signal(
        self, scope: str, key: str, *, payload: Any = None, event_time_ms: int | None = None
    ) -> Any:
        """Publish one signal."""
        return self._run(call_signals([_signal(scope, key, payload, event_time_ms)]))

    def signals(self, items: Iterable[Mapping[str, Any]]) -> Any:
        """Publish many signals (``{"scope", "key", "payload"?, "event_time_ms"?}`` each)."""
        return self._run(call_signals(items))

    def watermark(self, scope: str, watermark_ms: int) -> Any:
        """Advance a scope's event-time watermark."""
        return self._run(call_watermarks([{"scope": scope, "watermark_ms": watermark_ms}]))


class AsyncPurgatoryClient:
    """The same client for trio or asyncio (``async with AsyncPurgatoryClient(...) as client``).

    It binds to no event loop when made: each call runs on the loop that awaits it.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8080",
        *,
        token: str | None = None,
        timeout_s: float = 30.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._timeout_s = timeout_s
        self._clock: Callable[[], float] = anyio.current_time  # tests replace both
        self._sleep: Callable[[float], Awaitable[None]] = anyio.sleep
        self._http = httpx.AsyncClient(
            base_url=base_url, headers=_headers(token), timeout=timeout_s, transport=transport,
            verify=_tls(),
        )  # fmt: skip

    async def __aenter__(self) -> AsyncPurgatoryClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connections."""
        await self._http.aclose()

    async def _run(self, call: Call, *, extra_s: float = 0.0) -> Any:
        tries = Tries(self._clock(), self._timeout_s)
        while True:
            try:
                response = await self._http.request(
                    **call.request_args(self._timeout_s + extra_s), headers=tries.headers
                )
            except httpx.HTTPError as exc:
                raise TransportError(f"{call.method} {call.path}: {exc!r}") from exc
            pause = tries.pause(response.status_code, response.headers, self._clock())
            if pause is None:
                return answer(response.status_code, response.content)
            await self._sleep(pause)

    async def register(self, **spec: Any) -> Any:
        """Register one operation."""
        return await self._run(call_register(operation(**spec)))

    async def register_many(self, bodies: Iterable[Mapping[str, Any]]) -> Any:
        """Register many operations in one request."""
        return await self._run(call_register_many(bodies))

    async def get(self, scope: str, op_id: str) -> Any:
        """An operation and its outcome, if decided."""
        return await self._run(call_get(scope, op_id))

    async def wait(self, scope: str, op_id: str, timeout_ms: int = 30_000) -> Any:
        """Wait up to ``timeout_ms`` for an operation's outcome."""
        return await self._run(call_wait(scope, op_id, timeout_ms), extra_s=timeout_ms / 1000)

    async def cancel(self, scope: str, op_id: str) -> Any:
        """Cancel a pending operation."""
        return await self._run(call_cancel(scope, op_id))

    async def pending(
        self, scope: str, *, limit: int | None = None, cursor: str | None = None
    ) -> Any:
        """A page of a scope's pending operations (see :meth:`PurgatoryClient.pending`)."""
        return await self._run(call_pending(scope, limit, cursor))

    async def overview(self) -> Any:
        """What this replica holds (see :meth:`PurgatoryClient.overview`)."""
        return await self._run(call_overview())

    async def signal(
        self, scope: str, key: str, *, payload: Any = None, event_time_ms: int | None = None
    ) -> Any:
        """Publish one signal."""
        return await self._run(call_signals([_signal(scope, key, payload, event_time_ms)]))

    async def signals(self, items: Iterable[Mapping[str, Any]]) -> Any:
        """Publish many signals."""
        return await self._run(call_signals(items))

    async def watermark(self, scope: str, watermark_ms: int) -> Any:
        """Advance a scope's event-time watermark."""
        return await self._run(call_watermarks([{"scope": scope, "watermark_ms": watermark_ms}]))
