"""The route table's vocabulary (service layer): what a route serves and documents.

Each :class:`ApiRoute` names its path, method and handler, whether it needs a bearer token, and
what it documents; :data:`purgatory.service.ingress.http.routes.ROUTES` lists them, the
server serves them and the OpenAPI document describes them. The errors every route of a kind
may answer are documented here once (:attr:`ApiRoute.documented`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

__all__ = [
    "METHOD_NOT_ALLOWED",
    "NOT_FOUND_PATH",
    "OPERATION_NOT_FOUND",
    "OP_ID_CONFLICT",
    "Answer",
    "ApiRoute",
    "Handler",
    "Param",
    "error_answer",
]


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Answer:
    """One documented answer of a route.

    Attributes:
        schema: the body's schema, a name under ``#/components/schemas`` (None: any value of
            the media type).
        headers: the headers it always carries, names under ``#/components/headers``.
    """

    status: int
    description: str
    schema: str | None = None
    media_type: str = "application/json"
    headers: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Param:
    """A query parameter (a string, or an integer of ASCII digits)."""

    name: str
    description: str
    required: bool = True
    integer: bool = False
    minimum: int = 0


@dataclass(frozen=True, slots=True)
class ApiRoute:
    """One route: what serves it and what documents it.

    Attributes:
        body: the request body's schema, a name under ``#/components/schemas`` (None: no body).
        answers: the route's own answers; :attr:`documented` adds the errors of its kind.
    """

    path: str
    method: str
    handler: Handler
    summary: str
    auth: bool = True
    body: str | None = None
    params: tuple[Param, ...] = ()
    answers: tuple[Answer, ...] = ()
    description: str | None = None

    @property
    def documented(self) -> tuple[Answer, ...]:
        """Every answer the route may give, by status: its own and those of its kind."""
        common: list[Answer] = []
        if self.body is not None:
            common += [_MALFORMED, _BODY_TIMEOUT, _TOO_LARGE]
        if self.body is not None or self.params:
            common.append(_INVALID)
        if self.auth:
            common += [_UNAUTHORIZED, _LIMITED, _UNAVAILABLE]
        own = {answer.status for answer in self.answers}
        answers = [*self.answers, *(a for a in common if a.status not in own)]
        return tuple(sorted(answers, key=lambda answer: answer.status))


def error_answer(status: int, description: str, *headers: str) -> Answer:
    """A documented error answer: the ``Error`` body, and the ``headers`` it always carries."""
    return Answer(status, description, "Error", headers=headers)


_MALFORMED = error_answer(
    400, "The body is not JSON the codec reads (not UTF-8, a repeated name, nested over 64 deep)."
)
_UNAUTHORIZED = error_answer(
    401, "No known bearer token (when tokens are set).", "WWW-Authenticate"
)
#: An op_id not known in its scope.
OPERATION_NOT_FOUND = error_answer(404, "Unknown operation.")
_BODY_TIMEOUT = error_answer(408, "The body did not arrive whole in time.")
#: An op_id reused with another body.
OP_ID_CONFLICT = error_answer(409, "op_id reused with another body.")
_TOO_LARGE = error_answer(413, "Body over max_request_bytes, or batch over max_batch.")
_INVALID = error_answer(
    422, "A field or query parameter is out of its domain (or unknown); `field` names it."
)
_LIMITED = error_answer(429, "A limit was reached; retry after Retry-After.", "Retry-After")
_UNAVAILABLE = error_answer(
    503,
    "The scope's partition is being restored (or is not served by this replica), or the"
    " journal could not make the write durable: the broker did not acknowledge it within"
    " PURGATORY_JOURNAL_WAIT_MS (the write stays applied and becomes durable once acknowledged;"
    " a retried registration is a duplicate); retry after Retry-After. When the write may"
    " have been applied, the answer says `Purgatory-Applied: maybe`: send every later try with"
    " `Purgatory-Retry: 1`, so that a timer sent with a relative timeout_ms is not armed twice"
    " and a retried cancel finds its own outcome.",
    "Retry-After",
    "Purgatory-Applied",
)
#: Any path not in the table, and any method a path does not serve.
NOT_FOUND_PATH = error_answer(404, "No such path.")
METHOD_NOT_ALLOWED = error_answer(405, "The path does not serve this method.", "Allow")
