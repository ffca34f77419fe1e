"""The service's own cost per signal, with no broker: the whole pipeline over the in-memory one.

``python -m tests.benchmarks.bench_pipeline [--signals N] [--repeat R]`` runs the service as
``serve`` does (journal on, acknowledged delivery, 2 partitions) over
:class:`tests.service.fake_kafka.FakeTransport` (acknowledgements at once, polls of 500
records, as the Kafka source's), on trio's real clock, in this process. It registers ``N``
operations through the requests topic (one key each), then appends ``N`` signals and counts
the CPU seconds of the process until their ``N`` callbacks are written (with the garbage
collector tuned as ``serve`` tunes it): intake, decode,
engine, journal encode and group commit, release, outbox, encode, acknowledgements, metrics,
and trio's scheduling, without kafka-python's fetch and produce or a broker sharing the CPUs.
So it separates the service's Python from the client library's, and changes to the pipeline
can be compared to within a few percent (the end-to-end figures of
:mod:`tests.benchmarks.bench_service` move by 10% between runs on 2 cores).

Reported: the best and the median of ``R`` runs, in µs of CPU per signal.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence

import trio

from purgatory._codec import encode_request, encode_signal
from purgatory._codec._records import RegisterRequest, SignalRecord
from purgatory.service.app import Service, topics_of
from purgatory.service.run import _tune_gc
from purgatory.service.settings import Settings
from purgatory.service.telemetry.logging import configure_logging
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport

__all__ = ["run_pipeline"]

_SCOPES = 8
_POLL_S = 0.001


async def _wait_for(count: int, broker: FakeBroker, topic: str, timeout_s: float) -> None:
    with trio.fail_after(timeout_s):
        while sum(len(part) for part in broker.topics[topic]) < count:
            await trio.sleep(_POLL_S)


async def _run(signals: int) -> float:
    settings = Settings.from_env({}, topic_partitions=2, log_level="warning")
    broker = FakeBroker({t: 2 for t in topics_of(settings)})
    fake = FakeTransport(broker, ack_delay_s=0.0, max_batch=500)
    for i in range(signals):
        scope = f"s{i % _SCOPES}"
        request = RegisterRequest(op_id=f"o{i}", scope=scope, keys=(f"k{i}",), timeout_ms=3_600_000)
        broker.append(settings.topic_requests, scope.encode(), encode_request(request))
    stop = trio.Event()
    topics = [settings.topic_requests, settings.topic_signals]
    cpu_s = 0.0
    async with (
        fake.open_sink() as sink,
        fake.open_reader() as reader,
        fake.open_source(topics=topics, group_id="g", assignment=None) as source,
        trio.open_nursery() as nursery,
    ):
        service = Service(settings, Clock(), source, sink, reader)
        nursery.start_soon(lambda: service.run(stop, serve_http=False))
        requests = broker.topics[settings.topic_requests]
        with trio.fail_after(120):  # every registration applied, journaled and committed
            while any(
                broker.committed.get((settings.topic_requests, p), 0) < len(log)
                for p, log in enumerate(requests)
            ):
                await trio.sleep(_POLL_S)
        started = time.process_time()
        for i in range(signals):
            scope = f"s{i % _SCOPES}"
            value = encode_signal(SignalRecord(scope, f"k{i}", None, None))
            broker.append(settings.topic_signals, scope.encode(), value)
        await _wait_for(signals, broker, settings.topic_callbacks, 300)
        cpu_s = time.process_time() - started
        stop.set()
    return cpu_s / signals * 1e6


def run_pipeline(signals: int, repeat: int) -> list[float]:
    """µs of CPU per signal of each of ``repeat`` runs of ``signals`` signals."""
    return [trio.run(_run, signals) for _ in range(repeat)]


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's documentation)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_pipeline", description=__doc__
    )
    parser.add_argument("--signals", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    configure_logging("warning", "console")
    _tune_gc()  # as ``serve`` does
    runs = run_pipeline(args.signals, args.repeat)
    print(
        f"{args.signals} signals x {args.repeat}: best {min(runs):.1f} µs CPU per signal,"
        f" median {statistics.median(runs):.1f} ({', '.join(f'{r:.1f}' for r in runs)})"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
