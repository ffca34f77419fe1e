"""Metrics: counters and histograms by observation, gauges from statistics at scrape time."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Generic, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from purgatory._core import EngineStatistics, Outcome, OutcomeKind, TimeDomain, UsageError
from purgatory.service.telemetry.metrics import (
    DEAD_LETTER_REASONS,
    LATENCY_BUCKETS_S,
    REGISTRATION_RESULTS,
    WAIT_BUCKETS_S,
    Metrics,
    PartitionStatus,
    observe_many,
)
from purgatory.service.telemetry.stats import (
    ChangelogStatistics,
    CountChange,
    LayoutStatus,
    OutboxStatistics,
    SnapshotStatus,
    SupervisorStatistics,
)
from reaper import ExecutorStatistics, ReaperStatistics

T = TypeVar("T")

ENGINE = EngineStatistics(
    pending=12,
    watched=30,
    watch_keys=9,
    timer_buckets=4,
    timer_levels=2,
    signals=5,
    scopes_with_watermark=1,
    completed=100,
    expired=3,
    cancelled=1,
    purged=50,
    late=2,
    sequence=104,
    clock_ms=1_000,
    pending_bytes=24_000,
    remembered_signals=5,
    remembered_bytes=2_500,
    finished_bytes=90_000,
)
EXECUTOR = ExecutorStatistics(
    queued=7,
    capacity=1024,
    blocked_submitters=1,
    busy=True,
    submitted=10,
    executed=3,
    errors=0,
    last_lag_ms=250,
    max_lag_ms=1_500,
    total_lag_ms=2_000,
    accepting=True,
)
OUTBOX = OutboxStatistics(
    queued=5, in_flight=2, delivered=9, dead_lettered=1, retries=0, commits=3, commit_failures=0
)
REAPER = ReaperStatistics(
    wakeups=10,
    handed_off=3,
    last_lateness_ms=1,
    max_lateness_ms=20,
    sleeping_until_ms=None,
    advanced_to_ms=1_000,
)


def outcome(kind: OutcomeKind, *, registered_ms: int = 0, outcome_ms: int = 2_000) -> Outcome:
    return Outcome(
        op_id="op",
        scope="s",
        outcome=kind,
        registered_ms=registered_ms,
        outcome_ms=outcome_ms,
        deadline_ms=10_000,
        time_domain=TimeDomain.PROCESSING_TIME,
        sequence=1,
    )


@dataclasses.dataclass(frozen=True)
class Counts(Generic[T]):
    """A part whose statistics a test hands over."""

    statistics: Callable[[], T]


class Fakes:
    """Statistics that a test changes between scrapes."""

    def __init__(self) -> None:
        self.engine = ENGINE
        self.executor = EXECUTOR
        self.reaper = REAPER
        self.lag_by_partition: dict[tuple[str, int], int] = {("purgatory.signals", 0): 3}
        self.ready = True
        self.layout = LayoutStatus({"purgatory.requests": 2, "purgatory.changelog": 2}, 2)

    def bind(self, metrics: Metrics) -> None:
        metrics.bind(
            engines=self,
            executor=Counts(lambda: self.executor),
            reaper=Counts(lambda: self.reaper),
            outbox=Counts(lambda: OUTBOX),
            source=self,
            status=self,
            journal=Counts(
                lambda: ChangelogStatistics(
                    batches=3, records=4, entries=40, bytes=4_000, retries=0, pending_entries=2
                )
            ),
        )
        metrics.bind_snapshots(
            snapshots=lambda: [SnapshotStatus(0, 42.5, 7, 100, found=True)],
            snapshotter=lambda: SupervisorStatistics(starts=3, restarts=2, pid=9, last_exit=-9),
        )
        metrics.bind_layout(Counts(lambda: self.layout))

    def engine_statistics(self) -> EngineStatistics:
        return self.engine

    def lag(self) -> dict[tuple[str, int], int]:
        return dict(self.lag_by_partition)

    def is_ready(self) -> bool:
        return self.ready

    def partition_status(self) -> list[PartitionStatus]:
        return [PartitionStatus(0, True, 12, 0.5), PartitionStatus(1, False, 3, 0.1)]

    def standby_status(self) -> dict[int, bool]:
        return {2: True, 3: False}


def scrape(metrics: Metrics) -> dict[str, list[Sample]]:
    body, content_type = metrics.render()
    assert content_type.startswith("text/plain")
    return {f.name: f.samples for f in text_string_to_metric_families(body.decode())}


def value(samples: dict[str, list[Sample]], name: str, **labels: str) -> float:
    family = re.sub(r"_(total|bucket|sum|count)$", "", name)
    found = [
        s.value
        for s in samples.get(family, samples.get(name, []))
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def observe_everything(metrics: Metrics) -> None:
    metrics.outcome(outcome(OutcomeKind.COMPLETED, registered_ms=0, outcome_ms=2_000), now_ms=2_010)
    metrics.registration("pending")
    metrics.signals(3)
    metrics.callback_error()
    metrics.records_consumed("purgatory.signals", 4)
    metrics.records_produced("purgatory.callbacks")
    metrics.dead_lettered("purgatory.requests", "invalid")
    metrics.http_request("/v1/signals", "POST", 202, 0.003)
    metrics.reaper_lateness(2)
    metrics.partition_taken(1)


def test_every_name_is_exported_after_one_observation_each() -> None:
    metrics = Metrics(version="1.2.3")
    Fakes().bind(metrics)
    observe_everything(metrics)
    body = metrics.render()[0].decode()
    exported = {s.name for f in text_string_to_metric_families(body) for s in f.samples}
    for name in metrics.names():
        assert name in exported or f"{name}_count" in exported, name


def test_names_follow_the_conventions() -> None:
    metrics = Metrics()
    Fakes().bind(metrics)
    observe_everything(metrics)
    families = text_string_to_metric_families(metrics.render()[0].decode())
    # The text format shows each counter's and histogram's creation time as a `_created` gauge.
    kinds = {f.name: f.type for f in families if not f.name.endswith("_created")}
    assert len(metrics.names()) == 52
    for name in metrics.names():
        assert re.fullmatch(r"purgatory_[a-z0-9_]+", name), name
        family = name.removesuffix("_total")
        kind = kinds[family]
        assert (kind == "counter") == name.endswith("_total"), name
        if kind == "histogram":
            assert name.endswith("_seconds"), name
        for unit in ("_ms", "_milliseconds", "_minutes", "_hours", "_kb", "_mb"):
            assert unit not in name, name
    # Besides the purgatory_* families, only prometheus-client's standard process metrics.
    ours = {k for k in kinds if k.startswith("purgatory_")}
    assert ours == {name.removesuffix("_total") for name in metrics.names()}
    assert set(kinds) - ours == {
        "process_cpu_seconds", "process_max_fds", "process_open_fds",
        "process_resident_memory_bytes", "process_start_time_seconds",
        "process_virtual_memory_bytes",
    }  # fmt: skip


def test_gauges_are_computed_at_scrape_time() -> None:
    metrics = Metrics()
    fakes = Fakes()
    fakes.bind(metrics)
    first = scrape(metrics)
    assert value(first, "purgatory_pending_operations") == 12
    assert value(first, "purgatory_watched_entries") == 30
    assert value(first, "purgatory_watch_keys") == 9
    assert value(first, "purgatory_timer_buckets") == 4
    assert value(first, "purgatory_timer_levels") == 2
    assert value(first, "purgatory_signals_remembered") == 5
    assert value(first, "purgatory_pending_bytes") == 24_000
    assert value(first, "purgatory_remembered_bytes") == 2_500
    assert value(first, "purgatory_finished_bytes") == 90_000
    assert value(first, "purgatory_watermark_scopes") == 1
    assert value(first, "purgatory_late_expirations") == 2
    assert value(first, "purgatory_outcome_sequence") == 104
    assert value(first, "purgatory_executor_queue_depth") == 7
    assert value(first, "purgatory_executor_blocked_submitters") == 1
    assert value(first, "purgatory_executor_lag_seconds") == 0.25
    assert value(first, "purgatory_executor_max_lag_seconds") == 1.5
    assert value(first, "purgatory_reaper_max_lateness_seconds") == 0.02
    assert value(first, "purgatory_consumer_lag", topic="purgatory.signals", partition="0") == 3
    assert value(first, "purgatory_ready") == 1
    assert value(first, "purgatory_standby_partition", partition="2") == 1  # warm
    assert value(first, "purgatory_standby_partition", partition="3") == 0  # being rebuilt

    fakes.engine = dataclasses.replace(ENGINE, pending=13, sequence=105)
    fakes.executor = dataclasses.replace(EXECUTOR, queued=0, last_lag_ms=0)
    fakes.reaper = dataclasses.replace(REAPER, max_lateness_ms=40)
    fakes.lag_by_partition = {("purgatory.signals", 0): 0, ("purgatory.requests", 11): 8}
    fakes.ready = False
    second = scrape(metrics)
    assert value(second, "purgatory_pending_operations") == 13
    assert value(second, "purgatory_outcome_sequence") == 105
    assert value(second, "purgatory_executor_queue_depth") == 0
    assert value(second, "purgatory_executor_lag_seconds") == 0
    assert value(second, "purgatory_reaper_max_lateness_seconds") == 0.04
    assert value(second, "purgatory_consumer_lag", topic="purgatory.signals", partition="0") == 0
    assert value(second, "purgatory_consumer_lag", topic="purgatory.requests", partition="11") == 8
    assert value(second, "purgatory_ready") == 0


def test_the_topics_partition_counts_and_a_change_of_one() -> None:
    metrics = Metrics()
    fakes = Fakes()
    fakes.bind(metrics)
    first = scrape(metrics)
    assert value(first, "purgatory_topic_partitions", topic="purgatory.requests") == 2
    assert value(first, "purgatory_topic_partitions", topic="purgatory.changelog") == 2
    assert value(first, "purgatory_partition_count_mismatch") == 0

    fakes.layout = LayoutStatus(
        {"purgatory.requests": 4, "purgatory.changelog": 2},
        2,
        (CountChange("purgatory.requests", 2, 4),),
        "the partition count of purgatory.requests changed from 2 to 4 ...",
    )
    second = scrape(metrics)
    assert value(second, "purgatory_topic_partitions", topic="purgatory.requests") == 4
    assert value(second, "purgatory_partition_count_mismatch") == 1


def test_before_bind_only_info_and_not_ready() -> None:
    samples = scrape(Metrics(version="9.9.9"))
    assert value(samples, "purgatory_info", version="9.9.9") == 1
    assert value(samples, "purgatory_ready") == 0
    assert "purgatory_pending_operations" not in samples


def test_dead_letter_series_exist_at_zero_from_the_start() -> None:
    metrics = Metrics()
    metrics.expect_dead_letters(["req", "sig"])
    metrics.expect_dead_letters(["cb"], reasons=("undeliverable",))
    samples = scrape(metrics)
    name = "purgatory_records_dead_lettered_total"
    for topic in ("req", "sig"):
        for reason in ("invalid", "refused"):
            assert value(samples, name, topic=topic, reason=reason) == 0
    assert value(samples, name, topic="cb", reason="undeliverable") == 0
    assert set(DEAD_LETTER_REASONS) == {"invalid", "refused", "undeliverable"}
    metrics.dead_lettered("sig", "invalid")
    assert value(scrape(metrics), name, topic="sig", reason="invalid") == 1
    with pytest.raises(UsageError, match="reason must be one of"):
        metrics.expect_dead_letters(["cb"], reasons=("lost",))


def test_record_series_exist_at_zero_from_the_start() -> None:
    metrics = Metrics()
    metrics.expect_records(consumed=["req", "sig"], produced=["cb"])
    samples = scrape(metrics)
    for topic in ("req", "sig"):
        assert value(samples, "purgatory_records_consumed_total", topic=topic) == 0
    assert value(samples, "purgatory_records_produced_total", topic="cb") == 0
    metrics.records_consumed("sig", 3)
    assert value(scrape(metrics), "purgatory_records_consumed_total", topic="sig") == 3


def test_the_process_memory_is_exported() -> None:
    assert value(scrape(Metrics()), "process_resident_memory_bytes") > 1_000_000


def test_a_failing_source_loses_only_its_gauges() -> None:
    metrics = Metrics()

    def broken() -> EngineStatistics:
        raise RuntimeError("engine gone")

    class Broken(Fakes):
        def engine_statistics(self) -> EngineStatistics:
            return broken()

    fakes = Broken()
    metrics.bind(
        engines=fakes,
        executor=Counts(lambda: EXECUTOR),
        reaper=Counts(lambda: REAPER),
        outbox=Counts(lambda: OUTBOX),
        source=fakes,
        status=fakes,
    )
    samples = scrape(metrics)
    assert "purgatory_pending_operations" not in samples
    assert value(samples, "purgatory_executor_queue_depth") == 7
    assert value(samples, "purgatory_ready") == 1


def test_counters_and_their_labels() -> None:
    metrics = Metrics()
    observe_everything(metrics)
    metrics.outcome(outcome(OutcomeKind.EXPIRED), now_ms=2_000)
    metrics.http_request("/v1/signals", "POST", 202, 0.001)
    metrics.http_request("/v1/operations/{scope}/{op_id}", "GET", 404, 0.001)
    s = scrape(metrics)
    assert value(s, "purgatory_outcomes_total", outcome="completed") == 1
    assert value(s, "purgatory_outcomes_total", outcome="expired") == 1
    assert value(s, "purgatory_outcomes_total", outcome="cancelled") == 0
    for result in REGISTRATION_RESULTS:
        expected = 1 if result == "pending" else 0
        assert value(s, "purgatory_registrations_total", result=result) == expected
    assert value(s, "purgatory_signals_total") == 3
    assert value(s, "purgatory_callback_errors_total") == 1
    assert value(s, "purgatory_records_consumed_total", topic="purgatory.signals") == 4
    assert value(s, "purgatory_records_produced_total", topic="purgatory.callbacks") == 1
    dead = {"topic": "purgatory.requests", "reason": "invalid"}
    assert value(s, "purgatory_records_dead_lettered_total", **dead) == 1
    post = {"route": "/v1/signals", "method": "POST", "status": "202"}
    assert value(s, "purgatory_http_requests_total", **post) == 2
    get = {"route": "/v1/operations/{scope}/{op_id}", "method": "GET", "status": "404"}
    assert value(s, "purgatory_http_requests_total", **get) == 1
    route = {"route": "/v1/signals"}
    assert value(s, "purgatory_http_request_duration_seconds_count", **route) == 2
    with pytest.raises(UsageError, match="result must be one of pending"):
        metrics.registration("accepted")


def test_latencies_are_observed_in_seconds() -> None:
    metrics = Metrics()
    metrics.outcome(
        outcome(OutcomeKind.COMPLETED, registered_ms=500, outcome_ms=2_000), now_ms=2_020
    )
    metrics.outcome(outcome(OutcomeKind.EXPIRED, registered_ms=0, outcome_ms=60_000), now_ms=60_001)
    metrics.reaper_lateness(3)
    s = scrape(metrics)
    wait = "purgatory_registration_to_outcome_seconds"
    assert value(s, f"{wait}_sum", outcome="completed") == pytest.approx(1.5)
    assert value(s, f"{wait}_sum", outcome="expired") == pytest.approx(60.0)
    assert value(s, f"{wait}_bucket", outcome="completed", le="1.0") == 0
    assert value(s, f"{wait}_bucket", outcome="completed", le="2.5") == 1
    # Only a completed operation has a signal that led to its callback.
    assert value(s, "purgatory_signal_to_callback_seconds_count") == 1
    assert value(s, "purgatory_signal_to_callback_seconds_sum") == pytest.approx(0.02)
    assert value(s, "purgatory_reaper_lateness_seconds_sum") == pytest.approx(0.003)


def test_histogram_buckets_cover_the_documented_ranges() -> None:
    assert WAIT_BUCKETS_S[0] <= 0.001 and WAIT_BUCKETS_S[-1] >= 3600
    assert LATENCY_BUCKETS_S[0] <= 0.0005 and LATENCY_BUCKETS_S[-1] >= 10
    assert list(WAIT_BUCKETS_S) == sorted(set(WAIT_BUCKETS_S))
    assert list(LATENCY_BUCKETS_S) == sorted(set(LATENCY_BUCKETS_S))
    assert 0.025 in LATENCY_BUCKETS_S  # the p99 signal-to-callback target is a bucket bound
    metrics = Metrics()
    observe_everything(metrics)
    s = scrape(metrics)

    def bounds(family: str) -> list[float]:
        edges = {x.labels["le"] for x in s[family] if x.name.endswith("_bucket")}
        return sorted(float(e) for e in edges if e != "+Inf")

    assert bounds("purgatory_registration_to_outcome_seconds") == list(WAIT_BUCKETS_S)
    for family in (
        "purgatory_signal_to_callback_seconds",
        "purgatory_reaper_lateness_seconds",
        "purgatory_http_request_duration_seconds",
    ):
        assert bounds(family) == list(LATENCY_BUCKETS_S)


def test_each_instance_has_its_own_registry() -> None:
    one, two = Metrics(), Metrics()
    one.signals(5)
    assert value(scrape(one), "purgatory_signals_total") == 5
    assert value(scrape(two), "purgatory_signals_total") == 0
    assert one.registry is not two.registry


def test_openmetrics_on_request() -> None:
    metrics = Metrics()
    body, content_type = metrics.render("application/openmetrics-text; version=1.0.0")
    assert content_type.startswith("application/openmetrics-text")
    assert body.rstrip().endswith(b"# EOF")
    assert metrics.render("text/plain")[1].startswith("text/plain")


@given(
    values=st.lists(
        st.one_of(
            st.floats(min_value=0, max_value=1e6, allow_nan=False),
            st.sampled_from([0.0, 0.001, 0.005, 0.01, 0.1, 1.0, 5.0]),  # on the bounds
        ),
        max_size=60,
    )
)
def test_observe_many_writes_what_observe_writes(values: list[float]) -> None:
    one_by_one, at_once = CollectorRegistry(), CollectorRegistry()
    buckets = (0.001, 0.005, 0.01, 0.1, 1.0, 5.0)
    h1 = Histogram("h", "h", buckets=buckets, registry=one_by_one)
    h2 = Histogram("h", "h", buckets=buckets, registry=at_once)
    for value in values:
        h1.observe(value)
    observe_many(h2, values)
    first, second = generate_latest(one_by_one).decode(), generate_latest(at_once).decode()
    assert [
        line for line in first.splitlines() if "_sum" not in line and "_created" not in line
    ] == [line for line in second.splitlines() if "_sum" not in line and "_created" not in line]
    assert h2._sum.get() == pytest.approx(h1._sum.get())
