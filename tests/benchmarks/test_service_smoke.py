"""Smoke tests of the service benchmark at tiny sizes (tests of the harness, never of speed).

They run the real measurements (the service as a child process on a real embedded broker) and
check that each measures what its label says: every signal produced exactly one callback for
its own operation, the counts add up, latencies are real durations. No assertion depends on
how fast anything is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from purgatory._codec import WatermarkRecord, decode_callback, decode_signal
from tests.benchmarks.bench_service import (
    Arrival,
    bench_kafka_hop,
    bench_latency,
    bench_pipe,
    bench_throughput,
    nth_arrival_ns,
    percentile,
    pipe_output,
    signal_value,
    tally,
)

if TYPE_CHECKING:
    from purgatory.service._broker import EmbeddedBroker

pytestmark = pytest.mark.kafka

WARMUP = b"warmup0"


@pytest.fixture(scope="module")
def broker() -> Iterator[EmbeddedBroker]:
    """A Tansu broker for this module's runs (each run uses topics of its own).

    On Tansu alone: these test the harness, which measures on Tansu (``make bench``), not a
    broker; the service's behaviour on Kafka is what the tests on ``kafka_broker`` show.
    """
    from purgatory.service._broker import EmbeddedBroker  # noqa: PLC0415

    with EmbeddedBroker() as started:
        yield started


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
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    result = bench_throughput(broker, 1_000, register_batch=500, log_dir=tmp_path)
    assert result.signals == 1_000
    assert result.callbacks == result.distinct_ops == 1_000
    assert result.duplicates == result.unexpected == result.not_completed == result.missing == 0
    assert result.end_to_end_s > 0 and result.produce_s > 0
    assert math.isfinite(result.signals_per_s) and result.signals_per_s > 0
    assert result.service_cpu_s > 0  # the service did the work, in its own process


def test_paced_signals_each_complete_one_operation_with_a_real_latency(
    broker: EmbeddedBroker, tmp_path: Path
) -> None:
    result = bench_latency(broker, 500, 1.0, register_batch=500, log_dir=tmp_path)
    assert result.signals == 500
    assert result.callbacks == result.distinct_ops == 500
    assert result.duplicates == result.unexpected == result.not_completed == result.missing == 0
    assert result.without_send_time == 0  # every callback carried its signal's send time
    assert 0 <= result.min_ms <= result.p50_ms <= result.p90_ms <= result.p99_ms <= result.max_ms
    assert result.achieved_per_s > 0


def test_the_pipe_baseline_pipes_every_signal_exactly_once(broker: EmbeddedBroker) -> None:
    result = bench_pipe(broker, 1_000)
    assert result.signals == 1_000
    assert result.outputs == result.distinct_ops == 1_000
    assert result.duplicates == result.unexpected == result.not_completed == result.missing == 0
    assert result.piped == 1_000 + 200  # the warm-up's signals too
    assert result.end_to_end_s > 0 and result.produce_s > 0
    assert math.isfinite(result.signals_per_s) and result.signals_per_s > 0
    assert result.pipe_cpu_s > 0  # the pipe did the work, in its own process


def test_the_hop_baseline_receives_every_record_once_with_a_real_latency(
    broker: EmbeddedBroker,
) -> None:
    result = bench_kafka_hop(broker, 500, 1.0, linger_ms=5, fetch_max_wait_ms=5)
    assert (result.linger_ms, result.fetch_max_wait_ms) == (5, 5)
    assert result.records == result.received == result.distinct == 500
    assert 0 <= result.p50_ms <= result.p90_ms <= result.p99_ms <= result.max_ms
