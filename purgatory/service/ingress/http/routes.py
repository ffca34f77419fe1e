"""The API's routes (service layer): one module-level handler per route, and the table,
:data:`ROUTES`, that serves and documents them.

A write is answered once the journal has it acknowledged (``gate.durable``), waiting at most
``PURGATORY_JOURNAL_WAIT_MS``: a broker that does not acknowledge makes it answer 503 with
Retry-After (:class:`~purgatory.service.errors.JournalStalledError`), never hang.
"""

from __future__ import annotations

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
from purgatory.service.errors import NotServingError, OwnerUnansweredError, UnavailableError
from purgatory.service.ingress.http.answers import (
    HttpError,
    as_http_error,
    outcome_json,
    registration_json,
)
from purgatory.service.ingress.http.bodies import as_record, decode_batch, read_body
from purgatory.service.ingress.http.context import RequestContext, client_of, context_of
from purgatory.service.ingress.http.forwarding import (
    ForwardRefusedError,
    forward_parts,
    split_by_owner,
)
from purgatory.service.ingress.http.queries import (
    cursor_after,
    is_retry_request,
    page_cursor,
    query_int,
    scope_and_op_id,
)
from purgatory.service.ingress.http.table import (
    OP_ID_CONFLICT,
    OPERATION_NOT_FOUND,
    Answer,
    ApiRoute,
    Param,
    error_answer,
)
from purgatory.service.ops.overview import MAX_DEADLINES, MAX_SCOPES, ui_page
from purgatory.service.ops.recent import MAX_RECENT
from purgatory.service.ownership.forward import Forwarded

__all__ = ["ROUTES"]

_DEFAULT_PAGE = 100


# -- the handlers -------------------------------------------------------------------------------


async def create_operation(request: Request) -> Response:
    """``POST /v1/operations``."""
    ctx = context_of(request)
    try:
        body = await read_body(ctx, request)
        req = decode_request(as_record(body, "register", ""), ctx.config.limits)
    except (RecordError, HttpError) as exc:
        if not isinstance(exc, HttpError) or exc.status in (400, 422):
            ctx.config.metrics.registration("invalid")
        raise
    assert isinstance(req, RegisterRequest)
    try:
        status, answer = _register(ctx, req, client_of(request), retry=is_retry_request(request))
    except RecordError:  # a policy of this replica's, e.g. a reply_to not allowed
        ctx.config.metrics.registration("invalid")
        raise
    await ctx.gate.durable([ctx.table.partition_of(req.scope)], bounded=True)
    return JSONResponse(answer, status_code=status)


async def create_operations(request: Request) -> Response:
    """``POST /v1/operations:batch``."""
    ctx = context_of(request)
    try:
        payload = await read_body(ctx, request)
        decoded = decode_batch(
            ctx, payload, "operations", kind="register", decode=decode_request, cls=RegisterRequest
        )
    except HttpError as exc:
        if exc.status in (400, 422):
            ctx.config.metrics.registration("invalid")
        raise
    client, retry = client_of(request), is_retry_request(request)
    local, remote = split_by_owner(ctx, request, [req.scope for req in decoded])
    results: list[dict[str, Any]] = [{} for _ in decoded]
    for indexes, answered in await forward_parts(ctx, request, payload, "operations", remote):
        theirs = _their_results(answered, [decoded[index] for index in indexes])
        for index, result in zip(indexes, theirs, strict=True):
            results[index] = result
    for index in local:
        req = decoded[index]
        try:
            status, answer = _register(ctx, req, client, retry=retry)
        except (UsageError, RecordError, UnavailableError) as exc:  # per item, as alone
            mapped = as_http_error(exc)
            assert mapped is not None  # each of these has an answer
            message = mapped.message
            if isinstance(exc, RecordError):  # a policy of this replica's (a reply_to)
                ctx.config.metrics.registration("invalid")
                message = f"operations[{index}].{exc.field}: {exc.reason}"
            status = mapped.status
            answer = {"scope": req.scope, "op_id": req.op_id, "error": message}
        results[index] = {"http_status": status, **answer}
    await ctx.gate.durable({ctx.table.partition_of(decoded[i].scope) for i in local}, bounded=True)
    return JSONResponse({"results": results})


def _register(
    ctx: RequestContext, req: RegisterRequest, client: str, *, retry: bool = False
) -> tuple[int, dict[str, Any]]:
    """Apply one registration for ``client`` (``retry``: see :mod:`purgatory._codec._retry`);
    its status code and answer."""
    reg = ctx.flow.register(req, client=client, retry=retry)
    status = 201 if reg.status.value in ("pending", "completed") else 200
    return status, registration_json(req, reg)


def _their_results(
    answered: Forwarded | OwnerUnansweredError, reqs: list[RegisterRequest]
) -> list[dict[str, Any]]:
    """The results of the registrations ``reqs`` forwarded to one owner: the owner's, or,
    where it gave none, a 503 (an owner that did not answer: as the one mapping answers it)."""
    if isinstance(answered, OwnerUnansweredError):
        mapped = as_http_error(answered)
        assert mapped is not None  # an UnavailableError has an answer
        status, error, theirs = mapped.status, mapped.message, None
    else:
        status = 503
        error = f"forwarded to the scope's owner, which answered {answered.status}"
        theirs = answered.json().get("results") if answered.status == 200 else None
    results: list[dict[str, Any]] = []
    for position, req in enumerate(reqs):
        if isinstance(theirs, list) and position < len(theirs):
            results.append(theirs[position])
        else:
            results.append(
                {"http_status": status, "scope": req.scope, "op_id": req.op_id, "error": error}
            )
    return results


async def list_operations(request: Request) -> Response:
    """``GET /v1/operations``: one page of a scope's pending operations."""
    ctx = context_of(request)
    scope = request.query_params.get("scope")
    if not scope:
        raise HttpError(422, "query parameter scope is required", "scope")
    most = ctx.config.max_batch
    limit = query_int(request, "limit", default=min(_DEFAULT_PAGE, most), minimum=1, maximum=most)
    after = cursor_after(ctx, request)
    specs = ctx.reads.pending_page(scope, after=after, limit=limit + 1)
    page = specs[:limit]
    next_cursor = page_cursor(page[-1].op_id) if len(specs) > limit else None
    engine = ctx.table.engine_of(scope)
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
    ctx = context_of(request)
    scope, op_id = scope_and_op_id(request)
    found = ctx.reads.lookup(scope, op_id)
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
            "outcome": outcome_json(outcome) if outcome is not None else None,
        }
    )


async def wait_operation(request: Request) -> Response:
    """``GET /v1/operation/wait``."""
    ctx = context_of(request)
    scope, op_id = scope_and_op_id(request)
    most = ctx.config.max_wait_ms
    timeout_ms = query_int(
        request, "timeout_ms", default=min(30_000, most), minimum=0, maximum=most
    )
    try:
        outcome = await ctx.reads.wait(scope, op_id, timeout_ms)
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
            "outcome": outcome_json(outcome),
        }
    )


async def cancel_operation(request: Request) -> Response:
    """``DELETE /v1/operation``."""
    ctx = context_of(request)
    scope, op_id = scope_and_op_id(request)
    outcome = ctx.flow.cancel(CancelRequest(op_id=op_id, scope=scope))
    await ctx.gate.durable([ctx.table.partition_of(scope)], bounded=True)
    if outcome is None:
        found = ctx.reads.lookup(scope, op_id)
        if found is None:
            raise HttpError(404, f"op_id {op_id!r} is not known in scope {scope!r}", "op_id")
        earlier = found[1]
        if (
            is_retry_request(request)
            and earlier is not None
            and earlier.outcome is OutcomeKind.CANCELLED
        ):
            outcome = earlier  # the first try cancelled it (see purgatory._codec._retry)
        else:
            raise HttpError(409, "the operation has already finished", "op_id")
    return JSONResponse({"status": "cancelled", "outcome": outcome_json(outcome)})


async def _forward_others_first(
    ctx: RequestContext, request: Request, payload: Any, name: str, records: list[Any]
) -> tuple[list[int], list[dict[str, Any]]]:
    """Forward the items other replicas own (all must be taken before anything is applied
    here); returns the indexes to apply here and the owners' answers.

    Raises:
        NotServingError: a local part cannot be applied here now.
        OwnerUnansweredError: an owner did not answer in time.
        ForwardRefusedError: an owner refused its part (its answer is the batch's).
    """
    local, remote = split_by_owner(ctx, request, [r.scope for r in records])
    serving = ctx.table.serving()
    for index in local:  # every local part must be servable before anything is applied
        partition = ctx.table.partition_of(records[index].scope)
        if partition not in serving:
            raise NotServingError(partition, restoring=partition in ctx.table.restoring_now())
        ctx.table.check_inputs(partition)
    answers: list[dict[str, Any]] = []
    for _indexes, answered in await forward_parts(ctx, request, payload, name, remote):
        if isinstance(answered, OwnerUnansweredError):
            raise answered
        if answered.status != 200:
            raise ForwardRefusedError(answered)
        answers.append(answered.json())
    return local, answers


async def post_signals(request: Request) -> Response:
    """``POST /v1/signals``."""
    ctx = context_of(request)
    payload = await read_body(ctx, request)
    records = decode_batch(
        ctx, payload, "signals", kind="signal", decode=decode_signal, cls=SignalRecord
    )
    local, forwarded = await _forward_others_first(ctx, request, payload, "signals", records)
    client = client_of(request)
    completed = sum(ctx.flow.signal(records[i], client=client) for i in local)
    await ctx.gate.durable({ctx.table.partition_of(records[i].scope) for i in local}, bounded=True)
    completed += sum(answer.get("completed", 0) for answer in forwarded)
    return JSONResponse({"accepted": len(records), "completed": completed})


async def post_watermarks(request: Request) -> Response:
    """``POST /v1/watermarks``."""
    ctx = context_of(request)
    payload = await read_body(ctx, request)
    records = decode_batch(
        ctx, payload, "watermarks", kind="watermark", decode=decode_signal, cls=WatermarkRecord
    )
    local, forwarded = await _forward_others_first(ctx, request, payload, "watermarks", records)
    moved = sum(ctx.flow.watermark(records[i]) for i in local)
    await ctx.gate.durable({ctx.table.partition_of(records[i].scope) for i in local}, bounded=True)
    moved += sum(answer.get("moved", 0) for answer in forwarded)
    return JSONResponse({"accepted": len(records), "moved": moved})


async def overview(request: Request) -> Response:
    """``GET /v1/overview``: what the operators' page shows, for this replica."""
    config = context_of(request).config
    if config.overview is None:
        raise HttpError(404, "this server keeps no overview", None)
    return JSONResponse(await config.overview.snapshot())


async def ui(request: Request) -> Response:
    """``GET /ui``: the operators' page (static: its data comes from ``/v1/overview``)."""
    served = ui_page()
    return Response(served.body, media_type="text/html; charset=utf-8", headers=served.headers)


async def healthz(request: Request) -> Response:
    """``GET /healthz``."""
    return JSONResponse({"status": "ok"})


async def readyz(request: Request) -> Response:
    """``GET /readyz``."""
    config = context_of(request).config
    ready = config.status.is_ready()
    body = config.status.readiness()
    return JSONResponse(body, status_code=200 if ready else 503)


async def metrics(request: Request) -> Response:
    """``GET /metrics``."""
    data, content_type = context_of(request).config.metrics.render()
    return Response(data, media_type=content_type)


async def openapi(request: Request) -> Response:
    """``GET /openapi.json``."""
    return JSONResponse(context_of(request).config.openapi)


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
            OP_ID_CONFLICT,
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
        answers=(_OPERATION, OPERATION_NOT_FOUND),
    ),
    ApiRoute(
        "/v1/operation",
        "DELETE",
        cancel_operation,
        "Cancel a pending operation (its outcome is `cancelled`).",
        params=(_SCOPE, _OP_ID),
        answers=(
            Answer(200, "Cancelled.", "Cancelled"),
            OPERATION_NOT_FOUND,
            error_answer(409, "The operation already finished."),
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
        answers=(_OPERATION, OPERATION_NOT_FOUND),
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
            error_answer(404, "This server keeps no overview."),
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
