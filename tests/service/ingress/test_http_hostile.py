"""The HTTP API against hostile and careless clients: what each gets, and that none gets a 500.

All in virtual time through ASGI, but the connection tests at the end, which serve the API with
hypercorn's trio worker on loopback and hold a real socket half-sent, or refused before its body.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import h11
import httpx
import pytest
import structlog
import structlog.testing
import trio
import trio.testing
from hypercorn.trio import serve
from hypothesis import given, settings
from hypothesis import strategies as st

from purgatory._codec import Limits, RecordError, decode_request, decode_signal
from purgatory._codec._json import MAX_DEPTH, MAX_PAYLOAD_DEPTH, nesting
from purgatory._core import EngineConfig, Outcome
from purgatory.service.dispatch.dispatcher import Dispatcher
from purgatory.service.dispatch.reads import Reads
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.dispatch.waiters import Waiters
from purgatory.service.ingress.flow import Flow
from purgatory.service.ingress.http.app import HttpConfig, build_app
from purgatory.service.ingress.http.auth import Authenticator
from purgatory.service.ingress.http.queries import long_poll_wait_s
from purgatory.service.ingress.http.routes import ROUTES
from purgatory.service.ingress.http.server import server_config
from purgatory.service.journal.changelog import Gate, NoJournal
from purgatory.service.kafka.transport import Refusal
from purgatory.service.telemetry.metrics import Metrics
from reaper import Clock
from tests.service.ingress.test_http import Harness, running

JSON_ROUTES = [route for route in ROUTES if route.body is not None]
SPARK, CLI = "s" * 24, "c" * 24
Observed = list[tuple[str, str, int, str]]


@asynccontextmanager
async def api(
    *, tokens: dict[str, str] | None = None, max_pending_per_scope: int = 1_000
) -> AsyncIterator[tuple[Harness, httpx.AsyncClient, Observed]]:
    """The service over the in-memory broker, its API with ``tokens``, and what it observed:
    (route, method, status, client) per request."""
    observed: Observed = []
    async with running(max_pending_per_scope=max_pending_per_scope) as h:
        config = replace(
            h.service.http_config,
            authenticator=Authenticator(tokens or {}),
            metrics=_Observing(h.service.metrics, observed),
        )
        app = build_app(h.service, config)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(base_url="http://api", transport=transport) as http:
            yield h, http, observed


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


def error_of(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    error: dict[str, Any] = response.json()["error"]
    assert error["status"] == status and error["message"]
    return error


def op(op_id: str, **more: Any) -> dict[str, Any]:
    return {"scope": "s", "op_id": op_id, "keys": ["k"], "timeout_ms": 60_000, **more}


# -- bodies -------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [route.path for route in JSON_ROUTES])
async def test_json_nested_a_thousand_deep_is_a_400_on_every_json_route(
    autojump_clock: trio.testing.MockClock, path: str
) -> None:
    deep = b"[" * 1_000 + b"]" * 1_000
    inside = b'{"signals": [{"scope": "s", "key": "k", "payload": ' + deep + b"}]}"
    async with api() as (h, http, _):
        for body in (deep, inside, b"[" * 5_000):
            error = error_of(await http.post(path, content=body), 400)
            assert error["field"] == "(body)" and "nested too deeply" in error["message"]
        assert h.table.engine_statistics().pending == 0


async def test_payload_depth_is_bounded_the_same_over_http_and_kafka(
    autojump_clock: trio.testing.MockClock,
) -> None:
    deepest, deeper = nested(MAX_PAYLOAD_DEPTH), nested(MAX_PAYLOAD_DEPTH + 1)
    async with api() as (_, http, _):
        created = await http.post("/v1/operations", json=op("ok", payload=deepest))
        assert created.status_code == 201, created.text
        error = error_of(await http.post("/v1/operations", json=op("no", payload=deeper)), 422)
        assert error["field"] == "payload"
        batch = {"signals": [{"scope": "s", "key": "x", "payload": deepest}]}
        assert (await http.post("/v1/signals", json=batch)).status_code == 200  # 63 levels
        batch["signals"][0]["payload"] = deeper
        error = error_of(await http.post("/v1/signals", json=batch), 422)
        assert error["field"] == "signals[0].payload"
    record = {"v": 1, "type": "signal", "scope": "s", "key": "k", "payload": deeper}
    with pytest.raises(RecordError) as kafka:
        decode_signal(json.dumps(record).encode(), Limits())
    assert kafka.value.field == "payload"  # the same refusal from Kafka
    with pytest.raises(RecordError, match="nested too deeply"):
        decode_request(b'{"v":1,"payload":' + b"[" * (MAX_DEPTH + 1) + b"]" * 65 + b"}", Limits())


def depth_of(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max(map(depth_of, value), default=0)
    if isinstance(value, dict):
        return 1 + max(map(depth_of, value.values()), default=0)
    return 0


TRICKY = '[]{}"\\\u00e9a'  # brackets, quotes and backslashes inside strings too
json_values = st.recursive(
    st.none() | st.integers() | st.text(alphabet=TRICKY, max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(alphabet=TRICKY, max_size=3), inner, max_size=3)
    ),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None)
@given(value=json_values, ascii_only=st.booleans())
def test_the_depth_is_measured_on_the_text_as_the_parser_reads_it(
    value: Any, ascii_only: bool
) -> None:
    text = json.dumps(value, ensure_ascii=ascii_only)
    assert nesting(text) == nesting(text.encode()) == depth_of(value)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"scope":"s","scope":"t","op_id":"o","keys":["k"],"timeout_ms":5}', "repeats"),
        (json.dumps(op("o")).encode("utf-16"), "UTF-8"),
        (json.dumps(op("o")).encode("utf-16-le"), "JSON"),
        (json.dumps(op("o")).encode("utf-32"), "UTF-8"),
        (b"\xef\xbb\xbf" + json.dumps(op("o")).encode(), "JSON"),  # a byte order mark
        (b'{"scope": "s\xff"}', "UTF-8"),
        (b"", "JSON"),
        (b"{not json", "JSON"),
    ],
)
async def test_what_kafka_refuses_http_refuses_with_a_400(
    autojump_clock: trio.testing.MockClock, body: bytes, why: str
) -> None:
    async with api() as (h, http, _):
        error = error_of(await http.post("/v1/operations", content=body), 400)
        assert error["field"] == "(body)" and why in error["message"], error
        with pytest.raises(RecordError):
            decode_request(body, Limits())  # the same bytes from Kafka: refused too
        assert h.table.engine_statistics().pending == 0


async def test_a_repeated_name_inside_a_batch_item_is_a_400(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = b'{"signals":[{"scope":"s","key":"a","key":"b"}]}'
    async with api() as (_, http, _):
        error = error_of(await http.post("/v1/signals", content=body), 400)
        assert error["field"] == "(body)" and "repeats the name" in error["message"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/signals", {"signals": [], "junk": 1}, "junk"),
        ("/v1/watermarks", {"watermarks": [], "junk": 1}, "junk"),
        ("/v1/operations:batch", {"operations": [], "x" * 100: 1}, "x" * 61 + "..."),
        ("/v1/operations", op("o", junk=1), "junk"),
        (
            "/v1/signals",
            {"signals": [{"scope": "s", "key": "k", "colour": 1}]},
            "signals[0].colour",
        ),
        ("/v1/watermarks", {"watermarks": [{"scope": "s", "watermark_ms": 1, "x": 0}]}, None),
        ("/v1/operations:batch", {"operations": [op("a"), op("b", why=1)]}, "operations[1].why"),
    ],
)
async def test_unknown_fields_are_a_422_naming_them(
    autojump_clock: trio.testing.MockClock, path: str, body: Any, field: str | None
) -> None:
    async with api() as (h, http, _):
        error = error_of(await http.post(path, json=body), 422)
        assert error["field"] == (field or "watermarks[0].x")
        assert error["message"] == "unknown field"
        assert h.table.engine_statistics().pending == 0


# -- query parameters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    # superscript two, Arabic-Indic twelve, fullwidth twelve, NKo one: str.isdigit() says yes
    ["\u00b2", "\u0661\u0662", "\uff11\uff12", "\u07c1", "-1", "+1", "1e3", " 1", "", "9" * 5_000],
)
async def test_query_integers_are_ascii_digits_or_a_422_naming_them(
    autojump_clock: trio.testing.MockClock, value: str
) -> None:
    async with api() as (_, http, _):
        await http.post("/v1/operations", json=op("o"))
        for path, name in (("/v1/operation/wait", "timeout_ms"), ("/v1/operations", "limit")):
            answer = await http.get(path, params={"scope": "s", "op_id": "o", name: value})
            error = error_of(answer, 422)
            assert error["field"] == name


async def test_a_forwarded_long_poll_with_a_bad_timeout_is_not_a_500() -> None:
    # The wait added to a forward's timeout reads the same parameter, leniently.
    class _Request:
        def __init__(self, value: str) -> None:
            self.query_params = {"timeout_ms": value}

    assert long_poll_wait_s(_Request("²")) == 0.0  # type: ignore[arg-type]
    assert long_poll_wait_s(_Request("1500")) == 1.5  # type: ignore[arg-type]


# -- paths, methods, tokens, limits -------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/operations", "GET, POST"),
        ("PATCH", "/v1/operation", "DELETE, GET"),
        ("DELETE", "/healthz", "GET"),
        ("HEAD", "/readyz", "GET"),
        ("GET", "/v1/signals", "POST"),
        ("OPTIONS", "/v1/operations:batch", "POST"),
    ],
)
async def test_a_method_a_path_does_not_serve_is_a_405_with_allow(
    autojump_clock: trio.testing.MockClock, method: str, path: str, allow: str
) -> None:
    async with api(tokens={"spark": SPARK}) as (_, http, observed):
        answer = await http.request(method, path)
        assert answer.status_code == 405 and answer.headers["allow"] == allow
        if method != "HEAD":
            assert error_of(answer, 405)["field"] is None
        assert observed == [(path, method, 405, "anonymous")]


@pytest.mark.parametrize("path", ["/", "/nope", "/v1/operations/", "/v1/operation/s/o", "/v2"])
async def test_an_unknown_path_is_a_404_json_error(
    autojump_clock: trio.testing.MockClock, path: str
) -> None:
    async with api() as (_, http, observed):
        for method in ("GET", "POST"):
            error = error_of(await http.request(method, path), 404)
            assert error["field"] is None
        assert {route for route, *_ in observed} == {"(unknown)"}


async def test_tokens_name_the_client_and_a_missing_or_wrong_one_is_a_401(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with api(tokens={"spark": SPARK, "cli": CLI}) as (_, http, observed):
        for headers in ({}, {"Authorization": "Basic eDp5"}, {"Authorization": "Bearer"}):
            answer = await http.post("/v1/signals", json={"signals": []}, headers=headers)
            assert error_of(answer, 401)["field"] == "Authorization"
            assert answer.headers["www-authenticate"] == "Bearer"
        # A wrong token gets the same answer whatever its length.
        wrong = [
            await http.post(
                "/v1/signals", json={"signals": []}, headers={"Authorization": f"Bearer {t}"}
            )
            for t in ("x" * 24, "x", "x" * 4_000, SPARK + "x", SPARK[:-1])
        ]
        assert len({(a.status_code, a.content, a.headers["www-authenticate"]) for a in wrong}) == 1
        observed.clear()
        for token in (SPARK, CLI):
            answer = await http.post(
                "/v1/signals", json={"signals": []}, headers={"Authorization": f"bearer {token}"}
            )
            assert answer.status_code == 200
        assert (await http.get("/healthz")).status_code == 200  # probes stay open
        assert [client for *_, client in observed] == ["spark", "cli", "anonymous"]


async def test_the_log_names_the_client_and_warns_of_a_401(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with api(tokens={"spark": SPARK}) as (_, http, _):
        with structlog.testing.capture_logs() as logs:
            headers = {"Authorization": f"Bearer {SPARK}"}
            await http.post("/v1/signals", json={"signals": []}, headers=headers)
            await http.post("/v1/signals", json={"signals": []})
    events = [(e["event"], e.get("client"), e.get("status")) for e in logs]
    assert ("http_request", "spark", 200) in events
    [warning] = [e for e in logs if e["event"] == "http_unauthorized"]
    assert (warning["log_level"], warning["route"]) == ("warning", "/v1/signals")
    assert SPARK not in repr(logs)  # a token never reaches the log


async def test_a_limit_is_a_429_with_retry_after(autojump_clock: trio.testing.MockClock) -> None:
    async with api(max_pending_per_scope=1) as (_, http, _):
        assert (await http.post("/v1/operations", json=op("a"))).status_code == 201
        answer = await http.post("/v1/operations", json=op("b"))
        error_of(answer, 429)
        assert answer.headers["retry-after"] == "1"


async def test_a_body_that_never_ends_is_a_408(autojump_clock: trio.testing.MockClock) -> None:
    async def half_a_body() -> AsyncIterator[bytes]:
        yield b'{"signals": ['
        await trio.sleep_forever()

    async with api() as (h, http, _):
        start = trio.current_time()
        answer = await http.post("/v1/signals", content=half_a_body())
        assert error_of(answer, 408)["field"] == "(body)"
        assert trio.current_time() - start == pytest.approx(h.service.http_config.body_timeout_s)


# -- pages --------------------------------------------------------------------------------------


async def test_pages_cover_every_pending_operation_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ids = [f"op-{i:02d}" for i in range(25)]
    async with api() as (_, http, _):
        for start in range(0, len(ids), 10):
            batch = {"operations": [op(i) for i in reversed(ids[start : start + 10])]}
            assert (await http.post("/v1/operations:batch", json=batch)).status_code == 200
        await http.delete("/v1/operation", params={"scope": "s", "op_id": "op-07"})
        first = (await http.get("/v1/operations", params={"scope": "s"})).json()
        assert len(first["operations"]) == 10 and first["truncated"] is True  # max_batch
        seen: list[str] = []
        cursor: str | None = None
        while True:
            params = {"scope": "s", "limit": "4", **({"cursor": cursor} if cursor else {})}
            page = (await http.get("/v1/operations", params=params)).json()
            seen += [o["op_id"] for o in page["operations"]]
            assert page["truncated"] is (page["next_cursor"] is not None)
            cursor = page["next_cursor"]
            if cursor is None:
                break
            assert len(page["operations"]) == 4
        assert seen == [i for i in ids if i != "op-07"]
        empty = (await http.get("/v1/operations", params={"scope": "other"})).json()
        assert empty == {
            "scope": "other",
            "operations": [],
            "next_cursor": None,
            "truncated": False,
        }


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("cursor", "!!"),
        ("cursor", ""),
        ("cursor", "b3A="),  # "op", but not as the service writes it (padded, or other bits)
        ("cursor", "b3B"),
        ("cursor", "_w"),  # not UTF-8
        ("cursor", "b" * 1_000),
        ("cursor", "b3Atm"),  # a length base64 cannot have
        ("limit", "0"),
        ("limit", "11"),  # over max_batch
    ],
)
async def test_a_bad_cursor_or_limit_is_a_422_naming_it(
    autojump_clock: trio.testing.MockClock, name: str, value: str
) -> None:
    async with api() as (_, http, _):
        answer = await http.get("/v1/operations", params={"scope": "s", name: value})
        assert error_of(answer, 422)["field"] == name


async def test_a_cursor_from_a_finished_operation_still_pages_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with api() as (_, http, _):
        batch = {"operations": [op(i) for i in ("a", "b", "c", "d")]}
        await http.post("/v1/operations:batch", json=batch)
        page = (await http.get("/v1/operations", params={"scope": "s", "limit": "2"})).json()
        await http.delete("/v1/operation", params={"scope": "s", "op_id": "b"})  # its last
        params = {"scope": "s", "limit": "2", "cursor": page["next_cursor"]}
        rest = (await http.get("/v1/operations", params=params)).json()
        assert [o["op_id"] for o in rest["operations"]] == ["c", "d"]
        assert rest["next_cursor"] is None


# -- slow, stalled and refused clients, on a real socket -----------------------------------------


class _Observing:
    """The service's metrics, each answered request also noted as (route, method, status,
    client)."""

    def __init__(self, metrics: Metrics, observed: Observed) -> None:
        self._metrics = metrics
        self._observed = observed

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        return self._metrics.render(accept)

    def http_request(
        self, route: str, method: str, status: int, seconds: float, client: str = "anonymous"
    ) -> None:
        self._observed.append((route, method, status, client))

    def registration(self, result: str) -> None:
        self._metrics.registration(result)


class _Ready:
    def is_ready(self) -> bool:
        return True

    def readiness(self) -> dict[str, object]:
        return {"ready": True}


class _NoRelease:
    """The release of an app that serves no partition: nothing is ever decided."""

    def decided(self, outcomes: Sequence[Outcome]) -> None:
        raise AssertionError("no partition is served: nothing can be decided")

    def refused(self, refusal: Refusal) -> None:
        raise AssertionError("no record is consumed")

    def consumed(self, partition: int, offsets: Mapping[tuple[str, int], int]) -> None:
        raise AssertionError("no record is consumed")

    def resent(self, outcomes: Sequence[Outcome]) -> None:
        raise AssertionError("no partition is restored")

    async def wait_for_room(self) -> None:
        raise AssertionError("nothing is ever queued")


@dataclass
class _Served:
    flow: Flow
    reads: Reads
    gate: Gate


@asynccontextmanager
async def served(
    *,
    body_timeout_s: float = 30.0,
    read_grace_s: float = 10.0,
    keep_alive_timeout_s: float = 5.0,
    tokens: dict[str, str] | None = None,
) -> AsyncIterator[tuple[str, int]]:
    """The API (an empty state, ``tokens`` if any) served by hypercorn's trio worker on a
    loopback port."""
    table = PartitionTable(EngineConfig(), partitions=1)  # serves no partition
    waiters = Waiters()
    dispatcher = Dispatcher(table, waiters, now_ms=lambda: 0, max_deadline_ahead_ms=60_000)
    nothing_served = _Served(
        Flow(dispatcher, _NoRelease(), Clock(), egress=_NoRelease()),
        Reads(table, waiters),
        NoJournal(),
    )
    config = HttpConfig(
        limits=Limits(),
        max_request_bytes=10_000,
        max_batch=10,
        max_wait_ms=0,
        status=_Ready(),
        metrics=Metrics(),
        openapi={},
        authenticator=Authenticator(tokens or {}),
        body_timeout_s=body_timeout_s,
    )
    hypercorn = server_config(
        "127.0.0.1:0",
        max_wait_ms=0,
        graceful_timeout_s=0.1,
        read_grace_s=read_grace_s,
        keep_alive_timeout_s=keep_alive_timeout_s,
    )
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        bound = await nursery.start(
            partial(serve, build_app(nothing_served, config), hypercorn, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
        )
        host, port = bound[0].removeprefix("http://").rsplit(":", 1)
        yield host, int(port)
        stop.set()


async def _until_closed(stream: trio.SocketStream, within_s: float) -> bytes:
    """What the server sends until it closes the connection (at most ``within_s`` seconds)."""
    received = b""
    with trio.fail_after(within_s):
        while chunk := await stream.receive_some(65_536):
            received += chunk
    return received


async def test_a_stalled_upload_is_answered_408_and_dropped_in_time() -> None:
    async with served(body_timeout_s=0.5) as (host, port):
        stream = await trio.open_tcp_stream(host, port)
        start = trio.current_time()
        head = f"POST /v1/signals HTTP/1.1\r\nHost: {host}\r\nContent-Length: 100\r\n\r\n"
        await stream.send_all(head.encode() + b'{"signals": [')  # and nothing more
        received = await _until_closed(stream, within_s=3)
        elapsed = trio.current_time() - start
        assert received.startswith(b"HTTP/1.1 408"), received
        assert 0.4 <= elapsed < 2.5
        await stream.aclose()


async def test_stalled_headers_are_dropped_after_the_keep_alive_timeout() -> None:
    # Hypercorn's idle timer runs until a request's head is whole.
    async with served(keep_alive_timeout_s=0.5) as (host, port):
        stream = await trio.open_tcp_stream(host, port)
        start = trio.current_time()
        await stream.send_all(b"POST /v1/signals HTTP/1.1\r\nHost: x\r\nContent-Le")
        assert await _until_closed(stream, within_s=3) == b""
        assert 0.4 <= trio.current_time() - start < 2.5
        await stream.aclose()


async def test_a_silent_connection_is_dropped_after_the_read_timeout() -> None:
    # The body's own deadline is far; the read timeout (here max_wait_ms 0 + 0.5 s) is not.
    async with served(read_grace_s=0.5) as (host, port):
        stream = await trio.open_tcp_stream(host, port)
        start = trio.current_time()
        head = b"POST /v1/signals HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
        await stream.send_all(head + b"{")
        await _until_closed(stream, within_s=3)
        assert 0.4 <= trio.current_time() - start < 2.5
        await stream.aclose()


async def test_stalled_uploads_do_not_hold_up_the_probes() -> None:
    async with served(body_timeout_s=2.0) as (host, port):
        stalled = []
        for _ in range(100):
            stream = await trio.open_tcp_stream(host, port)
            await stream.send_all(
                b"POST /v1/signals HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
            )
            stalled.append(stream)
        with trio.fail_after(2):
            async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
                assert (await http.get("/healthz")).json() == {"status": "ok"}
        for stream in stalled:
            await stream.aclose()


async def _answer(stream: trio.SocketStream, client: h11.Connection) -> tuple[h11.Response, bytes]:
    """The next whole answer on ``stream``, read through ``client`` (within 5 s)."""
    response: h11.Response | None = None
    body = b""
    with trio.fail_after(5):
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some(65_536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response, body
            else:
                raise AssertionError(f"not an answer: {event!r}")


def _says_close(response: h11.Response) -> bool:
    return any(n == b"connection" and b"close" in v.lower() for n, v in response.headers)


EARLY = [  # (status, with the token, declared body): answered before the body is read
    pytest.param(401, False, 5_000, id="401"),
    pytest.param(413, True, 15_000, id="413"),  # over max_request_bytes (10,000)
]


@pytest.mark.parametrize(("status", "with_token", "length"), EARLY)
async def test_an_early_answer_keeps_the_connection_for_the_next_request(
    status: int, with_token: bool, length: int
) -> None:
    # The answer comes before the body is sent; then the body, late as over a real network, then
    # two more requests on the same connection: the server read and discarded the body.
    headers = [("Host", "x"), ("Content-Length", str(length))]
    if with_token:
        headers.append(("Authorization", f"Bearer {SPARK}"))
    async with served(tokens={"spark": SPARK}) as (host, port):
        stream = await trio.open_tcp_stream(host, port)
        client = h11.Connection(h11.CLIENT)
        await stream.send_all(
            client.send(h11.Request(method="POST", target="/v1/signals", headers=headers))
        )
        response, body = await _answer(stream, client)
        assert response.status_code == status, body
        assert json.loads(body)["error"]["status"] == status
        assert not _says_close(response)
        await trio.sleep(0.2)  # the server has long finished its answer
        await stream.send_all(client.send(h11.Data(data=b" " * length)))
        await stream.send_all(client.send(h11.EndOfMessage()))
        client.start_next_cycle()
        for path in ("/healthz", "/readyz"):
            await stream.send_all(
                client.send(h11.Request(method="GET", target=path, headers=[("Host", "x")]))
            )
            await stream.send_all(client.send(h11.EndOfMessage()))
            response, body = await _answer(stream, client)
            assert response.status_code == 200, body
            client.start_next_cycle()
        await stream.aclose()


@pytest.mark.parametrize(("status", "with_token", "length"), EARLY)
async def test_an_early_answer_to_a_body_too_big_to_read_closes_the_connection(
    status: int, with_token: bool, length: int
) -> None:
    # Far more than the server would read: it says Connection: close and closes; a new
    # connection is served.
    headers = [("Host", "x"), ("Content-Length", str(length * 1_000))]
    if with_token:
        headers.append(("Authorization", f"Bearer {SPARK}"))
    async with served(tokens={"spark": SPARK}) as (host, port):
        stream = await trio.open_tcp_stream(host, port)
        client = h11.Connection(h11.CLIENT)
        await stream.send_all(
            client.send(h11.Request(method="POST", target="/v1/signals", headers=headers))
        )
        await stream.send_all(client.send(h11.Data(data=b" " * 1_000)))
        response, _ = await _answer(stream, client)
        assert response.status_code == status
        assert _says_close(response)
        assert await _until_closed(stream, within_s=3) == b""
        await stream.aclose()
        async with httpx.AsyncClient(base_url=f"http://{host}:{port}") as http:
            assert (await http.get("/healthz")).status_code == 200
