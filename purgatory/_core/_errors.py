"""The error tree shared by every layer (core concept: errors; stdlib only).

::

    PurgatoryError                  base of every error the project raises on purpose
    +-- UsageError (ValueError)     a caller passed a bad argument; the message names it
    |   +-- ConflictError           an operation id reused with another body (HTTP 409)
    |   +-- LimitError              a configured limit would be exceeded (HTTP 429)
    |       +-- SizeLimitError      an input would make a callback too large (HTTP 422)
    +-- BadRecordError (ValueError) a record (bytes, JSON) could not be decoded or validated
    +-- TransportError              a broker, socket or HTTP peer failed
    +-- ConfigError (ValueError)    a setting is missing or invalid; the message names it

    +-- UnavailableError            (the service's: :mod:`purgatory.service.errors`) not now:
                                    retry later (HTTP 503 with Retry-After)

    InvariantError (AssertionError) an internal invariant broke: a bug, never caught

Third-party errors are translated into this tree at the boundary that meets them.
"""

from __future__ import annotations

__all__ = [
    "BadRecordError",
    "ConfigError",
    "ConflictError",
    "InvariantError",
    "LimitError",
    "PurgatoryError",
    "SizeLimitError",
    "TransportError",
    "UsageError",
]


class PurgatoryError(Exception):
    """Base class of every error the project raises on purpose."""


class UsageError(PurgatoryError, ValueError):
    """A caller passed a bad argument; the message names the argument."""


class BadRecordError(PurgatoryError, ValueError):
    """A record could not be decoded or failed validation; the message names the field."""


class TransportError(PurgatoryError):
    """A broker, socket or HTTP peer failed."""


class ConfigError(PurgatoryError, ValueError):
    """A setting is missing or invalid; the message names the setting."""


class InvariantError(AssertionError):
    """An internal invariant broke. A bug: never caught."""


class ConflictError(UsageError):
    """An operation id was reused with a different body (HTTP 409)."""


class LimitError(UsageError):
    """A configured limit would be exceeded (HTTP 429); nothing was changed.

    Attributes:
        field: the name of the limit crossed (``max_pending_bytes_per_scope``, ...), or None.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class SizeLimitError(LimitError):
    """An input would make a callback carry too many bytes (HTTP 422); nothing was changed.

    Attributes:
        field: the input's field at fault: ``payload`` (a signal) or ``keys`` (a registration).
    """

    field: str

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}", field=field)
