"""Prometheus metrics (service layer concept: metrics; the core only exposes ``statistics()``).

A :class:`Metrics` owns its own ``CollectorRegistry`` (never the process-global one), so every
service instance, and every test, has its own. Three kinds of metric, all ``purgatory_*`` and in
base units (seconds, bytes, counts):

* counters (``*_total``), incremented by the shell where the event happens;
* histograms (``*_seconds``) of latencies, observed by the shell;
* the process's own (``process_resident_memory_bytes``, CPU seconds, open files), from
  prometheus-client's process collector;
* gauges computed at scrape time: a collector asks the parts given to :meth:`Metrics.bind` for
  their statistics and turns the frozen records they return into gauge samples, so a gauge is
  never stale and nothing has to be updated on the hot path.

:meth:`Metrics.render` asks them, so call it from the trio thread that owns the state
(a plain HTTP route does). A callable that raises loses only its own gauges for that scrape (the
failure is logged); the rest of the scrape goes on.
"""

from __future__ import annotations

import bisect
import importlib.metadata
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.exposition import CONTENT_TYPE_LATEST, choose_encoder, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from purgatory._core import EngineStatistics, Outcome, OutcomeKind, UsageError
from purgatory.service.telemetry.layout_metrics import LAYOUT_METRIC_NAMES, LayoutCollector
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.snapshot_metrics import SNAPSHOT_METRIC_NAMES, SnapshotCollector
from purgatory.service.telemetry.stats import (
    ChangelogStatistics,
    LayoutStatus,
    OutboxStatistics,
    SnapshotStatus,
    SupervisorStatistics,
)
from reaper import ExecutorStatistics, ReaperStatistics

__all__ = [
    "DEAD_LETTER_REASONS",
    "LATENCY_BUCKETS_S",
    "REGISTRATION_RESULTS",
    "WAIT_BUCKETS_S",
    "Counted",
    "Engines",
    "Lagging",
    "Metrics",
    "PartitionStatus",
    "Status",
]

#: The ``result`` label values of ``purgatory_registrations_total``.
REGISTRATION_RESULTS = (
    "pending",
    "completed",
    "duplicate",
    "rearmed",
    "conflict",
    "limited",
    "invalid",
)

#: Buckets of registration-to-outcome: 1 ms to 1 h (operations wait minutes to hours).
WAIT_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
    60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0,
)  # fmt: skip

#: Buckets of the other latencies: 0.5 ms to 10 s (the p99 target of 25 ms is a bound).
LATENCY_BUCKETS_S = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.015, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

_log = get_logger()

_S = TypeVar("_S")
_S_co = TypeVar("_S_co", covariant=True)


def _seconds(ms: float) -> float:
    return max(0.0, ms / 1000)


def observe_many(histogram: Any, values: list[float]) -> None:
    """``histogram.observe(v)`` for each of ``values``, one bucket increment per bucket.

    prometheus-client's ``observe`` takes the value's lock three times over (sum, bucket) and
    scans the bounds in Python; the acknowledger observes two histograms per callback. This
    counts the values per bucket first, then adds each count and the sum once (the client's
    own ``_upper_bounds``, ``_buckets`` and ``_sum``: the same series, the same exposition,
    checked against ``observe`` by the tests).
    """
    if not values:
        return
    bounds = histogram._upper_bounds
    counts = [0] * len(bounds)
    for value in values:
        counts[bisect.bisect_left(bounds, value)] += 1
    histogram._sum.inc(sum(values))
    buckets = histogram._buckets
    for index, count in enumerate(counts):
        if count:
            buckets[index].inc(count)


@dataclass(frozen=True, slots=True)
class PartitionStatus:
    """One input partition held by this replica, for ``/readyz`` and the metrics.

    Attributes:
        partition: its number.
        serving: restored and served (False: restoring, or fenced and waiting to restore).
        records: changelog records its restore read.
        seconds: how long its restore took (so far, while restoring).
        state: its state (:class:`~purgatory.service.ownership.life.PartitionState`'s value:
            ``taken``, ``restoring``, ``serving``, ``fenced`` or ``handing_over``).
        fenced: times it was fenced since this replica started.
        reason: why it is not serving, when it is not and one is known (a restore's error
            while it waits to try again, a fence).
    """

    partition: int
    serving: bool
    records: int
    seconds: float
    state: str = "serving"
    fenced: int = 0
    reason: str | None = None


class Counted(Protocol[_S_co]):
    """A part that counts what it does: a frozen record at each call."""

    def statistics(self) -> _S_co: ...


class Engines(Protocol):
    """The engines of the partitions served, their counts summed."""

    def engine_statistics(self) -> EngineStatistics: ...


class Lagging(Protocol):
    """A consumer: records behind the end, by ``(topic, partition)``."""

    def lag(self) -> dict[tuple[str, int], int]: ...


class Status(Protocol):
    """Whether the service serves, and the input partitions it holds."""

    def is_ready(self) -> bool: ...

    def partition_status(self) -> list[PartitionStatus]: ...

    def standby_status(self) -> dict[int, bool]: ...


@dataclass(frozen=True, slots=True)
class _Sources:
    engine: Callable[[], EngineStatistics]
    executor: Callable[[], ExecutorStatistics]
    reaper: Callable[[], ReaperStatistics]
    outbox: Callable[[], OutboxStatistics]
    consumer_lag: Callable[[], dict[tuple[str, int], int]]
    ready: Callable[[], bool]
    partitions: Callable[[], list[PartitionStatus]]
    journal: Callable[[], ChangelogStatistics] | None
    standbys: Callable[[], dict[int, bool]]


# (name, help, value from the record) for each source's gauges.
_ENGINE_GAUGES: tuple[tuple[str, str, Callable[[EngineStatistics], float]], ...] = (
    ("purgatory_pending_operations", "Operations waiting for their outcome (exact).",
     lambda s: s.pending),
    ("purgatory_watched_entries", "Entries in all watch lists (may over-count until a purge).",
     lambda s: s.watched),
    ("purgatory_watch_keys", "Watch keys with at least one watcher.", lambda s: s.watch_keys),
    ("purgatory_timer_buckets", "Timing-wheel buckets in the delay queue.",
     lambda s: s.timer_buckets),
    ("purgatory_timer_levels", "Levels of the hierarchical timing wheel.",
     lambda s: s.timer_levels),
    ("purgatory_signals_remembered", "Signals held in TTL state.", lambda s: s.signals),
    ("purgatory_pending_bytes", "Estimated memory of the pending operations.",
     lambda s: s.pending_bytes),
    ("purgatory_remembered_bytes", "Estimated memory of the remembered signals.",
     lambda s: s.remembered_bytes),
    ("purgatory_finished_bytes",
     "Estimated memory of the finished operations kept for idempotent retries.",
     lambda s: s.finished_bytes),
    ("purgatory_watermark_scopes", "Scopes with an event-time watermark.",
     lambda s: s.scopes_with_watermark),
    ("purgatory_late_expirations", "Operations expired late (overdue on restore) since start.",
     lambda s: s.late),
    ("purgatory_outcome_sequence", "Sequence number of the last outcome (grows across restarts).",
     lambda s: s.sequence),
)  # fmt: skip
_EXECUTOR_GAUGES: tuple[tuple[str, str, Callable[[ExecutorStatistics], float]], ...] = (
    ("purgatory_executor_queue_depth", "Expirations and callbacks waiting to run.",
     lambda s: s.queued),
    ("purgatory_executor_blocked_submitters", "Tasks waiting because the executor is full.",
     lambda s: s.blocked_submitters),
    ("purgatory_executor_lag_seconds", "How late the last callback started after it was due.",
     lambda s: _seconds(s.last_lag_ms)),
    ("purgatory_executor_max_lag_seconds", "The largest callback lag since start.",
     lambda s: _seconds(s.max_lag_ms)),
)  # fmt: skip
_REAPER_GAUGES: tuple[tuple[str, str, Callable[[ReaperStatistics], float]], ...] = (
    ("purgatory_reaper_max_lateness_seconds", "The reaper's largest wake-up lateness since start.",
     lambda s: _seconds(s.max_lateness_ms)),
)  # fmt: skip
_OUTBOX_GAUGES: tuple[tuple[str, str, Callable[[OutboxStatistics], float]], ...] = (
    ("purgatory_outbox_queued_records",
     "Callbacks and dead letters decided, not yet handed to the producer.", lambda s: s.queued),
    ("purgatory_outbox_unacknowledged_records",
     "Records handed to the producer that the broker has not acknowledged yet.",
     lambda s: s.in_flight),
)  # fmt: skip
_CONSUMER_LAG = ("purgatory_consumer_lag", "Records not yet consumed, per topic and partition.")
_READY = ("purgatory_ready", "1 when the service serves (restored, consuming), else 0.")
_PARTITION_SERVING = (
    "purgatory_partition_serving",
    "Per input partition held: 1 when restored and served, 0 while its restore runs.",
)
_RESTORE_RECORDS = (
    "purgatory_partition_restore_records",
    "Changelog records the partition's restore read (so far, while it runs).",
)
_RESTORE_SECONDS = (
    "purgatory_partition_restore_seconds",
    "How long the partition's restore took (so far, while it runs).",
)
_STANDBY = (
    "purgatory_standby_partition",
    "Per partition the group asks this replica to keep warm before it moves here: 1 once warm"
    " (rebuilt and caught up with its journal), 0 while it is rebuilt.",
)
_JOURNAL_PENDING = (
    "purgatory_journal_pending_entries",
    "Journal entries recorded that the broker has not acknowledged yet.",
)
_JOURNAL_UNACKNOWLEDGED = (
    "purgatory_journal_unacknowledged_seconds",
    "How long the oldest journal entry the broker has not acknowledged has waited (0: none).",
)
_JOURNAL_STALLED = (
    "purgatory_journal_stalled",
    "1 while that wait is PURGATORY_JOURNAL_WAIT_MS or more (HTTP writes answer 503), else 0.",
)
_JOURNAL_COUNTERS = (
    ("purgatory_journal_records", "Changelog records written (journal batches, per partition)."),
    ("purgatory_journal_entries", "Inputs journaled and acknowledged."),
    ("purgatory_journal_bytes", "Bytes of changelog records written."),
)
_INFO = ("purgatory_info", "Always 1; the labels describe the running build.")


class _ScrapeCollector(Collector):
    """Yields the gauges, computed from the bound statistics at each scrape."""

    def __init__(self, version: str) -> None:
        self.version = version
        self.sources: _Sources | None = None

    def describe(self) -> Iterable[Metric]:
        gauges: list[Metric] = [GaugeMetricFamily(name, doc) for name, doc in _gauge_docs()]
        counters = [CounterMetricFamily(name, doc) for name, doc in _JOURNAL_COUNTERS]
        return gauges + counters

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(*_INFO, labels=["version"])
        info.add_metric([self.version], 1)
        yield info
        sources = self.sources
        if sources is None:
            yield GaugeMetricFamily(*_READY, value=0)
            return
        yield from _gauges("engine", sources.engine, _ENGINE_GAUGES)
        yield from _gauges("executor", sources.executor, _EXECUTOR_GAUGES)
        yield from _gauges("reaper", sources.reaper, _REAPER_GAUGES)
        yield from _gauges("outbox", sources.outbox, _OUTBOX_GAUGES)
        try:
            lag = sources.consumer_lag()
            ready = sources.ready()
        except Exception as exc:
            _log.error("metrics_source_failed", source="consumer_lag/ready", error=repr(exc))
            return
        family = GaugeMetricFamily(*_CONSUMER_LAG, labels=["topic", "partition"])
        for (topic, partition), records in sorted(lag.items()):
            family.add_metric([topic, str(partition)], records)
        yield family
        yield GaugeMetricFamily(*_READY, value=1 if ready else 0)
        yield from _partition_gauges(sources)


def _partition_gauges(sources: _Sources) -> Iterator[Metric]:
    try:
        held = sources.partitions()
        standbys = sources.standbys()
        journal = sources.journal() if sources.journal is not None else None
    except Exception as exc:
        _log.error("metrics_source_failed", source="partitions/journal", error=repr(exc))
        return
    families = [
        GaugeMetricFamily(*doc, labels=["partition"])
        for doc in (_PARTITION_SERVING, _RESTORE_RECORDS, _RESTORE_SECONDS)
    ]
    for status in sorted(held, key=lambda s: s.partition):
        label = [str(status.partition)]
        families[0].add_metric(label, 1 if status.serving else 0)
        families[1].add_metric(label, status.records)
        families[2].add_metric(label, status.seconds)
    yield from families
    standby = GaugeMetricFamily(*_STANDBY, labels=["partition"])
    for partition, warm in standbys.items():
        standby.add_metric([str(partition)], 1 if warm else 0)
    yield standby
    if journal is not None:
        yield GaugeMetricFamily(*_JOURNAL_PENDING, value=journal.pending_entries)
        yield GaugeMetricFamily(*_JOURNAL_UNACKNOWLEDGED, value=journal.unacknowledged_s)
        yield GaugeMetricFamily(*_JOURNAL_STALLED, value=1 if journal.stalled else 0)
        values = (journal.records, journal.entries, journal.bytes)
        for (name, doc), value in zip(_JOURNAL_COUNTERS, values, strict=True):
            yield CounterMetricFamily(name, doc, value=value)


def _gauges(
    source: str,
    read: Callable[[], _S],
    table: tuple[tuple[str, str, Callable[[_S], float]], ...],
) -> Iterator[Metric]:
    try:
        record = read()
    except Exception as exc:
        _log.error("metrics_source_failed", source=source, error=repr(exc))
        return
    for name, doc, value in table:
        yield GaugeMetricFamily(name, doc, value=value(record))


def _gauge_docs() -> list[tuple[str, str]]:
    tables = (_ENGINE_GAUGES, _EXECUTOR_GAUGES, _REAPER_GAUGES, _OUTBOX_GAUGES)
    rows = [(name, doc) for table in tables for name, doc, _ in table]
    return [
        *rows,
        _CONSUMER_LAG,
        _READY,
        _INFO,
        _PARTITION_SERVING,
        _RESTORE_RECORDS,
        _RESTORE_SECONDS,
        _STANDBY,
        _JOURNAL_PENDING,
        _JOURNAL_UNACKNOWLEDGED,
        _JOURNAL_STALLED,
    ]


def _installed_version() -> str:
    try:
        return importlib.metadata.version("purgatory")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


#: The reasons of ``purgatory_records_dead_lettered_total``: a consumed record that does not
#: decode or breaks a record limit (``invalid``), or that the state refused (``refused``: a
#: conflict, a pending limit); a callback the broker would not take (``undeliverable``, labelled
#: with the callback's topic).
DEAD_LETTER_REASONS = ("invalid", "refused", "undeliverable")


class Metrics:
    """The service's metrics, in a registry of their own.

    Args:
        version: the ``version`` label of ``purgatory_info``; the installed package's version by
            default.
    """

    def __init__(self, *, version: str | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_resident_memory_bytes, CPU, open files
        self._outcomes = Counter(
            "purgatory_outcomes_total", "Outcomes decided, by kind.", ["outcome"], registry=r
        )
        self._consumed = Counter(
            "purgatory_records_consumed_total", "Kafka records consumed.", ["topic"], registry=r
        )
        self._produced = Counter(
            "purgatory_records_produced_total", "Kafka records produced.", ["topic"], registry=r
        )
        self._dead_lettered = Counter(
            "purgatory_records_dead_lettered_total",
            "Consumed records sent to the dead-letter topic, by source topic and reason.",
            ["topic", "reason"],
            registry=r,
        )
        self._http = Counter(
            "purgatory_http_requests_total",
            "HTTP requests answered, by route template, method, status and client.",
            ["route", "method", "status", "client"],
            registry=r,
        )
        self._callback_errors = Counter(
            "purgatory_callback_errors_total",
            "Callbacks the broker would not take (each was sent to the dead-letter topic).",
            registry=r,
        )
        self._overdue = Counter(
            "purgatory_registrations_overdue_total",
            "Registrations whose deadline had passed on arrival (they expire at the next step;"
            " their lateness is the client's, kept out of the lateness and lag series).",
            registry=r,
        )
        self._signals = Counter("purgatory_signals_total", "Signals applied.", registry=r)
        self._taken = Counter(
            "purgatory_partition_restores_total",
            "Input partitions this replica was given and began to restore, by partition (a"
            " rebalance moves, and restores, only the partitions that change owner).",
            ["partition"],
            registry=r,
        )
        self._fenced = Counter(
            "purgatory_partition_fenced_total",
            "Times another writer appended to an input partition's changelog while this replica"
            " owned it, by partition (a zombie owner, or two replicas configured onto the same"
            " partitions): nothing decided since is released, and the partition is restored.",
            ["partition"],
            registry=r,
        )
        self._registrations = Counter(
            "purgatory_registrations_total",
            "Registrations, by result: " + ", ".join(REGISTRATION_RESULTS) + ".",
            ["result"],
            registry=r,
        )
        self._wait = Histogram(
            "purgatory_registration_to_outcome_seconds",
            "From registration to outcome, by outcome.",
            ["outcome"],
            buckets=WAIT_BUCKETS_S,
            registry=r,
        )
        self._signal_to_callback = Histogram(
            "purgatory_signal_to_callback_seconds",
            "From the signal that completed an operation to its callback being sent.",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self._lateness = Histogram(
            "purgatory_reaper_lateness_seconds",
            "How long after its deadline an expiration was delivered (reaper and executor delay).",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self._http_duration = Histogram(
            "purgatory_http_request_duration_seconds",
            "HTTP request duration, by route template.",
            ["route"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self._counters = (
            self._outcomes,
            self._consumed,
            self._produced,
            self._dead_lettered,
            self._http,
            self._callback_errors,
            self._overdue,
            self._signals,
            self._taken,
            self._fenced,
            self._registrations,
        )
        self._histograms = (
            self._wait,
            self._signal_to_callback,
            self._lateness,
            self._http_duration,
        )
        # Series of known label values exist from the start, so rate() sees their first event.
        for kind in OutcomeKind:
            self._outcomes.labels(outcome=kind.value)
            self._wait.labels(outcome=kind.value)
        for result in REGISTRATION_RESULTS:
            self._registrations.labels(result=result)
        self._collector = _ScrapeCollector(version or _installed_version())
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r.register(self._collector)
        self._snapshots = SnapshotCollector()
        r.register(self._snapshots)
        self._layout = LayoutCollector()
        r.register(self._layout)

    def bind(
        self,
        *,
        engines: Engines,
        executor: Counted[ExecutorStatistics],
        reaper: Counted[ReaperStatistics],
        outbox: Counted[OutboxStatistics],
        source: Lagging,
        status: Status,
        journal: Counted[ChangelogStatistics] | None = None,
    ) -> None:
        """Set the parts the gauges are read from at each scrape (again: replace them).

        Until this is called the scrape has only ``purgatory_info`` and ``purgatory_ready 0``.

        Args:
            engines: the partitions' engines (their summed ``engine_statistics``).
            executor: the completion executor.
            reaper: the reaper.
            outbox: the outbox (records not yet acknowledged).
            source: the input topics' consumer (records behind the end, its ``lag``).
            status: whether the service serves, and the input partitions held.
            journal: the journal's writer (None: no journal).
        """
        self._collector.sources = _Sources(
            engines.engine_statistics,
            executor.statistics,
            reaper.statistics,
            outbox.statistics,
            source.lag,
            status.is_ready,
            status.partition_status,
            journal.statistics if journal is not None else None,
            status.standby_status,
        )

    def bind_snapshots(
        self,
        *,
        snapshots: Callable[[], list[SnapshotStatus]],
        snapshotter: Callable[[], SupervisorStatistics] | None = None,
    ) -> None:
        """Set what the snapshot gauges and the snapshotter's restarts are read from at each
        scrape (until then their families have no samples).

        Args:
            snapshots: each watched partition's latest snapshot (the snapshot watch's).
            snapshotter: the snapshotter supervisor's counts (None: no child is supervised).
        """
        self._snapshots.bind(snapshots=snapshots, snapshotter=snapshotter)

    def bind_layout(self, layout: Counted[LayoutStatus]) -> None:
        """Set what the topics' partition counts and the mismatch flag are read from at each
        scrape (the service's :class:`~purgatory.service.ownership.layout.TopicLayout`)."""
        self._layout.bind(layout.statistics)

    def outcome(self, outcome: Outcome, *, now_ms: int) -> None:
        """Count a delivered outcome and observe its latencies.

        Args:
            outcome: the outcome whose callback was just sent.
            now_ms: the time it was sent; for a completed operation, ``now_ms - outcome_ms`` is
                the signal-to-callback latency.
        """
        self.outcomes((outcome,), now_ms=now_ms)

    def outcomes(self, outcomes: Iterable[Outcome], *, now_ms: int) -> None:
        """:meth:`outcome` for each of ``outcomes`` (all sent at ``now_ms``), counted per kind
        and observed per histogram in one pass: what the acknowledger calls per delivery."""
        waits: dict[str, list[float]] = {}
        latencies: list[float] = []
        for outcome in outcomes:
            kind = outcome.outcome.value
            waits.setdefault(kind, []).append(_seconds(outcome.outcome_ms - outcome.registered_ms))
            if outcome.outcome is OutcomeKind.COMPLETED:
                latencies.append(_seconds(now_ms - outcome.outcome_ms))
        for kind, seconds in waits.items():
            self._child(self._outcomes, kind).inc(len(seconds))
            observe_many(self._child(self._wait, kind), seconds)
        if latencies:
            observe_many(self._signal_to_callback, latencies)

    def registration(self, result: str) -> None:
        """Count a registration by its result (one of :data:`REGISTRATION_RESULTS`).

        Raises:
            UsageError: if ``result`` is not one of them (label values stay bounded).
        """
        if result not in REGISTRATION_RESULTS:
            raise UsageError(f"result must be one of {', '.join(REGISTRATION_RESULTS)}")
        self._child(self._registrations, result).inc()

    def registration_overdue(self) -> None:
        """Count a registration whose deadline had already passed when it arrived."""
        self._overdue.inc()

    def signals(self, count: int = 1) -> None:
        """Count applied signals."""
        self._signals.inc(count)

    def callback_error(self, count: int = 1) -> None:
        """Count callbacks the broker would not take."""
        self._callback_errors.inc(count)

    def records_consumed(self, topic: str, count: int = 1) -> None:
        """Count Kafka records consumed from ``topic``."""
        self._child(self._consumed, topic).inc(count)

    def records_produced(self, topic: str, count: int = 1) -> None:
        """Count Kafka records produced to ``topic``."""
        self._child(self._produced, topic).inc(count)

    def expect_records(self, *, consumed: Iterable[str], produced: Iterable[str]) -> None:
        """Export the consumed and produced series of these topics at 0 from the start, so the
        first burst after a start shows in ``rate()`` and ``increase()`` (see below)."""
        for topic in consumed:
            self._child(self._consumed, topic)
        for topic in produced:
            self._child(self._produced, topic)

    def expect_dead_letters(
        self, topics: Iterable[str], *, reasons: Iterable[str] = ("invalid", "refused")
    ) -> None:
        """Export the dead-letter series of ``topics`` (for ``reasons``) at 0 from the start.

        A counter series otherwise appears with its first increment, and ``increase()`` over
        it then misses that first dead letter: an alert would never see it.
        """
        for topic in topics:
            for reason in reasons:
                if reason not in DEAD_LETTER_REASONS:
                    raise UsageError(f"reason must be one of {', '.join(DEAD_LETTER_REASONS)}")
                self._dead_lettered.labels(topic=topic, reason=reason)

    def partition_taken(self, partition: int) -> None:
        """Count a partition this replica was given (its restore begins)."""
        self._taken.labels(partition=str(partition)).inc()
        self._child(self._fenced, str(partition))  # at 0 from the start: increase() sees the first

    def partition_fenced(self, partition: int) -> None:
        """Count a partition fenced because another writer appended to its changelog."""
        self._fenced.labels(partition=str(partition)).inc()

    def dead_lettered(self, topic: str, reason: str) -> None:
        """Count a record of ``topic`` sent to the dead letters; keep ``reason`` a short word."""
        self._dead_lettered.labels(topic=topic, reason=reason).inc()

    def http_request(
        self, route: str, method: str, status: int, seconds: float, client: str = "anonymous"
    ) -> None:
        """Count an answered HTTP request and observe its duration.

        Args:
            route: the route template (``/v1/operations/{scope}``), never the raw path.
            method: the HTTP method.
            status: the status code answered.
            seconds: how long the request took.
            client: the client's name (from its token; ``anonymous`` without one): the names
                are the operator's, so the label's values are bounded.
        """
        self._http.labels(route=route, method=method, status=str(status), client=client).inc()
        self._http_duration.labels(route=route).observe(max(0.0, seconds))

    def _child(self, family: Any, *labels: str) -> Any:
        """``family.labels(*labels)``, memoized: the hot paths call this per record."""
        key = (id(family), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = family.labels(*labels)
        return child

    def reaper_lateness(self, lateness_ms: int) -> None:
        """Observe how long after its deadline an expiration was delivered, in ms."""
        self._lateness.observe(_seconds(lateness_ms))

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """The scrape: the exposition body and its content type.

        Args:
            accept: the request's ``Accept`` header; OpenMetrics when it asks for it, the
                Prometheus text format otherwise.
        """
        if accept:
            encode, content_type = choose_encoder(accept)
            return encode(self.registry), content_type
        return generate_latest(self.registry), CONTENT_TYPE_LATEST

    def names(self) -> set[str]:
        """Every metric name exported, as written in queries.

        Counters with their ``_total``, gauges as they are, histograms by their base name
        (queried as ``<name>_bucket``, ``<name>_sum`` and ``<name>_count``).
        """
        found = {name for name, _ in _gauge_docs()}
        found.update(name + "_total" for name, _ in _JOURNAL_COUNTERS)
        found.update(SNAPSHOT_METRIC_NAMES)
        found.update(LAYOUT_METRIC_NAMES)
        for wrapper in (*self._counters, *self._histograms):
            for metric in wrapper.describe():
                found.add(metric.name + "_total" if metric.type == "counter" else metric.name)
        return found
