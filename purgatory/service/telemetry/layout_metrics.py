"""The topics' partition counts as metrics (service layer concept: metrics, beside ``metrics``).

Computed at scrape time from the service's
:class:`~purgatory.service.ownership.layout.TopicLayout`: the partition count
last seen of each topic keyed by scope, and whether one changed while the service ran (its
inputs are then stopped until it is restarted). Unbound, the families have no samples.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.stats import LayoutStatus

__all__ = ["LAYOUT_METRIC_NAMES", "LayoutCollector"]

_log = get_logger()

_PARTITIONS = (
    "purgatory_topic_partitions",
    "Partitions of each topic keyed by scope (requests, signals, changelog, snapshots), as last"
    " seen in the brokers' metadata.",
)
_MISMATCH = (
    "purgatory_partition_count_mismatch",
    "1 once a topic's partition count changed while the service ran: it takes no input until"
    " it is restarted on topics of one count; else 0.",
)

#: Every name these metrics are queried by.
LAYOUT_METRIC_NAMES = (_PARTITIONS[0], _MISMATCH[0])


class LayoutCollector(Collector):
    """Yields the topics' partition counts and the mismatch flag, read at each scrape."""

    def __init__(self) -> None:
        self._status: Callable[[], LayoutStatus] | None = None

    def bind(self, status: Callable[[], LayoutStatus] | None) -> None:
        """Set the source (again: replace it); None leaves the families without samples."""
        self._status = status

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterator[Metric]:
        partitions, mismatch = self._families()
        status = None
        if self._status is not None:
            try:
                status = self._status()
            except Exception as exc:
                _log.error("metrics_source_failed", source="layout", error=repr(exc))
        if status is not None:
            for topic, count in sorted(status.counts.items()):
                partitions.add_metric([topic], count)
            mismatch.add_metric([], 1 if status.inputs_stopped is not None else 0)
        yield from (partitions, mismatch)

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        return (
            GaugeMetricFamily(*_PARTITIONS, labels=["topic"]),
            GaugeMetricFamily(*_MISMATCH, labels=[]),
        )
