"""What every HTTP handler is given (service layer): the configuration of the routes, and the
request context that :func:`~purgatory.service.ingress.http.app.build_app` keeps on the
application's state (the inputs' flow, the read model, the configuration, the journal's
gate).

A handler finds its context with :func:`context_of` and the client that auth named with
:func:`client_of`; everything else it reads from the request through :mod:`.bodies` and
:mod:`.queries`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from starlette.requests import Request

from purgatory._codec import Limits
from purgatory.service.dispatch.reads import Reads
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.ingress.flow import Flow
from purgatory.service.ingress.http.auth import ANONYMOUS, Authenticator
from purgatory.service.ingress.http.server import BODY_TIMEOUT_S
from purgatory.service.journal.changelog import Gate
from purgatory.service.ownership.forward import Forwarder

__all__ = [
    "HttpConfig",
    "HttpMetrics",
    "OverviewSource",
    "Owners",
    "RequestContext",
    "Served",
    "Status",
    "client_of",
    "context_of",
]


class Status(Protocol):
    """Whether the replica serves (``/readyz``)."""

    def is_ready(self) -> bool: ...

    def readiness(self) -> Mapping[str, object]: ...


class HttpMetrics(Protocol):
    """What the routes count, and the scrape they serve."""

    def render(self, accept: str | None = None) -> tuple[bytes, str]: ...

    def http_request(
        self, route: str, method: str, status: int, seconds: float, client: str = "anonymous"
    ) -> None: ...

    def registration(self, result: str) -> None: ...


class Owners(Protocol):
    """Where each partition's owner answers (None: here, or nowhere known)."""

    def url_of(self, partition: int) -> str | None: ...


class OverviewSource(Protocol):
    """The operators' overview (``GET /v1/overview``)."""

    async def snapshot(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """What the routes need besides the inputs' flow and the read model.

    ``metrics.http_request`` is called once per request with the route (its path, or
    ``(unknown)``), the method, the status, the seconds it took and the client's name.
    ``overview`` answers ``GET /v1/overview`` (None: that route answers 404); ``owners`` says
    where to forward a scope another replica owns (None: nowhere).
    """

    limits: Limits
    max_request_bytes: int
    max_batch: int
    max_wait_ms: int
    status: Status
    metrics: HttpMetrics
    openapi: Mapping[str, Any]
    authenticator: Authenticator = field(default_factory=lambda: Authenticator({}))
    forwarder: Forwarder | None = None
    owners: Owners | None = None
    body_timeout_s: float = BODY_TIMEOUT_S
    overview: OverviewSource | None = None


class Served(Protocol):
    """What an application serves: the service's parts the routes reach."""

    flow: Flow
    reads: Reads
    gate: Gate


@dataclass(frozen=True, slots=True)
class RequestContext:
    """What the handlers serve: kept on the application's state by ``build_app``.

    Attributes:
        flow: where writes go (dispatch, release, wake).
        reads: the read model (lookups, pages, long polls).
        config: the routes' configuration.
        gate: the journal, which says when a write is durable.
    """

    flow: Flow
    reads: Reads
    config: HttpConfig
    gate: Gate

    @property
    def table(self) -> PartitionTable:
        """The partition table (which partitions are served here)."""
        return self.reads.table


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
