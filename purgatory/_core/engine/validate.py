"""Argument checks shared by the core's public constructors (core concept: validation).

Each check raises :class:`UsageError` (a ``ValueError``) whose message starts with the
argument's name, so a caller can always tell which argument was wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from purgatory._core._errors import UsageError

__all__ = ["MAX_TIME_MS", "check_ms", "check_positive_int", "check_text", "slot_setters"]

#: The largest time the core accepts: 9999-12-31T23:59:59.999Z in epoch milliseconds.
#: Anything beyond is an absurd deadline (most likely seconds or microseconds mixed up).
MAX_TIME_MS = 253_402_300_799_999


def check_ms(name: str, value: object) -> int:
    """Return ``value`` if it is an int time in ``[0, MAX_TIME_MS]``.

    Raises:
        UsageError: naming ``name`` when the value is not an int, negative or absurd.
    """
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
        raise UsageError(f"{name} must be an int of milliseconds, got {value!r}")
    if value < 0:
        raise UsageError(f"{name} must be >= 0 milliseconds, got {value}")
    if value > MAX_TIME_MS:
        raise UsageError(f"{name} must be <= {MAX_TIME_MS} ms (year 9999), got {value}")
    return int(value)


def check_positive_int(name: str, value: object, *, minimum: int = 1, maximum: int = 2**31) -> int:
    """Return ``value`` if it is an int in ``[minimum, maximum]``.

    Raises:
        UsageError: naming ``name`` otherwise.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise UsageError(f"{name} must be an int, got {value!r}")
    if not minimum <= value <= maximum:
        raise UsageError(f"{name} must be between {minimum} and {maximum}, got {value}")
    return int(value)


def check_text(name: str, value: object) -> str:
    """Return ``value`` if it is a non-empty str.

    Raises:
        UsageError: naming ``name`` otherwise.
    """
    if not isinstance(value, str) or not value:
        raise UsageError(f"{name} must be a non-empty str, got {value!r}")
    return value


def slot_setters(cls: type, *names: str) -> tuple[Callable[[object, object], None], ...]:
    """The slot setters of a slotted dataclass's fields, which must be ``names`` in order.

    For building a record whose values are already known to be valid (a decoder's fast path,
    a restore from a snapshot) without its constructor's checks: the setters bypass the frozen
    ``__setattr__`` and ``__post_init__``, so the values must be as ``__post_init__`` would
    leave them. Listing the names is the guard: adding a field to ``cls`` fails here, at import,
    until every such builder sets it.

    Raises:
        AssertionError: the fields of ``cls`` are not ``names``, in this order.
    """
    fields = tuple(field.name for field in dataclasses.fields(cls))
    assert fields == names, f"a trusted builder of {cls.__name__} must set {fields}"
    return tuple(getattr(cls, name).__set__ for name in names)
