"""The service's own errors (service layer), beside the core's tree in :mod:`purgatory._core`.

One error says "unavailable, retry later"; the HTTP layer answers every kind of it 503 with
``Retry-After``, and the clients retry it within their deadline::

    PurgatoryError (core: purgatory._core._errors draws the whole tree)
    └── UnavailableError         nothing is wrong with the request: try it again later
        ├── NotServingError      the scope's partition is not served here now (restoring,
        │                        fenced, another replica's, or inputs stopped)
        ├── JournalStalledError  the broker did not acknowledge the write's journal entry in
        │                        time (the write is applied and may still become durable)
        └── OwnerUnansweredError the replica that owns the scope did not answer a forwarded
                                 request in time (a write that had begun to leave may have
                                 been applied there)
"""

from __future__ import annotations

from purgatory._core import PurgatoryError

__all__ = ["JournalStalledError", "NotServingError", "OwnerUnansweredError", "UnavailableError"]


class UnavailableError(PurgatoryError):
    """The service cannot take this request now; retry later (HTTP 503 with Retry-After).

    Attributes:
        field: what the answer names as its field (None: nothing in the request).
        retry_after_s: the pause the answer suggests before a retry, in whole seconds.
        maybe_applied: the write may have been applied before this was raised (the answer
            then carries ``Purgatory-Applied: maybe``, and a client marks its retry with
            ``Purgatory-Retry: 1``, so that a timer sent with a relative timeout is not armed
            twice); False: it was refused before anything changed.
    """

    field: str | None = None
    retry_after_s: int = 1
    maybe_applied: bool = False


class NotServingError(UnavailableError):
    """The scope's partition is not served here now (HTTP 503 with Retry-After).

    Args:
        partition: the scope's partition.
        restoring: True while this replica restores it (it will serve it soon).
        stopped: why this replica takes no input at all (None: it does); see
            :mod:`purgatory.service.ownership.layout`.
        maybe_applied: raised after the write was applied (its partition was fenced while
            it waited for the journal: its entry may be in the log or withdrawn).

    Attributes:
        partition: the scope's partition.
        restoring: True while this replica restores it (it will serve it soon).
    """

    field = "scope"

    def __init__(
        self,
        partition: int,
        *,
        restoring: bool,
        stopped: str | None = None,
        maybe_applied: bool = False,
    ) -> None:
        what = "is being restored" if restoring else "is not served by this replica"
        if stopped is not None:
            what = f"takes no input: {stopped}"
        super().__init__(f"partition {partition} {what}; retry later")
        self.partition = partition
        self.restoring = restoring
        self.maybe_applied = maybe_applied


class JournalStalledError(UnavailableError):
    """The broker did not acknowledge a write's journal entry within ``wait_ms`` (HTTP 503
    with Retry-After).

    The write was applied here and its entry stays recorded: it becomes durable (and what it
    decided is delivered) once the broker acknowledges it, unless this replica stops first. A
    retry is safe: a retried registration is a duplicate of the first.

    Args:
        wait_ms: how long the write waited (``PURGATORY_JOURNAL_WAIT_MS``).

    Attributes:
        wait_ms: how long the write waited.
    """

    maybe_applied = True

    def __init__(self, wait_ms: int) -> None:
        super().__init__(
            f"the journal is not acknowledging: the broker did not acknowledge this write's"
            f" changelog record within {wait_ms} ms (PURGATORY_JOURNAL_WAIT_MS). The write is"
            f" applied and stays recorded: it becomes durable once the broker acknowledges it."
            f" Retry later; a retried registration is a duplicate"
        )
        self.wait_ms = wait_ms


class OwnerUnansweredError(UnavailableError):
    """The replica that owns the scope did not answer a forwarded request in time, or could
    not be reached (HTTP 503 with Retry-After; see :mod:`purgatory.service.ownership.forward`).

    Args:
        why: what happened (no answer within the bound, or the connection's error).
        maybe_applied: the request was a write that had begun to leave: the owner may have
            applied it and its answer been lost (the answer then carries
            ``Purgatory-Applied: maybe``); False: a read, or a request that never left.
    """

    field = "scope"

    def __init__(self, why: str, *, maybe_applied: bool) -> None:
        message = f"the replica that owns the scope did not answer in time ({why}); retry later"
        if maybe_applied:
            message += (
                ". The write may have been applied there: a retry is safe (a retried"
                " registration is a duplicate)"
            )
        super().__init__(message)
        self.why = why
        self.maybe_applied = maybe_applied
