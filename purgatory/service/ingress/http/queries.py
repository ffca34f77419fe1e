"""Reading what a request says besides its body (service layer): its query parameters (the
operation it names, bounded integers, a page's cursor, a long poll's wait) and whether it is a
retry.

Integers are ASCII digits only and bounded, so a parameter out of its domain is a 422 naming
it, never a 500.
"""

from __future__ import annotations

import base64
import binascii

from starlette.requests import Request

from purgatory._codec import RETRY_HEADER, is_retry
from purgatory.service.ingress.http.answers import HttpError
from purgatory.service.ingress.http.context import RequestContext

__all__ = [
    "cursor_after",
    "is_retry_request",
    "long_poll_wait_s",
    "page_cursor",
    "query_int",
    "scope_and_op_id",
]

_MAX_DIGITS = 15  # a query integer longer than this is out of every domain


def scope_and_op_id(request: Request) -> tuple[str, str]:
    """The operation a request names, by its ``scope`` and ``op_id`` query parameters.

    Raises:
        HttpError: 422 naming the one missing.
    """
    scope, op_id = request.query_params.get("scope"), request.query_params.get("op_id")
    if not scope:
        raise HttpError(422, "query parameter scope is required", "scope")
    if not op_id:
        raise HttpError(422, "query parameter op_id is required", "op_id")
    return scope, op_id


def query_int(request: Request, name: str, *, default: int, minimum: int, maximum: int) -> int:
    """An integer query parameter: ASCII digits only, in ``[minimum, maximum]``.

    Raises:
        HttpError: 422 naming ``name``.
    """
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS:
        value = int(raw)
        if minimum <= value <= maximum:
            return value
    raise HttpError(422, f"must be an integer in [{minimum}, {maximum}] (ASCII digits)", name)


def long_poll_wait_s(request: Request) -> float:
    """A long poll's own wait, added to the forwarding timeout: read leniently (0: none, or
    not a wait), since the owner validates it."""
    raw = request.query_params.get("timeout_ms", "")
    return int(raw) / 1000 if raw.isascii() and raw.isdigit() and len(raw) < 9 else 0.0


def is_retry_request(request: Request) -> bool:
    """Whether the request is marked as a retry of a write that may have been applied."""
    return is_retry(request.headers.get(RETRY_HEADER))


def page_cursor(op_id: str) -> str:
    """The opaque cursor of the page that starts after ``op_id``."""
    return base64.urlsafe_b64encode(op_id.encode("utf-8")).rstrip(b"=").decode("ascii")


def cursor_after(ctx: RequestContext, request: Request) -> str | None:
    """The op_id a page starts after, from its ``cursor`` (None: the first page).

    Raises:
        HttpError: 422 a cursor that no page gave.
    """
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
    if not op_id or page_cursor(op_id) != raw:
        raise HttpError(422, "must be the next_cursor of a page", "cursor")
    return op_id
