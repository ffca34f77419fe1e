"""The snapshots' metrics: read from the snapshot watch and the supervisor at each scrape,
declared without samples until they are bound."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from purgatory.service.telemetry.metrics import Metrics
from purgatory.service.telemetry.snapshot_metrics import SNAPSHOT_METRIC_NAMES
from purgatory.service.telemetry.stats import SnapshotStatus, SupervisorStatistics
from tests.service.telemetry.test_metrics import scrape, value


def _supervisor(restarts: int) -> SupervisorStatistics:
    return SupervisorStatistics(starts=restarts + 1, restarts=restarts, pid=77, last_exit=None)


def test_unbound_the_families_are_declared_without_samples() -> None:
    body = Metrics().render()[0].decode()
    for name in ("purgatory_snapshot_age_seconds", "purgatory_snapshot_lag_records"):
        assert f"# TYPE {name} gauge" in body
    assert "# TYPE purgatory_snapshotter_restarts_total counter" in body
    samples = {s.name for f in text_string_to_metric_families(body) for s in f.samples}
    assert not samples & set(SNAPSHOT_METRIC_NAMES)
    assert set(SNAPSHOT_METRIC_NAMES) <= Metrics().names()


def test_ages_lags_and_restarts_are_read_at_each_scrape() -> None:
    metrics = Metrics()
    statuses = [SnapshotStatus(0, 12.5, 40, 960, found=True), SnapshotStatus(1, 3.0, 0, 0, False)]
    restarts = [0]
    metrics.bind_snapshots(
        snapshots=lambda: list(statuses), snapshotter=lambda: _supervisor(restarts[0])
    )
    first = scrape(metrics)
    assert value(first, "purgatory_snapshot_age_seconds", partition="0") == 12.5
    assert value(first, "purgatory_snapshot_age_seconds", partition="1") == 3.0
    assert value(first, "purgatory_snapshot_lag_records", partition="0") == 40
    assert value(first, "purgatory_snapshot_lag_records", partition="1") == 0
    assert value(first, "purgatory_snapshotter_restarts_total") == 0  # at 0 from the start
    statuses[0] = SnapshotStatus(0, 72.5, 90, 960, found=True)
    restarts[0] = 3
    second = scrape(metrics)
    assert value(second, "purgatory_snapshot_age_seconds", partition="0") == 72.5
    assert value(second, "purgatory_snapshot_lag_records", partition="0") == 90
    assert value(second, "purgatory_snapshotter_restarts_total") == 3


def test_without_a_supervisor_there_is_no_restart_count() -> None:
    metrics = Metrics()
    metrics.bind_snapshots(snapshots=lambda: [SnapshotStatus(2, 1.0, 1, 5, found=True)])
    samples = scrape(metrics)
    assert value(samples, "purgatory_snapshot_age_seconds", partition="2") == 1.0
    assert samples["purgatory_snapshotter_restarts"] == []


def test_a_failing_source_loses_only_its_own_series() -> None:
    metrics = Metrics()

    def broken() -> list[SnapshotStatus]:
        raise RuntimeError("watch gone")

    metrics.bind_snapshots(snapshots=broken, snapshotter=lambda: _supervisor(1))
    samples = scrape(metrics)
    assert samples["purgatory_snapshot_age_seconds"] == []
    assert samples["purgatory_snapshot_lag_records"] == []
    assert value(samples, "purgatory_snapshotter_restarts_total") == 1
    assert value(samples, "process_resident_memory_bytes") > 0
