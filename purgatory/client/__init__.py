"""A small client for purgatory's HTTP API: blocking and async flavours with the same methods.

* :class:`PurgatoryClient` -- the blocking client (``register``, ``register_many``, ``get``,
  ``wait``, ``cancel``, ``pending``, ``signal``, ``signals``, ``watermark``);
* :class:`AsyncPurgatoryClient` -- the same methods, awaited under trio or asyncio;
* :func:`operation` -- the body of one registration, for ``register_many``;
* :class:`ApiError` -- the service answered an error: its ``status`` and the ``field`` named.

A request that cannot reach the service raises :class:`purgatory.TransportError`.
"""

from purgatory.client._clients import AsyncPurgatoryClient, PurgatoryClient
from purgatory.client._requests import ApiError, operation

__all__ = ["ApiError", "AsyncPurgatoryClient", "PurgatoryClient", "operation"]
