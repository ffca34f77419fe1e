"""The error tree shared by every layer (core concept: errors; stdlib only).

::

    PurgatoryError                  base of every error the project raises on purpose
    +-- UsageError (ValueError)     a caller passed a bad argument; the message names it
    +-- BadRecordError (ValueError) a record (bytes, JSON) could not be decoded or validated
    +-- TransportError              a broker, socket or HTTP peer failed
    +-- ConfigError (ValueError)    a setting is missing or invalid; the message names it

    InvariantError (AssertionError) an internal invariant broke: a bug, never caught

Third-party errors are translated into this tree at the boundary that meets them.
"""

from __future__ import annotations

__all__ = [
    "BadRecordError",
    "ConfigError",
    "InvariantError",
    "PurgatoryError",
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
