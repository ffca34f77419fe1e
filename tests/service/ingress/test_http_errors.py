"""One mapping from errors to HTTP answers, for whole requests and batch items alike."""

from __future__ import annotations

import pytest

from purgatory._codec import RecordError
from purgatory._core import (
    ConfigError,
    ConflictError,
    LimitError,
    SizeLimitError,
    TransportError,
    UsageError,
)
from purgatory.service.errors import JournalStalledError, NotServingError, OwnerUnansweredError
from purgatory.service.ingress.http.answers import HttpError, as_http_error


@pytest.mark.parametrize(
    ("exc", "status", "field", "headers"),
    [
        (HttpError(413, "too large", "(body)"), 413, "(body)", {}),
        (RecordError("keys[1]", "must be a string"), 422, "keys[1]", {}),
        (ConflictError("op_id 'a' is pending with another body"), 409, "op_id", {}),
        (SizeLimitError("payload", "too large"), 422, "payload", {}),
        (LimitError("too many", field="max_pending"), 429, "max_pending", {"Retry-After": "1"}),
        (NotServingError(3, restoring=True), 503, "scope", {"Retry-After": "1"}),
        (
            NotServingError(3, restoring=True, maybe_applied=True),
            503,
            "scope",
            {"Retry-After": "1", "Purgatory-Applied": "maybe"},
        ),
        (JournalStalledError(5_000), 503, None, {"Retry-After": "1", "Purgatory-Applied": "maybe"}),
        (
            OwnerUnansweredError("no answer within 5000 ms", maybe_applied=True),
            503,
            "scope",
            {"Retry-After": "1", "Purgatory-Applied": "maybe"},
        ),
        (
            OwnerUnansweredError("ConnectError", maybe_applied=False),
            503,
            "scope",
            {"Retry-After": "1"},
        ),
        (TransportError("gone"), 503, None, {"Retry-After": "1", "Purgatory-Applied": "maybe"}),
        (UsageError("deadline_ms: too far ahead"), 422, None, {}),
    ],
)
def test_every_error_the_api_answers_has_one_status_field_and_headers(
    exc: Exception, status: int, field: str | None, headers: dict[str, str]
) -> None:
    answer = as_http_error(exc)
    assert answer is not None
    assert (answer.status, answer.field, answer.headers) == (status, field, headers)
    assert answer.message  # never an empty message


def test_an_error_the_api_does_not_answer_is_left_to_raise() -> None:
    assert as_http_error(ConfigError("PURGATORY_X: bad")) is None
    assert as_http_error(RuntimeError("a bug")) is None


def test_unavailable_is_not_a_usage_error() -> None:
    # "Retry later" is not "your request is wrong": a caller catching UsageError (422) must
    # not swallow a 503.
    assert not isinstance(NotServingError(0, restoring=True), UsageError)
    assert not isinstance(JournalStalledError(1), ValueError)
