"""The connections to other replicas survive cancellation at every stage of a request.

Against a real loopback server (h11 over trio), driven by events, not by time: requests are
cancelled while waiting for a place, while their answer has not begun, and halfway through its
body; afterwards every place is free again, no broken connection is reused, and the next
request goes through. Then keep-alive: a connection is reused, one the peer closed while idle
is replaced without failing the request, one closed before answering a first use fails it, and
one idle too long is not reused.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import h11
import pytest
import trio
import trio.testing

from purgatory.service.ownership import peer_http
from purgatory.service.ownership.peer_http import IDLE_S, MAX_CONNECTIONS, PeerError, Peers


@dataclass
class _Server:
    """A peer whose answer depends on the path; it counts connections and requests."""

    url: str = ""
    connections: int = 0
    requests: list[str] = field(default_factory=list)
    release: trio.Event = field(default_factory=trio.Event)
    waiting: int = 0  # requests held until ``release``
    streams: list[trio.SocketStream] = field(default_factory=list)  # every connection taken
    closed: int = 0  # connections ended

    async def handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.streams.append(stream)
        conn = h11.Connection(our_role=h11.SERVER)
        try:
            while True:
                path = await self._read_request(conn, stream)
                if path is None:
                    return
                self.requests.append(path)
                if not await self._answer(conn, stream, path):
                    return
                conn.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            pass
        finally:
            self.closed += 1
            await trio.aclose_forcefully(stream)

    async def _read_request(self, conn: h11.Connection, stream: trio.SocketStream) -> str | None:
        path = None
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65_536))
            elif isinstance(event, h11.Request):
                path = event.target.decode()
            elif isinstance(event, h11.EndOfMessage):
                return path
            elif isinstance(event, h11.ConnectionClosed):
                return None

    async def _answer(self, conn: h11.Connection, stream: trio.SocketStream, path: str) -> bool:
        """Answer ``path``; whether the connection may carry another request."""
        body = b'{"ok":true}'
        if path == "/drop":
            return False  # closes without a word
        if path == "/hold":
            self.waiting += 1
            await self.release.wait()
        headers = [("content-length", str(len(body))), ("x-path", path)]
        if path == "/chunked":
            await stream.send_all(conn.send(h11.Response(status_code=200, headers=[])) or b"")
            for piece in (b"ab", b"cd", b"ef"):
                await stream.send_all(conn.send(h11.Data(data=piece)) or b"")
            await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
            return True
        await stream.send_all(conn.send(h11.Response(status_code=200, headers=headers)) or b"")
        if path == "/partial":
            await stream.send_all(conn.send(h11.Data(data=body[:4])) or b"")
            self.waiting += 1
            await trio.sleep_forever()
        await stream.send_all(conn.send(h11.Data(data=body)) or b"")
        await stream.send_all(conn.send(h11.EndOfMessage()) or b"")
        return path != "/close-after"  # closes while the client thinks it idle


@asynccontextmanager
async def _peer() -> AsyncIterator[_Server]:
    server = _Server()
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    host, port = listeners[0].socket.getsockname()
    server.url = f"http://{host}:{port}"
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, server.handle, listeners)
        yield server
        nursery.cancel_scope.cancel()


async def _get(peers: Peers, server: _Server, path: str, sent: list[str] | None = None) -> bytes:
    def on_sent() -> None:
        if sent is not None:
            sent.append(path)

    answer = await peers.request(server.url, "GET", path, headers=[], body=None, on_sent=on_sent)
    assert answer.status == 200
    return answer.body


async def _until(condition: object, *, checks: int = 10_000) -> None:
    """Let the other tasks run until ``condition()`` holds (bounded in count)."""
    for _ in range(checks):
        if condition():  # type: ignore[operator]
            return
        await trio.sleep(0)
        await trio.testing.wait_all_tasks_blocked()
    raise AssertionError("the condition never held")


async def test_requests_cancelled_at_every_stage_give_back_every_place() -> None:
    async with _peer() as server:
        peers = Peers()
        async with trio.open_nursery() as nursery:
            # Every place taken by a request whose answer is held, one more waiting for a place.
            for _ in range(MAX_CONNECTIONS):
                nursery.start_soon(_get, peers, server, "/hold")
            await _until(lambda: server.waiting == MAX_CONNECTIONS)
            assert peers._slots.value == 0
            nursery.start_soon(_get, peers, server, "/ok")
            await trio.testing.wait_all_tasks_blocked()
            assert "/ok" not in server.requests
            nursery.cancel_scope.cancel()  # held ones mid-answer, the last one before a place
        assert peers._slots.value == MAX_CONNECTIONS
        assert not any(peers._idle.values())  # none of them is kept: each was cut short
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(_get, peers, server, "/partial")
            await _until(lambda: server.waiting == MAX_CONNECTIONS + 4)
            nursery.cancel_scope.cancel()  # halfway through each body
        assert peers._slots.value == MAX_CONNECTIONS
        assert not any(peers._idle.values())
        assert await _get(peers, server, "/ok") == b'{"ok":true}'
        assert server.requests.count("/ok") == 1  # the one that waited for a place never left
        await peers.aclose()


async def test_a_connection_is_reused_and_one_the_peer_closed_is_replaced() -> None:
    async with _peer() as server:
        peers = Peers()
        assert await _get(peers, server, "/ok") == b'{"ok":true}'
        assert await _get(peers, server, "/chunked") == b"abcdef"
        assert server.connections == 1  # kept alive
        sent: list[str] = []
        assert await _get(peers, server, "/close-after", sent) == b'{"ok":true}'
        await _until(lambda: server.connections == 1 and len(server.requests) == 3)
        # The peer closed it once it answered; the next request meets the close first, and
        # goes again on a new connection (the peer never read it).
        assert await _get(peers, server, "/ok", sent) == b'{"ok":true}'
        assert server.connections == 2
        assert server.requests == ["/ok", "/chunked", "/close-after", "/ok"]
        assert sent == ["/close-after", "/ok", "/ok"]  # told each time it began to leave
        await peers.aclose()


async def test_a_peer_that_restarted_leaves_no_stale_connection_to_fail_a_request() -> None:
    async with _peer() as server:
        peers = Peers()
        async with trio.open_nursery() as nursery:  # three connections, each kept idle
            for _ in range(3):
                nursery.start_soon(_get, peers, server, "/hold")
            await _until(lambda: server.waiting == 3)
            server.release.set()
        assert (
            server.connections == 3 and len(peers._idle[("http", "127.0.0.1", _port(server))]) == 3
        )
        for handler_stream in list(server.streams):  # the peer restarts: every one is closed
            await handler_stream.aclose()
        await _until(lambda: server.closed == 3)
        assert await _get(peers, server, "/ok") == b'{"ok":true}'
        assert server.connections == 4  # one new connection; no stale one tried twice
        await peers.aclose()


def _port(server: _Server) -> int:
    return int(server.url.rsplit(":", 1)[1])


async def test_a_new_connection_closed_before_its_answer_fails_the_request() -> None:
    async with _peer() as server:
        peers = Peers()
        with pytest.raises(PeerError, match="closed the connection before answering"):
            await _get(peers, server, "/drop")
        assert server.requests == ["/drop"]  # not sent twice: the peer read it
        assert peers._slots.value == MAX_CONNECTIONS
        await peers.aclose()


async def test_a_connection_idle_too_long_is_not_reused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with _peer() as server:
        peers = Peers()
        await _get(peers, server, "/ok")
        await trio.sleep(IDLE_S / 2)
        await _get(peers, server, "/ok")
        assert server.connections == 1
        await trio.sleep(IDLE_S)
        await _get(peers, server, "/ok")
        assert server.connections == 2
        await peers.aclose()


async def test_an_answer_too_large_fails_and_its_connection_is_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peer_http, "MAX_ANSWER_BYTES", 6)
    async with _peer() as server:
        peers = Peers()
        with pytest.raises(PeerError, match="larger than 6 bytes"):
            await _get(peers, server, "/ok")
        assert not any(peers._idle.values())
        assert await _get(peers, server, "/chunked") == b"abcdef"  # 6 bytes: within
        assert server.connections == 2
        await peers.aclose()


async def test_a_refused_connection_says_so_and_frees_its_place() -> None:
    with socket.socket() as closed:  # a port nobody listens on: the kernel answers RST
        closed.bind(("127.0.0.1", 0))
        host, port = closed.getsockname()
        peers = Peers()
        with pytest.raises(PeerError, match="ConnectError"):
            await peers.request(
                f"http://{host}:{port}", "GET", "/", headers=[], body=None, on_sent=lambda: None
            )
        assert peers._slots.value == MAX_CONNECTIONS


async def test_the_request_carries_its_body_headers_and_the_base_urls_path() -> None:
    seen: list[h11.Request | bytes] = []

    async def handler(stream: trio.SocketStream) -> None:
        conn = h11.Connection(our_role=h11.SERVER)
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await stream.receive_some(65_536))
            elif isinstance(event, h11.Request | h11.Data):
                seen.append(event if isinstance(event, h11.Request) else bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                break
        answer = h11.Response(
            status_code=201, headers=[("Retry-After", "1"), ("Content-Length", "0")]
        )
        await stream.send_all((conn.send(answer) or b"") + (conn.send(h11.EndOfMessage()) or b""))
        await trio.aclose_forcefully(stream)

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    host, port = listeners[0].socket.getsockname()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.serve_listeners, handler, listeners)
        peers = Peers()
        answer = await peers.request(
            f"http://{host}:{port}/base",
            "POST",
            "/v1/operations?x=1",
            headers=[("content-type", "application/json")],
            body=b'{"a":1}',
            on_sent=lambda: None,
        )
        assert (answer.status, answer.body) == (201, b"")
        assert ("retry-after", "1") in answer.headers
        request, body = seen
        assert isinstance(request, h11.Request)
        assert (request.method, request.target) == (b"POST", b"/base/v1/operations?x=1")
        assert (b"content-type", b"application/json") in request.headers
        assert (b"host", f"{host}:{port}".encode()) in request.headers
        assert body == b'{"a":1}'
        await peers.aclose()
        nursery.cancel_scope.cancel()
