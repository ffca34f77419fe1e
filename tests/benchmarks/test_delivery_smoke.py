"""Smoke tests of the delivery benchmark at tiny sizes (tests of the harness, never of speed).

They run the real measurements (the service as a child process, in each delivery mode) on the
session's Apache Kafka, as ``make bench-delivery`` does, and check that each measures what its
label says: every signal produced exactly one callback for its own operation in both modes (a
``read_committed`` reader of the transactional service sees no duplicate), and each mode took
effect (the transactional service writes transactions, the acknowledged one none). The
report's tests need no broker: they check that the ratios are to the mean of the acknowledged
runs and that a wrong count shows in the markdown and in the JSON. No assertion depends on how
fast anything is.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.benchmarks._measure import machine_info
from tests.benchmarks.bench_delivery import (
    ACKNOWLEDGED,
    FULL,
    MODES,
    TRANSACTIONAL,
    DeliveryBenchConfig,
    DeliveryReport,
    ModeResult,
    render,
    run_delivery_benchmarks,
    summarize,
    write_json,
)
from tests.benchmarks.bench_service import FULL as SERVICE_FULL
from tests.benchmarks.bench_service import LatencyResult, ThroughputResult
from tests.benchmarks.test_service_smoke import _filled

if TYPE_CHECKING:
    from purgatory.devtools.kafka_broker import KafkaBroker

pytestmark = pytest.mark.kafka

#: Each mode once, tiny: four services in all (two per mode).
TINY = DeliveryBenchConfig(
    throughput_signals=500,
    register_batch=500,
    latency_duration_s=0.3,
    modes=(ACKNOWLEDGED, TRANSACTIONAL),
)


def test_both_modes_deliver_every_signal_exactly_once_on_kafka(
    apache_kafka: KafkaBroker,
) -> None:
    report = run_delivery_benchmarks(TINY, broker=apache_kafka)
    assert [r.mode for r in report.runs] == [ACKNOWLEDGED, TRANSACTIONAL]
    latency_signals = round(TINY.latency_rate_per_s * TINY.latency_duration_s)
    for run in report.runs:
        t, lat = run.throughput, run.latency
        assert t.signals == t.callbacks == t.distinct_ops == TINY.throughput_signals
        assert lat.signals == lat.callbacks == lat.distinct_ops == latency_signals
        for r in (t, lat):
            assert r.duplicates == r.unexpected == r.not_completed == r.missing == 0
        assert lat.without_send_time == 0  # every callback carried its signal's send time
        assert 0 <= lat.min_ms <= lat.p50_ms <= lat.p99_ms <= lat.max_ms
        assert math.isfinite(t.signals_per_s) and t.signals_per_s > 0
        assert t.service_cpu_s > 0 and run.cpu_us_per_signal > 0
        assert run.problems(TINY.partitions) == []
    acknowledged, transactional = report.runs
    # The mode took effect: one transactional producer per partition (and the start's check).
    assert acknowledged.throughput_transactional_ids == acknowledged.latency_transactional_ids == 0
    assert transactional.throughput_transactional_ids >= TINY.partitions
    assert transactional.latency_transactional_ids >= TINY.partitions
    assert report.summary.throughput_ratio > 0 and report.summary.cpu_ratio > 0
    text = render(report, "cmd")
    assert text.count("| ok |") == 2


# -- the report (no broker needed) ---------------------------------------------------------------


def _run(
    mode: str, per_s: float, *, cpu_s: float, p50: float, p99: float, duplicates: int = 0
) -> ModeResult:
    n, rate = 10_000, 1_000
    throughput = _filled(
        ThroughputResult,
        signals=n,
        end_to_end_s=n / per_s,
        signals_per_s=per_s,
        callbacks=n + duplicates,
        distinct_ops=n,
        duplicates=duplicates,
        service_cpu_s=cpu_s,
        broker_cpu_s=cpu_s / 2,
    )
    latency = _filled(
        LatencyResult,
        rate_per_s=rate,
        duration_s=1.0,
        signals=rate,
        achieved_per_s=rate,
        callbacks=rate,
        distinct_ops=rate,
        p50_ms=p50,
        p90_ms=p99,
        p99_ms=p99,
        max_ms=p99,
    )
    ids = 3 if mode == TRANSACTIONAL else 0
    return ModeResult(mode, throughput, latency, ids, ids)


def _report(transactional: ModeResult) -> DeliveryReport:
    runs = [
        _run(ACKNOWLEDGED, 5_500, cpu_s=1.0, p50=10.0, p99=20.0),
        transactional,
        _run(ACKNOWLEDGED, 4_500, cpu_s=1.0, p50=14.0, p99=30.0),
    ]
    return DeliveryReport(machine_info(), FULL, runs, summarize(runs))


def _cells(text: str, start: str) -> list[list[str]]:
    """The cells of every markdown row of ``text`` whose first cell is ``start``."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0] == start:
            rows.append(cells)
    return rows


def test_the_full_run_is_acknowledged_around_transactional_at_bench_service_sizes() -> None:
    assert MODES == FULL.modes == (ACKNOWLEDGED, TRANSACTIONAL, ACKNOWLEDGED)
    assert FULL.throughput_signals == SERVICE_FULL.throughput_signals
    assert FULL.latency_duration_s == SERVICE_FULL.latency_duration_s
    assert FULL.latency_rate_per_s == 1_000


def test_the_ratios_are_to_the_mean_of_the_acknowledged_runs() -> None:
    report = _report(_run(TRANSACTIONAL, 2_500, cpu_s=2.0, p50=40.0, p99=75.0))
    s = report.summary
    assert s.acknowledged_runs == 2 and s.transactional_runs == 1
    assert s.acknowledged_signals_per_s == pytest.approx(5_000)
    assert s.throughput_ratio == pytest.approx(0.5)
    assert s.acknowledged_spread == pytest.approx(0.2)
    assert s.cpu_ratio == pytest.approx(2.0)
    assert s.p50_added_ms == pytest.approx(28.0) and s.p99_added_ms == pytest.approx(50.0)
    text = render(report, "cmd")
    first, again = _cells(text, ACKNOWLEDGED)[0], _cells(text, f"{ACKNOWLEDGED}, again")[0]
    (transactional,) = _cells(text, TRANSACTIONAL)
    assert first[1:4] == ["5.50 k/s", "1.10x", "100"]
    assert again[1:3] == ["4.50 k/s", "0.90x"]
    assert transactional[1:5] == ["2.50 k/s", "**0.50x**", "200", "40.0 / 75.0 ms"]
    assert [first[-1], transactional[-1], again[-1]] == ["ok", "ok", "ok"]
    assert "signals/s **0.50x**" in text and "differ by 20%" in text
    assert "Command: `cmd`" in text


def test_duplicates_and_a_mode_that_did_not_take_effect_show() -> None:
    duplicated = _run(TRANSACTIONAL, 2_500, cpu_s=2.0, p50=40.0, p99=75.0, duplicates=7)
    no_transactions = dataclasses.replace(duplicated, throughput_transactional_ids=0)
    text = render(_report(no_transactions), "cmd")
    (row,) = _cells(text, TRANSACTIONAL)
    assert row[-2] == "7 / 0"
    assert "1: 7 duplicates" in row[-1] and "transactional ids added 0 / 3" in row[-1]
    with pytest.raises(ValueError, match="transactional"):
        summarize([_run(ACKNOWLEDGED, 5_000, cpu_s=1.0, p50=1.0, p99=2.0)])
    with pytest.raises(ValueError, match="modes"):
        run_delivery_benchmarks(dataclasses.replace(FULL, modes=(ACKNOWLEDGED,)))


def test_the_json_holds_every_run_in_order_and_the_summary(tmp_path: Path) -> None:
    report = _report(_run(TRANSACTIONAL, 2_500, cpu_s=2.0, p50=40.0, p99=75.0, duplicates=1))
    path = tmp_path / "out" / "bench-delivery.json"
    write_json(report, path, "cmd")
    payload = json.loads(path.read_text())
    assert payload["command"] == "cmd"
    assert payload["config"]["modes"] == [ACKNOWLEDGED, TRANSACTIONAL, ACKNOWLEDGED]
    assert [r["mode"] for r in payload["runs"]] == list(MODES)
    tx = payload["runs"][1]
    assert tx["duplicates"] == [1, 0] and tx["problems"] == ["1: 1 duplicates"]
    assert tx["cpu_us_per_signal"] == pytest.approx(200.0)
    assert tx["throughput"]["signals_per_s"] == 2_500
    assert payload["summary"]["throughput_ratio"] == pytest.approx(0.5)
    assert "cpu_us_per_signal" in payload["units"]
