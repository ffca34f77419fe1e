"""What every HTTP handler shares (service layer): the configuration, error answers, and
reading a request (its body, queries and cursor) and forwarding it to its owner.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from purgatory._codec import (
    APPLIED_HEADER,
    RETRY_HEADER,
    Limits,
    RecordError,
    RegisterRequest,
    SignalRecord,
    WatermarkRecord,
    encode_callback,
    is_retry,
)
from purgatory._codec._json import parse_json
from purgatory._core import (
    ConflictError,
    LimitError,
    Outcome,
    Registration,
    SizeLimitError,
    TransportError,
    UsageError,
)
from purgatory.service.dispatch.partitions import ServiceState
from purgatory.service.errors import UnavailableError
from purgatory.service.ingress.http.auth import ANONYMOUS, Authenticator
from purgatory.service.ingress.http.server import BODY_TIMEOUT_S
from purgatory.service.journal.changelog import Gate
from purgatory.service.ownership.forward import FORWARDED_BY, Forwarded, Forwarder

__all__ = ["HttpConfig", "HttpError"]


_R = TypeVar("_R", RegisterRequest, SignalRecord, WatermarkRecord)
_MAX_DIGITS = 15  # a query integer longer than this is out of every domain
_DEFAULT_PAGE = 100


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


# -- errors -------------------------------------------------------------------------------------


class HttpError(Exception):
    """An error answer, with the field it is about and any headers it carries."""

    def __init__(
        self,
        status: int,
        message: str,
        field: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = dict(headers or {})


def as_http_error(exc: BaseException) -> HttpError | None:
    """The answer the API gives for ``exc``: the one mapping from errors to HTTP statuses,
    used by every route and by each item of a batch (None: not an error the API answers).

    ============================  ======  =============================================
    error                         status  field, headers
    ============================  ======  =============================================
    :class:`HttpError`            its own its own
    ``RecordError``               422     the record's field
    ``ConflictError``             409     ``op_id``
    ``SizeLimitError``            422     the input's field
    ``LimitError``                429     the limit; ``Retry-After: 1``
    ``UnavailableError``          503     its field; ``Retry-After``, and
                                          ``Purgatory-Applied: maybe`` when it may have applied
    ``TransportError``            503     none: the journal failed (``not durable: ...``);
                                          ``Retry-After: 1``, ``Purgatory-Applied: maybe``
    ``UsageError``                422     none
    ============================  ======  =============================================
    """
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, RecordError):
        return HttpError(422, exc.reason, exc.field)
    if isinstance(exc, ConflictError):
        return HttpError(409, str(exc), "op_id")
    if isinstance(exc, SizeLimitError):
        return HttpError(422, str(exc), exc.field)
    if isinstance(exc, LimitError):
        return HttpError(429, str(exc), exc.field, {"Retry-After": "1"})
    if isinstance(exc, UnavailableError):
        headers = {"Retry-After": str(exc.retry_after_s)}
        if exc.maybe_applied:
            headers[APPLIED_HEADER] = "maybe"
        return HttpError(503, str(exc), exc.field, headers)
    if isinstance(exc, TransportError):
        headers = {"Retry-After": "1", APPLIED_HEADER: "maybe"}
        return HttpError(503, f"not durable: {exc}", None, headers)
    if isinstance(exc, UsageError):
        return HttpError(422, str(exc), None)
    return None


class _ForwardFailedError(Exception):
    """An owner did not take its part of a batch: its answer is the batch's."""

    def __init__(self, answer: Forwarded) -> None:
        super().__init__(answer.status)
        self.answer = answer


def _error(
    status: int, message: str, field: str | None, headers: Mapping[str, str] | None = None
) -> JSONResponse:
    body = {"error": {"status": status, "field": field, "message": message}}
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


def _passed_on(answered: Forwarded) -> Response:
    """The owner's answer, as this replica's."""
    response = Response(answered.body, status_code=answered.status)
    for name, value in answered.headers.items():
        response.headers[name] = value
    return response


# -- what every handler shares ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Context:
    """What the handlers serve: kept on the application's state by :func:`build_app`."""

    state: ServiceState
    config: HttpConfig
    gate: Gate


def _context(request: Request) -> _Context:
    context = request.app.state.purgatory
    assert isinstance(context, _Context)
    return context


def _target(ctx: _Context, request: Request, partition: int) -> str | None:
    """Where to forward a request for ``partition``: None to answer here."""
    if ctx.config.forwarder is None or FORWARDED_BY in request.headers:
        return None
    return ctx.config.owner_url(partition)


async def _forward(
    ctx: _Context, request: Request, url: str, raw: bytes | None, *, extra_s: float = 0.0
) -> Forwarded:
    assert ctx.config.forwarder is not None
    return await ctx.config.forwarder.send(
        url,
        method=request.method,
        path=request.url.path,
        query=request.url.query,
        headers=request.headers,
        body=raw,
        extra_s=extra_s,
    )


def _split(
    ctx: _Context, request: Request, scopes: list[str]
) -> tuple[list[int], dict[str, list[int]]]:
    """The batch's item indexes to apply here, and those to forward, by owner URL."""
    local: list[int] = []
    remote: dict[str, list[int]] = {}
    serving = ctx.state.serving()
    for index, scope in enumerate(scopes):
        partition = ctx.state.partition_of(scope)
        url = None if partition in serving else _target(ctx, request, partition)
        if url is None:
            local.append(index)
        else:
            remote.setdefault(url, []).append(index)
    return local, remote


def _wait_s(request: Request) -> float:
    """A long poll's own wait, added to the forwarding timeout."""
    raw = request.query_params.get("timeout_ms", "")
    return int(raw) / 1000 if raw.isascii() and raw.isdigit() and len(raw) < 9 else 0.0


async def _body(ctx: _Context, request: Request) -> Any:
    """The body, parsed by the codec's parser: any JSON value."""
    limit = ctx.config.max_request_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, f"body over max_request_bytes ({limit})")
    chunks: list[bytes] = []
    size = 0
    with trio.move_on_after(ctx.config.body_timeout_s) as deadline:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise HttpError(413, f"body over max_request_bytes ({limit})")
                chunks.append(chunk)
        except ClientDisconnect:
            raise HttpError(400, "the client left before its body ended", "(body)") from None
    if deadline.cancelled_caught:
        raise HttpError(
            408,
            f"the body did not arrive whole within {ctx.config.body_timeout_s:g} s",
            "(body)",
            {"Connection": "close"},
        )
    raw = request.state.raw = b"".join(chunks)  # kept: it may be forwarded as it came
    try:
        return parse_json(raw, limit)
    except RecordError as exc:
        raise HttpError(400, f"body: {exc.reason}", "(body)") from None


def _envelope(item: Any, kind: str, field: str) -> dict[str, Any]:
    if not isinstance(item, dict):
        raise HttpError(422, "must be a JSON object", field)
    if item.get("type", kind) != kind:
        raise HttpError(422, f"must be {kind!r} here", f"{field}.type" if field else "type")
    return {"v": 1, "type": kind, **item}


def _shown(name: str) -> str:
    return name if len(name) <= 64 else name[:61] + "..."


def _items(ctx: _Context, payload: Any, name: str) -> list[Any]:
    if not isinstance(payload, dict) or not isinstance(payload.get(name), list):
        raise HttpError(422, f"must be an object with a list {name!r}", name)
    for other in payload:
        if other != name:
            raise HttpError(422, "unknown field", _shown(other))
    listed: list[Any] = payload[name]
    if len(listed) > ctx.config.max_batch:
        raise HttpError(413, f"more than max_batch ({ctx.config.max_batch}) items", name)
    return listed


def _decode_all(
    ctx: _Context,
    payload: Any,
    name: str,
    *,
    kind: str,
    decode: Callable[..., object],
    cls: type[_R],
) -> list[_R]:
    """Decode every item of a batch before any is applied; errors name ``name[i].field``."""
    decoded: list[_R] = []
    for i, item in enumerate(_items(ctx, payload, name)):
        try:
            record = decode(_envelope(item, kind, f"{name}[{i}]"), ctx.config.limits)
        except RecordError as exc:
            raise HttpError(422, exc.reason, f"{name}[{i}].{exc.field}") from None
        assert isinstance(record, cls)  # _envelope() pinned the type
        decoded.append(record)
    return decoded


def _client(request: Request) -> str:
    client = getattr(request.state, "client", ANONYMOUS)
    assert isinstance(client, str)
    return client


def _register(
    ctx: _Context, req: RegisterRequest, client: str, *, retry: bool = False
) -> tuple[int, dict[str, Any]]:
    """Apply one registration for ``client`` (``retry``: see :mod:`purgatory._codec._retry`);
    its status code and answer."""
    reg = ctx.state.register(req, client=client, retry=retry)
    status = 201 if reg.status.value in ("pending", "completed") else 200
    return status, _registration_json(req, reg)


def _signal(ctx: _Context, record: SignalRecord, client: str) -> int:
    """Apply one signal for ``client``; how many operations it completed."""
    return ctx.state.signal(record, client=client)


def _retry(request: Request) -> bool:
    """Whether the request is marked as a retry of a write that may have been applied."""
    return is_retry(request.headers.get(RETRY_HEADER))


def _query(request: Request) -> tuple[str, str]:
    scope, op_id = request.query_params.get("scope"), request.query_params.get("op_id")
    if not scope:
        raise HttpError(422, "query parameter scope is required", "scope")
    if not op_id:
        raise HttpError(422, "query parameter op_id is required", "op_id")
    return scope, op_id


def _query_int(request: Request, name: str, *, default: int, minimum: int, maximum: int) -> int:
    """An integer query parameter: ASCII digits only, in ``[minimum, maximum]``."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS:
        value = int(raw)
        if minimum <= value <= maximum:
            return value
    raise HttpError(422, f"must be an integer in [{minimum}, {maximum}] (ASCII digits)", name)


def _cursor(op_id: str) -> str:
    """The opaque cursor of the page that starts after ``op_id``."""
    return base64.urlsafe_b64encode(op_id.encode("utf-8")).rstrip(b"=").decode("ascii")


def _after(ctx: _Context, request: Request) -> str | None:
    """The op_id a page starts after, from its ``cursor`` (None: the first page)."""
    raw = request.query_params.get("cursor")
    if raw is None:
        return None
    longest = 4 * ((ctx.config.limits.max_op_id_bytes + 2) // 3)
    op_id = None
    if raw and raw.isascii() and len(raw) <= longest:
        try:
            padded = raw + "=" * (-len(raw) % 4)
            op_id = base64.b64decode(padded, altchars=b"-_", validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            op_id = None
    if not op_id or _cursor(op_id) != raw:
        raise HttpError(422, "must be the next_cursor of a page", "cursor")
    return op_id


def _outcome_json(outcome: Outcome) -> Any:
    return json.loads(encode_callback(outcome))  # the callback record, payloads as JSON


def _registration_json(req: RegisterRequest, reg: Registration) -> dict[str, Any]:
    outcome = reg.outcome
    return {
        "status": reg.status.value,
        "scope": req.scope,
        "op_id": req.op_id,
        "outcome": _outcome_json(outcome) if outcome is not None else None,
    }
