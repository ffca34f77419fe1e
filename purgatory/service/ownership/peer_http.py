"""The HTTP/1.1 connections from this replica to the others (service layer): cancel-safe.

The forwarder (:mod:`purgatory.service.ownership.forward`) bounds each request it sends on by
cancelling it, and cancellation is the one thing this client must survive. httpx's pool could
not: a request cancelled at the wrong moment left its connection counted as in use for good
(httpcore issue 1093), and once every slot of the pool was lost so, each forwarded request
waited for a slot until its bound and answered 503, until the replica restarted. A rollout,
which cancels many requests at once (owners stopping, partitions moving), lost them within
minutes.

Here a connection belongs to exactly one request from the moment it is taken until it is given
back, and it is given back only after a whole exchange (the answer read to its end, both sides
willing to go on); any other way out, a cancellation included, closes it. Nothing is shared
but a list of idle connections, changed only between checkpoints, and a semaphore (at most
:data:`MAX_CONNECTIONS` at once), which trio releases whatever happens. An idle connection is
kept for :data:`IDLE_S` (under the server's keep-alive timeout, 5 s); one that the peer closed
all the same (it restarted) fails before any byte of an answer, and the request is sent once
more on a new connection (the peer did not read it), the other idle ones to that peer dropped.
The body of an answer is at most :data:`MAX_ANSWER_BYTES`.

Speaks HTTP/1.1 through h11 over trio's streams, ``https`` through trio's TLS stream with the
system's trust store.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import h11
import trio

__all__ = ["IDLE_S", "MAX_ANSWER_BYTES", "MAX_CONNECTIONS", "Answer", "PeerError", "Peers"]

#: Requests in flight to all peers at once; more wait for a place (within their bound).
MAX_CONNECTIONS = 64
#: Idle connections kept per peer.
MAX_IDLE = 16
#: How long an idle connection is kept: under the server's keep-alive timeout (5 s).
IDLE_S = 4.0
#: The largest answer body read (a page of a scope is far smaller).
MAX_ANSWER_BYTES = 64 * 1024 * 1024
_READ = 65_536


class PeerError(Exception):
    """The peer could not be reached, or its answer was not HTTP/1.1 this client can read."""


class _StaleError(PeerError):
    """A reused connection was closed by the peer before any byte of an answer."""


@dataclass(frozen=True, slots=True)
class Answer:
    """A peer's answer: its status, its headers (names in lower case) and its body."""

    status: int
    headers: Sequence[tuple[str, str]]
    body: bytes


@dataclass(slots=True)
class _Connection:
    stream: trio.abc.Stream
    h11: h11.Connection
    idle_since: float = 0.0

    def close(self) -> None:
        """Close at once, without a checkpoint (a cancelled request's way out)."""
        stream = self.stream
        while isinstance(stream, trio.SSLStream):
            stream = stream.transport_stream
        if isinstance(stream, trio.SocketStream):
            stream.socket.close()


class Peers:
    """Connections to the other replicas, at most :data:`MAX_CONNECTIONS` in use at once."""

    def __init__(self) -> None:
        self._slots = trio.Semaphore(MAX_CONNECTIONS)
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._tls: ssl.SSLContext | None = None
        self._closed = False

    async def request(
        self,
        base_url: str,
        method: str,
        target: str,
        *,
        headers: Sequence[tuple[str, str]],
        body: bytes | None,
        on_sent: Callable[[], None],
    ) -> Answer:
        """Send one request to the peer at ``base_url`` and read its whole answer.

        ``target`` is the path and query after ``base_url``'s own path; ``on_sent`` is called
        as the request begins to leave (the peer may act on it from then on). Unbounded in
        time: the caller cancels it.

        Raises:
            PeerError: no connection, a connection lost before the whole answer, or an answer
                that is not HTTP/1.1 or is larger than :data:`MAX_ANSWER_BYTES`.
        """
        parts = urlsplit(base_url)
        tls = parts.scheme == "https"
        host = parts.hostname or ""
        peer = (parts.scheme, host, parts.port or (443 if tls else 80))
        host_header = parts.netloc.rsplit("@", 1)[-1]
        head = [("host", host_header), *headers, ("content-length", str(len(body or b"")))]
        request = h11.Request(method=method, target=parts.path + target, headers=head)
        async with self._slots:
            for _ in range(3):  # a stale idle connection, then (the others dropped) a new one
                connection, reused = await self._take(peer)
                try:
                    answer, again = await _exchange(connection, request, body, on_sent)
                except _StaleError:
                    connection.close()
                    if not reused:
                        raise
                    # The peer closed it while idle: it restarted, or its keep-alive ran out,
                    # and so for every other connection idle as long. None of them is tried.
                    self._drop_idle(peer)
                    continue
                except BaseException:
                    connection.close()
                    raise
                self._give_back(peer, connection, again)
                return answer
        raise PeerError("RemoteProtocolError: every connection closed before answering")

    async def aclose(self) -> None:
        """Close every idle connection (those in use close with their requests)."""
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()
        await trio.lowlevel.checkpoint()

    def _drop_idle(self, peer: tuple[str, str, int]) -> None:
        for connection in self._idle.pop(peer, []):
            connection.close()

    async def _take(self, peer: tuple[str, str, int]) -> tuple[_Connection, bool]:
        now = trio.current_time()
        idle = self._idle.get(peer, [])
        while idle:
            connection = idle.pop()
            if now - connection.idle_since < IDLE_S:
                return connection, True
            connection.close()
        scheme, host, port = peer
        try:
            if scheme == "https":
                if self._tls is None:
                    self._tls = ssl.create_default_context()
                stream: trio.abc.Stream = await trio.open_ssl_over_tcp_stream(
                    host, port, ssl_context=self._tls
                )
            else:
                stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            raise PeerError(f"ConnectError: {exc}") from exc
        return _Connection(stream, h11.Connection(our_role=h11.CLIENT)), False

    def _give_back(self, peer: tuple[str, str, int], connection: _Connection, again: bool) -> None:
        idle = self._idle.setdefault(peer, [])
        if not again or self._closed or len(idle) >= MAX_IDLE:
            connection.close()
            return
        connection.h11.start_next_cycle()
        connection.idle_since = trio.current_time()
        idle.append(connection)


async def _exchange(
    connection: _Connection, request: h11.Request, body: bytes | None, on_sent: Callable[[], None]
) -> tuple[Answer, bool]:
    """One request and its whole answer on ``connection``; and whether it may carry another."""
    conn, stream = connection.h11, connection.stream
    out = conn.send(request) or b""
    if body:
        out += conn.send(h11.Data(data=body)) or b""
    out += conn.send(h11.EndOfMessage()) or b""
    on_sent()
    answered = False  # any byte of an answer came
    try:
        await stream.send_all(out)
        status, headers, chunks, size = 0, [], [], 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(_READ)
                if not data and not answered:
                    raise _StaleError("the peer closed the connection before answering")
                answered = answered or bool(data)
                conn.receive_data(bytes(data))
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in event.headers]
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > MAX_ANSWER_BYTES:
                    raise PeerError(f"the answer is larger than {MAX_ANSWER_BYTES} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
            elif isinstance(event, h11.ConnectionClosed):
                raise PeerError("RemoteProtocolError: the peer closed the connection mid-answer")
            # an InformationalResponse (100 Continue) is passed over
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
        if not answered:
            raise _StaleError(f"ReadError: {exc}") from exc
        raise PeerError(f"ReadError: {exc}") from exc
    except h11.ProtocolError as exc:
        raise PeerError(f"RemoteProtocolError: {exc}") from exc
    again = conn.our_state is h11.DONE and conn.their_state is h11.DONE
    return Answer(status, headers, b"".join(chunks)), again
