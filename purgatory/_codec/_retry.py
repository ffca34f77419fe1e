"""How an HTTP write that may have been applied is retried (shared by the service and clients).

A 503 is not always "nothing happened": a write can be applied and then wait too long for the
journal, or its partition can be fenced while it waits. Such an answer carries
``Purgatory-Applied: maybe``. A client that tries the write again marks every later try with
``Purgatory-Retry: 1``; the service then treats a timer sent with a relative ``timeout_ms``
that it finds pending or finished as a ``duplicate`` instead of arming it again from the
retry's later arrival (which would move it or, once fired, start a second round with a second
callback). A 503 without the header (a partition being restored, another replica's) refused
the write before anything changed: the next try is a fresh one, unmarked, so an inactivity
timer pushed back during a restart is pushed back. A retried cancel that finds the operation
cancelled answers 200 with that outcome (unmarked: 409, already finished).
"""

from __future__ import annotations

__all__ = ["APPLIED_HEADER", "RETRY_HEADER", "is_retry"]

#: On a 503: the write may have been applied before the service gave up waiting for it.
APPLIED_HEADER = "Purgatory-Applied"
#: On a request: this write is a retry of one that may have been applied.
RETRY_HEADER = "Purgatory-Retry"


def is_retry(value: str | None) -> bool:
    """Whether a request's ``Purgatory-Retry`` header marks it as a retry."""
    return value is not None and value.strip() not in ("", "0")
