"""The delayed operation (core concept: an operation that completes once; sans-IO, stdlib only).

A :class:`DelayedOperation` is a :class:`TimerTask` with a completion condition. Three paths can
end it: a signal makes :meth:`try_complete` find the condition true, the timer reaches its
deadline and the executor calls :meth:`run`, or the owner calls :meth:`force_complete`. All three
go through :meth:`force_complete`, which flips ``is_completed`` exactly once: only its first
caller gets True and runs :meth:`on_complete`; an expiration runs :meth:`on_expiration` only when
``run`` won that race. So an operation reaches exactly one terminal outcome, whatever the order.

The purgatory's ``cancel_for_key`` is the fourth path, and it is terminal too (unlike Kafka, where
a cancelled operation lingers in its other keys' lists and may still complete): once
``is_cancelled`` is set, ``force_complete`` returns False forever and no callback runs.
"""

from __future__ import annotations

from purgatory._core.wheel.timer import TimerTask

__all__ = ["DelayedOperation"]

_PENDING = 0
_COMPLETED = 1
_CANCELLED = 2


class DelayedOperation(TimerTask):
    """An operation that waits for a condition until ``deadline_ms``.

    Subclasses override :meth:`try_complete` (check the condition, call :meth:`force_complete`
    when it holds), :meth:`on_complete` and :meth:`on_expiration`.

    Args:
        deadline_ms: when the operation expires, in integer milliseconds.

    Raises:
        UsageError: (a ``ValueError``) if ``deadline_ms`` is invalid.
    """

    __slots__ = ("_state",)

    def __init__(self, *, deadline_ms: int) -> None:
        super().__init__(deadline_ms=deadline_ms)
        self._state = _PENDING

    @property
    def is_completed(self) -> bool:
        """True once :meth:`force_complete` has succeeded (by any path)."""
        return self._state == _COMPLETED

    @property
    def is_cancelled(self) -> bool:
        """True once the operation was cancelled (it will never complete nor expire)."""
        return self._state == _CANCELLED

    @property
    def is_done(self) -> bool:
        """True once the operation reached a terminal state: completed or cancelled."""
        return self._state != _PENDING

    def cancel_operation(self) -> bool:
        """Cancel the operation: terminal, without completing it and without callbacks.

        Returns:
            True if this call cancelled it; False if it was already completed or cancelled.
        """
        if self._state != _PENDING:
            return False
        self._state = _CANCELLED
        self.cancel()
        return True

    def try_complete(self) -> bool:
        """Check the condition; call :meth:`force_complete` and return its result if it holds.

        Returns:
            True if this call completed the operation.
        """
        return False

    def force_complete(self) -> bool:
        """Complete the operation now, exactly once.

        Cancels the timer entry and calls :meth:`on_complete`.

        Returns:
            True for the first caller only; False if the operation was already completed.
        """
        if self._state != _PENDING:
            return False
        self._state = _COMPLETED
        self.cancel()
        self.on_complete()
        return True

    def on_complete(self) -> None:
        """Called exactly once, by the call that completed the operation (expiry included)."""

    def on_expiration(self) -> None:
        """Called after :meth:`on_complete` when the deadline, not the condition, ended it."""

    def run(self) -> None:
        """The timer's action: complete the operation and, if this won, expire it."""
        if self.force_complete():
            self.on_expiration()
