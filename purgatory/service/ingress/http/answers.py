"""What the API answers (service layer): the one mapping from errors to HTTP answers, the JSON
error body, and the JSON of outcomes and registrations.

Every route, each item of a batch, and a forward whose owner did not answer (an
:class:`~purgatory.service.errors.OwnerUnansweredError`) are answered through
:func:`as_http_error`, so an error has one status, one field and one set of headers wherever
it is raised.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

from purgatory._codec import APPLIED_HEADER, RecordError, RegisterRequest, encode_callback
from purgatory._core import (
    ConflictError,
    LimitError,
    Outcome,
    Registration,
    SizeLimitError,
    TransportError,
    UsageError,
)
from purgatory.service.errors import UnavailableError

__all__ = ["HttpError", "as_http_error", "error_response", "outcome_json", "registration_json"]


class HttpError(Exception):
    """An error answer, with the field it is about and any headers it carries.

    Args:
        status: the HTTP status.
        message: what the answer says.
        field: the field of the request it is about (None: the request as a whole).
        headers: the headers the answer carries.
    """

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
                                          (an owner that did not answer a forward included)
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


def error_response(error: HttpError) -> JSONResponse:
    """The answer of ``error``: ``{"error": {"status", "field", "message"}}``, its headers."""
    body = {"error": {"status": error.status, "field": error.field, "message": error.message}}
    return JSONResponse(body, status_code=error.status, headers=error.headers)


def outcome_json(outcome: Outcome) -> Any:
    """An outcome as the API shows it: its callback record, payloads as JSON."""
    return json.loads(encode_callback(outcome))


def registration_json(req: RegisterRequest, reg: Registration) -> dict[str, Any]:
    """What a registration answers: its status, scope, op_id, and outcome if it has one."""
    outcome = reg.outcome
    return {
        "status": reg.status.value,
        "scope": req.scope,
        "op_id": req.op_id,
        "outcome": outcome_json(outcome) if outcome is not None else None,
    }
