"""How the HTTP server treats its connections (service layer): hypercorn's limits, and what an
answer given before its request's body was read does to the connection.

Slow and stalled clients (:func:`server_config`; hypercorn's trio worker serves the API). Each
stage of a request has a bound, so a stalled or trickling client is dropped in bounded time and
stalled uploads cannot pile up:

* the request line and headers: at most ``h11_max_incomplete_size`` (:data:`MAX_INCOMPLETE_BYTES`,
  16 KiB), whole within the keep-alive timeout (:data:`KEEP_ALIVE_TIMEOUT_S`, 5 s) of connecting
  or of the previous answer: hypercorn's idle timer runs until a request's head is whole, then
  the connection is closed;
* the body: whole within ``body_timeout_s`` (:data:`BODY_TIMEOUT_S`, 30 s), else 408 and the
  connection is closed;
* any moment: hypercorn's ``read_timeout`` closes a connection that sent nothing for that long.
  It reads a connection all the time, a request in progress included, and a long poll sends
  nothing while it waits, so this is the longest long poll (``max_wait_ms``) plus
  :data:`READ_GRACE_S` (10 s): 70 s by default.

Early answers (:class:`EarlyAnswers`). A 401 (no known token), a 413 (a declared
``Content-Length`` over ``max_request_bytes``), a 404 or a 405 is answered before the request's
body was read. HTTP/1.1 keeps a connection unless the answer says ``Connection: close``, yet
hypercorn closes one whose request body had not arrived whole when the answer ended, without a
word: a keep-alive client that sends the rest of its body, or its next request, meets a broken
pipe. So an early answer is sent at once, whole; when the rest of the body is declared and at
most :data:`DRAIN_FACTOR` times ``max_request_bytes``, the answer's end is held back while that
rest is read and thrown away (within ``body_timeout_s``, else the connection is closed as after a
408), and the connection then serves the next request. A larger rest, or one of unknown length
(chunked), is not read: the answer says ``Connection: close`` and the connection is closed, so
the client opens a new one. Reading the body first and answering after would keep the connection
too, but would hold the answer back from a client that waits for it before it sends its body.
"""

from __future__ import annotations

from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from starlette.applications import Starlette
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "BODY_TIMEOUT_S",
    "DRAIN_FACTOR",
    "KEEP_ALIVE_TIMEOUT_S",
    "MAX_INCOMPLETE_BYTES",
    "READ_GRACE_S",
    "EarlyAnswers",
    "InFlight",
    "serve_app",
    "server_config",
]

#: How long a request's body may take to arrive, whole.
BODY_TIMEOUT_S = 30.0
#: A connection's read timeout beyond the longest long poll.
READ_GRACE_S = 10.0
#: How long an idle keep-alive connection is kept (and a request's head may take).
KEEP_ALIVE_TIMEOUT_S = 5.0
#: The most bytes of a request line and headers.
MAX_INCOMPLETE_BYTES = 16 * 1024
#: After an early answer, the most of a body read and thrown away, in ``max_request_bytes``.
DRAIN_FACTOR = 2
_CLOSE = (b"connection", b"close")


def server_config(
    bind: str,
    *,
    max_wait_ms: int,
    graceful_timeout_s: float,
    read_grace_s: float = READ_GRACE_S,
    keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S,
) -> HypercornConfig:
    """Hypercorn's configuration for the API on ``bind`` (``host:port``); see the module
    docstring for the timeouts and limits."""
    config = HypercornConfig()
    config.bind = [bind]
    config.accesslog = None
    config.graceful_timeout = graceful_timeout_s
    config.read_timeout = max_wait_ms / 1000 + read_grace_s  # type: ignore[assignment]
    config.keep_alive_timeout = keep_alive_timeout_s
    config.h11_max_incomplete_size = MAX_INCOMPLETE_BYTES
    return config


class InFlight:
    """The HTTP requests the application is answering now (counted by :class:`EarlyAnswers`)."""

    def __init__(self) -> None:
        self.count = 0
        self._none = trio.Event()
        self._none.set()

    def entered(self) -> None:
        self.count += 1
        if self.count == 1:
            self._none = trio.Event()

    def left(self) -> None:
        self.count -= 1
        if not self.count:
            self._none.set()

    async def wait_for_none(self) -> None:
        """Return once no request is being answered."""
        while self.count:
            await self._none.wait()


async def serve_app(
    app: Starlette,
    config: HypercornConfig,
    done: trio.Event | None,
    stopped: trio.Event,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` with hypercorn's trio worker until ``stopped``, then take no new
    connection and answer the requests in flight (within ``config.graceful_timeout``); the
    bound addresses go to ``task_status``, and ``done`` is set once it is over.

    Over means every request ``app`` was answering has its answer: hypercorn itself may wait
    out its whole graceful timeout for connections that carry no request (seen in a rollout:
    10 s with none in flight), and nothing is lost by closing those.
    """
    asgi: Any = app  # hypercorn's framework type does not name Starlette
    in_flight: InFlight = app.state.in_flight
    try:
        async with trio.open_nursery() as nursery:

            async def close_once_answered() -> None:
                await stopped.wait()
                await in_flight.wait_for_none()
                await trio.sleep(0)  # hypercorn takes the last answers' ends
                nursery.cancel_scope.cancel()

            nursery.start_soon(close_once_answered)
            await serve(asgi, config, shutdown_trigger=stopped.wait, task_status=task_status)
            nursery.cancel_scope.cancel()
    finally:
        if done is not None:
            done.set()


class _Body:
    """What has arrived of a request's body, told by each ASGI message the application receives."""

    def __init__(self, scope: Scope) -> None:
        headers = dict(scope["headers"])  # h11 lower-cases the names, refuses repeated lengths
        length = headers.get(b"content-length")
        self.declared = int(length) if length is not None else None
        #: Whether the body ended (or the client left), or there is none.
        self.ended = self.declared in (None, 0) and b"transfer-encoding" not in headers
        self.received = 0

    def saw(self, message: Message) -> None:
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            self.ended = self.ended or not message.get("more_body", False)
        else:  # http.disconnect
            self.ended = True

    def left(self) -> int | None:
        """The bytes still to come (None: unknown, the body is chunked)."""
        return None if self.declared is None else self.declared - self.received


class EarlyAnswers:
    """ASGI middleware: an answer given before its request's body was read keeps a keep-alive
    connection usable (see the module docstring).

    Args:
        app: the application.
        max_bytes: the most of a body read and thrown away after an early answer; a larger (or
            chunked) rest is not read, and the answer says ``Connection: close``.
        within_s: how long that reading may take; past it, the connection is closed.
    """

    def __init__(
        self, app: ASGIApp, *, max_bytes: int, within_s: float, in_flight: InFlight | None = None
    ) -> None:
        self._app = app
        self._max_bytes = max_bytes
        self._within_s = within_s
        self._in_flight = in_flight if in_flight is not None else InFlight()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        body = _Body(scope)
        drain = False

        async def receive_seen() -> Message:
            message = await receive()
            body.saw(message)
            return message

        async def send_then_drain(message: Message) -> None:
            nonlocal drain
            if message["type"] == "http.response.start" and not body.ended:
                headers = list(message.get("headers", []))
                closing = any(
                    n.lower() == b"connection" and b"close" in v.lower() for n, v in headers
                )
                left = body.left()
                drain = not closing and left is not None and left <= self._max_bytes
                if not closing and not drain:
                    message = {**message, "headers": [*headers, _CLOSE]}
            elif message["type"] == "http.response.body" and drain and not message.get("more_body"):
                await send({**message, "more_body": True})  # the whole answer, at once
                with trio.move_on_after(self._within_s):
                    while not body.ended:
                        await receive_seen()
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        self._in_flight.entered()
        try:
            await self._app(scope, receive_seen, send_then_drain)
        finally:
            self._in_flight.left()
