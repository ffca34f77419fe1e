"""kafka-python's faults, as the service's :class:`TransportError` (service layer).

kafka-python reports most broker faults with a ``KafkaError``, but not all of them: while its
metadata is momentarily empty or partial (a broker fencing itself, leaders moving, a topic
answered with an error and dropped from the cache) its own checks raise ``AssertionError`` or
``ValueError`` ("Unrecognized partition"), and a socket can raise ``OSError``. Each is the
broker's weather, not a bug of the service, and must not end a replica: the caller gets a
``TransportError``, which it retries with its own back-off and log event, as when the broker is
away. So :func:`client_faults` goes around kafka-python's calls only, never around the
service's own code (a batch's handler, a decoder): an error there still surfaces, and so does
any error the project raises on purpose (an ``InvariantError`` is an ``AssertionError``, a
``ConfigError`` a ``ValueError``), from a callback kafka-python runs or not.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kafka.errors import KafkaError

from purgatory._core import InvariantError, PurgatoryError, TransportError

__all__ = ["client_faults", "describe", "is_client_fault"]

_FAULTS = (KafkaError, AssertionError, ValueError, OSError)


def is_client_fault(exc: BaseException) -> bool:
    """Whether ``exc``, raised by a kafka-python call, is the client's failure (see above)."""
    return isinstance(exc, _FAULTS) and not isinstance(exc, (PurgatoryError, InvariantError))


def describe(exc: BaseException) -> str:
    """``exc`` for a message: a ``KafkaError`` names its class itself, the others do not."""
    return str(exc) if isinstance(exc, KafkaError) else f"{type(exc).__name__}: {exc}"


@contextmanager
def client_faults(what: str) -> Iterator[None]:
    """Raise a client fault of the calls inside as ``TransportError(f"{what}: ...")``.

    Raises:
        TransportError: a kafka-python call failed (chained to what it raised).
    """
    try:
        yield
    except Exception as exc:
        if not is_client_fault(exc):
            raise
        raise TransportError(f"{what}: {describe(exc)}") from exc
