"""The operators' overview (``GET /v1/overview``), its rings, the page's route and what a page of
pending operations says each still waits for, over the in-memory broker in virtual time."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from purgatory._core import UsageError
from purgatory.service.egress.outbox import Outbox
from purgatory.service.ingress.intake import Intake
from purgatory.service.kafka.transport import ConsumedRecord, OutRecord, Refusal, SendFailure
from purgatory.service.ops.overview import Overview, ui_page
from purgatory.service.ops.recent import MAX_TEXT, Recent, Ring
from reaper import Clock, CompletionExecutor
from tests.service.ingress.test_http import EPOCH_MS, Harness, running

TOKEN = "overview-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REQUESTS = "purgatory.requests"


async def _overview(h: Harness) -> dict[str, Any]:
    answer = await h.http.get("/v1/overview", headers=AUTH)
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


async def test_the_overview_needs_the_token_and_the_page_does_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(token=TOKEN) as h:
        refused = await h.http.get("/v1/overview")
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        served = await h.http.get("/ui")
        assert served.status_code == 200
        assert served.headers["content-type"] == "text/html; charset=utf-8"
        policy = served.headers["content-security-policy"]
        assert "script-src 'sha256-" in policy
        assert "connect-src 'self'" in policy
        assert "unsafe-inline" not in policy
        assert served.content == ui_page().body
        assert b"sessionStorage" in served.content


async def test_the_overview_shows_partitions_scopes_deadlines_outcomes_and_dead_letters(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(token=TOKEN) as h:
        start = h.clock.now_ms()
        for i in range(3):
            await h.client.register(
                scope="big", op_id=f"b{i}", keys=["x"], deadline_ms=start + 90_000 - i
            )
        await h.client.register(scope="small", op_id="soon", keys=["y"], timeout_ms=20_000)
        await h.client.register(scope="small", op_id="done", keys=["z"], timeout_ms=60_000)
        await h.client.signal("small", "z")
        h.broker.append(REQUESTS, b"small", b"{not json")
        async with trio.open_nursery() as nursery:  # the harness reads no Kafka input itself
            service = h.service
            nursery.start_soon(
                Intake(
                    service.source,
                    service.flow,
                    service.release,
                    service.gate,
                    requests_topic=service.settings.topic_requests,
                    signals_topic=service.settings.topic_signals,
                    limits=service.settings.to_limits(),
                    egress=service.outbox,
                ).run
            )
            await trio.sleep(21)  # "soon" expires meanwhile
            nursery.cancel_scope.cancel()
        body = await _overview(h)

        assert body["ready"] is True
        assert body["partitions"] == {
            "0": {"state": "serving", "restore_records": 0, "restore_seconds": 0.0, "fenced": 0}
        }
        assert (body["pending"], body["scope_count"]) == (3, 1)
        assert body["scopes"] == [{"scope": "big", "pending": 3, "partition": 0}]
        assert [(d["op_id"], d["deadline_ms"] - start) for d in body["deadlines"]] == [
            ("b2", 89_998),
            ("b1", 89_999),
            ("b0", 90_000),
        ]
        assert body["complete"] is True
        outcomes = [(o["op_id"], o["outcome"], o["late"], o["missing"]) for o in body["outcomes"]]
        assert outcomes == [("soon", "expired", False, ["y"]), ("done", "completed", False, [])]
        assert body["outcomes_total"] == 2
        [letter] = body["dead_letters"]
        assert (letter["topic"], letter["partition"], letter["offset"]) == (REQUESTS, 0, 0)
        assert letter["key"] == "small"
        assert letter["reason"]
        assert body["dead_letters_total"] == 1
        assert body["now_ms"] == h.clock.now_ms()


async def test_the_costly_parts_are_kept_a_while_and_shared(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(token=TOKEN) as h:
        await h.client.register(scope="a", op_id="one", keys=["x"], timeout_ms=600_000)
        first = await _overview(h)
        await h.client.register(scope="a", op_id="two", keys=["x"], timeout_ms=600_000)
        again = await _overview(h)
        assert again["computed_ms"] == first["computed_ms"]  # kept: the least age is 1 s
        assert again["scopes"] == [{"scope": "a", "pending": 1, "partition": 0}]
        assert again["pending"] == 2  # counts are read at each request
        await trio.sleep(1)
        later = await _overview(h)
        assert later["computed_ms"] > first["computed_ms"]
        assert later["scopes"] == [{"scope": "a", "pending": 2, "partition": 0}]
        async with trio.open_nursery() as nursery:  # concurrent requests: one computation
            answers: list[dict[str, Any]] = []

            async def ask() -> None:
                answers.append(await h.service.overview.snapshot())

            await trio.sleep(1)
            for _ in range(3):
                nursery.start_soon(ask)
        assert len({a["computed_ms"] for a in answers}) == 1


async def test_a_page_of_pending_operations_says_what_each_still_waits_for(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running(token=TOKEN) as h:
        await h.client.register(scope="s", op_id="all", keys=["a", "b", "c"], timeout_ms=60_000)
        await h.client.register(
            scope="s", op_id="any", keys=["d", "e"], condition="any", timeout_ms=60_000
        )
        await h.client.register(
            scope="s",
            op_id="count",
            keys=["a", "f", "g"],
            condition="count",
            count=2,
            timeout_ms=60_000,
        )
        await h.client.register(scope="s", op_id="timer", timeout_ms=60_000)
        await h.client.signal("s", "a")
        page_ = await h.client.pending("s")
        waits = {
            op["op_id"]: (op["condition"], op["missing"], op["still_needed"], op["time_domain"])
            for op in page_["operations"]
        }
        assert waits == {
            "all": ("all", ["b", "c"], 2, "processing_time"),
            "any": ("any", ["d", "e"], 1, "processing_time"),
            "count": ("count", ["f", "g"], 1, "processing_time"),
            "timer": ("all", [], 0, "processing_time"),
        }


async def test_a_dead_letter_counts_once_acknowledged_and_once_only(
    autojump_clock: trio.testing.MockClock,
) -> None:
    recent = Recent(lambda: EPOCH_MS, dead_letters=2)
    clock = Clock(offset_ms=EPOCH_MS)
    sent: list[OutRecord] = []

    class Sink:
        """Refuses the first dead letter as too large: the outbox sends it again bare."""

        async def send_batch(self, batch: Any) -> Any:
            failures: list[SendFailure | None] = [
                SendFailure("big", retriable=False) if not sent and r.topic == "dead" else None
                for r in batch
            ]
            sent.extend(batch)

            class Delivery:
                async def results(self) -> list[SendFailure | None]:
                    return failures

                async def offsets(self) -> list[int | None]:
                    return [None] * len(batch)

            return Delivery()

    executor = CompletionExecutor(clock)
    outbox = Outbox(
        Sink(),
        executor,
        clock,
        callbacks_topic="cb",
        dead_letters_topic="dead",
        max_record_bytes=1_000_000,
        on_dead_lettered=recent.dead_letter,
    )
    reason = "r" * (MAX_TEXT + 10)
    record = ConsumedRecord("t", 3, 7, None, b"not json", EPOCH_MS)
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        await nursery.start(outbox.run)
        outbox.put_dead_letter(Refusal(record, reason, "keys", "invalid"))
        await outbox.acknowledged()
        nursery.cancel_scope.cancel()
    assert [r.topic for r in sent] == ["dead", "dead"]  # refused, then taken without the value
    [kept] = recent.dead_letters.latest()  # once, when acknowledged; not when refused
    assert (kept.topic, kept.partition, kept.offset, kept.field, kept.key) == (
        "t",
        3,
        7,
        "keys",
        None,
    )
    assert len(kept.reason) == MAX_TEXT and kept.reason.endswith("...")
    recent.dead_letter(OutRecord("dead", None, b'{"type": "callback"}'))  # not a dead letter
    recent.dead_letter(OutRecord("dead", None, b"\xff"))
    assert recent.dead_letters.added == 1


def test_a_ring_keeps_the_last_items_newest_first() -> None:
    ring: Ring[int] = Ring(3)
    assert ring.latest() == []
    for i in range(5):
        ring.add(i)
    assert ring.latest() == [4, 3, 2]
    assert ring.added == 5
    with pytest.raises(UsageError, match="capacity"):
        Ring(0)
    with pytest.raises(UsageError, match="outcomes"):
        Recent(lambda: 0, outcomes=101)


class _NotReady:
    def readiness(self) -> dict[str, object]:
        return {}


async def test_the_overview_bounds_its_lists(autojump_clock: trio.testing.MockClock) -> None:
    async with running(token=TOKEN) as h:
        with pytest.raises(UsageError, match="scopes"):
            Overview(
                h.table,
                clock=h.clock,
                status=_NotReady(),
                recent=Recent(h.clock.now_ms),
                scopes=101,
            )
        with pytest.raises(UsageError, match="deadlines"):
            Overview(
                h.table,
                clock=h.clock,
                status=_NotReady(),
                recent=Recent(h.clock.now_ms),
                deadlines=0,
            )
        small = Overview(
            h.table,
            clock=h.clock,
            status=_NotReady(),
            recent=Recent(h.clock.now_ms),
            scopes=2,
            deadlines=3,
            step=2,
        )
        for i in range(5):
            await h.client.register(
                scope=f"s{i}", op_id="x", keys=["k"], timeout_ms=50_000 + i * 1_000
            )
        await h.client.register(scope="s4", op_id="y", keys=["k"], timeout_ms=90_000)
        body = await small.snapshot()
        assert [s["scope"] for s in body["scopes"]] == ["s4", "s0"]
        assert [d["scope"] for d in body["deadlines"]] == ["s0", "s1", "s2"]
        assert body["scope_count"] == 5 and body["pending"] == 6
