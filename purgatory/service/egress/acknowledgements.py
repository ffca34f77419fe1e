"""Where acknowledged outcomes go (service layer: egress).

The outbox tells one object, :class:`Acknowledgements`, of each outcome whose callback the broker
acknowledged; it tells each listener in the order they were added: the partitions' waiters and
delivered marks (dispatch), then the operator's recent outcomes (ops). The composition root adds
them once the stages exist, so the outbox needs to know none of them.
"""

from __future__ import annotations

from collections.abc import Callable

from purgatory._core import Outcome

__all__ = ["Acknowledgements"]


class Acknowledgements:
    """Fans each acknowledged outcome out to its listeners, in order."""

    def __init__(self) -> None:
        self._listeners: list[Callable[[Outcome], None]] = []

    def listen(self, listener: Callable[[Outcome], None]) -> None:
        """Tell ``listener`` of every outcome acknowledged from now on."""
        self._listeners.append(listener)

    def delivered(self, outcome: Outcome) -> None:
        """The broker acknowledged ``outcome``'s callback."""
        for listener in self._listeners:
            listener(outcome)
