"""Forwarding a request to the replica that owns its scope's partition (service layer).

Any replica answers for any scope: a request whose scope's partition another replica owns
(:mod:`purgatory.service.ownership.owners`) is sent on to that replica, as it came (method,
path, query, body, ``Authorization``), and its answer is returned as the owner gave it. A
forwarded request carries ``X-Purgatory-Forwarded-By``; a replica never forwards such a
request again, so two replicas that disagree on ownership (in the middle of a rollout) answer
503 with Retry-After instead of bouncing it between them. An owner that cannot be reached is a
503 as well: the client retries within its deadline, and every write is idempotent.

**Answers within a bound.** Connecting and the whole request, the answer's body included, take
at most ``wait_ms``: the journal wait (``PURGATORY_JOURNAL_WAIT_MS``), the longest a write
answered here waits for its own journal, so a client gets its answer within the same bound
wherever its scope lives (a long poll adds its own wait). Per-step timeouts would not do: they
bound each connect, read and write, not the request, and an owner whose link drops packets
after the connection was made holds a request until the client has long given up. So the bound
cancels the request, and the connections (:mod:`.peer_http`) are built to be cancelled. An owner
that does not answer in time, or cannot be connected to, raises
:class:`~purgatory.service.errors.OwnerUnansweredError`, an ``UnavailableError`` the API's one
error mapping answers: 503, ``Retry-After``, and, for a write whose request had begun to
leave, ``Purgatory-Applied: maybe`` (the owner may have applied it and its answer been lost,
as a write whose journal stalled may be durable later): the client marks its retry, which the
owner then takes as the duplicate it may be. A read, or a request that never left (no
connection), was not applied.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import trio

from purgatory._core import UsageError
from purgatory.service.errors import OwnerUnansweredError
from purgatory.service.ownership.peer_http import PeerError, Peers
from purgatory.service.telemetry.logging import get_logger

__all__ = ["FORWARDED_BY", "Forwarded", "Forwarder", "new_forwarder"]

_log = get_logger()

FORWARDED_BY = "x-purgatory-forwarded-by"
_PASSED_HEADERS = ("authorization", "content-type", "purgatory-retry")
_ANSWER_HEADERS = ("content-type", "retry-after", "allow", "www-authenticate", "purgatory-applied")
_READS = frozenset({"GET", "HEAD", "OPTIONS"})  # never change anything at the owner


class Forwarded:
    """The owner's answer (status, body and the headers worth passing on)."""

    def __init__(self, status: int, body: bytes, headers: Mapping[str, str]) -> None:
        self.status = status
        self.body = body
        self.headers = dict(headers)

    def json(self) -> Any:
        """The body as JSON."""
        return json.loads(self.body)


class Forwarder:
    """Sends requests on to other replicas.

    Args:
        peers: the connections to the other replicas (:mod:`.peer_http`).
        me: this replica's name in ``X-Purgatory-Forwarded-By`` (its ordinal).
        wait_ms: how long connecting to an owner and its whole answer may take
            (``PURGATORY_JOURNAL_WAIT_MS``); a long poll adds its own wait.

    Raises:
        UsageError: ``wait_ms`` is not positive.
    """

    def __init__(self, peers: Peers, *, me: str, wait_ms: int = 5_000) -> None:
        if wait_ms <= 0:
            raise UsageError(f"wait_ms must be > 0, got {wait_ms}")
        self._peers = peers
        self._me = me
        self._wait_ms = wait_ms

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
        """Send one request to ``base_url`` and return its answer.

        Args:
            base_url: the owner's base URL.
            method: the request's method, ``path`` and ``query`` its target, as it came.
            path: see ``method``.
            query: see ``method``.
            headers: the request's headers (only those worth passing on are sent).
            body: the request's body, as it came.
            extra_s: a long poll's own wait, added to the bound.

        Returns:
            The owner's answer, whatever its status.

        Raises:
            OwnerUnansweredError: the owner did not answer within ``wait_ms`` plus
                ``extra_s``, or could not be reached (see the module docstring).
        """
        passed = [(k, v) for k, v in headers.items() if k.lower() in _PASSED_HEADERS]
        passed.append((FORWARDED_BY, self._me))
        target = path + (f"?{query}" if query else "")
        within_s = self._wait_ms / 1000 + extra_s
        sent = False

        def began_to_leave() -> None:
            nonlocal sent  # the owner may apply it from now on
            sent = True

        why = f"no answer within {round(within_s * 1000)} ms"
        with trio.move_on_after(within_s):
            try:
                answer = await self._peers.request(
                    base_url, method, target, headers=passed, body=body, on_sent=began_to_leave
                )
            except PeerError as exc:
                why = str(exc)
            else:
                kept = {k: v for k, v in answer.headers if k in _ANSWER_HEADERS}
                return Forwarded(answer.status, answer.body, kept)
        url = f"{base_url}{target}"
        maybe_applied = sent and method.upper() not in _READS
        _log.warning(
            "forward_failed", url=url, method=method, error=why, maybe_applied=maybe_applied
        )
        raise OwnerUnansweredError(why, maybe_applied=maybe_applied)

    async def aclose(self) -> None:
        """Close the idle connections."""
        await self._peers.aclose()


def new_forwarder(*, me: str, wait_ms: int = 5_000) -> Forwarder:
    """A forwarder with its own connection pool (close it with :meth:`Forwarder.aclose`).

    Args:
        me: this replica's name in ``X-Purgatory-Forwarded-By``.
        wait_ms: how long an owner may take (``PURGATORY_JOURNAL_WAIT_MS``).
    """
    return Forwarder(Peers(), me=me, wait_ms=wait_ms)
