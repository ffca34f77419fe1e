"""Forwarding a request to the replica that owns its scope's partition (service layer).

Any replica answers for any scope: a request whose scope's partition another replica owns
(:mod:`purgatory.service.ownership.owners`) is sent on to that replica, as it came (method, path,
query,
body, ``Authorization``), and its answer is returned as the owner gave it. A forwarded request
carries ``X-Purgatory-Forwarded-By``; a replica never forwards such a request again, so two
replicas that disagree on ownership (in the middle of a rollout) answer 503 with Retry-After
instead of bouncing it between them. An owner that cannot be reached is a 503 as well: the
client retries within its deadline, and every write is idempotent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import httpx

from purgatory.service.telemetry.logging import get_logger

__all__ = ["FORWARDED_BY", "Forwarded", "Forwarder", "new_forwarder"]

_log = get_logger()

FORWARDED_BY = "x-purgatory-forwarded-by"
_PASSED_HEADERS = ("authorization", "content-type", "purgatory-retry")
_ANSWER_HEADERS = ("content-type", "retry-after", "allow", "www-authenticate", "purgatory-applied")


class Forwarded:
    """The owner's answer (status, body and the headers worth passing on)."""

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = dict(headers)

    def json(self) -> Any:
        """The body as JSON."""
        return httpx.Response(self.status, content=self.body).json()


class Forwarder:
    """Sends requests on to other replicas.

    Args:
        client: the HTTP client (one connection pool for every peer).
        me: this replica's name in ``X-Purgatory-Forwarded-By`` (its ordinal).
        timeout_s: how long an owner may take (a long poll adds its own wait).
    """

    def __init__(self, client: httpx.AsyncClient, *, me: str, timeout_s: float = 30.0) -> None:
        self._client = client
        self._me = me
        self._timeout_s = timeout_s

    async def send(
        self,
        base_url: str,
        *,
        method: str,
        path: str,
        query: str,
        headers: Mapping[str, str],
        body: bytes | None,
        extra_s: float = 0.0,
    ) -> Forwarded:
        """Send one request to ``base_url`` and return its answer (a 503 when unreachable)."""
        passed = {k: v for k, v in headers.items() if k.lower() in _PASSED_HEADERS}
        passed[FORWARDED_BY] = self._me
        url = f"{base_url}{path}" + (f"?{query}" if query else "")
        try:
            response = await self._client.request(
                method, url, content=body, headers=passed, timeout=self._timeout_s + extra_s
            )
        except httpx.HTTPError as exc:
            _log.warning("forward_failed", url=url, error=repr(exc))
            error = (
                b'{"error":{"status":503,"field":"scope","message":"the replica owning the'
                b' scope cannot be reached; retry later"}}'
            )
            return Forwarded(503, error, {"content-type": "application/json", "retry-after": "1"})
        kept = {k: v for k, v in response.headers.items() if k.lower() in _ANSWER_HEADERS}
        return Forwarded(response.status_code, response.content, kept)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()


def new_forwarder(*, me: str, timeout_s: float = 30.0) -> Forwarder:
    """A forwarder with its own connection pool (close it with :meth:`Forwarder.aclose`)."""
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=16)
    return Forwarder(httpx.AsyncClient(limits=limits), me=me, timeout_s=timeout_s)
