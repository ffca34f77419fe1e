"""A small client for purgatory's HTTP API: blocking and trio flavours with the same methods."""

from purgatory.client._clients import AsyncPurgatoryClient, PurgatoryClient
from purgatory.client._requests import ApiError, operation

__all__ = ["ApiError", "AsyncPurgatoryClient", "PurgatoryClient", "operation"]
