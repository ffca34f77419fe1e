"""How the HTTP server treats its connections (service layer): hypercorn's limits.

Slow and stalled clients (:func:`server_config`; hypercorn's trio worker serves the API). Each
stage of a request has a bound, so a stalled or trickling client is dropped in bounded time and
stalled uploads cannot pile up:

* the request line and headers: at most ``h11_max_incomplete_size`` (:data:`MAX_INCOMPLETE_BYTES`,
  16 KiB), whole within the keep-alive timeout (:data:`KEEP_ALIVE_TIMEOUT_S`, 5 s) of connecting
  or of the previous answer: hypercorn's idle timer runs until a request's head is whole, then
  the connection is closed;
* the body: whole within ``body_timeout_s`` (:data:`BODY_TIMEOUT_S`, 30 s), else 408 and the
  connection is closed;
* any moment: hypercorn's ``read_timeout`` closes a connection that sent nothing for that long.
  It reads a connection all the time, a request in progress included, and a long poll sends
  nothing while it waits, so this is the longest long poll (``max_wait_ms``) plus
  :data:`READ_GRACE_S` (10 s): 70 s by default.
"""

from __future__ import annotations

from hypercorn.config import Config as HypercornConfig

__all__ = [
    "BODY_TIMEOUT_S",
    "KEEP_ALIVE_TIMEOUT_S",
    "MAX_INCOMPLETE_BYTES",
    "READ_GRACE_S",
    "server_config",
]

#: How long a request's body may take to arrive, whole.
BODY_TIMEOUT_S = 30.0
#: A connection's read timeout beyond the longest long poll.
READ_GRACE_S = 10.0
#: How long an idle keep-alive connection is kept (and a request's head may take).
KEEP_ALIVE_TIMEOUT_S = 5.0
#: The most bytes of a request line and headers.
MAX_INCOMPLETE_BYTES = 16 * 1024


def server_config(
    bind: str,
    *,
    max_wait_ms: int,
    graceful_timeout_s: float,
    read_grace_s: float = READ_GRACE_S,
    keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S,
) -> HypercornConfig:
    """Hypercorn's configuration for the API on ``bind`` (``host:port``); see the module
    docstring for the timeouts and limits."""
    config = HypercornConfig()
    config.bind = [bind]
    config.accesslog = None
    config.graceful_timeout = graceful_timeout_s
    config.read_timeout = max_wait_ms / 1000 + read_grace_s  # type: ignore[assignment]
    config.keep_alive_timeout = keep_alive_timeout_s
    config.h11_max_incomplete_size = MAX_INCOMPLETE_BYTES
    return config
