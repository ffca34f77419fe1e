"""Smoke tests of the service benchmark at tiny sizes (tests of the harness, never of speed).

They run the real measurements (the service as a child process) on each of the session's
brokers, Apache Kafka and Tansu, as ``make bench`` does, and check that each measures what its
label says: every signal produced exactly one callback for its own operation, the counts add
up, latencies are real durations. The report's tests need no broker: they check that each
broker's results stand beside the other's, each against its own baselines, in the markdown and
in the JSON, and that the brokers run Kafka first, one at a time. No assertion depends on how
fast anything is.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import pytest

from purgatory._codec import WatermarkRecord, decode_callback, decode_signal
from tests.benchmarks import bench_service
from tests.benchmarks._measure import machine_info
from tests.benchmarks.bench_service import (
    QUICK,
    Arrival,
    BrokerReport,
    HopResult,
    HttpResult,
    LatencyResult,
    PipeResult,
    RssResult,
    ServiceBenchConfig,
    ServiceReport,
    ThroughputResult,
    bench_kafka_hop,
    bench_latency,
    bench_pipe,
    bench_throughput,
    brokers_of,
    compute_durability,
    compute_ratios,
    decision_split,
    evaluate_targets,
    nth_arrival_ns,
    percentile,
    pipe_output,
    render,
    run_service_benchmarks,
    signal_value,
    tally,
    write_json,
)

if TYPE_CHECKING:
    from purgatory.devtools.broker import Broker

pytestmark = pytest.mark.kafka

WARMUP = b"warmup0"


def _callback(op_id: str, key: str, *, outcome: str = "completed", t: int = 0) -> bytes:
    return json.dumps(
        {"op_id": op_id, "keys": [key], "outcome": outcome, "signals": {key: {"t": t}}}
    ).encode()


def test_tally_counts_duplicates_strangers_and_missing_operations() -> None:
    arrivals: list[Arrival] = [
        (10, WARMUP, _callback("o9", "k9")),  # warm-up: not counted
        (20, b"s0", _callback("o0", "k0", t=5)),
        (30, b"s1", _callback("o1", "k1", t=6)),
        (40, b"s0", _callback("o0", "k0", t=5)),  # a second callback for o0
        (50, b"s1", _callback("o7", "k7")),  # not one of the 3 operations
        (60, b"s1", _callback("o2", "k1")),  # o2 with another operation's key
    ]
    counts = tally(arrivals, 3, WARMUP)
    assert counts.callbacks == 5
    assert counts.distinct_ops == 2
    assert counts.duplicates == 1
    assert counts.unexpected == 2
    assert counts.missing == 1
    assert counts.not_completed == 0
    assert counts.first == {"o0": (20, {"t": 5}), "o1": (30, {"t": 6})}
    assert nth_arrival_ns(arrivals, 2, WARMUP) == 30
    assert tally([(1, b"s0", _callback("o0", "k0", outcome="expired"))], 1, WARMUP).not_completed


def test_the_decision_split_moves_arrivals_onto_the_wall_clock() -> None:
    def callback(op_id: str, outcome_ms: int, t: int, w: int) -> bytes:
        signals = {"k": {"t": t, "w": w}}
        return json.dumps({"op_id": op_id, "outcome_ms": outcome_ms, "signals": signals}).encode()

    # o0: sent at perf 1 ms = wall 1,000,000 ms, decided at wall 1,000,004 ms (4 ms), read at
    # perf 11 ms = wall 1,000,010 ms (6 ms later). o1: decided as sent, read 7 ms later.
    wall = 1_000_000 * 1_000_000
    arrivals: list[Arrival] = [
        (11_000_000, b"s0", callback("o0", 1_000_004, 1_000_000, wall)),
        (12_000_000, b"s0", callback("o0", 1_000_004, 1_000_000, wall)),  # a repeat: ignored
        (30_000_000, WARMUP, callback("o9", 1_000_000, 0, 0)),  # warm-up: ignored
        (9_000_000, b"s1", callback("o1", 1_000_002, 2_000_000, wall + 2_000_000)),
    ]
    assert decision_split(arrivals, WARMUP) == ([0.0, 4.0], [6.0, 7.0])


def test_the_pipe_output_is_the_callback_the_service_would_send() -> None:
    value = pipe_output(decode_signal(signal_value("s3", "k42", '{"t":7}')), 9)
    callback = decode_callback(value)
    assert callback["op_id"] == "o42" and callback["scope"] == "s3"
    assert callback["outcome"] == "completed" and callback["keys"] == ["k42"]
    assert callback["signals"] == {"k42": '{"t":7}'}
    counts = tally([(1, b"s3", value)], 43, WARMUP)
    assert counts.distinct_ops == 1 and counts.unexpected == counts.duplicates == 0
    with pytest.raises(RuntimeError):
        pipe_output(WatermarkRecord("s0", 5), 0)  # the benchmark sends no watermarks


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.50) == 50
    assert percentile(values, 0.99) == 99
    assert percentile(values, 1.0) == 100
    assert percentile([7.0], 0.99) == 7
    assert percentile([], 0.5) == 0


def test_every_signal_through_kafka_gets_exactly_one_callback(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    result = bench_throughput(kafka_broker, 1_000, register_batch=500, log_dir=tmp_path)
    assert result.signals == 1_000
    assert result.callbacks == result.distinct_ops == 1_000
    assert result.duplicates == result.unexpected == result.not_completed == result.missing == 0
    assert result.end_to_end_s > 0 and result.produce_s > 0
    assert math.isfinite(result.signals_per_s) and result.signals_per_s > 0
    assert result.service_cpu_s > 0  # the service did the work, in its own process


def test_paced_signals_each_complete_one_operation_with_a_real_latency(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    result = bench_latency(kafka_broker, 500, 1.0, register_batch=500, log_dir=tmp_path)
    assert result.signals == 500
    assert result.callbacks == result.distinct_ops == 500
    assert result.duplicates == result.unexpected == result.not_completed == result.missing == 0
    assert result.without_send_time == 0  # every callback carried its signal's send time
    assert 0 <= result.min_ms <= result.p50_ms <= result.p90_ms <= result.p99_ms <= result.max_ms
    assert result.achieved_per_s > 0
    # Both halves are real durations within the whole (the decision's clock has 1 ms steps).
    for p50, p99 in (result.to_decision_ms, result.after_decision_ms):
        assert -1.0 <= p50 <= p99 <= result.max_ms + 1.0
    assert result.after_decision_ms[0] > 0  # at least the callback's round trip and the read


def test_the_pipe_baseline_pipes_every_signal_exactly_once(kafka_broker: Broker) -> None:
    result = bench_pipe(kafka_broker, 1_000)
    assert result.signals == 1_000
    assert result.outputs == result.distinct_ops == 1_000
    assert result.duplicates == result.unexpected == result.not_completed == result.missing == 0
    assert result.piped == 1_000 + 200  # the warm-up's signals too
    assert result.end_to_end_s > 0 and result.produce_s > 0
    assert math.isfinite(result.signals_per_s) and result.signals_per_s > 0
    assert result.pipe_cpu_s > 0  # the pipe did the work, in its own process


def test_the_hop_baseline_receives_every_record_once_with_a_real_latency(
    kafka_broker: Broker,
) -> None:
    result = bench_kafka_hop(kafka_broker, 500, 1.0, linger_ms=5, fetch_max_wait_ms=5)
    assert (result.linger_ms, result.fetch_max_wait_ms) == (5, 5)
    assert result.records == result.received == result.distinct == 500
    assert 0 <= result.p50_ms <= result.p90_ms <= result.p99_ms <= result.max_ms


# -- the report, both brokers side by side (no broker needed) ------------------------------------

_Result = TypeVar("_Result")


def _filled(cls: type[_Result], **given: Any) -> _Result:
    """A result whose fields without a default are 0 (no missing, duplicate or stray callback)
    but for ``given``."""
    values: dict[str, Any] = {
        f.name: 0
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    return cls(**(values | given))


def _broker_report(
    name: str, *, service: float, pipe: float, no_journal: float, p99: float, hop_p99: float
) -> BrokerReport:
    """One broker's results at ``QUICK`` sizes: these rates (signals/s) and p99s (ms), every
    count exact."""
    n, rate = QUICK.throughput_signals, QUICK.hop_rate_per_s

    def throughput(per_s: float, *, journal: bool) -> ThroughputResult:
        return _filled(
            ThroughputResult,
            signals=n,
            end_to_end_s=n / per_s,
            signals_per_s=per_s,
            producer_per_s=2 * per_s,
            callbacks=n,
            distinct_ops=n,
            journal=journal,
            journal_entries=2 * n if journal else 0,
            journal_bytes=200 * n if journal else 0,
        )

    def latency(p99_ms: float, *, journal: bool) -> LatencyResult:
        signals = round(rate * QUICK.latency_duration_s)
        return _filled(
            LatencyResult,
            rate_per_s=rate,
            duration_s=QUICK.latency_duration_s,
            signals=signals,
            achieved_per_s=rate,
            callbacks=signals,
            distinct_ops=signals,
            p50_ms=p99_ms / 4,
            p90_ms=p99_ms / 2,
            p99_ms=p99_ms,
            max_ms=p99_ms,
            journal=journal,
        )

    records = round(rate * QUICK.hop_duration_s)
    t, nj = throughput(service, journal=True), throughput(no_journal, journal=False)
    piped = _filled(
        PipeResult,
        signals=n,
        end_to_end_s=n / pipe,
        signals_per_s=pipe,
        producer_per_s=pipe,
        piped=n + 200,
        outputs=n,
        distinct_ops=n,
    )
    lat, lat_nj = [latency(p99, journal=True)], [latency(p99 / 2, journal=False)]
    hops = [
        _filled(
            HopResult,
            rate_per_s=rate,
            linger_ms=5,
            fetch_max_wait_ms=5,
            records=records,
            received=records,
            distinct=records,
            p50_ms=hop_p99 / 2,
            p99_ms=hop_p99,
        )
    ]
    rss = _filled(RssResult, pending=QUICK.rss_pending, rss_after_bytes=100 << 20)
    http = _filled(
        HttpResult,
        single_requests=300,
        single_s=1.5,
        single_per_s=200.0,
        batch_size=1_000,
        batched_ops=5_000,
        batched_s=0.5,
        batched_ops_per_s=10_000.0,
    )
    return BrokerReport(
        broker=name,
        throughput=t,
        pipe=piped,
        latency=lat,
        hops=hops,
        rss=rss,
        http=http,
        ratios=compute_ratios(QUICK, t, piped, lat, hops),
        targets=evaluate_targets(
            QUICK, t, piped, latency=lat, hops=hops, rss=rss, throughput_no_journal=nj
        ),
        throughput_no_journal=nj,
        latency_no_journal=lat_nj,
        durability=compute_durability(t, nj, lat, lat_nj),
    )


KAFKA = _broker_report(
    "kafka", service=4_000, pipe=8_000, no_journal=5_000, p99=40.0, hop_p99=10.0
)  # ratios 0.50x, 0.80x, 4.00x
TANSU = _broker_report(
    "tansu", service=6_000, pipe=10_000, no_journal=6_000, p99=30.0, hop_p99=15.0
)  # ratios 0.60x, 1.00x, 2.00x


def _two_brokers() -> ServiceReport:
    return ServiceReport(machine=machine_info(), config=QUICK, brokers=[KAFKA, TANSU])


def _row(text: str, start: str) -> list[str]:
    """The cells of the first markdown row of ``text`` whose first cell starts with ``start``."""
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and cells[0].startswith(start):
            return cells
    raise AssertionError(f"no row {start!r} in:\n{text}")


def test_the_report_sets_each_broker_beside_its_own_baselines() -> None:
    text = render(_two_brokers(), "cmd")
    assert _row(text, "figure") == [
        "figure (each broker beside its own baselines)",
        "Apache Kafka",
        "Tansu",
    ]
    assert _row(text, "1. signals/s")[1:] == ["4.0 k/s", "6.0 k/s"]
    assert _row(text, "1'. signals/s")[1:] == ["8.0 k/s", "10.0 k/s"]
    pipe_ratio = _row(text, "target: signals/s end to end: service / bare")
    assert pipe_ratio[1].startswith("**0.50x**") and pipe_ratio[1].endswith(", met")
    assert pipe_ratio[2].startswith("**0.60x**") and pipe_ratio[2].endswith(", met")
    p99_ratio = _row(text, "target: p99 at 1 k/s")
    assert p99_ratio[1].startswith("**4.00x**") and p99_ratio[1].endswith("**NOT met**")
    assert p99_ratio[2].startswith("**2.00x**") and p99_ratio[2].endswith(", met")
    assert _row(text, "every signal one callback")[1:] == ["ok", "ok"]
    # Then a section per broker, Kafka's first, each with its own targets and journal cost.
    kafka, tansu = text.index("## On Apache Kafka ("), text.index("## On Tansu (")
    assert text.index("## The brokers side by side") < kafka < tansu
    assert "(DESIGN.md: the service beside its baselines on Apache Kafka)" in text[kafka:tansu]
    assert "(DESIGN.md: the service beside its baselines on Tansu)" in text[tansu:]
    assert "**0.80x**" in text[kafka:tansu] and "**1.00x**" in text[tansu:]


def test_a_report_of_one_broker_has_no_side_by_side_table() -> None:
    one = ServiceReport(machine=machine_info(), config=QUICK, brokers=[TANSU])
    text = render(one, "cmd", heading="###")
    assert "side by side" not in text and "Apache Kafka" not in text
    assert "### On Tansu (" in text and "**0.60x**" in text


def test_the_json_holds_both_brokers_by_name(tmp_path: Path) -> None:
    path = tmp_path / "out" / "bench-service.json"
    write_json(_two_brokers(), path, "cmd")
    payload = json.loads(path.read_text())
    assert payload["command"] == "cmd"
    assert payload["config"]["throughput_signals"] == QUICK.throughput_signals
    assert list(payload["brokers"]) == ["kafka", "tansu"]  # the order they ran
    kafka, tansu = payload["brokers"]["kafka"], payload["brokers"]["tansu"]
    assert "broker" not in kafka and "config" not in kafka and "machine" not in kafka
    assert kafka["ratios"]["throughput_ratio"] == pytest.approx(0.5)
    assert tansu["ratios"]["throughput_ratio"] == pytest.approx(0.6)
    assert tansu["ratios"]["p99_ratio"] == pytest.approx(2.0)
    assert tansu["durability"]["throughput_ratio"] == pytest.approx(1.0)
    assert "brokers" in payload["units"]


def test_the_broker_option_names_one_broker_or_both_kafka_first() -> None:
    assert brokers_of("both") == ("kafka", "tansu")
    assert brokers_of("kafka") == ("kafka",)
    assert brokers_of("tansu") == ("tansu",)
    with pytest.raises(ValueError, match="--broker"):
        brokers_of("redpanda")


def test_the_brokers_run_kafka_first_on_the_brokers_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, object]] = []

    def measure(config: ServiceBenchConfig, broker: Broker, name: str, **_: object) -> BrokerReport:
        calls.append((name, broker))
        return KAFKA if name == "kafka" else TANSU

    monkeypatch.setattr(bench_service, "run_broker_benchmarks", measure)
    kafka, tansu = cast("Broker", object()), cast("Broker", object())
    running = {"kafka": kafka, "tansu": tansu}  # running already: nothing is started
    report = run_service_benchmarks(QUICK, brokers=("tansu", "kafka"), running=running)
    assert calls == [("kafka", kafka), ("tansu", tansu)]
    assert [b.broker for b in report.brokers] == ["kafka", "tansu"]
    calls.clear()
    assert run_service_benchmarks(QUICK, brokers=("tansu",), running=running).brokers == [TANSU]
    assert calls == [("tansu", tansu)]
    for wrong in ((), ("kafka", "redpanda")):
        with pytest.raises(ValueError, match="brokers"):
            run_service_benchmarks(QUICK, brokers=wrong, running=running)
