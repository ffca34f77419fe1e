"""The reply_to allow-list: the policy, its settings, and where it applies (HTTP and Kafka
intake refuse; a restore replays what was accepted)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from purgatory._codec import RecordError, encode_request, encode_signal
from purgatory._codec._records import RegisterRequest, SignalRecord
from purgatory._core import ConfigError
from purgatory.service.app import Service, topics_of
from purgatory.service.dispatch.reply_to import DEFAULT_PREFIX, ReplyToPolicy
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport
from tests.service.ingress.test_http import running

EPOCH_MS = 1_763_780_400_000
DEFAULTS = ReplyToPolicy.from_settings(Settings())
OWN = (
    "purgatory.requests",
    "purgatory.signals",
    "purgatory.dead-letters",
    "purgatory.changelog",
    "purgatory.snapshots",
)


def _refusal(policy: ReplyToPolicy, topic: str) -> RecordError:
    with pytest.raises(RecordError) as caught:
        policy.check(topic)
    assert caught.value.field == "reply_to"
    assert str(caught.value).startswith("reply_to: ")
    return caught.value


# -- the policy ---------------------------------------------------------------------------------


def test_the_defaults_allow_the_callbacks_topic_and_the_prefix() -> None:
    assert Settings().reply_to_prefix == DEFAULT_PREFIX == "purgatory.reply."
    assert Settings().reply_to_topics is None
    for allowed in (None, "purgatory.callbacks", "purgatory.reply.team-a", "purgatory.reply.x.y"):
        DEFAULTS.check(allowed)


@pytest.mark.parametrize("topic", ["__consumer_offsets", "__transaction_state", "_schemas", "_x"])
def test_kafka_internal_names_are_refused_saying_why_and_what_is_allowed(topic: str) -> None:
    error = _refusal(DEFAULTS, topic)
    assert error.reason == (
        f"{topic!r} starts with '_', a Kafka internal topic; allowed: the callbacks topic"
        " 'purgatory.callbacks' (or no reply_to), or a topic starting with 'purgatory.reply.'"
    )


@pytest.mark.parametrize("topic", OWN)
def test_the_services_own_topics_are_refused(topic: str) -> None:
    assert "is one of the service's own topics; allowed: " in _refusal(DEFAULTS, topic).reason


@pytest.mark.parametrize("topic", ["elsewhere", "purgatory.reply", "purgatory.replyx", "x._y"])
def test_other_names_are_refused(topic: str) -> None:
    assert _refusal(DEFAULTS, topic).reason.startswith(f"{topic!r} is not allowed; allowed: ")


def test_exact_names_allow_those_names_only() -> None:
    settings = Settings.from_env({"PURGATORY_REPLY_TO_TOPICS": "team.a, results"})
    assert settings.reply_to_topics == ("team.a", "results")
    policy = ReplyToPolicy.from_settings(settings)
    policy.check("team.a")
    policy.check("results")
    policy.check("purgatory.reply.z")  # the prefix still applies
    reason = _refusal(policy, "team.a.b").reason
    assert reason.endswith("or one of 'results', 'team.a'")


def test_an_empty_prefix_allows_no_name_by_prefix() -> None:
    settings = Settings.from_env({"PURGATORY_REPLY_TO_PREFIX": ""})
    assert settings.reply_to_prefix == ""
    policy = ReplyToPolicy.from_settings(settings)
    policy.check(None)
    policy.check("purgatory.callbacks")
    assert _refusal(policy, "purgatory.reply.x").reason == (
        "'purgatory.reply.x' is not allowed; allowed: the callbacks topic 'purgatory.callbacks'"
        " (or no reply_to)"
    )


def test_a_prefix_over_the_services_topics_still_refuses_them() -> None:
    policy = ReplyToPolicy.from_settings(Settings(reply_to_prefix="purgatory."))
    policy.check("purgatory.anything")
    policy.check("purgatory.callbacks")
    for topic in OWN:
        _refusal(policy, topic)


def test_renamed_topics_are_the_ones_refused() -> None:
    settings = Settings(topic_requests="jobs.in", topic_callbacks="jobs.out", reply_to_prefix="")
    policy = ReplyToPolicy.from_settings(settings)
    policy.check("jobs.out")
    _refusal(policy, "jobs.in")
    assert "one of the service's own topics" in _refusal(policy, "jobs.in").reason
    assert "is not allowed" in _refusal(policy, "purgatory.requests").reason


def test_a_long_list_is_cut_in_the_reason() -> None:
    policy = ReplyToPolicy("cb", frozenset(f"t{i}" for i in range(8)), prefix="")
    assert _refusal(policy, "u").reason.endswith("one of 't0', 't1', 't2', 't3', 't4' and 3 more")


_NAMES = st.text(st.sampled_from("ab._-"), min_size=1, max_size=8)


@given(
    prefix=st.sampled_from(["", "_", "a", "a.", "purgatory.reply."]),
    topics=st.frozensets(_NAMES, max_size=4),
    topic=_NAMES,
)
def test_internal_and_own_names_are_refused_whatever_the_lists_say(
    prefix: str, topics: frozenset[str], topic: str
) -> None:
    own = frozenset({"a.requests", topic + "-own"})
    policy = ReplyToPolicy("cb", topics | own, prefix=prefix, own_topics=own)
    allowed = topic in topics or (bool(prefix) and topic.startswith(prefix))
    if topic.startswith("_"):
        allowed = False
    try:
        policy.check(topic)
    except RecordError:
        assert not allowed
    else:
        assert allowed
    for name in own:
        _refusal(policy, name)


# -- the settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"PURGATORY_REPLY_TO_TOPICS": "ok,__consumer_offsets"},
            "PURGATORY_REPLY_TO_TOPICS: must not name '__consumer_offsets': names starting with"
            " '_' (Kafka's internal topics) are never a reply_to",
        ),
        (
            {"PURGATORY_REPLY_TO_TOPICS": "purgatory.changelog"},
            "PURGATORY_REPLY_TO_TOPICS: must not name 'purgatory.changelog', the service's own"
            " PURGATORY_TOPIC_CHANGELOG",
        ),
        (
            {"PURGATORY_REPLY_TO_PREFIX": "_"},
            "PURGATORY_REPLY_TO_PREFIX: must not start with '_' (Kafka's internal topics are"
            " never a reply_to), got '_'",
        ),
        (
            {"PURGATORY_REPLY_TO_PREFIX": "a b"},
            "PURGATORY_REPLY_TO_PREFIX: must be 0 to 249 characters from a-z A-Z 0-9 . _ -"
            " (empty: no prefix), got 'a b'",
        ),
        (
            {"PURGATORY_REPLY_TO_TOPICS": "a,,b"},
            "PURGATORY_REPLY_TO_TOPICS: must be a comma-separated list of distinct Kafka topic"
            " names, got 'a,,b'",
        ),
    ],
)
def test_the_settings_refuse_what_no_policy_may_allow(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(environ)
    assert str(caught.value) == message


def test_the_callbacks_topic_may_be_listed() -> None:
    settings = Settings.from_env({"PURGATORY_REPLY_TO_TOPICS": "purgatory.callbacks"})
    ReplyToPolicy.from_settings(settings).check("purgatory.callbacks")


# -- HTTP ---------------------------------------------------------------------------------------


async def test_an_http_registration_to_an_internal_topic_is_a_422_naming_reply_to(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        body = {"scope": "s", "op_id": "x", "keys": ["k"], "timeout_ms": 60_000}
        for topic in ("__consumer_offsets", "purgatory.requests", "elsewhere"):
            response = await h.http.post("/v1/operations", json={**body, "reply_to": topic})
            assert response.status_code == 422, response.text
            error = response.json()["error"]
            assert error["field"] == "reply_to"
            assert repr(topic) in error["message"] and "allowed: " in error["message"]
        assert h.reads.lookup("s", "x") is None
        assert h.table.engine_statistics().pending == 0
        ok = {**body, "op_id": "y", "reply_to": "purgatory.reply.team"}
        assert (await h.http.post("/v1/operations", json=ok)).status_code == 201


async def test_a_batch_refuses_only_the_item_whose_reply_to_is_not_allowed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with running() as h:
        body = {"scope": "s", "keys": ["k"], "timeout_ms": 60_000}
        batch = [
            {**body, "op_id": "a"},
            {**body, "op_id": "b", "reply_to": "__consumer_offsets"},
            {**body, "op_id": "c", "reply_to": "purgatory.reply.team"},
        ]
        response = await h.http.post("/v1/operations:batch", json={"operations": batch})
        assert response.status_code == 200, response.text
        results = response.json()["results"]
        assert [r["http_status"] for r in results] == [201, 422, 201]
        assert results[1]["error"].startswith("operations[1].reply_to: ")
        assert h.reads.lookup("s", "b") is None
        assert h.reads.lookup("s", "a") is not None and h.reads.lookup("s", "c") is not None


# -- Kafka intake and restore, on the in-memory broker ------------------------------------------

REPLY = "purgatory.reply.team"
LEGACY = "legacy.results"


def _broker(settings: Settings) -> FakeBroker:
    topics = {t: 2 for t in topics_of(settings)}
    return FakeBroker(topics | {REPLY: 1, LEGACY: 1})


async def _run_for(
    broker: FakeBroker, settings: Settings, seconds: float, services: list[Service]
) -> None:
    async def serve(stop: trio.Event) -> None:
        fake = FakeTransport(broker)
        topics = [settings.topic_requests, settings.topic_signals]
        async with (
            fake.open_sink() as sink,
            fake.open_reader() as reader,
            fake.open_source(topics=topics, group_id="g", assignment=None) as source,
        ):
            service = Service(settings, Clock(offset_ms=EPOCH_MS), source, sink, reader)
            services.append(service)
            await service.run(stop, serve_http=False)

    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve, stop)
        await trio.sleep(seconds)
        stop.set()


def _register(broker: FakeBroker, settings: Settings, op_id: str, **kw: Any) -> None:
    request = RegisterRequest(op_id=op_id, scope="s", keys=("k",), timeout_ms=3_600_000, **kw)
    broker.append(settings.topic_requests, b"s", encode_request(request))


def _values(broker: FakeBroker, topic: str) -> list[dict[str, Any]]:
    return [json.loads(r.value or b"") for r in broker.records(topic)]


async def test_a_kafka_registration_to_a_refused_topic_is_dead_lettered_as_invalid(
    autojump_clock: trio.testing.MockClock,
) -> None:
    settings = Settings.from_env({}, topic_partitions=2, shutdown_grace_ms=5_000)
    broker = _broker(settings)
    _register(broker, settings, "bad", reply_to="__consumer_offsets")
    _register(broker, settings, "good", reply_to=REPLY)
    broker.append(settings.topic_signals, b"s", encode_signal(SignalRecord("s", "k", None, None)))
    services: list[Service] = []
    await _run_for(broker, settings, 1, services)
    [letter] = _values(broker, settings.topic_dead_letters)
    assert (letter["topic"], letter["offset"], letter["field"]) == (
        settings.topic_requests,
        0,
        "reply_to",
    )
    assert letter["reason"].startswith("reply_to: '__consumer_offsets' starts with '_'")
    assert [v["op_id"] for v in _values(broker, REPLY)] == ["good"]
    assert _values(broker, settings.topic_callbacks) == []
    registry = services[0].metrics.registry
    labels = {"topic": settings.topic_requests, "reason": "invalid"}
    assert registry.get_sample_value("purgatory_records_dead_lettered_total", labels) == 1
    assert registry.get_sample_value("purgatory_registrations_total", {"result": "invalid"}) == 1


async def test_a_journaled_registration_to_a_topic_refused_since_is_still_restored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Accepted while LEGACY was allowed, journaled; the replica restarts with LEGACY refused.
    before = Settings.from_env(
        {"PURGATORY_REPLY_TO_TOPICS": LEGACY}, topic_partitions=2, shutdown_grace_ms=5_000
    )
    after = Settings.from_env({}, topic_partitions=2, shutdown_grace_ms=5_000)
    with pytest.raises(RecordError):
        ReplyToPolicy.from_settings(after).check(LEGACY)
    broker = _broker(before)
    _register(broker, before, "kept", reply_to=LEGACY)
    await _run_for(broker, before, 1, [])
    assert not _values(broker, LEGACY)
    services: list[Service] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_run_for, broker, after, 2, services)
        await trio.sleep(1)
        [service] = services
        spec, outcome = service.reads.lookup("s", "kept") or (None, None)
        assert spec is not None and spec.reply_to == LEGACY and outcome is None
        broker.append(after.topic_signals, b"s", encode_signal(SignalRecord("s", "k", None, None)))
    assert [(v["op_id"], v["outcome"]) for v in _values(broker, LEGACY)] == [("kept", "completed")]
    assert _values(broker, after.topic_dead_letters) == []  # the input was not read again
