"""The snapshots' metrics (service layer concept: metrics, beside
:mod:`purgatory.service.telemetry.metrics`).

Computed at scrape time from two sources that ``purgatory serve`` binds when it runs a
snapshotter (:mod:`purgatory.service.run`): the
:class:`~purgatory.service.snapshots.snapshot_watch.SnapshotWatch` (how old each partition's
latest snapshot is, and how many changelog records follow it) and the
:class:`~purgatory.service.supervisors.supervisor.Supervisor` (how often the snapshotter was
restarted). Unbound (snapshots off, or a service run in-process by tests), the families are
declared with no samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.stats import SnapshotStatus, SupervisorStatistics

__all__ = ["SNAPSHOT_METRIC_NAMES", "SnapshotCollector"]

_log = get_logger()

_S = TypeVar("_S")

_AGE = (
    "purgatory_snapshot_age_seconds",
    "Seconds since the partition's latest snapshot was written (from its manifest record on"
    " the snapshots topic; with none found, since this replica began to look).",
)
_LAG = (
    "purgatory_snapshot_lag_records",
    "Changelog records after the partition's latest snapshot: what a restore replays on top of it.",
)
_RESTARTS = (
    "purgatory_snapshotter_restarts_total",
    "Times the snapshotter child process was started again after it exited (killed, crashed)"
    " or failed to start.",
)

#: Every name these metrics are queried by.
SNAPSHOT_METRIC_NAMES = (_AGE[0], _LAG[0], _RESTARTS[0])


class SnapshotCollector(Collector):
    """Yields the snapshots' gauges and the snapshotter's restarts, read at each scrape."""

    def __init__(self) -> None:
        self._snapshots: Callable[[], list[SnapshotStatus]] | None = None
        self._snapshotter: Callable[[], SupervisorStatistics] | None = None

    def bind(
        self,
        *,
        snapshots: Callable[[], list[SnapshotStatus]] | None,
        snapshotter: Callable[[], SupervisorStatistics] | None,
    ) -> None:
        """Set the sources (again: replace them); None leaves a family without samples."""
        self._snapshots = snapshots
        self._snapshotter = snapshotter

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        age, lag, restarts = self._families()
        for status in _read("snapshots", self._snapshots) or []:
            label = [str(status.partition)]
            age.add_metric(label, status.age_s)
            lag.add_metric(label, status.lag_records)
        supervised = _read("snapshotter", self._snapshotter)
        if supervised is not None:
            restarts.add_metric([], supervised.restarts)
        yield from (age, lag, restarts)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(*_AGE, labels=["partition"]),
            GaugeMetricFamily(*_LAG, labels=["partition"]),
            CounterMetricFamily(*_RESTARTS, labels=[]),
        )


def _read(source: str, read: Callable[[], _S] | None) -> _S | None:
    """``read()``, or None when unbound or failing (the failure is logged)."""
    if read is None:
        return None
    try:
        return read()
    except Exception as exc:
        _log.error("metrics_source_failed", source=source, error=repr(exc))
        return None
