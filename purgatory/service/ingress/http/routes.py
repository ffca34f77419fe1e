"""The API's routes (service layer): one module-level handler per route, and the table,
:data:`ROUTES`, that serves and documents them.

A write is answered once the journal has it acknowledged (``gate.durable``), waiting at most
``PURGATORY_JOURNAL_WAIT_MS``: a broker that does not acknowledge makes it answer 503 with
Retry-After (:class:`~purgatory.service.errors.JournalStalledError`), never hang.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from purgatory._codec import (
    CancelRequest,
    RecordError,
    RegisterRequest,
    SignalRecord,
    WatermarkRecord,
    decode_request,
    decode_signal,
)
from purgatory._core import (
    OutcomeKind,
    UsageError,
)
from purgatory.service.errors import NotServingError, UnavailableError
from purgatory.service.ingress.http.requests import (
    _DEFAULT_PAGE,
    HttpError,
    _after,
    _body,
    _client,
    _Context,
    _context,
    _cursor,
    _decode_all,
    _envelope,
    _forward,
    _ForwardFailedError,
    _outcome_json,
    _query,
    _query_int,
    _register,
    _retry,
    _signal,
    _split,
    as_http_error,
)
from purgatory.service.ingress.http.table import (
    _CONFLICT,
    _NOT_FOUND,
    Answer,
    ApiRoute,
    Param,
    _error_answer,
)
from purgatory.service.ops.overview import MAX_DEADLINES, MAX_SCOPES, ui_page
from purgatory.service.ops.recent import MAX_RECENT
from purgatory.service.ownership.forward import Forwarded

__all__ = ["ROUTES"]


# -- the handlers -------------------------------------------------------------------------------


async def create_operation(request: Request) -> Response:
    """``POST /v1/operations``."""
    ctx = _context(request)
    try:
        body = await _body(ctx, request)
        req = decode_request(_envelope(body, "register", ""), ctx.config.limits)
    except (RecordError, HttpError) as exc:
        if not isinstance(exc, HttpError) or exc.status in (400, 422):
            ctx.config.count_registration("invalid")
        raise
    assert isinstance(req, RegisterRequest)
    try:
        status, answer = _register(ctx, req, _client(request), retry=_retry(request))
    except RecordError:  # a policy of this replica's, e.g. a reply_to not allowed
        ctx.config.count_registration("invalid")
        raise
    await ctx.gate.durable([ctx.state.partition_of(req.scope)], bounded=True)
    return JSONResponse(answer, status_code=status)


async def create_operations(request: Request) -> Response:
    """``POST /v1/operations:batch``."""
    ctx = _context(request)
    try:
        payload = await _body(ctx, request)
        decoded = _decode_all(
            ctx, payload, "operations", kind="register", decode=decode_request, cls=RegisterRequest
        )
    except HttpError as exc:
        if exc.status in (400, 422):
            ctx.config.count_registration("invalid")
        raise
    client, retry = _client(request), _retry(request)
    local, remote = _split(ctx, request, [req.scope for req in decoded])
    results: list[dict[str, Any]] = [{} for _ in decoded]
    for indexes, answered in await _to_owners(ctx, request, payload, "operations", remote):
        theirs = answered.json().get("results") if answered.status == 200 else None
        for position, index in enumerate(indexes):
            req = decoded[index]
            if isinstance(theirs, list) and position < len(theirs):
                results[index] = theirs[position]
            else:
                error = f"forwarded to the scope's owner, which answered {answered.status}"
                results[index] = {
                    "http_status": 503,
                    "scope": req.scope,
                    "op_id": req.op_id,
                    "error": error,
                }
    for index in local:
        req = decoded[index]
        try:
            status, answer = _register(ctx, req, client, retry=retry)
        except (UsageError, RecordError, UnavailableError) as exc:  # per item, as alone
            mapped = as_http_error(exc)
            assert mapped is not None  # each of these has an answer
            message = mapped.message
            if isinstance(exc, RecordError):  # a policy of this replica's (a reply_to)
                ctx.config.count_registration("invalid")
                message = f"operations[{index}].{exc.field}: {exc.reason}"
            status = mapped.status
            answer = {"scope": req.scope, "op_id": req.op_id, "error": message}
        results[index] = {"http_status": status, **answer}
    await ctx.gate.durable({ctx.state.partition_of(decoded[i].scope) for i in local}, bounded=True)
    return JSONResponse({"results": results})


async def list_operations(request: Request) -> Response:
    """``GET /v1/operations``: one page of a scope's pending operations."""
    ctx = _context(request)
    scope = request.query_params.get("scope")
    if not scope:
        raise HttpError(422, "query parameter scope is required", "scope")
    most = ctx.config.max_batch
    limit = _query_int(request, "limit", default=min(_DEFAULT_PAGE, most), minimum=1, maximum=most)
    after = _after(ctx, request)
    specs = ctx.state.pending_page(scope, after=after, limit=limit + 1)
    page = specs[:limit]
    next_cursor = _cursor(page[-1].op_id) if len(specs) > limit else None
    engine = ctx.state.engine_of(scope)
    operations = []
    for spec in page:
        missing = engine.missing_keys(spec)  # O(keys): a lookup each, no TTL refreshed
        operations.append(
            {
                "op_id": spec.op_id,
                "keys": list(spec.keys),
                "deadline_ms": spec.deadline_ms,
                "time_domain": spec.time_domain.value,
                "condition": spec.condition.value,
                "missing": list(missing),
                "still_needed": max(0, spec.needed - (len(spec.keys) - len(missing))),
            }
        )
    return JSONResponse(
        {
            "scope": scope,
            "operations": operations,
            "next_cursor": next_cursor,
            "truncated": next_cursor is not None,
        }
    )


async def get_operation(request: Request) -> Response:
    """``GET /v1/operation``."""
    ctx = _context(request)
    scope, op_id = _query(request)
    found = ctx.state.lookup(scope, op_id)
    if found is None:
        raise HttpError(404, f"op_id {op_id!r} is not known in scope {scope!r}", "op_id")
    spec, outcome = found
    return JSONResponse(
        {
            "scope": scope,
            "op_id": op_id,
            "status": "pending" if outcome is None else outcome.outcome.value,
            "keys": list(spec.keys),
            "deadline_ms": spec.deadline_ms,
            "time_domain": spec.time_domain.value,
            "outcome": _outcome_json(outcome) if outcome is not None else None,
        }
    )


async def wait_operation(request: Request) -> Response:
    """``GET /v1/operation/wait``."""
    ctx = _context(request)
    scope, op_id = _query(request)
    most = ctx.config.max_wait_ms
    timeout_ms = _query_int(
        request, "timeout_ms", default=min(30_000, most), minimum=0, maximum=most
    )
    try:
        outcome = await ctx.state.wait(scope, op_id, timeout_ms)
    except NotServingError:
        raise  # 503 with Retry-After, not "unknown"
    except UsageError as exc:
        raise HttpError(404, str(exc), "op_id") from None
    if outcome is None:
        return JSONResponse({"scope": scope, "op_id": op_id, "status": "pending"})
    return JSONResponse(
        {
            "scope": scope,
            "op_id": op_id,
            "status": outcome.outcome.value,
            "outcome": _outcome_json(outcome),
        }
    )


async def cancel_operation(request: Request) -> Response:
    """``DELETE /v1/operation``."""
    ctx = _context(request)
    scope, op_id = _query(request)
    outcome = ctx.state.cancel(CancelRequest(op_id=op_id, scope=scope))
    await ctx.gate.durable([ctx.state.partition_of(scope)], bounded=True)
    if outcome is None:
        found = ctx.state.lookup(scope, op_id)
        if found is None:
            raise HttpError(404, f"op_id {op_id!r} is not known in scope {scope!r}", "op_id")
        earlier = found[1]
        if _retry(request) and earlier is not None and earlier.outcome is OutcomeKind.CANCELLED:
            outcome = earlier  # the first try cancelled it (see purgatory._codec._retry)
        else:
            raise HttpError(409, "the operation has already finished", "op_id")
    return JSONResponse({"status": "cancelled", "outcome": _outcome_json(outcome)})


async def _forward_parts(
    ctx: _Context, request: Request, payload: Any, name: str, records: list[Any]
) -> tuple[list[int], list[dict[str, Any]]]:
    """Forward the items other replicas own (all must be taken before anything is applied
    here); returns the indexes to apply here and the owners' answers."""
    local, remote = _split(ctx, request, [r.scope for r in records])
    serving = ctx.state.serving()
    for index in local:  # every local part must be servable before anything is applied
        partition = ctx.state.partition_of(records[index].scope)
        if partition not in serving:
            raise NotServingError(partition, restoring=partition in ctx.state.restoring_now())
        ctx.state.check_inputs(partition)
    answers: list[dict[str, Any]] = []
    for _indexes, answered in await _to_owners(ctx, request, payload, name, remote):
        if answered.status != 200:
            raise _ForwardFailedError(answered)
        answers.append(answered.json())
    return local, answers


async def _to_owners(
    ctx: _Context, request: Request, payload: Any, name: str, remote: dict[str, list[int]]
) -> list[tuple[list[int], Forwarded]]:
    """Send each owner its items of the batch ``payload[name]`` (as they came, in one request
    per owner); each owner's indexes and answer. The one place a batch is forwarded: the
    callers decide what an owner's failure means (an item's 503, or the whole batch's)."""
    answers = []
    for url, indexes in remote.items():
        sub = json.dumps({name: [payload[name][i] for i in indexes]}).encode()
        answers.append((indexes, await _forward(ctx, request, url, sub)))
    return answers


async def post_signals(request: Request) -> Response:
    """``POST /v1/signals``."""
    ctx = _context(request)
    payload = await _body(ctx, request)
    records = _decode_all(
        ctx, payload, "signals", kind="signal", decode=decode_signal, cls=SignalRecord
    )
    local, forwarded = await _forward_parts(ctx, request, payload, "signals", records)
    client = _client(request)
    completed = sum(_signal(ctx, records[i], client) for i in local)
    await ctx.gate.durable({ctx.state.partition_of(records[i].scope) for i in local}, bounded=True)
    completed += sum(answer.get("completed", 0) for answer in forwarded)
    return JSONResponse({"accepted": len(records), "completed": completed})


async def post_watermarks(request: Request) -> Response:
    """``POST /v1/watermarks``."""
    ctx = _context(request)
    payload = await _body(ctx, request)
    records = _decode_all(
        ctx, payload, "watermarks", kind="watermark", decode=decode_signal, cls=WatermarkRecord
    )
    local, forwarded = await _forward_parts(ctx, request, payload, "watermarks", records)
    moved = sum(ctx.state.watermark(records[i]) for i in local)
    await ctx.gate.durable({ctx.state.partition_of(records[i].scope) for i in local}, bounded=True)
    moved += sum(answer.get("moved", 0) for answer in forwarded)
    return JSONResponse({"accepted": len(records), "moved": moved})


async def overview(request: Request) -> Response:
    """``GET /v1/overview``: what the operators' page shows, for this replica."""
    config = _context(request).config
    if config.overview is None:
        raise HttpError(404, "this server keeps no overview", None)
    return JSONResponse(await config.overview())


async def ui(request: Request) -> Response:
    """``GET /ui``: the operators' page (static: its data comes from ``/v1/overview``)."""
    served = ui_page()
    return Response(served.body, media_type="text/html; charset=utf-8", headers=served.headers)


async def healthz(request: Request) -> Response:
    """``GET /healthz``."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """``GET /readyz``."""
    config = _context(request).config
    ready = config.ready()
    body = config.readiness() if config.readiness is not None else {"ready": ready}
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    """``GET /metrics``."""
    data, content_type = _context(request).config.metrics()
    return Response(data, media_type=content_type)


async def openapi(request: Request) -> Response:
    """``GET /openapi.json``."""
    return JSONResponse(_context(request).config.openapi)


_SCOPE = Param("scope", "The operation's scope.")
_OP_ID = Param("op_id", "The operation's id within its scope.")
_OPERATION = Answer(200, "The operation.", "OperationStatus")

#: Every route of the API, served by :func:`build_app` and documented by ``openapi``.
ROUTES: tuple[ApiRoute, ...] = (
    ApiRoute(
        "/v1/operations",
        "POST",
        create_operation,
        "Register an operation (idempotent by scope and op_id).",
        body="Register",
        answers=(
            Answer(200, "Duplicate, or a timer re-armed.", "Registration"),
            Answer(201, "Registered (pending, or completed at once).", "Registration"),
            _CONFLICT,
        ),
    ),
    ApiRoute(
        "/v1/operations",
        "GET",
        list_operations,
        "List the pending operations of a scope, a page at a time.",
        description="Pages are in op_id order; pass a page's `next_cursor` as `cursor` for the"
        " next one (null: the last page). Each page costs the same whatever the scope's size."
        " Each operation says what it still waits for: `missing`, its keys no remembered"
        " signal answers now, of which `still_needed` must still arrive (`all`: every one;"
        " `any`: one; `count`: the count less the keys signalled); a timer waits for its"
        " deadline only.",
        params=(
            _SCOPE,
            Param(
                "limit",
                "The most operations in the page (default 100, at most max_batch).",
                required=False,
                integer=True,
                minimum=1,
            ),
            Param("cursor", "The `next_cursor` of the page before.", required=False),
        ),
        answers=(Answer(200, "One page of pending operations.", "PendingPage"),),
    ),
    ApiRoute(
        "/v1/operations:batch",
        "POST",
        create_operations,
        "Register many operations; each gets its own status.",
        body="RegisterBatch",
        answers=(Answer(200, "One result per operation, in order.", "RegisterResults"),),
    ),
    ApiRoute(
        "/v1/operation",
        "GET",
        get_operation,
        "Get an operation and its outcome, if any.",
        params=(_SCOPE, _OP_ID),
        answers=(_OPERATION, _NOT_FOUND),
    ),
    ApiRoute(
        "/v1/operation",
        "DELETE",
        cancel_operation,
        "Cancel a pending operation (its outcome is `cancelled`).",
        params=(_SCOPE, _OP_ID),
        answers=(
            Answer(200, "Cancelled.", "Cancelled"),
            _NOT_FOUND,
            _error_answer(409, "The operation already finished."),
        ),
    ),
    ApiRoute(
        "/v1/operation/wait",
        "GET",
        wait_operation,
        "Wait (long poll) for an operation's outcome.",
        params=(
            _SCOPE,
            _OP_ID,
            Param(
                "timeout_ms",
                "How long to wait (default 30000), at most max_wait_ms.",
                required=False,
                integer=True,
            ),
        ),
        answers=(_OPERATION, _NOT_FOUND),
    ),
    ApiRoute(
        "/v1/signals",
        "POST",
        post_signals,
        "Publish signals (facts remembered with a TTL).",
        body="SignalBatch",
        answers=(Answer(200, "Accepted, and how many operations completed.", "SignalsAccepted"),),
    ),
    ApiRoute(
        "/v1/watermarks",
        "POST",
        post_watermarks,
        "Advance scopes' event-time watermarks (monotonic; older: no-op).",
        body="WatermarkBatch",
        answers=(Answer(200, "Accepted, and how many moved.", "WatermarksAccepted"),),
    ),
    ApiRoute(
        "/v1/overview",
        "GET",
        overview,
        "What the operators' page shows, for the replica that answers.",
        description="The partitions this replica holds and their restore (as `/readyz`), its"
        f" pending operations and scopes, the busiest scopes (at most {MAX_SCOPES}) and the"
        f" earliest processing-time deadlines (at most {MAX_DEADLINES}), computed in bounded"
        " steps and kept a little while (`computed_ms`, `compute_ms`; `complete` is false when"
        " the state changed too fast to be read whole), and the last outcomes and dead letters"
        f" it settled (at most {MAX_RECENT} each, newest first). Not forwarded: ask each"
        " replica.",
        answers=(
            Answer(200, "The overview.", "Overview"),
            _error_answer(404, "This server keeps no overview."),
        ),
    ),
    ApiRoute(
        "/ui",
        "GET",
        ui,
        "The operators' page (HTML; it asks for a token when `/v1/overview` needs one).",
        auth=False,
        answers=(Answer(200, "The page.", media_type="text/html"),),
    ),
    ApiRoute(
        "/healthz",
        "GET",
        healthz,
        "Liveness.",
        auth=False,
        answers=(Answer(200, "Alive.", "Health"),),
    ),
    ApiRoute(
        "/readyz",
        "GET",
        readyz,
        "Readiness: every input partition held is restored and served.",
        auth=False,
        description="The body lists each partition held in its state: `serving`; `restoring`"
        " with the changelog records read and the seconds spent so far; `taken` (waiting to"
        " restore, with the `reason` when a restore failed on the broker and waits to try"
        " again); `fenced` (another writer appended to its changelog); `handing_over` (the"
        " group took it away: what it recorded settles); the partition"
        " count of each topic keyed by scope; `inputs_stopped`, why no input is taken"
        " (a topic's partition count changed while the service ran), null while they are; and"
        " the `journal`: `stalled` while the broker does not acknowledge it (writes answer 503"
        " with Retry-After), which leaves the replica ready.",
        answers=(
            Answer(200, "Ready.", "Readiness"),
            Answer(
                503,
                "Not ready (starting, a partition not serving yet, or inputs stopped).",
                "Readiness",
            ),
        ),
    ),
    ApiRoute(
        "/metrics",
        "GET",
        metrics,
        "Prometheus metrics.",
        auth=False,
        answers=(Answer(200, "Text exposition.", media_type="text/plain"),),
    ),
    ApiRoute(
        "/openapi.json",
        "GET",
        openapi,
        "This document.",
        auth=False,
        answers=(Answer(200, "OpenAPI 3.1.", "OpenApi"),),
    ),
)
