"""Where a signal's CPU goes: py-spy samples the service through measurement 1's burst.

``python -m tests.benchmarks.profile_service [--broker tansu|kafka] [--signals N] [--out DIR]``
starts the broker and the service as :mod:`tests.benchmarks.bench_service` does, registers
``N`` operations, then sends ``N`` signals as one burst while ``py-spy record`` samples every
thread of the service (200 Hz, ``--nonblocking``: the service is never stopped to be read). It
writes the flame graph (``profile-<broker>.svg``), the raw folded stacks
(``profile-<broker>.txt``) and prints the share of the samples by stage: each sample is
charged to the first stage, from the innermost frame outwards, whose module prefix its stack
holds (see :data:`STAGES`), so a share is CPU spent *in* that stage's own code or in what it
calls that no inner stage claims (the standard library, kafka-python internals).

py-spy is in the ``dev`` extra; on Linux it needs ptrace rights over the child (the default
``kernel.yama.ptrace_scope`` of 1 allows a parent's descendants, as here).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

import httpx

from purgatory.devtools.broker import Broker
from purgatory.devtools.dev_broker import open_dev_broker
from tests.benchmarks._measure import quiet_kafka_warnings
from tests.benchmarks.bench_service import (
    _HTTP_TIMEOUT_S,
    _WARMUP_KEY,
    CallbackReader,
    ServiceProcess,
    _paced_send,
    _producer,
    _signal_records,
    _timed_burst,
    _warm_up,
    register_range,
)

# (stage, module-path fragments): a sample goes to the first stage, scanning its frames from
# the innermost, whose fragment one of the frames contains. Order matters only between stages
# that call each other; inner frames are scanned first, so a stage's callees that belong to
# another stage are charged to that one.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("metrics (prometheus-client)", ("prometheus_client/",)),
    ("logging", ("structlog/", "/telemetry/logging")),
    ("service metrics", ("/service/telemetry/",)),
    ("codec: decode inputs", ("_codec/_inbound", "_codec/_fastpath", "_codec/_records")),
    ("codec: encode outputs", ("_codec/_json", "_codec/_outbound", "_codec/_dead_letters")),
    ("journal: encode", ("_core/durability/", "/service/journal/format", "_core/_compact")),
    ("engine and wheel", ("_core/engine/", "_core/wheel/", "_core/flink/")),
    ("kafka-python: fetch and decode", ("kafka/consumer/", "kafka/record/")),
    ("kafka-python: produce", ("kafka/producer/",)),
    ("kafka-python: network", ("kafka/client_async", "kafka/conn", "kafka/protocol/")),
    ("journal: changelog and release", ("/service/journal/",)),
    ("outbox and acknowledgements", ("/service/egress/", "/service/acks")),
    ("dispatch and admission", ("/service/dispatch/", "/service/ownership/")),
    ("intake", ("/service/ingress/",)),
    ("source and sink threads", ("/service/kafka/",)),
    ("HTTP server", ("hypercorn/", "starlette/", "h11/")),
    ("trio scheduler and hand-offs", ("trio/", "outcome/")),
    ("idle (selectors, locks)", ("selectors.py", "threading.py")),
)


def stage_of(stack: str) -> str:
    """The stage a folded stack (``frame;frame;...``, outermost first) is charged to."""
    frames = stack.split(";")
    for frame in reversed(frames):
        for name, fragments in STAGES:
            if any(fragment in frame for fragment in fragments):
                return name
    return "other"


def shares(folded_lines: Iterable[str]) -> dict[str, float]:
    """Each stage's share of the samples in py-spy's raw (folded) output, largest first."""
    counts: Counter[str] = Counter()
    for line in folded_lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if stack and count.isdigit():
            counts[stage_of(stack)] += int(count)
    total = sum(counts.values()) or 1
    return {name: n / total for name, n in counts.most_common()}


def _record(pid: int, out: Path, fmt: str) -> subprocess.Popen[bytes]:
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    command = [py_spy, "record", "--pid", str(pid), "--rate", "200", "--nonblocking", "--gil"]
    command += ["--format", fmt, "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _stop(recorder: subprocess.Popen[bytes]) -> None:
    recorder.send_signal(signal.SIGINT)
    try:
        _, err = recorder.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        recorder.kill()
        raise
    if recorder.returncode not in (0, -signal.SIGINT):
        raise RuntimeError(f"py-spy failed ({recorder.returncode}): {err.decode()[-2000:]}")


def _paced(
    broker: Broker,
    service: ServiceProcess,
    reader: CallbackReader,
    records: list[tuple[bytes, bytes]],
    rate_per_s: int,
) -> float:
    """Send ``records`` at ``rate_per_s``, wait for their callbacks; the service's CPU
    seconds meanwhile."""
    producer = _producer(broker.bootstrap_servers, linger_ms=5)
    topic = service.settings.topic_signals
    try:
        producer.partitions_for(topic)
        before = service.cpu_s()
        _paced_send(producer, topic, len(records), rate_per_s, records.__getitem__)
        producer.flush(60)
        if not reader.wait(lambda: reader.counted >= len(records), 120):
            raise RuntimeError(f"only {reader.counted} callbacks; {service.log_tail()}")
        return service.cpu_s() - before
    finally:
        producer.close(5)


def profile(
    broker_name: str, signals: int, out: Path, *, rate_per_s: int = 0, partitions: int = 2
) -> dict[str, float]:
    """Profile ``signals`` on ``broker_name``, sent as one burst (or at ``rate_per_s``);
    write the SVG and folded stacks to ``out``; return the stage shares (also written as
    ``profile-<broker>.json``)."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"profile-{broker_name}" + (f"-{rate_per_s}" if rate_per_s else "")
    svg, folded = out / f"{name}.svg", out / f"{name}.txt"
    with contextlib.ExitStack() as stack:
        log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        broker = stack.enter_context(open_dev_broker(broker_name))
        service = stack.enter_context(
            ServiceProcess(broker, partitions=partitions, log_dir=log_dir)
        )
        http = stack.enter_context(httpx.Client(base_url=service.url, timeout=_HTTP_TIMEOUT_S))
        reader = stack.enter_context(
            CallbackReader(
                broker.bootstrap_servers, service.settings.topic_callbacks, partitions, _WARMUP_KEY
            )
        )
        _warm_up(service, http, reader)
        register_range(http, range(signals), batch=10_000, scopes=8)
        records = _signal_records(signals, 8)
        recorders = [_record(service.pid, folded, "raw"), _record(service.pid, svg, "flamegraph")]
        try:
            if rate_per_s:
                cpu_s = _paced(broker, service, reader, records, rate_per_s)
            else:
                _, _, _, cpu, cpu_after = _timed_burst(
                    broker,
                    service.settings.topic_signals,
                    records,
                    reader,
                    subject_cpu_s=service.cpu_s,
                    missing=lambda: f"callbacks arrived; {service.log_tail()}",
                )
                cpu_s = cpu_after[0] - cpu[0]
        finally:
            for recorder in recorders:
                _stop(recorder)
    result = shares(folded.read_text().splitlines())
    cpu_us = cpu_s / signals * 1e6
    summary = {
        "broker": broker_name,
        "signals": signals,
        "rate_per_s": rate_per_s,
        "service_cpu_us_per_signal": cpu_us,
    }
    (out / f"{name}.json").write_text(json.dumps({**summary, "shares": result}, indent=2) + "\n")
    how = f"at {rate_per_s}/s" if rate_per_s else "in one burst"
    print(f"{broker_name}: {signals} signals {how}, service CPU {cpu_us:.0f} µs per signal")
    for name, share in result.items():
        print(f"  {share:6.1%}  {name}")
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (see the module's documentation)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.profile_service", description=__doc__
    )
    parser.add_argument("--broker", choices=("tansu", "kafka"), default="tansu")
    parser.add_argument("--signals", type=int, default=50_000)
    parser.add_argument("--rate", type=int, default=0, help="signals per second (0: a burst)")
    parser.add_argument("--out", type=Path, default=Path("docs"))
    args = parser.parse_args(argv)
    with quiet_kafka_warnings():
        profile(args.broker, args.signals, args.out, rate_per_s=args.rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
