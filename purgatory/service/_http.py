"""The HTTP API (service layer): Starlette routes over the service's state machine.

Bodies are the JSON records of :mod:`purgatory._codec` without their ``v``/``type`` envelope,
so HTTP and Kafka accept exactly the same operations and signals, validated by the same code
(and described by the same JSON Schemas, which the OpenAPI document references). Operations are
addressed by query parameters (``?scope=...&op_id=...``) because both may contain ``/``.

Errors are JSON ``{"error": {"status", "field", "message"}}`` with the field that was wrong:
400 malformed JSON, 401 missing token, 404 unknown operation, 409 an id reused with another body,
413 a body over ``max_request_bytes`` or a batch over ``max_batch``, 422 a field out of its
domain, 429 a pending limit. Nothing is half-applied: a batch is validated whole before any
item is applied.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import trio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from purgatory._codec import (
    CancelRequest,
    Limits,
    RecordError,
    RegisterRequest,
    SignalRecord,
    WatermarkRecord,
    decode_request,
    decode_signal,
    encode_callback,
)
from purgatory._core import (
    ConflictError,
    LimitError,
    Outcome,
    Registration,
    SizeLimitError,
    TransportError,
    UsageError,
)
from purgatory.service._changelog import Gate, NoJournal
from purgatory.service._forward import FORWARDED_BY, Forwarded, Forwarder
from purgatory.service._state import NotServingError, ServiceState

__all__ = ["HttpConfig", "build_app"]

_R = TypeVar("_R", RegisterRequest, SignalRecord, WatermarkRecord)


@dataclass(frozen=True, slots=True)
class HttpConfig:
    """What the routes need besides the state machine."""

    limits: Limits
    max_request_bytes: int
    max_batch: int
    max_wait_ms: int
    api_token: str | None
    ready: Callable[[], bool]
    metrics: Callable[[], tuple[bytes, str]]
    openapi: Mapping[str, Any]
    observe: Callable[[str, str, int, float], None] = lambda route, method, status, s: None
    count_registration: Callable[[str], None] = lambda result: None
    readiness: Callable[[], Mapping[str, object]] | None = None
    forwarder: Forwarder | None = None
    owner_url: Callable[[int], str | None] = lambda partition: None


class _ForwardFailedError(Exception):
    """An owner did not take its part of a batch: its answer is the batch's."""

    def __init__(self, answer: Forwarded) -> None:
        super().__init__(answer.status)
        self.answer = answer


def _passed_on(answered: Forwarded) -> Response:
    """The owner's answer, as this replica's."""
    response = Response(answered.body, status_code=answered.status)
    for name, value in answered.headers.items():
        response.headers[name] = value
    return response


def _wait_s(request: Request) -> float:
    """A long poll's own wait, added to the forwarding timeout."""
    raw = request.query_params.get("timeout_ms", "")
    return int(raw) / 1000 if raw.isdigit() and len(raw) < 9 else 0.0


class HttpError(Exception):
    """An error answer, with the field it is about."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field


def _error(status: int, message: str, field: str | None) -> JSONResponse:
    body = {"error": {"status": status, "field": field, "message": message}}
    return JSONResponse(body, status_code=status)


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


def build_app(state: ServiceState, config: HttpConfig, gate: Gate | None = None) -> Starlette:
    """The Starlette application serving the API over ``state``.

    A write is answered once ``gate`` (the journal) has it acknowledged: a 2xx means it survives
    a crash. Reads see the engine as it is, writes not yet acknowledged included. A request for
    a scope another replica owns is forwarded to it (``config.forwarder``); a batch is split by
    owner, the other owners' parts forwarded first, then the local part applied.
    """
    gate = gate if gate is not None else NoJournal()

    def target(request: Request, partition: int) -> str | None:
        """Where to forward a request for ``partition``: None to answer here."""
        if config.forwarder is None or FORWARDED_BY in request.headers:
            return None
        return config.owner_url(partition)

    async def forward(
        request: Request, url: str, raw: bytes | None, *, extra_s: float = 0.0
    ) -> Forwarded:
        assert config.forwarder is not None
        return await config.forwarder.send(
            url,
            method=request.method,
            path=request.url.path,
            query=request.url.query,
            headers=request.headers,
            body=raw,
            extra_s=extra_s,
        )

    def split(request: Request, scopes: list[str]) -> tuple[list[int], dict[str, list[int]]]:
        """The batch's item indexes to apply here, and those to forward, by owner URL. Raises
        NotServingError before anything is applied when a local item's partition is not ready."""
        local: list[int] = []
        remote: dict[str, list[int]] = {}
        serving = state.serving()
        for index, scope in enumerate(scopes):
            partition = state.partition_of(scope)
            url = None if partition in serving else target(request, partition)
            if url is None:
                local.append(index)
            else:
                remote.setdefault(url, []).append(index)
        return local, remote

    async def body(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > config.max_request_bytes:
            raise HttpError(413, f"body over max_request_bytes ({config.max_request_bytes})")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > config.max_request_bytes:
                raise HttpError(413, f"body over max_request_bytes ({config.max_request_bytes})")
            chunks.append(chunk)
        raw = request.state.raw = b"".join(chunks)  # kept: it may be forwarded as it came
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise HttpError(400, f"body is not valid JSON: {exc}", "(body)") from None

    def envelope(item: Any, kind: str, field: str) -> dict[str, Any]:
        if not isinstance(item, dict):
            raise HttpError(422, "must be a JSON object", field)
        if item.get("type", kind) != kind:
            raise HttpError(422, f"must be {kind!r} here", f"{field}.type" if field else "type")
        return {"v": 1, "type": kind, **item}

    def items(payload: Any, name: str) -> list[Any]:
        if not isinstance(payload, dict) or not isinstance(payload.get(name), list):
            raise HttpError(422, f"must be an object with a list {name!r}", name)
        listed: list[Any] = payload[name]
        if len(listed) > config.max_batch:
            raise HttpError(413, f"more than max_batch ({config.max_batch}) items", name)
        return listed

    def decode_all(
        payload: Any, name: str, kind: str, decode: Callable[..., object], cls: type[_R]
    ) -> list[_R]:
        """Decode every item of a batch before any is applied; errors name ``name[i].field``."""
        decoded: list[_R] = []
        for i, item in enumerate(items(payload, name)):
            try:
                record = decode(envelope(item, kind, f"{name}[{i}]"), config.limits)
            except RecordError as exc:
                raise HttpError(422, exc.reason, f"{name}[{i}].{exc.field}") from None
            assert isinstance(record, cls)  # envelope() pinned the type
            decoded.append(record)
        return decoded

    def register_one(req: RegisterRequest) -> tuple[int, dict[str, Any]]:
        reg = state.register(req)
        status = 201 if reg.status.value in ("pending", "completed") else 200
        return status, _registration_json(req, reg)

    def query(request: Request) -> tuple[str, str]:
        scope, op_id = request.query_params.get("scope"), request.query_params.get("op_id")
        if not scope:
            raise HttpError(422, "query parameter scope is required", "scope")
        if not op_id:
            raise HttpError(422, "query parameter op_id is required", "op_id")
        return scope, op_id

    async def create_operation(request: Request) -> Response:
        try:
            req = decode_request(envelope(await body(request), "register", ""), config.limits)
        except (RecordError, HttpError) as exc:
            if not isinstance(exc, HttpError) or exc.status in (400, 422):
                config.count_registration("invalid")
            raise
        assert isinstance(req, RegisterRequest)
        status, answer = register_one(req)
        await gate.durable()
        return JSONResponse(answer, status_code=status)

    async def create_operations(request: Request) -> Response:
        payload = await body(request)
        try:
            decoded = decode_all(payload, "operations", "register", decode_request, RegisterRequest)
        except HttpError as exc:
            if exc.status in (400, 422):
                config.count_registration("invalid")
            raise
        local, remote = split(request, [req.scope for req in decoded])
        results: list[dict[str, Any]] = [{} for _ in decoded]
        raw_items = payload["operations"]
        for url, indexes in remote.items():
            sub = json.dumps({"operations": [raw_items[i] for i in indexes]}).encode()
            answered = await forward(request, url, sub)
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
                status, answer = register_one(req)
            except ConflictError as exc:
                status, answer = 409, {"scope": req.scope, "op_id": req.op_id, "error": str(exc)}
            except SizeLimitError as exc:
                status, answer = 422, {"scope": req.scope, "op_id": req.op_id, "error": str(exc)}
            except LimitError as exc:
                status, answer = 429, {"scope": req.scope, "op_id": req.op_id, "error": str(exc)}
            except NotServingError as exc:
                status, answer = 503, {"scope": req.scope, "op_id": req.op_id, "error": str(exc)}
            results[index] = {"http_status": status, **answer}
        await gate.durable()
        return JSONResponse({"results": results})

    async def get_operation(request: Request) -> Response:
        scope, op_id = query(request)
        found = state.lookup(scope, op_id)
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
        scope, op_id = query(request)
        raw = request.query_params.get("timeout_ms", "30000")
        if not raw.isdigit() or not 0 <= int(raw) <= config.max_wait_ms:
            raise HttpError(422, f"must be an integer in [0, {config.max_wait_ms}]", "timeout_ms")
        try:
            outcome = await state.wait(scope, op_id, int(raw))
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
        scope, op_id = query(request)
        outcome = state.cancel(CancelRequest(op_id=op_id, scope=scope))
        await gate.durable()
        if outcome is None:
            found = state.lookup(scope, op_id)
            if found is None:
                raise HttpError(404, f"op_id {op_id!r} is not known in scope {scope!r}", "op_id")
            raise HttpError(409, "the operation has already finished", "op_id")
        return JSONResponse({"status": "cancelled", "outcome": _outcome_json(outcome)})

    async def list_operations(request: Request) -> Response:
        scope = request.query_params.get("scope")
        if not scope:
            raise HttpError(422, "query parameter scope is required", "scope")
        specs = state.pending(scope)
        return JSONResponse(
            {
                "scope": scope,
                "operations": [
                    {"op_id": s.op_id, "keys": list(s.keys), "deadline_ms": s.deadline_ms}
                    for s in specs[: config.max_batch]
                ],
                "truncated": len(specs) > config.max_batch,
            }
        )

    async def forward_parts(
        request: Request, payload: Any, name: str, records: list[Any]
    ) -> tuple[list[int], list[dict[str, Any]]]:
        """Forward the items other replicas own (all must be taken before anything is applied
        here); returns the indexes to apply here and the owners' answers."""
        local, remote = split(request, [r.scope for r in records])
        serving = state.serving()
        for index in local:  # every local part must be servable before anything is applied
            partition = state.partition_of(records[index].scope)
            if partition not in serving:
                raise NotServingError(partition, restoring=partition in state.restoring_now())
        answers: list[dict[str, Any]] = []
        for url, indexes in remote.items():
            sub = json.dumps({name: [payload[name][i] for i in indexes]}).encode()
            answered = await forward(request, url, sub)
            if answered.status != 200:
                raise _ForwardFailedError(answered)
            answers.append(answered.json())
        return local, answers

    async def post_signals(request: Request) -> Response:
        payload = await body(request)
        records = decode_all(payload, "signals", "signal", decode_signal, SignalRecord)
        local, forwarded = await forward_parts(request, payload, "signals", records)
        completed = sum(state.signal(records[i]) for i in local)
        await gate.durable()
        completed += sum(answer.get("completed", 0) for answer in forwarded)
        return JSONResponse({"accepted": len(records), "completed": completed})

    async def post_watermarks(request: Request) -> Response:
        payload = await body(request)
        records = decode_all(payload, "watermarks", "watermark", decode_signal, WatermarkRecord)
        local, forwarded = await forward_parts(request, payload, "watermarks", records)
        moved = sum(state.watermark(records[i]) for i in local)
        await gate.durable()
        moved += sum(answer.get("moved", 0) for answer in forwarded)
        return JSONResponse({"accepted": len(records), "moved": moved})

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = config.ready()
        body = config.readiness() if config.readiness is not None else {"ready": ready}
        return JSONResponse(body, status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        data, content_type = config.metrics()
        return Response(data, media_type=content_type)

    async def openapi(request: Request) -> Response:
        return JSONResponse(config.openapi)

    def guarded(
        route: str, handler: Callable[[Request], Awaitable[Response]], *, auth: bool
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            start = trio.current_time()
            try:
                if auth and config.api_token is not None:
                    expected = f"Bearer {config.api_token}"
                    if request.headers.get("authorization") != expected:
                        raise HttpError(401, "a valid bearer token is required", "Authorization")
                response = await handler(request)
            except HttpError as exc:
                response = _error(exc.status, exc.message, exc.field)
            except RecordError as exc:
                response = _error(422, exc.reason, exc.field)
            except ConflictError as exc:
                response = _error(409, str(exc), "op_id")
            except SizeLimitError as exc:
                response = _error(422, str(exc), exc.field)
            except LimitError as exc:
                response = _error(429, str(exc), None)
            except NotServingError as exc:
                url = None if exc.restoring else target(request, exc.partition)
                if url is not None:
                    raw = getattr(request.state, "raw", None)
                    answered = await forward(request, url, raw, extra_s=_wait_s(request))
                    response = _passed_on(answered)
                else:
                    response = _error(503, str(exc), "scope")
                    response.headers["Retry-After"] = "1"
            except _ForwardFailedError as exc:
                response = _passed_on(exc.answer)
            except TransportError as exc:  # the journal failed: the write is not durable
                response = _error(503, f"not durable: {exc}", None)
                response.headers["Retry-After"] = "1"
            except UsageError as exc:
                response = _error(422, str(exc), None)
            config.observe(route, request.method, response.status_code, trio.current_time() - start)
            return response

        return endpoint

    routes = [
        ("/v1/operations", create_operation, ["POST"], True),
        ("/v1/operations", list_operations, ["GET"], True),
        ("/v1/operations:batch", create_operations, ["POST"], True),
        ("/v1/operation", get_operation, ["GET"], True),
        ("/v1/operation", cancel_operation, ["DELETE"], True),
        ("/v1/operation/wait", wait_operation, ["GET"], True),
        ("/v1/signals", post_signals, ["POST"], True),
        ("/v1/watermarks", post_watermarks, ["POST"], True),
        ("/healthz", healthz, ["GET"], False),
        ("/readyz", readyz, ["GET"], False),
        ("/metrics", metrics, ["GET"], False),
        ("/openapi.json", openapi, ["GET"], False),
    ]
    return Starlette(
        routes=[
            Route(path, guarded(path, handler, auth=auth), methods=methods)
            for path, handler, methods, auth in routes
        ]
    )
