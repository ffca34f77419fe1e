"""Restoring a partition from the changelog: journal bytes, replay, snapshot (harness).

``python -m tests.benchmarks.bench_restore [--quick] [--out DIR] [--sizes N,...] [--batch B]``
starts one embedded broker (Tansu, in memory) in this process and, for each size ``N``
(100 k and 1 M; ``--quick``: 10 k and 100 k), journals, snapshots and restores one input
partition the way the service does, over the real Kafka clients on loopback.

The workload (drawn beforehand, deterministic): ``N`` registrations in scopes ``s0..s99``, each
with a UUID ``op_id``, 1 to 3 watch keys (``part-<i>-<j>``, condition ``all``), a processing-time
deadline one hour after its arrival (``timeout_ms`` 3 600 000, so nothing expires during a run)
and, on one in four, a small JSON payload; inputs arrive at 50 per simulated millisecond. Every
key of every tenth operation is signalled 1 000 registrations after it (one signal in two with a
small JSON payload), which completes ~10 % of them; the clock advances every 200 simulated ms
(the reaper's longest sleep). The times are epoch milliseconds from 2026-01-01.

1. **Journal**: an ``Engine(partition=0, journal=changelog.journal_for(0))`` is fed the inputs
   by a :class:`~purgatory.service.journal.changelog.Changelog` writing to the changelog topic
   through
   the service's own sink (``kafka_transport(settings).open_sink()``). After every batch of
   ``B`` inputs (10 000 by default: the service's ``max_batch``, an HTTP batch) the input
   positions are recorded and ``durable()`` awaited, as the HTTP path answers a batch; the
   delivered mark is the outcome sequence reached at the previous acknowledgement. Reported:
   record-value bytes per input entry (envelope included), entries per record, inputs per wall
   second up to the last acknowledgement, and the CPU of the thread that applies the inputs
   (``time.thread_time``). Baseline: the same inputs into an ``Engine`` without a journal, on
   the same thread, so the journal's CPU per input is the difference.
2. **Restore from the journal alone**: ``restore_partition(snapshots_topic=None)`` with the
   service's :class:`~purgatory.service.kafka.reader.KafkaLogReader`. The reader is wrapped so
   that the time spent inside the handler (decode and replay, in the reader's thread) is
   measured; the rest of ``Progress.tail_s`` is the fetch (broker round trips and kafka-python's
   parsing of record batches). A second read with a decode-only handler (``json.loads`` of each
   record and ``decode_entry`` of each row) splits the handler into decode and replay; a read
   with a no-op handler is the fetch alone.
3. **Snapshot**: ``snapshot_engine`` of the live engine (CPU seconds, ``time.process_time``,
   bytes), written with ``write_snapshot`` through the same sink (wall seconds, chunks); then a
   short tail is journaled after it (``N / 100`` registrations, 100 at least, each completed by a
   signal, and a clock advance), and the partition is restored from the snapshot plus that tail:
   ``Progress.fetch_s`` (``find_latest`` and the chunks), ``rebuild_s`` (``restore_engine``),
   ``tail_s``, the RSS it added and the process's peak RSS (``ru_maxrss``).
4. **Baseline** (the project's rule: beside a baseline in the same run): the same pending
   operations rebuilt by calling ``Engine.register`` one by one on a fresh engine (specs already
   built, no decoding), what a restore without the bulk path would cost at the least, beside
   ``restore_engine`` on the snapshot bytes (the bulk path, decoding included), both in CPU
   seconds, in memory; once more each with the collector paused, to show its share.

Every restore is checked against the live engine: the same pending count (``N`` minus the
completed ones), signals remembered, outcome counts, sequence, clock and input positions; the
engine without a journal must reach the same state too. Times are wall seconds
(``time.perf_counter``, and trio's clock inside ``Progress``) unless named CPU; the garbage
collector runs during every timed step, blind to what existed before it (the precomputed
inputs, the engines of earlier steps), as in a service that holds only what it restored. The
broker, kafka-python's threads and this process share the machine's CPUs; the broker's CPU
seconds are reported beside the figures. The target (DESIGN.md): a restore of 1 M pending
operations in <= 30 s, checked at each size of at least 1 M registrations (900 k of them still
pending), its seconds scaled linearly to 1 M pending. The report is a markdown table with the
machine and the command, and ``DIR/bench-restore.json`` (``DIR`` defaults to ``docs``).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import random
import resource
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import trio

from purgatory._core import (
    AdvanceEntry,
    Engine,
    EngineConfig,
    EngineStatistics,
    JournalEntry,
    OperationSpec,
    RegisterEntry,
    SignalEntry,
    decode_entry,
    encode_entry,
    restore_engine,
    snapshot_engine,
)
from purgatory.devtools.broker import EmbeddedBroker
from purgatory.service.app import kafka_transport
from purgatory.service.journal.acknowledged import AcknowledgedWriter
from purgatory.service.journal.changelog import Changelog
from purgatory.service.journal.format import decode_journal_record
from purgatory.service.journal.restore import Progress, Restored, restore_partition
from purgatory.service.kafka.transport import ConsumedRecord, LogReader
from purgatory.service.settings import Settings
from purgatory.service.snapshots.snapshots import write_snapshot
from tests.benchmarks._measure import (
    gc_paused,
    gc_running_on_new_objects,
    machine_info,
    quiet_kafka_warnings,
)
from tests.benchmarks.bench_service import process_cpu_s

__all__ = [
    "FULL",
    "QUICK",
    "BaselineResult",
    "JournalRestoreResult",
    "JournalResult",
    "RestoreBenchConfig",
    "RestoreReport",
    "SizeResult",
    "SnapshotResult",
    "Target",
    "TimedReader",
    "Workload",
    "bench_size",
    "evaluate_targets",
    "main",
    "make_tail",
    "make_workload",
    "render",
    "run_restore_benchmarks",
    "write_json",
]

#: DESIGN.md: a restore of 1 M pending operations takes at most this long.
TARGET_RESTORE_S = 30.0
TARGET_PENDING = 1_000_000

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z: the service's clock is epoch ms
TIMEOUT_MS = 3_600_000  # every deadline is one hour after its registration
SCOPES = 100
INPUTS_PER_MS = 50  # 50 k inputs per simulated second
ADVANCE_EVERY_MS = 200  # PURGATORY_REAPER_MAX_SLEEP_MS: the reaper steps at least this often
COMPLETE_EVERY = 10  # every tenth operation is completed by signals
SIGNAL_LAG = 1_000  # its keys are signalled this many registrations later
_OP_PAYLOAD = '{"job":"etl-nightly","attempt":1,"owner":"team-data"}'
_SIGNAL_PAYLOAD = '{"rows":123456,"bytes":987654321,"ok":true}'
_MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class RestoreBenchConfig:
    """Sizes of one run: ``sizes`` registrations per partition, ``batch`` inputs per
    ``durable()``, ``seed`` of the workload, ``timeout_s_per_million`` the bound of one size."""

    sizes: tuple[int, ...]
    batch: int = 10_000
    seed: int = 7
    timeout_s_per_million: float = 1_200.0


FULL = RestoreBenchConfig(sizes=(100_000, 1_000_000))
QUICK = RestoreBenchConfig(sizes=(10_000, 100_000))


# -- the workload -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Workload:
    """The inputs of one partition, in arrival order, as the core's typed journal entries."""

    inputs: list[JournalEntry]
    registrations: int
    signals: int
    advances: int
    completed: int  # operations the signals complete
    positions: list[dict[str, int]]  # the input positions reached after each batch


def _op_id(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def make_workload(n: int, *, batch: int, seed: int, settings: Settings) -> Workload:
    """``n`` registrations, the signals that complete every tenth, and the clock advances."""
    rng = random.Random(seed)
    inputs: list[JournalEntry] = []
    keys: list[tuple[str, ...]] = []
    counts = {"register": 0, "signal": 0, "advance": 0}
    next_advance_ms = START_MS + ADVANCE_EVERY_MS

    def now() -> int:
        return START_MS + len(inputs) // INPUTS_PER_MS

    def add(entry: JournalEntry, kind: str) -> None:
        nonlocal next_advance_ms
        if now() >= next_advance_ms:
            inputs.append(AdvanceEntry(now()))
            counts["advance"] += 1
            next_advance_ms += ADVANCE_EVERY_MS
        inputs.append(entry)
        counts[kind] += 1

    def signal_all(i: int) -> None:
        for j, key in enumerate(keys[i]):
            payload = _SIGNAL_PAYLOAD if (i // COMPLETE_EVERY + j) % 2 == 0 else None
            add(SignalEntry(now(), f"s{i % SCOPES}", key, None, payload), "signal")

    for i in range(n):
        op_keys = tuple(f"part-{i:08d}-{j}" for j in range(1 + rng.randrange(3)))
        keys.append(op_keys)
        at = now()
        spec = OperationSpec(
            op_id=_op_id(rng),
            scope=f"s{i % SCOPES}",
            keys=op_keys,
            deadline_ms=at + TIMEOUT_MS,
            payload=_OP_PAYLOAD if i % 4 == 0 else None,
            timeout_ms=TIMEOUT_MS,
        )
        add(RegisterEntry(at, spec), "register")
        late = i - SIGNAL_LAG
        if late >= 0 and late % COMPLETE_EVERY == 0:
            signal_all(late)
    for i in range(max(0, n - SIGNAL_LAG), n):
        if i % COMPLETE_EVERY == 0:
            signal_all(i)
    inputs.append(AdvanceEntry(now()))
    counts["advance"] += 1
    positions: list[dict[str, int]] = []
    requests = signals = 0
    for start in range(0, len(inputs), batch):
        for entry in inputs[start : start + batch]:
            if isinstance(entry, RegisterEntry):
                requests += 1
            elif isinstance(entry, SignalEntry):
                signals += 1
        positions.append({settings.topic_requests: requests, settings.topic_signals: signals})
    return Workload(
        inputs=inputs,
        registrations=counts["register"],
        signals=counts["signal"],
        advances=counts["advance"],
        completed=(n + COMPLETE_EVERY - 1) // COMPLETE_EVERY,
        positions=positions,
    )


def make_tail(count: int, *, start_ms: int) -> list[JournalEntry]:
    """The journal after a snapshot: ``count`` short operations, each completed by a signal."""
    tail: list[JournalEntry] = []
    for i in range(count):
        at = start_ms + i // INPUTS_PER_MS
        spec = OperationSpec(
            op_id=f"tail-{i:08d}",
            scope=f"s{i % SCOPES}",
            keys=(f"tail-key-{i:08d}",),
            deadline_ms=at + TIMEOUT_MS,
            timeout_ms=TIMEOUT_MS,
        )
        tail.append(RegisterEntry(at, spec))
    end_ms = start_ms + count // INPUTS_PER_MS
    tail += [SignalEntry(end_ms, f"s{i % SCOPES}", f"tail-key-{i:08d}", None, None)
             for i in range(count)]  # fmt: skip
    tail.append(AdvanceEntry(end_ms + 1))
    return tail


def _apply(engine: Engine, inputs: Sequence[JournalEntry]) -> None:
    """Apply inputs through the engine's public calls (what the intake and HTTP layer do)."""
    register, signal, advance = engine.register, engine.signal, engine.advance_clock
    for entry in inputs:
        if isinstance(entry, RegisterEntry):
            register(entry.spec, now_ms=entry.now_ms)
        elif isinstance(entry, SignalEntry):
            signal(entry.scope, entry.key, now_ms=entry.now_ms, event_time_ms=entry.event_time_ms,
                   payload=entry.payload)  # fmt: skip
        elif isinstance(entry, AdvanceEntry):
            advance(entry.now_ms)
        else:
            raise TypeError(f"the workload holds no {type(entry).__name__}")


def _state(engine: Engine) -> tuple[int, ...]:
    """What two engines that applied the same inputs must agree on (watch lists and wheel
    buckets aside: completed operations linger in the live engine's until a purge)."""
    s: EngineStatistics = engine.statistics()
    return (s.pending, s.signals, s.completed, s.expired, s.cancelled, s.sequence, s.clock_ms)


# -- a reader that times its handler ------------------------------------------------------------


class TimedReader:
    """A :class:`~purgatory.service.kafka.transport.LogReader` that measures the handler it is
    given.

    ``handle_s`` and ``handle_cpu_s`` add up the wall and thread-CPU seconds spent inside the
    handler (which runs in the reader's worker thread); the rest of a read is the fetch.
    """

    def __init__(self, reader: LogReader) -> None:
        self._reader = reader
        self.handle_s = 0.0
        self.handle_cpu_s = 0.0

    def reset(self) -> None:
        """Start counting from zero."""
        self.handle_s = self.handle_cpu_s = 0.0

    async def read(
        self,
        topic: str,
        partition: int,
        start: int,
        handle: Callable[[list[ConsumedRecord]], None],
    ) -> int:
        """Read as the wrapped reader does, timing ``handle``."""

        def timed_handle(batch: list[ConsumedRecord]) -> None:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                handle(batch)
            finally:
                self.handle_s += time.perf_counter() - wall
                self.handle_cpu_s += time.thread_time() - cpu

        return await self._reader.read(topic, partition, start, timed_handle)

    async def end_offset(self, topic: str, partition: int) -> int:
        """The wrapped reader's answer."""
        return await self._reader.end_offset(topic, partition)

    async def partition_count(self, topic: str) -> int:
        """The wrapped reader's answer."""
        return await self._reader.partition_count(topic)


# -- results ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class JournalResult:
    """Part 1: the journal written through the real sink, beside the engine alone."""

    inputs: int
    registrations: int
    signals: int
    advances: int
    completed: int
    batch: int
    records: int
    entries: int
    bytes: int
    bytes_per_entry: float
    entries_per_record: float
    register_entry_bytes: float  # mean encoded row (JSON) of each kind, without the envelope
    signal_entry_bytes: float
    write_s: float  # first input to the last durable(), wall
    entries_per_s: float
    apply_cpu_s: float  # thread CPU applying the inputs (engine + journal encoding)
    process_cpu_s: float  # this process, every thread (kafka-python's included)
    broker_cpu_s: float
    plain_cpu_s: float  # baseline: the same inputs, engine without a journal, thread CPU
    plain_inputs_per_s: float
    journal_us_per_input: float  # apply_cpu_s - plain_cpu_s, per input
    same_state: bool  # the journaled engine and the plain one agree


@dataclass(frozen=True, slots=True)
class JournalRestoreResult:
    """Part 2: ``restore_partition`` from the journal alone."""

    seconds: float
    records: int
    entries: int
    bytes: int
    fetch_s: float  # tail_s minus the time inside the handler
    decode_s: float  # the handler of a decode-only read
    decode_cpu_s: float  # its thread CPU
    replay_s: float  # the restore's handler minus decode_s
    handler_s: float
    handler_cpu_s: float
    read_only_s: float  # a read with a no-op handler
    decode_read_s: float  # the decode-only read, whole
    entries_per_s: float
    pending: int
    process_cpu_s: float
    broker_cpu_s: float
    seconds_per_million_pending: float
    ok: bool


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    """Part 3: the snapshot written, then a restore from it and a short tail."""

    pending: int
    bytes: int
    bytes_per_pending: float
    snapshot_cpu_s: float
    write_s: float
    chunks: int
    tail_inputs: int
    seconds: float
    fetch_s: float
    rebuild_s: float
    tail_s: float
    tail_records: int
    rss_growth_bytes: int  # VmRSS across the restore
    peak_rss_bytes: int  # ru_maxrss of this process so far
    process_cpu_s: float  # this process during the restore, every thread
    broker_cpu_s: float
    seconds_per_million_pending: float
    ok: bool


@dataclass(frozen=True, slots=True)
class BaselineResult:
    """Part 4: the same pending operations registered one by one on a fresh engine, beside
    ``restore_engine`` on the snapshot bytes (the bulk path, decoding included), in CPU seconds
    of this process; each with the collector running (blind to older objects) and paused."""

    operations: int
    register_cpu_s: float
    register_wall_s: float
    register_per_s: float
    bulk_cpu_s: float
    bulk_per_s: float
    register_gc_paused_cpu_s: float
    bulk_gc_paused_cpu_s: float
    ok: bool


@dataclass(frozen=True, slots=True)
class SizeResult:
    """Everything measured at one size."""

    n: int
    journal: JournalResult
    journal_restore: JournalRestoreResult
    snapshot: SnapshotResult
    baseline: BaselineResult
    peak_rss_bytes: int
    wall_s: float


@dataclass(frozen=True, slots=True)
class Target:
    """One DESIGN.md target and whether this run met it."""

    name: str
    measured: str
    required: str
    met: bool


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """Everything one run produced."""

    machine: dict[str, str | int]
    config: RestoreBenchConfig
    sizes: list[SizeResult]
    targets: list[Target] = field(default_factory=list)
    wall_s: float = 0.0


# -- measuring ----------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def _mean_entry_bytes(inputs: Sequence[JournalEntry], kind: type) -> float:
    sample = [e for e in inputs[:20_000] if type(e) is kind]
    sizes = [len(json.dumps(encode_entry(e), separators=(",", ":")).encode()) for e in sample]
    return sum(sizes) / len(sizes) if sizes else 0.0


def _run_plain(workload: Workload, config: EngineConfig) -> tuple[float, tuple[int, ...]]:
    """The baseline of part 1: thread CPU seconds to apply the inputs without a journal."""
    engine = Engine(config, partition=0)
    with gc_running_on_new_objects():
        cpu = time.thread_time()
        _apply(engine, workload.inputs)
        cpu_s = time.thread_time() - cpu
    return cpu_s, _state(engine)


def _decode_only(batch: list[ConsumedRecord]) -> None:
    for record in batch:
        doc = decode_journal_record(record.value or b"")
        if doc is not None:
            for row in doc["entries"]:
                decode_entry(row)


def _ignore(_batch: list[ConsumedRecord]) -> None:
    pass


@dataclass
class _Kafka:
    """What the Kafka part hands back to the in-memory parts that follow it."""

    journal: JournalResult
    journal_restore: JournalRestoreResult
    snapshot: SnapshotResult
    engine: Engine
    data: bytes


async def _kafka_part(
    broker: EmbeddedBroker,
    settings: Settings,
    workload: Workload,
    plain: tuple[float, tuple[int, ...]],
    *,
    n: int,
    batch: int,
    changelog_topic: str,
    snapshots_topic: str,
    timeout_s: float,
    say: Callable[[str], None],
) -> _Kafka:
    with trio.fail_after(timeout_s):
        return await _measure_kafka(
            broker,
            settings,
            workload,
            plain,
            n=n,
            batch=batch,
            changelog_topic=changelog_topic,
            snapshots_topic=snapshots_topic,
            say=say,
        )


async def _measure_kafka(
    broker: EmbeddedBroker,
    settings: Settings,
    workload: Workload,
    plain: tuple[float, tuple[int, ...]],
    *,
    n: int,
    batch: int,
    changelog_topic: str,
    snapshots_topic: str,
    say: Callable[[str], None],
) -> _Kafka:
    config = settings.to_engine_config()
    transport = kafka_transport(settings)
    pid = broker.pid or 0
    async with transport.open_sink() as sink, transport.open_reader() as kafka_reader:
        reader = TimedReader(kafka_reader)
        delivered = [0]
        writer = AcknowledgedWriter(
            sink, topic=changelog_topic, delivered=lambda _partition: delivered[0]
        )
        changelog = Changelog(writer, max_record_bytes=settings.max_record_bytes)
        async with trio.open_nursery() as nursery:
            await nursery.start(changelog.run)
            engine = Engine(config, partition=0, journal=changelog.journal_for(0))

            say(f"{n:,}: journal through the sink, durable() every {batch:,} inputs")
            inputs = workload.inputs
            apply_cpu = 0.0
            positions: dict[str, int] = {}
            broker0, cpu0, wall0 = process_cpu_s(pid), time.process_time(), time.perf_counter()
            with gc_running_on_new_objects():
                for index, start in enumerate(range(0, len(inputs), batch)):
                    cpu = time.thread_time()
                    _apply(engine, inputs[start : start + batch])
                    positions = workload.positions[index]
                    for topic, offset in positions.items():
                        changelog.position(0, topic, offset)
                    apply_cpu += time.thread_time() - cpu
                    await changelog.durable()
                    delivered[0] = engine.statistics().sequence  # released, then delivered
            write_s = time.perf_counter() - wall0
            process_s, broker_s = time.process_time() - cpu0, process_cpu_s(pid) - broker0
            stats = changelog.statistics()
            live = _state(engine)
            plain_cpu_s, plain_state = plain
            journal = JournalResult(
                inputs=len(inputs),
                registrations=workload.registrations,
                signals=workload.signals,
                advances=workload.advances,
                completed=workload.completed,
                batch=batch,
                records=stats.records,
                entries=stats.entries,
                bytes=stats.bytes,
                bytes_per_entry=stats.bytes / stats.entries,
                entries_per_record=stats.entries / stats.records,
                register_entry_bytes=_mean_entry_bytes(inputs, RegisterEntry),
                signal_entry_bytes=_mean_entry_bytes(inputs, SignalEntry),
                write_s=write_s,
                entries_per_s=stats.entries / write_s,
                apply_cpu_s=apply_cpu,
                process_cpu_s=process_s,
                broker_cpu_s=broker_s,
                plain_cpu_s=plain_cpu_s,
                plain_inputs_per_s=len(inputs) / plain_cpu_s,
                journal_us_per_input=(apply_cpu - plain_cpu_s) / len(inputs) * 1e6,
                same_state=live == plain_state
                and stats.entries == len(inputs)
                and live[2] == workload.completed
                and live[0] == n - workload.completed,
            )
            journal_end = await reader.end_offset(changelog_topic, 0)

            say(f"{n:,}: restore from the journal alone")
            reader.reset()
            with gc_running_on_new_objects():
                wall = time.perf_counter()
                await reader.read(changelog_topic, 0, 0, _ignore)
                read_only_s = time.perf_counter() - wall
            reader.reset()
            with gc_running_on_new_objects():
                wall = time.perf_counter()
                await reader.read(changelog_topic, 0, 0, _decode_only)
                decode_read_s = time.perf_counter() - wall
            decode_s, decode_cpu_s = reader.handle_s, reader.handle_cpu_s
            reader.reset()
            progress = Progress(0)
            broker0, cpu0 = process_cpu_s(pid), time.process_time()
            with gc_running_on_new_objects():
                restored = await restore_partition(
                    reader,
                    topic=changelog_topic,
                    snapshots_topic=None,
                    partition=0,
                    config=config,
                    journal=None,
                    progress=progress,
                )
            process_s, broker_s = time.process_time() - cpu0, process_cpu_s(pid) - broker0
            seconds = progress.seconds or 0.0
            pending = restored.engine.statistics().pending
            journal_restore = JournalRestoreResult(
                seconds=seconds,
                records=progress.records,
                entries=progress.entries,
                bytes=progress.bytes,
                fetch_s=progress.tail_s - reader.handle_s,
                decode_s=decode_s,
                decode_cpu_s=decode_cpu_s,
                replay_s=reader.handle_s - decode_s,
                handler_s=reader.handle_s,
                handler_cpu_s=reader.handle_cpu_s,
                read_only_s=read_only_s,
                decode_read_s=decode_read_s,
                entries_per_s=progress.entries / seconds,
                pending=pending,
                process_cpu_s=process_s,
                broker_cpu_s=broker_s,
                seconds_per_million_pending=seconds * 1e6 / pending,
                ok=_restored_ok(restored, live, positions, journal_end, progress.entries),
            )
            del restored
            gc.collect()

            say(f"{n:,}: snapshot of {live[0]:,} pending operations, written through the sink")
            with gc_running_on_new_objects():
                cpu = time.process_time()
                data = snapshot_engine(engine)
                snapshot_cpu_s = time.process_time() - cpu
            wall = time.perf_counter()
            manifest = await write_snapshot(
                sink,
                topic=snapshots_topic,
                data=data,
                partition=0,
                journal_offset=journal_end,
                clock_ms=engine.clock_ms,
                input_positions=positions,
                delivered=delivered[0],
                max_record_bytes=settings.max_record_bytes,
            )
            write_s = time.perf_counter() - wall
            tail_ops = max(100, n // 100)
            tail = make_tail(tail_ops, start_ms=engine.clock_ms + 1)
            _apply(engine, tail)
            positions = {t: o + tail_ops for t, o in positions.items()}  # one record per input
            for topic, offset in positions.items():
                changelog.position(0, topic, offset)
            await changelog.durable()
            delivered[0] = engine.statistics().sequence
            live = _state(engine)
            journal_end = await reader.end_offset(changelog_topic, 0)

            say(f"{n:,}: restore from the snapshot and a tail of {len(tail):,} inputs")
            reader.reset()
            progress = Progress(0)
            broker0, cpu0 = process_cpu_s(pid), time.process_time()
            rss0 = _rss_bytes()
            with gc_running_on_new_objects():
                restored = await restore_partition(
                    reader,
                    topic=changelog_topic,
                    snapshots_topic=snapshots_topic,
                    partition=0,
                    config=config,
                    journal=None,
                    progress=progress,
                )
            rss_growth = _rss_bytes() - rss0
            process_s, broker_s = time.process_time() - cpu0, process_cpu_s(pid) - broker0
            seconds = progress.seconds or 0.0
            changelog.close()
        ok = _restored_ok(restored, live, positions, journal_end, len(tail))
        ok = ok and progress.snapshot_pending == n - workload.completed
        del restored
        gc.collect()
        snapshot = SnapshotResult(
            pending=n - workload.completed,
            bytes=len(data),
            bytes_per_pending=len(data) / (n - workload.completed),
            snapshot_cpu_s=snapshot_cpu_s,
            write_s=write_s,
            chunks=manifest.chunks,
            tail_inputs=len(tail),
            seconds=seconds,
            fetch_s=progress.fetch_s,
            rebuild_s=progress.rebuild_s,
            tail_s=progress.tail_s,
            tail_records=progress.records,
            rss_growth_bytes=rss_growth,
            peak_rss_bytes=_peak_rss_bytes(),
            process_cpu_s=process_s,
            broker_cpu_s=broker_s,
            seconds_per_million_pending=seconds * 1e6 / (n - workload.completed),
            ok=ok,
        )
    return _Kafka(journal, journal_restore, snapshot, engine, data)


def _restored_ok(
    restored: Restored, live: tuple[int, ...], positions: dict[str, int], end: int, entries: int
) -> bool:
    """The restored engine is the live one (counts, sequence, clock), with its positions."""
    return (
        _state(restored.engine) == live
        and restored.positions == positions
        and restored.journal_end == end
        and restored.progress.entries == entries
    )


def _register_all(engine: Engine, specs: Sequence[OperationSpec], *, pause_gc: bool) -> float:
    now_ms = engine.clock_ms
    fresh = Engine(engine.config, partition=0, start_ms=now_ms)
    register = fresh.register
    with gc_paused() if pause_gc else gc_running_on_new_objects():
        cpu = time.process_time()
        for spec in specs:
            register(spec, now_ms=now_ms)
        cpu_s = time.process_time() - cpu
    if fresh.statistics().pending != len(specs):
        raise RuntimeError("the baseline engine does not hold every operation")
    del fresh
    gc.collect()
    return cpu_s


def _restore_bulk(data: bytes, config: EngineConfig, *, pause_gc: bool) -> tuple[float, int]:
    with gc_paused() if pause_gc else gc_running_on_new_objects():
        cpu = time.process_time()
        engine = restore_engine(data, now_ms=0, config=config)
        cpu_s = time.process_time() - cpu
    pending = engine.statistics().pending
    del engine
    gc.collect()
    return cpu_s, pending


def _baseline(engine: Engine, data: bytes) -> BaselineResult:
    """Part 4: the pending operations of ``engine`` registered one by one on a fresh engine,
    and the snapshot ``data`` (of the same pending operations) restored in bulk."""
    specs = engine.pending()
    wall = time.perf_counter()
    register_cpu_s = _register_all(engine, specs, pause_gc=False)
    register_wall_s = time.perf_counter() - wall
    bulk_cpu_s, pending = _restore_bulk(data, engine.config, pause_gc=False)
    register_paused_s = _register_all(engine, specs, pause_gc=True)
    bulk_paused_s, pending_paused = _restore_bulk(data, engine.config, pause_gc=True)
    return BaselineResult(
        operations=len(specs),
        register_cpu_s=register_cpu_s,
        register_wall_s=register_wall_s,
        register_per_s=len(specs) / register_cpu_s,
        bulk_cpu_s=bulk_cpu_s,
        bulk_per_s=len(specs) / bulk_cpu_s,
        register_gc_paused_cpu_s=register_paused_s,
        bulk_gc_paused_cpu_s=bulk_paused_s,
        ok=pending == pending_paused == len(specs),
    )


def bench_size(
    broker: EmbeddedBroker,
    n: int,
    config: RestoreBenchConfig,
    *,
    say: Callable[[str], None] = lambda _message: None,
) -> SizeResult:
    """Every measurement at size ``n``, on topics of its own."""
    began = time.perf_counter()
    settings = Settings(kafka_bootstrap_servers=broker.bootstrap_servers)
    say(f"{n:,}: drawing the workload")
    workload = make_workload(n, batch=config.batch, seed=config.seed, settings=settings)
    say(f"{n:,}: baseline: {len(workload.inputs):,} inputs into an engine without a journal")
    plain = _run_plain(workload, settings.to_engine_config())
    gc.collect()
    prefix = f"restore-{uuid.uuid4().hex[:10]}"
    changelog_topic, snapshots_topic = f"{prefix}.changelog", f"{prefix}.snapshots"
    broker.create_topics({changelog_topic: 1, snapshots_topic: 1})

    kafka = trio.run(
        functools.partial(
            _kafka_part,
            broker,
            settings,
            workload,
            plain,
            n=n,
            batch=config.batch,
            changelog_topic=changelog_topic,
            snapshots_topic=snapshots_topic,
            timeout_s=60 + config.timeout_s_per_million * n / 1e6,
            say=say,
        )
    )
    del workload
    gc.collect()
    say(f"{n:,}: baseline: {kafka.snapshot.pending:,} registrations one by one, and in bulk")
    baseline = _baseline(kafka.engine, kafka.data)
    return SizeResult(
        n=n,
        journal=kafka.journal,
        journal_restore=kafka.journal_restore,
        snapshot=kafka.snapshot,
        baseline=baseline,
        peak_rss_bytes=_peak_rss_bytes(),
        wall_s=time.perf_counter() - began,
    )


def evaluate_targets(sizes: Sequence[SizeResult]) -> list[Target]:
    """DESIGN.md's restore target, at each size of at least 1 M registrations (its seconds
    scaled linearly to 1 M pending: 10 % of the registrations are completed)."""
    targets = []
    for r in sizes:
        if r.n < TARGET_PENDING:
            continue  # fixed costs (a consumer per read, metadata) dominate small sizes
        for name, seconds, cpu_s, per_million in (
            ("restore from the latest snapshot + tail", r.snapshot.seconds,
             r.snapshot.process_cpu_s, r.snapshot.seconds_per_million_pending),
            ("restore from the journal alone", r.journal_restore.seconds,
             r.journal_restore.process_cpu_s, r.journal_restore.seconds_per_million_pending),
        ):  # fmt: skip
            targets.append(
                Target(
                    f"{name}, {r.snapshot.pending:,} pending ({_count(r.n)} registered)",
                    f"{seconds:.1f} s, {cpu_s:.1f} CPU s ({per_million:.1f} s per 1 M pending)",
                    f"<= {TARGET_RESTORE_S:.0f} s per 1 M pending",
                    per_million <= TARGET_RESTORE_S,
                )
            )
    return targets


# -- reporting ----------------------------------------------------------------------------------


def _count(value: int) -> str:
    if value >= 1_000_000 and value % 1_000_000 == 0:
        return f"{value // 1_000_000}M"
    if value >= 1_000 and value % 1_000 == 0:
        return f"{value // 1_000}k"
    return f"{value:,}"


def _k(value: float) -> str:
    return f"{value / 1e3:,.1f} k" if value < 1e6 else f"{value / 1e6:,.2f} M"


def _s(value: float) -> str:
    return f"{value:,.3f}" if value < 1 else f"{value:,.2f}"


def _loadavg() -> str:
    """The 1, 5 and 15 minute load averages: other work on the machine shows here."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _rows(sizes: Sequence[SizeResult]) -> list[tuple[str, Callable[[SizeResult], str]]]:
    return [
        ("**1. Journal** (durable() after every batch)", lambda r: ""),
        ("inputs: registrations / signals / advances",
         lambda r: f"{r.journal.registrations:,} / {r.journal.signals:,} / {r.journal.advances}"),
        ("completed by the signals", lambda r: f"{r.journal.completed:,}"),
        ("changelog records; entries per record",
         lambda r: f"{r.journal.records:,}; {r.journal.entries_per_record:,.0f}"),
        ("**changelog bytes per input entry** (record value, envelope included)",
         lambda r: f"**{r.journal.bytes_per_entry:.1f} B** ({r.journal.bytes / _MIB:,.1f} MiB)"),
        ("mean entry, register / signal (JSON row)",
         lambda r: f"{r.journal.register_entry_bytes:.0f} / {r.journal.signal_entry_bytes:.0f} B"),
        ("**journal write**, first input to the last ack (wall)",
         lambda r: f"**{_k(r.journal.entries_per_s)} inputs/s** ({_s(r.journal.write_s)} s)"),
        ("engine + journal, CPU of the applying thread",
         lambda r: f"{r.journal.apply_cpu_s / r.journal.inputs * 1e6:.1f} us/input "
                   f"({_k(r.journal.inputs / r.journal.apply_cpu_s)} inputs/s)"),
        ("baseline: engine without a journal, same thread",
         lambda r: f"{r.journal.plain_cpu_s / r.journal.inputs * 1e6:.1f} us/input "
                   f"({_k(r.journal.plain_inputs_per_s)} inputs/s)"),
        ("**journal CPU overhead per input**",
         lambda r: f"**{r.journal.journal_us_per_input:.1f} us** "
                   f"(x{r.journal.apply_cpu_s / r.journal.plain_cpu_s:.2f})"),
        ("CPU s during the write: this process / broker",
         lambda r: f"{r.journal.process_cpu_s:.1f} / {r.journal.broker_cpu_s:.1f}"),
        ("**2. Restore from the journal alone**", lambda r: ""),
        ("**restore_partition** (records; entries)",
         lambda r: f"**{_s(r.journal_restore.seconds)} s** ({r.journal_restore.records:,}; "
                   f"{r.journal_restore.entries:,})"),
        ("fetch / decode / replay (s)",
         lambda r: f"{_s(r.journal_restore.fetch_s)} / {_s(r.journal_restore.decode_s)} / "
                   f"{_s(r.journal_restore.replay_s)}"),
        ("thread CPU inside the handler: decode-only read; restore (s)",
         lambda r: f"{_s(r.journal_restore.decode_cpu_s)}; {_s(r.journal_restore.handler_cpu_s)}"),
        ("read alone (no-op handler); read + decode (s)",
         lambda r: f"{_s(r.journal_restore.read_only_s)}; {_s(r.journal_restore.decode_read_s)}"),
        ("entries replayed per s; s per 1 M pending (linear)",
         lambda r: f"{_k(r.journal_restore.entries_per_s)}/s; "
                   f"{r.journal_restore.seconds_per_million_pending:.1f} s"),
        ("CPU s during it: this process / broker",
         lambda r: f"{r.journal_restore.process_cpu_s:.1f} / {r.journal_restore.broker_cpu_s:.1f}"),
        ("**3. Snapshot**", lambda r: ""),
        ("pending operations", lambda r: f"{r.snapshot.pending:,}"),
        ("snapshot_engine: CPU s; bytes (per pending op)",
         lambda r: f"{_s(r.snapshot.snapshot_cpu_s)}; {r.snapshot.bytes / _MIB:,.1f} MiB "
                   f"({r.snapshot.bytes_per_pending:.1f} B)"),
        ("write_snapshot through the sink: s; chunks",
         lambda r: f"{_s(r.snapshot.write_s)}; {r.snapshot.chunks}"),
        ("**restore_partition from the snapshot** + tail (inputs)",
         lambda r: f"**{_s(r.snapshot.seconds)} s** (+{r.snapshot.tail_inputs:,})"),
        ("fetch_s / rebuild_s / tail_s",
         lambda r: f"{_s(r.snapshot.fetch_s)} / {_s(r.snapshot.rebuild_s)} / "
                   f"{_s(r.snapshot.tail_s)}"),
        ("s per 1 M pending (linear)",
         lambda r: f"{r.snapshot.seconds_per_million_pending:.1f} s"),
        ("CPU s during it: this process / broker",
         lambda r: f"{r.snapshot.process_cpu_s:.1f} / {r.snapshot.broker_cpu_s:.1f}"),
        ("RSS growth across the restore; peak RSS of the process",
         lambda r: f"{r.snapshot.rss_growth_bytes / _MIB:,.0f} MiB; "
                   f"{r.snapshot.peak_rss_bytes / _MIB:,.0f} MiB"),
        ("**4. Rebuilding the pending operations** (CPU, in memory)", lambda r: ""),
        ("bulk: restore_engine on the snapshot bytes (decoding included)",
         lambda r: f"{_s(r.baseline.bulk_cpu_s)} s ({_k(r.baseline.bulk_per_s)} ops/s)"),
        ("baseline: Engine.register one by one (specs prebuilt)",
         lambda r: f"{_s(r.baseline.register_cpu_s)} s ({_k(r.baseline.register_per_s)} ops/s)"),
        ("bulk speed-up over register",
         lambda r: f"x{r.baseline.register_cpu_s / r.baseline.bulk_cpu_s:.2f}"),
        ("the same with the collector paused: bulk / register (s); speed-up",
         lambda r: f"{_s(r.baseline.bulk_gc_paused_cpu_s)} / "
                   f"{_s(r.baseline.register_gc_paused_cpu_s)}; x"
                   f"{r.baseline.register_gc_paused_cpu_s / r.baseline.bulk_gc_paused_cpu_s:.2f}"),
        ("checks (restored = live; plain = journaled)",
         lambda r: "ok" if _all_ok(r) else "**MISMATCH**"),
        ("wall s for this size", lambda r: f"{r.wall_s:.0f}"),
    ]  # fmt: skip


def _all_ok(r: SizeResult) -> bool:
    return r.journal.same_state and r.journal_restore.ok and r.snapshot.ok and r.baseline.ok


def render(report: RestoreReport, command: str) -> str:
    """The report as markdown: machine, command, one column per size, the targets."""
    m = report.machine
    header = "| measurement | " + " | ".join(f"N = {_count(r.n)}" for r in report.sizes) + " |"
    lines = [
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['implementation']} {m['python']}, "
        f"{m['platform']}. The broker (Tansu, in memory), kafka-python's threads and this "
        "process share these CPUs, over loopback.",
        "",
        f"Command: `{command}` ({report.wall_s:.0f} s; load average {m['loadavg_at_start']} at "
        f"the start, {m['loadavg_at_end']} at the end)",
        "",
        header,
        "|---|" + "---:|" * len(report.sizes),
        *(
            f"| {label} | " + " | ".join(cell(r) for r in report.sizes) + " |"
            for label, cell in _rows(report.sizes)
        ),
        "",
    ]
    if report.targets:
        lines += [
            "| target (DESIGN.md) | measured | required | met |",
            "|---|---:|---:|:---:|",
            *(
                f"| {t.name} | {t.measured} | {t.required} | {'yes' if t.met else 'NO'} |"
                for t in report.targets
            ),
            "",
        ]
    else:
        lines += [
            f"DESIGN.md's target (a restore of 1 M pending operations in <= "
            f"{TARGET_RESTORE_S:.0f} s) is checked at 1 M registrations: the full run.",
            "",
        ]
    return "\n".join(lines)


def run_restore_benchmarks(
    config: RestoreBenchConfig, *, progress: Callable[[str], None] | None = None
) -> RestoreReport:
    """Run every size of ``config`` on one broker started here."""
    say = progress or (lambda _message: None)
    began = time.perf_counter()
    machine: dict[str, str | int] = machine_info()
    machine["loadavg_at_start"] = _loadavg()
    results = []
    with EmbeddedBroker() as broker:
        say(f"broker at {broker.bootstrap_servers}")
        for n in config.sizes:
            results.append(bench_size(broker, n, config, say=say))
    machine["loadavg_at_end"] = _loadavg()
    return RestoreReport(
        machine=machine,
        config=config,
        sizes=results,
        targets=evaluate_targets(results),
        wall_s=time.perf_counter() - began,
    )


def write_json(report: RestoreReport, path: Path, command: str) -> None:
    """Write the report (with the command and the units) as JSON."""
    payload: dict[str, Any] = {"command": command, **asdict(report)}
    payload["units"] = {
        "seconds": "wall seconds (time.perf_counter; trio's clock in restore_partition's "
        "Progress) unless named cpu",
        "cpu_s": "CPU seconds: time.thread_time of the applying thread (apply, plain), "
        "time.process_time of this process, /proc/<pid>/stat of the broker",
        "bytes": "changelog record values (the journal's JSON, envelope included); snapshot "
        "bytes as snapshot_engine returns them (zlib level 1)",
        "fetch_s": "reading time outside the handler: broker round trips and kafka-python",
        "rss": "bytes; peak is ru_maxrss of this process, which also holds the workload and "
        "the live engine",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.benchmarks.bench_restore [--quick] [--out DIR] ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.benchmarks.bench_restore", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="10k and 100k (under 2 minutes)")
    parser.add_argument("--sizes", help="comma-separated registrations per size (100000,1000000)")
    parser.add_argument("--batch", type=int, help=f"inputs per durable() ({FULL.batch:,})")
    parser.add_argument("--out", type=Path, default=Path("docs"), help="output directory")
    args = parser.parse_args(argv)
    base = QUICK if args.quick else FULL
    sizes = tuple(int(s) for s in args.sizes.split(",")) if args.sizes else base.sizes
    if any(n < 1 for n in sizes) or (args.batch is not None and args.batch < 1):
        parser.error("sizes and batch must be positive")
    config = RestoreBenchConfig(sizes=sizes, batch=args.batch or base.batch)
    command = " ".join(
        ["python -m tests.benchmarks.bench_restore", *(argv if argv is not None else sys.argv[1:])]
    )

    def progress(message: str) -> None:
        print(f"... {message}", file=sys.stderr, flush=True)

    with quiet_kafka_warnings():
        report = run_restore_benchmarks(config, progress=progress)
    print(render(report, command))
    out = args.out / "bench-restore.json"
    write_json(report, out, command)
    print(f"Wrote {out}")
    return 0 if all(_all_ok(r) for r in report.sizes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
