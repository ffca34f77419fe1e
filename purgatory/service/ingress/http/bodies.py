"""Reading a request's body (service layer): within ``max_request_bytes`` and the body
timeout, parsed by the codec's own parser, and a batch decoded whole before any item is
applied.

An HTTP body item is a codec record without its ``v``/``type`` envelope: :func:`as_record`
adds it, so HTTP and Kafka inputs are decoded by the same code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import trio
from starlette.requests import ClientDisconnect, Request

from purgatory._codec import RecordError, RegisterRequest, SignalRecord, WatermarkRecord
from purgatory._codec._json import parse_json
from purgatory.service.ingress.http.answers import HttpError
from purgatory.service.ingress.http.context import RequestContext

__all__ = ["as_record", "batch_items", "decode_batch", "read_body"]

_R = TypeVar("_R", RegisterRequest, SignalRecord, WatermarkRecord)


async def read_body(ctx: RequestContext, request: Request) -> Any:
    """The body, parsed by the codec's parser: any JSON value.

    The raw body is kept on ``request.state.raw``: it may be forwarded to the scope's owner
    as it came.

    Raises:
        HttpError: 413 over ``max_request_bytes``; 400 a client that left mid-body, or a body
            that is not JSON the codec reads; 408 a body that did not arrive in time.
    """
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
    raw = request.state.raw = b"".join(chunks)
    try:
        return parse_json(raw, limit)
    except RecordError as exc:
        raise HttpError(400, f"body: {exc.reason}", "(body)") from None


def as_record(item: Any, kind: str, field: str) -> dict[str, Any]:
    """The codec record of a body item of type ``kind``: the item in its envelope.

    Raises:
        HttpError: 422 naming ``field``: not an object, or a ``type`` other than ``kind``.
    """
    if not isinstance(item, dict):
        raise HttpError(422, "must be a JSON object", field)
    if item.get("type", kind) != kind:
        raise HttpError(422, f"must be {kind!r} here", f"{field}.type" if field else "type")
    return {"v": 1, "type": kind, **item}


def batch_items(ctx: RequestContext, payload: Any, name: str) -> list[Any]:
    """The items of a batch body ``{name: [...]}``.

    Raises:
        HttpError: 422 not such an object (or another field beside ``name``); 413 more than
            ``max_batch`` items.
    """
    if not isinstance(payload, dict) or not isinstance(payload.get(name), list):
        raise HttpError(422, f"must be an object with a list {name!r}", name)
    for other in payload:
        if other != name:
            raise HttpError(422, "unknown field", _shown(other))
    listed: list[Any] = payload[name]
    if len(listed) > ctx.config.max_batch:
        raise HttpError(413, f"more than max_batch ({ctx.config.max_batch}) items", name)
    return listed


def decode_batch(
    ctx: RequestContext,
    payload: Any,
    name: str,
    *,
    kind: str,
    decode: Callable[..., object],
    cls: type[_R],
) -> list[_R]:
    """Decode every item of a batch before any is applied; errors name ``name[i].field``.

    Raises:
        HttpError: as :func:`batch_items`, or 422 for the first item that does not decode.
    """
    decoded: list[_R] = []
    for i, item in enumerate(batch_items(ctx, payload, name)):
        try:
            record = decode(as_record(item, kind, f"{name}[{i}]"), ctx.config.limits)
        except RecordError as exc:
            raise HttpError(422, exc.reason, f"{name}[{i}].{exc.field}") from None
        assert isinstance(record, cls)  # as_record() pinned the type
        decoded.append(record)
    return decoded


def _shown(name: str) -> str:
    return name if len(name) <= 64 else name[:61] + "..."
