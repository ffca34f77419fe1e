"""The service's own errors (service layer), beside the core's tree in :mod:`purgatory._core`.

:class:`NotServingError` is the service's "unavailable, retry later": the scope's partition is
not served here now (restoring, fenced, or another replica's). The HTTP layer answers it 503
with ``Retry-After``; the clients retry it within their deadline.
"""

from __future__ import annotations

from purgatory._core import UsageError

__all__ = ["NotServingError"]


class NotServingError(UsageError):
    """The scope's partition is not served here now (HTTP 503 with Retry-After).

    Args:
        partition: the scope's partition.
        restoring: True while this replica restores it (it will serve it soon).
        stopped: why this replica takes no input at all (None: it does); see
            :mod:`purgatory.service._layout`.

    Attributes:
        partition: the scope's partition.
        restoring: True while this replica restores it (it will serve it soon).
    """

    def __init__(self, partition: int, *, restoring: bool, stopped: str | None = None) -> None:
        what = "is being restored" if restoring else "is not served by this replica"
        if stopped is not None:
            what = f"takes no input: {stopped}"
        super().__init__(f"partition {partition} {what}; retry later")
        self.partition = partition
        self.restoring = restoring
