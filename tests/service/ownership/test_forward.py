"""Forwarding to the partition's owner (ordinal mode), over the in-memory broker, in virtual
time: what is forwarded, what is applied here, and what is never forwarded twice; and an owner
that does not answer (a real loopback socket that accepts and stays silent, or never accepts) is
a 503 with Retry-After within the journal wait, saying whether the write may have been applied."""

from __future__ import annotations

import dataclasses
import json
import socket
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from purgatory._codec import APPLIED_HEADER
from purgatory._core import ConfigError, UsageError
from purgatory._core.flink.key_groups import key_group_range_for_operator
from purgatory.service.app import Service, topics_of
from purgatory.service.ingress.http.app import build_app
from purgatory.service.ownership.forward import FORWARDED_BY, Forwarded, Forwarder
from purgatory.service.ownership.owners import StaticOwners
from purgatory.service.ownership.partitioning import partition_for
from purgatory.service.ownership.peer_http import Peers
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport

EPOCH_MS = 1_763_780_400_000
PEERS = ("http://replica-0:8080", "http://replica-1:8080")
LOCAL = next(f"s{i}" for i in range(100) if partition_for(f"s{i}", 2) == 0)
REMOTE = next(f"s{i}" for i in range(100) if partition_for(f"s{i}", 2) == 1)


def test_each_partition_has_one_owner_by_flinks_range_formula() -> None:
    for partitions, replicas in ((8, 3), (2, 2), (12, 5), (7, 7)):
        urls = [f"http://r{i}" for i in range(replicas)]
        owned = [StaticOwners(urls, i, partitions).own() for i in range(replicas)]
        assert sorted(p for part in owned for p in part) == list(range(partitions))
        for ordinal, part in enumerate(owned):
            assert list(part) == list(key_group_range_for_operator(partitions, replicas, ordinal))
    owners = StaticOwners(PEERS, 0, 2)
    assert owners.url_of(0) is None and owners.url_of(1) == "http://replica-1:8080"
    with pytest.raises(UsageError, match="need at least as many partitions"):
        StaticOwners(PEERS, 0, 1)
    with pytest.raises(UsageError, match="ordinal 2"):
        StaticOwners(PEERS, 2, 4)


def test_the_peer_settings_go_together_and_the_ordinal_indexes_the_peers() -> None:
    with pytest.raises(ConfigError, match="PURGATORY_REPLICA_ORDINAL: set it together"):
        Settings.from_env({"PURGATORY_PEER_URLS": "http://a:1,http://b:1"})
    with pytest.raises(ConfigError, match=r"must index PURGATORY_PEER_URLS \(2 URLs\), got 2"):
        Settings.from_env(
            {"PURGATORY_PEER_URLS": "http://a:1,http://b:1", "PURGATORY_REPLICA_ORDINAL": "2"}
        )
    with pytest.raises(ConfigError, match="PURGATORY_PEER_URLS: must be a comma-separated list"):
        Settings.from_env({"PURGATORY_PEER_URLS": "ftp://a", "PURGATORY_REPLICA_ORDINAL": "0"})
    ok = Settings.from_env(
        {"PURGATORY_PEER_URLS": " http://a:1 ,http://b:1", "PURGATORY_REPLICA_ORDINAL": "1"}
    )
    assert ok.peer_urls == ("http://a:1", "http://b:1") and ok.replica_ordinal == 1


@dataclass
class _Owner(Forwarder):
    """The other replica, as seen through the forwarder: records what it is sent."""

    status: int = 200
    sent: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        pass  # no connection pool

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
        payload: Any = json.loads(body) if body else None
        self.sent.append(
            {"url": base_url, "method": method, "path": path, "query": query, "body": payload}
        )
        if self.status != 200:
            error = {"error": {"status": self.status, "field": None, "message": "owner says no"}}
            return Forwarded(self.status, json.dumps(error).encode(), {"retry-after": "1"})
        if path == "/v1/signals":
            answer: Any = {"accepted": len(payload["signals"]), "completed": 7}
        elif path == "/v1/operations:batch":
            answer = {
                "results": [
                    {"http_status": 201, "op_id": o["op_id"]} for o in payload["operations"]
                ]
            }
        else:
            answer = {"from": "owner"}
        return Forwarded(200, json.dumps(answer).encode(), {"content-type": "application/json"})

    async def aclose(self) -> None:
        pass


@asynccontextmanager
async def replica_0(
    owner: Forwarder, peers: tuple[str, ...] = PEERS
) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    settings = Settings.from_env(
        {},
        peer_urls=peers,
        replica_ordinal=0,
        kafka_static_partitions=(0,),
        max_deadline_ahead_ms=86_400_000,
    )
    broker = FakeBroker({t: 2 for t in topics_of(settings)})
    fake = FakeTransport(broker)
    topics = [settings.topic_requests, settings.topic_signals]
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(
            topics=topics, group_id="g", assignment=[(t, 0) for t in topics]
        ) as source,
    ):
        service = Service(settings, Clock(offset_ms=EPOCH_MS), source, sink, reader)
        assert service.forwarder is not None
        await service.forwarder.aclose()
        service.forwarder = owner
        service.app = build_app(service, dataclasses.replace(service.http_config, forwarder=owner))
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: service.run(trio.Event(), serve_http=False))
            while not service.table.serving():
                await trio.sleep(0.01)
            transport = httpx.ASGITransport(app=service.app)
            async with httpx.AsyncClient(base_url="http://replica-0", transport=transport) as http:
                yield http, service
            nursery.cancel_scope.cancel()


def _op(scope: str, op_id: str) -> dict[str, Any]:
    return {"scope": scope, "op_id": op_id, "keys": ["k"], "timeout_ms": 60_000}


async def test_a_request_for_another_replicas_scope_is_forwarded_as_it_came(
    autojump_clock: trio.testing.MockClock,
) -> None:
    owner = _Owner()
    async with replica_0(owner) as (http, _service):
        answer = await http.get(
            "/v1/operation/wait", params={"scope": REMOTE, "op_id": "o", "timeout_ms": "5000"}
        )
        assert (answer.status_code, answer.json()) == (200, {"from": "owner"})
        [sent] = owner.sent
        assert sent["url"] == "http://replica-1:8080" and sent["path"] == "/v1/operation/wait"
        assert "timeout_ms=5000" in sent["query"] and f"scope={REMOTE}" in sent["query"]
        created = await http.post("/v1/operations", json=_op(REMOTE, "r"))
        assert created.status_code == 200 and owner.sent[-1]["body"] == _op(REMOTE, "r")
        # The local scope is answered here: nothing more is forwarded.
        mine = await http.post("/v1/operations", json=_op(LOCAL, "l"))
        assert mine.status_code == 201 and len(owner.sent) == 2


async def test_a_forwarded_request_is_never_forwarded_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    owner = _Owner()
    async with replica_0(owner) as (http, _service):
        answer = await http.get(
            "/v1/operation", params={"scope": REMOTE, "op_id": "o"}, headers={FORWARDED_BY: "1"}
        )
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        assert owner.sent == []


async def test_a_batch_is_split_by_owner_and_the_local_part_applied_here(
    autojump_clock: trio.testing.MockClock,
) -> None:
    owner = _Owner()
    async with replica_0(owner) as (http, service):
        ops = [_op(LOCAL, "a"), _op(REMOTE, "b"), _op(LOCAL, "c"), _op(REMOTE, "d")]
        results = (await http.post("/v1/operations:batch", json={"operations": ops})).json()
        assert [r["op_id"] for r in results["results"]] == ["a", "b", "c", "d"]  # in order
        assert owner.sent[0]["body"] == {"operations": [ops[1], ops[3]]}
        assert service.reads.lookup(LOCAL, "a") is not None
        signals = [{"scope": s, "key": "k"} for s in (LOCAL, REMOTE, REMOTE)]
        answer = (await http.post("/v1/signals", json={"signals": signals})).json()
        assert owner.sent[1]["body"] == {"signals": signals[1:]}
        assert answer == {"accepted": 3, "completed": 2 + 7}  # a and c here, 7 there


async def test_a_batch_whose_owner_refuses_its_part_applies_nothing_here(
    autojump_clock: trio.testing.MockClock,
) -> None:
    owner = _Owner(status=503)
    async with replica_0(owner) as (http, service):
        await http.post("/v1/operations", json=_op(LOCAL, "a"))
        signals = [{"scope": LOCAL, "key": "k"}, {"scope": REMOTE, "key": "k"}]
        answer = await http.post("/v1/signals", json={"signals": signals})
        assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
        found = service.reads.lookup(LOCAL, "a")
        assert found is not None and found[1] is None  # the local signal was not applied


# -- an owner that does not answer ------------------------------------------------------------

WAIT_MS = 5_000  # PURGATORY_JOURNAL_WAIT_MS's default


@contextmanager
def _silent_owner(*, accepts: bool) -> Iterator[str]:
    """A loopback port where the owner should be, that never answers: the kernel accepts its
    connections (nobody reads them), or, its one-connection backlog taken, drops their SYNs as
    a cut link drops packets (no RST: the client's connect just waits)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16 if accepts else 0)
        host, port = listener.getsockname()
        with socket.socket() as filler:
            if not accepts:
                filler.connect((host, port))  # takes the backlog's only place
            yield f"http://{host}:{port}"


@asynccontextmanager
async def _forwarding_to(owner_url: str) -> AsyncIterator[tuple[httpx.AsyncClient, Service]]:
    forwarder = Forwarder(Peers(), me="0", wait_ms=WAIT_MS)
    try:
        async with replica_0(forwarder, (PEERS[0], owner_url)) as (http, service):
            yield http, service
    finally:
        await forwarder.aclose()


async def _timed(request: Any) -> tuple[httpx.Response, float]:
    start = trio.current_time()
    answer = await request
    return answer, trio.current_time() - start


def _says_unanswered(answer: httpx.Response, *, maybe_applied: bool) -> None:
    assert answer.status_code == 503 and answer.headers["retry-after"] == "1"
    assert (APPLIED_HEADER in answer.headers) is maybe_applied
    if maybe_applied:
        assert answer.headers[APPLIED_HEADER] == "maybe"
    error = answer.json()["error"]
    assert error["status"] == 503 and error["field"] == "scope"
    assert "did not answer in time" in error["message"]
    assert ("may have been applied" in error["message"]) is maybe_applied


async def test_an_owner_that_accepts_and_never_answers_is_a_503_within_the_journal_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with _silent_owner(accepts=True) as owner_url:
        async with _forwarding_to(owner_url) as (http, service):
            created, took_s = await _timed(http.post("/v1/operations", json=_op(REMOTE, "r")))
            assert took_s == WAIT_MS / 1000
            _says_unanswered(created, maybe_applied=True)  # it reached the owner: who knows
            assert "no answer within 5000 ms" in created.json()["error"]["message"]

            read, took_s = await _timed(http.get("/v1/operation", params=_where(REMOTE)))
            assert took_s == WAIT_MS / 1000
            _says_unanswered(read, maybe_applied=False)  # a read changes nothing

            polled, took_s = await _timed(
                http.get("/v1/operation/wait", params={**_where(REMOTE), "timeout_ms": "2000"})
            )
            assert took_s == pytest.approx(
                WAIT_MS / 1000 + 2
            )  # a long poll's own wait comes on top
            _says_unanswered(polled, maybe_applied=False)

            await http.post("/v1/operations", json=_op(LOCAL, "a"))
            signals = [{"scope": LOCAL, "key": "k"}, {"scope": REMOTE, "key": "k"}]
            batch, took_s = await _timed(http.post("/v1/signals", json={"signals": signals}))
            assert took_s == WAIT_MS / 1000
            _says_unanswered(batch, maybe_applied=True)
            found = service.reads.lookup(LOCAL, "a")
            assert found is not None and found[1] is None  # nor is the local part applied


async def test_an_owner_that_never_accepts_is_a_503_within_the_journal_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with _silent_owner(accepts=False) as owner_url:
        async with _forwarding_to(owner_url) as (http, _service):
            created, took_s = await _timed(http.post("/v1/operations", json=_op(REMOTE, "r")))
            assert took_s == WAIT_MS / 1000
            _says_unanswered(created, maybe_applied=False)  # it never left: nothing applied


async def test_an_owner_that_refuses_the_connection_is_a_503_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with socket.socket() as closed:  # a port nobody listens on: the kernel answers RST
        closed.bind(("127.0.0.1", 0))
        host, port = closed.getsockname()
        async with _forwarding_to(f"http://{host}:{port}") as (http, _service):
            created, took_s = await _timed(http.post("/v1/operations", json=_op(REMOTE, "r")))
            assert took_s < 0.1
            _says_unanswered(created, maybe_applied=False)
            assert "ConnectError" in created.json()["error"]["message"]


async def test_a_registration_batch_whose_owner_is_unreachable_answers_its_items_503(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Each forwarded item is answered as the one mapping answers an owner that did not
    # answer; the local part is applied here all the same.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        host, port = closed.getsockname()
        async with _forwarding_to(f"http://{host}:{port}") as (http, service):
            ops = [_op(LOCAL, "a"), _op(REMOTE, "b")]
            answer = await http.post("/v1/operations:batch", json={"operations": ops})
            assert answer.status_code == 200
            mine, theirs = answer.json()["results"]
            assert mine["http_status"] == 201 and service.reads.lookup(LOCAL, "a") is not None
            assert theirs["http_status"] == 503 and theirs["op_id"] == "b"
            assert "did not answer in time" in theirs["error"]


async def test_the_forwarders_bound_is_positive() -> None:
    with pytest.raises(UsageError, match="wait_ms must be > 0"):
        Forwarder(Peers(), me="0", wait_ms=0)


def _where(scope: str) -> dict[str, str]:
    return {"scope": scope, "op_id": "r"}
