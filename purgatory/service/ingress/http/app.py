"""The HTTP API (service layer): Starlette routes over the flow of inputs and the read model.

Bodies are the JSON records of :mod:`purgatory._codec` without their ``v``/``type`` envelope,
parsed by the codec's own parser (:func:`~purgatory._codec._json.parse_json`: UTF-8 only, no
repeated name, at most 64 levels deep), so HTTP and Kafka accept exactly the same operations and
signals, validated by the same code (and described by the same JSON Schemas, which the OpenAPI
document references). Operations are addressed by query parameters (``?scope=...&op_id=...``)
because both may contain ``/``.

One table, :data:`purgatory.service.ingress.http.routes.ROUTES`, lists every route: its path and
method, its handler (a module-level function that finds the state, the configuration and the
journal's gate on ``request.app``), whether it needs a bearer token, and what it documents
(summary, query parameters, request body schema, answers with their media types and headers).
:func:`build_app` serves the table and :mod:`purgatory.service.ingress.http.openapi` documents it,
so a
route cannot be served undocumented.

Errors are JSON ``{"error": {"status", "field", "message"}}`` with the field that was wrong:
400 malformed JSON (``(body)``), 401 no known bearer token (``Authorization``, with
``WWW-Authenticate: Bearer``), 404 unknown operation or path, 405 a method the path does not
serve (with ``Allow``), 408 a body that did not arrive in time, 409 an id reused with another
body, 413 a body over ``max_request_bytes`` or a batch over ``max_batch``, 422 a field or query
parameter out of its domain (an unknown field included), 429 a limit (with ``Retry-After``), 503
(with ``Retry-After``) whatever :class:`~purgatory.service.errors.UnavailableError` says (a
partition not served here yet, a journal the broker did not acknowledge within
``PURGATORY_JOURNAL_WAIT_MS``) or a journal that failed. Nothing is half-applied: a batch is
validated whole before any item is applied.

The modules: ``context`` (the routes' configuration and what every handler is given),
``bodies`` and ``queries`` (reading a request), ``forwarding`` (sending it to its scope's
owner), ``answers`` (the one error mapping, :func:`~.answers.as_http_error`, and the JSON of
outcomes), ``table`` (what a route is), ``routes`` (the handlers and the table), ``server``
(how slow and stalled clients are cut off, and how an answer given before the body was read
keeps the connection), and this one, which serves the table.
"""

from __future__ import annotations

from collections.abc import Mapping

import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route, request_response
from starlette.types import Receive, Scope, Send

from purgatory._core import PurgatoryError
from purgatory.service.errors import NotServingError, OwnerUnansweredError
from purgatory.service.ingress.http.answers import HttpError, as_http_error, error_response
from purgatory.service.ingress.http.auth import ANONYMOUS, AuthError
from purgatory.service.ingress.http.context import (
    HttpConfig,
    RequestContext,
    Served,
    context_of,
)
from purgatory.service.ingress.http.forwarding import (
    ForwardRefusedError,
    forward_to_owner,
    owner_response,
    owner_url_for,
)
from purgatory.service.ingress.http.queries import long_poll_wait_s
from purgatory.service.ingress.http.routes import ROUTES
from purgatory.service.ingress.http.server import DRAIN_FACTOR, EarlyAnswers, InFlight
from purgatory.service.ingress.http.table import ApiRoute
from purgatory.service.telemetry.logging import get_logger

__all__ = ["HttpConfig", "build_app"]


_log = get_logger()
_UNKNOWN_PATH = "(unknown)"  # the route label of requests no route matches


# -- serving the table --------------------------------------------------------------------------


async def _serve(request: Request, label: str, route: ApiRoute | None, allow: str) -> Response:
    """Answer ``request`` with ``route`` (None: 404 if ``allow`` is empty, else 405), mapping
    every error to its JSON answer, and observe it."""
    ctx = context_of(request)
    start = trio.current_time()
    client = ANONYMOUS
    try:
        if route is None:
            if not allow:
                raise HttpError(404, f"no route {request.url.path!r}", None)
            raise HttpError(
                405, f"{request.method} is not served here (only {allow})", None, {"Allow": allow}
            )
        if route.auth:
            try:
                client = ctx.config.authenticator.identify(request.headers.get("authorization"))
            except AuthError as exc:
                raise HttpError(
                    401, str(exc), "Authorization", {"WWW-Authenticate": "Bearer"}
                ) from None
        request.state.client = client
        response = await route.handler(request)
    except ForwardRefusedError as exc:
        response = owner_response(exc.answer)
    except (HttpError, PurgatoryError) as exc:
        answered = await _answer_error(ctx, request, exc)
        if answered is None:
            raise
        response = answered
    elapsed_s = trio.current_time() - start
    status = response.status_code
    ctx.config.metrics.http_request(label, request.method, status, elapsed_s, client)
    if status == 401:  # who tried, from where: the only clue an operator gets
        peer = request.client.host if request.client is not None else None
        _log.warning("http_unauthorized", route=label, method=request.method, peer=peer)
    else:  # free when debug is off (the level filter drops it before formatting)
        _log.debug(
            "http_request",
            route=label,
            method=request.method,
            status=status,
            client=client,
            ms=round(elapsed_s * 1000, 2),
        )
    return response


async def _answer_error(
    ctx: RequestContext, request: Request, exc: HttpError | PurgatoryError
) -> Response | None:
    """The answer for ``exc``: the owner's, when the scope is another replica's; otherwise
    the one error mapping's (None: not an error the API answers)."""
    if isinstance(exc, NotServingError) and not exc.restoring:  # another replica's?
        url = owner_url_for(ctx, request, exc.partition)
        if url is not None:
            raw = getattr(request.state, "raw", None)
            wait_s = long_poll_wait_s(request)
            try:
                return owner_response(
                    await forward_to_owner(ctx, request, url, raw, extra_s=wait_s)
                )
            except OwnerUnansweredError as unanswered:
                exc = unanswered  # answered as any other unavailability
    answer = as_http_error(exc)
    return error_response(answer) if answer is not None else None


class _Path:
    """The ASGI application of one path: its routes by method, 405 for any other method.

    An application rather than a function, so that Starlette's ``Route`` lets every method
    through to it (and its own 405 answer is never the plain-text one).
    """

    def __init__(self, label: str, methods: Mapping[str, ApiRoute]) -> None:
        self._label = label
        self._methods = dict(methods)
        self._allow = ", ".join(sorted(methods))
        self._app = request_response(self._endpoint)

    async def _endpoint(self, request: Request) -> Response:
        return await _serve(request, self._label, self._methods.get(request.method), self._allow)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


def build_app(served: Served, config: HttpConfig) -> Starlette:
    """The Starlette application serving :data:`ROUTES` over ``served``: writes through its
    ``flow``, reads from its ``reads``.

    A write is answered once ``served.gate`` (the journal) has it acknowledged: a 2xx means it
    survives a crash. Reads see the engine as it is, writes not yet acknowledged included. A
    request for a scope another replica owns is forwarded to it (``config.forwarder``); a batch
    is split by owner, the other owners' parts forwarded first, then the local part applied. An
    answer given before the request's body was read keeps the connection usable (see
    :class:`~purgatory.service.ingress.http.server.EarlyAnswers`).
    """
    by_path: dict[str, dict[str, ApiRoute]] = {}
    in_flight = InFlight()
    for route in ROUTES:
        by_path.setdefault(route.path, {})[route.method] = route
    app = Starlette(
        routes=[
            *(Route(path, _Path(path, methods)) for path, methods in by_path.items()),
            Route("/{rest:path}", _Path(_UNKNOWN_PATH, {})),  # last: what nothing else matched
        ],
        middleware=[
            Middleware(
                EarlyAnswers,
                max_bytes=DRAIN_FACTOR * config.max_request_bytes,
                within_s=config.body_timeout_s,
                in_flight=in_flight,
            )
        ],
    )
    app.state.purgatory = RequestContext(served.flow, served.reads, config, served.gate)
    app.state.in_flight = in_flight  # what a graceful stop waits for (server.serve_app)
    return app
