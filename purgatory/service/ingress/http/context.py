"""What every HTTP handler is given (service layer): the configuration of the routes, and the
request context that :func:`~purgatory.service.ingress.http.app.build_app` keeps on the
application's state (the state machine, the configuration, the journal's gate).

A handler finds its context with :func:`context_of` and the client that auth named with
:func:`client_of`; everything else it reads from the request through :mod:`.bodies` and
:mod:`.queries`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request

from purgatory._codec import Limits
from purgatory.service.dispatch.partitions import ServiceState
from purgatory.service.ingress.http.auth import ANONYMOUS, Authenticator
from purgatory.service.ingress.http.server import BODY_TIMEOUT_S
from purgatory.service.journal.changelog import Gate
from purgatory.service.ownership.forward import Forwarder

__all__ = ["HttpConfig", "RequestContext", "client_of", "context_of"]


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """What the routes need besides the state machine.

    ``observe`` is called once per request with the route (its path, or ``(unknown)``), the
    method, the status, the seconds it took and the client's name. ``overview`` answers
    ``GET /v1/overview`` (None: that route answers 404).
    """

    limits: Limits
    max_request_bytes: int
    max_batch: int
    max_wait_ms: int
    ready: Callable[[], bool]
    metrics: Callable[[], tuple[bytes, str]]
    openapi: Mapping[str, Any]
    authenticator: Authenticator = field(default_factory=lambda: Authenticator({}))
    observe: Callable[[str, str, int, float, str], None] = lambda route, method, status, s, c: None
    count_registration: Callable[[str], None] = lambda result: None
    readiness: Callable[[], Mapping[str, object]] | None = None
    forwarder: Forwarder | None = None
    owner_url: Callable[[int], str | None] = lambda partition: None
    body_timeout_s: float = BODY_TIMEOUT_S
    overview: Callable[[], Awaitable[Mapping[str, Any]]] | None = None


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What the handlers serve: kept on the application's state by ``build_app``.

    Attributes:
        state: the state machine the routes read and write.
        config: the routes' configuration.
        gate: the journal, which says when a write is durable.
    """

    state: ServiceState
    config: HttpConfig
    gate: Gate


def context_of(request: Request) -> RequestContext:
    """The context of the application that serves ``request``."""
    context = request.app.state.purgatory
    assert isinstance(context, RequestContext)
    return context


def client_of(request: Request) -> str:
    """The name of the client that auth identified for ``request`` (``ANONYMOUS`` without a
    token, or before auth ran)."""
    client = getattr(request.state, "client", ANONYMOUS)
    assert isinstance(client, str)
    return client
