"""Where a graceful stop's time went (service layer: telemetry).

A stop runs its phases in turn within one grace (:mod:`purgatory.service.app`): HTTP answers
what it has, the inputs stop, the journal is flushed, the outbox delivers and commits. A stop
that runs out of its grace fails loudly, and which phase held it is the first thing to know:
the service logs each phase's end, in seconds from the stop, with ``service_stopped``, and the
error of a stop that ran out names them too.
"""

from __future__ import annotations

import trio

__all__ = ["StopPhases"]


class StopPhases:
    """The end of each phase of a graceful stop, in trio time."""

    def __init__(self) -> None:
        self._began: float | None = None
        self._ends: dict[str, float] = {}

    def begin(self, grace_s: float) -> float:
        """The stop begins now; returns when it must be over (trio time)."""
        self._began = trio.current_time()
        return self._began + grace_s

    def end(self, phase: str) -> None:
        """``phase`` is over now."""
        self._ends[phase] = trio.current_time()

    def seconds(self) -> dict[str, float]:
        """``{"<phase>_s": seconds from the stop to its end}``, in the order they ended."""
        if self._began is None:
            return {}
        return {f"{phase}_s": round(at - self._began, 3) for phase, at in self._ends.items()}
