"""A rolling restart as a Kubernetes Deployment does it, under load, checked like the nemesis.

``python -m tests.nemesis.rollout [--pending N] [--out DIR]`` (``make rollout``) runs, on Apache
Kafka (the project's dev broker, started as the nemesis starts it, here on loopback: nothing is
cut, so no lab is needed):

1. three ``purgatory serve`` replicas in one consumer group (each with its journal and its
   snapshotter child, the service's default delivery, each on its own HTTP port advertised to
   the group), on topics of 6 partitions;
2. ``N`` pending operations (300,000; deadlines hours away) registered through HTTP batches
   spread over the replicas, then a steady load through the whole rollout: single HTTP
   registrations (150/s) to ready replicas, as a Service routes, and Kafka signals (100/s),
   each completing an operation registered before (:mod:`tests.nemesis.rollout_load`);
3. after ``--before-s`` of load, each replica in turn: taken out of the routing and SIGTERMed
   (its snapshotter writes last snapshots), waited until gone, started again with the same
   settings, waited until ``/readyz`` answers 200, and only then the next one (a Deployment
   with ``maxUnavailable: 1``, ``maxSurge: 0``); ``--after-s`` more of load;
4. then quiet: every replica ready, a callback for every signal the broker acknowledged,
   the pending count steady; every scope's pending operations read through the HTTP read API;
   the replicas stopped; the callbacks topic read from its start to its end;
5. the verdict (:mod:`tests.nemesis.rollout_verdict`): nothing lost, nothing conflicting, the
   share of writes answered 2xx within 2 s of their first send (target 99 %), the latencies,
   the 503s, and each replica's stop and restart-to-ready seconds.

It prints a markdown table (the machine, the command, the figures) and writes
``DIR/rollout.json`` (``DIR`` defaults to ``docs``); the logs, the writes, the signals and the
callbacks go to ``--work`` (a new directory in /tmp by default). Every wait is bounded and
says what it waited for when it runs out; every process started is stopped (and killed if it
must be) on the way out. Exits 0 when everything held, 1 when something did not (named), 2
when the run could not be made.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import resource
import secrets
import shutil
import sys
import tempfile
import traceback
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio
from kafka import KafkaProducer

from purgatory.devtools.child import own_names
from purgatory.devtools.kafka_broker import KafkaBroker, default_libs
from tests.benchmarks._measure import machine_info, quiet_kafka_warnings
from tests.benchmarks.bench_restart import metric_samples
from tests.benchmarks.bench_service import process_cpu_s
from tests.nemesis._clock import wall_ms
from tests.nemesis.history import Callback, Request, write_callbacks
from tests.nemesis.report import log_events
from tests.nemesis.rollout_load import (
    Router,
    Signaller,
    Target,
    Write,
    Writer,
    preload,
    preload_targets,
    shuffled,
)
from tests.nemesis.rollout_replica import ReplicaTimeoutError, RolloutReplica
from tests.nemesis.rollout_verdict import (
    Step,
    correctness,
    dropped_at_stop,
    in_window,
    passed,
    readiness_seconds,
    table,
    write_figures,
)
from tests.nemesis.topic import TopicReader

__all__ = ["Config", "main"]

_BROKER_START_S = 90.0
_READY_S = 180.0  # a start to /readyz 200: the group's join, the restore of ~100k operations
_STOP_S = 60.0  # SIGTERM to gone: the shutdown grace (10 s), the last snapshots (8 s), margin
_FLUSH_S = 30.0
_CALLBACKS_S = 180.0
_STEADY_S = 60.0
_READ_S = 60.0
_PAGE = 10_000
_DEADLINE_AHEAD_MS = 3 * 3600 * 1000
_LOADAVG_EVERY_S = 5.0
_TOPICS = ("requests", "signals", "callbacks", "dead_letters", "changelog", "snapshots")
# The load generator stands for clients on other machines: it runs at a higher priority than
# the broker and the replicas (which it starts back at the usual one), so that it sends on time
# and reads its answers at once on a 2-CPU machine they keep busy.
_HARNESS_NICE = -10


@dataclass(frozen=True, slots=True)
class Config:
    """One rollout run: its sizes, rates, phases and directories."""

    pending: int = 300_000
    replicas: int = 3
    partitions: int = 6
    scopes: int = 64
    write_rate: float = 150.0
    signal_rate: float = 100.0
    before_s: float = 20.0
    after_s: float = 15.0
    delivery: str = "acknowledged"
    batch: int = 5_000
    seed: int = 1
    target_share: float = 0.99
    out: Path = Path("docs")
    work: Path = Path("/tmp/rollout")
    command: str = ""


class RolloutStalledError(RuntimeError):
    """A replica did not stop or become ready in time: the rollout goes no further."""


class _Run:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.token = secrets.token_urlsafe(24)
        self.names = own_names("rollout.", secrets.token_hex(4))
        self.prefix = _prioritize_harness()
        self.broker = KafkaBroker(
            log_path=config.work / "broker.log",
            die_with_parent=True,
            start_timeout_s=_BROKER_START_S,
            command_prefix=self.prefix,
        )
        self.replicas: list[RolloutReplica] = []
        self.clients: list[httpx.AsyncClient] = []
        self.producer: Any = None
        self.doc: dict[str, Any] = {}
        self.loads: list[float] = [os.getloadavg()[0]]
        self.cpu: dict[tuple[str, int], list[float]] = {}
        self.steps: list[Step] = []
        self.live: deque[Target] = deque()
        self.registrations: list[Request] = []
        self.load_began = self.load_ended = 0.0
        self.reader: TopicReader | None = None

    def topic(self, kind: str) -> str:
        return self.names[f"PURGATORY_TOPIC_{kind.upper()}"]

    # -- setting up ----------------------------------------------------------------------------

    async def start(self) -> None:
        """The broker, the topics, the replicas; until every replica is ready."""
        c = self.config
        self.broker.start()
        self.broker.create_topics({self.topic(kind): c.partitions for kind in _TOPICS})
        env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")},
            **self.names,
            "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": self.broker.bootstrap_servers,
            "PURGATORY_API_TOKEN": self.token,
            "PURGATORY_DELIVERY": c.delivery,
            "PURGATORY_TOPIC_PARTITIONS": str(c.partitions),
        }
        self.replicas = [RolloutReplica(i, env, c.work, self.prefix) for i in range(c.replicas)]
        for replica in self.replicas:
            replica.start()
        began = trio.current_time()
        async with trio.open_nursery() as nursery:
            for replica in self.replicas:
                nursery.start_soon(replica.wait_ready, _READY_S, self.token)
        self.doc["cluster_ready_s"] = round(trio.current_time() - began, 1)
        headers = {"authorization": f"Bearer {self.token}"}
        # A client's pool of 64 connections per replica, as the nemesis's workload has (the
        # writer keeps at most 48 requests in flight to one): a burst of a connection per
        # waiting write would overflow the server's accept queue, and each would then cost
        # the connect timeout.
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        timeout = httpx.Timeout(10.0, connect=3.0)
        self.clients = [
            httpx.AsyncClient(base_url=r.url, headers=headers, limits=limits, timeout=timeout)
            for r in self.replicas
        ]
        self.producer = KafkaProducer(
            bootstrap_servers=self.broker.bootstrap_servers,
            acks="all",
            linger_ms=5,
            request_timeout_ms=10_000,
            delivery_timeout_ms=30_000,
            max_block_ms=5_000,
            enable_idempotence=False,  # as the nemesis's workload: a duplicate is a duplicate
        )
        self.producer.partitions_for(self.topic("signals"))  # metadata now, not in the load

    # -- the phases ----------------------------------------------------------------------------

    async def load_and_roll(self) -> tuple[Writer, Signaller, Router]:
        """Preload, then the steady load around the rollout; the load's three parts."""
        c = self.config
        deadline_ms = wall_ms() + _DEADLINE_AHEAD_MS
        targets = preload_targets(c.pending, c.scopes)
        began = trio.current_time()
        self.registrations = await preload(
            self.clients, targets, deadline_ms=deadline_ms, batch=c.batch
        )
        self.doc["preload_s"] = round(trio.current_time() - began, 1)
        print(f"rollout: {c.pending:,} preloaded in {self.doc['preload_s']} s", flush=True)
        router = Router([r.url for r in self.replicas], self.token)
        writer = Writer(
            router,
            self.clients,
            rate_per_s=c.write_rate,
            scopes=c.scopes,
            deadline_ms=deadline_ms,
            on_ok=self._signal_later,
        )
        signaller = Signaller(
            self.producer,
            self.topic("signals"),
            shuffled(targets, c.seed),
            self.live,
            rate_per_s=c.signal_rate,
        )
        stop = trio.Event()
        async with trio.open_nursery() as outer:
            outer.start_soon(router.run)
            outer.start_soon(self._sample_load)
            await trio.sleep(2 * 0.25)  # the router's first polls
            self.load_began = trio.current_time()
            async with trio.open_nursery() as load:
                load.start_soon(writer.run, stop)
                load.start_soon(signaller.run, stop)
                await trio.sleep(c.before_s)
                try:
                    await self.roll(router)
                except RolloutStalledError as exc:
                    self.doc["stalled"] = str(exc)
                    print(f"rollout: STALLED: {exc}", flush=True)
                await trio.sleep(c.after_s)
                stop.set()
                self.load_ended = trio.current_time()
            outer.cancel_scope.cancel()
        self.doc["load_s"] = round(self.load_ended - self.load_began, 1)
        return writer, signaller, router

    def _signal_later(self, write: Write) -> None:
        self.live.append(write.target)

    async def _sample_load(self) -> None:
        """The load average every 5 s, and every process's CPU seconds every second."""
        for n in itertools.count(1):
            self._sample_cpu()
            await trio.sleep(1.0)
            if n % round(_LOADAVG_EVERY_S) == 0:
                self.loads.append(os.getloadavg()[0])

    def _sample_cpu(self) -> None:
        """The CPU seconds of the broker, each ``serve``, each snapshotter and this process,
        so far: the first and the last reading of each process during the load."""
        pids = [("broker", self.broker.pid), ("harness", os.getpid())]
        for replica in self.replicas:
            pids.append(("serve", replica.pid))
            pids += [("snapshotter", child) for child in replica.children()]
        for component, pid in pids:
            if pid is None:
                continue
            try:
                cpu_s = process_cpu_s(pid)
            except OSError:  # it exited meanwhile
                continue
            first_last = self.cpu.setdefault((component, pid), [cpu_s, cpu_s])
            first_last[1] = cpu_s

    def cpu_shares(self, seconds: float) -> dict[str, float]:
        """Each component's share of the machine's CPU during the load (1.0: every CPU)."""
        used: dict[str, float] = {}
        for (component, _), (first, last) in self.cpu.items():
            used[component] = used.get(component, 0.0) + last - first
        cpus = os.cpu_count() or 1
        return {k: round(v / (seconds * cpus), 3) for k, v in sorted(used.items())}

    async def roll(self, router: Router) -> None:
        """Each replica in turn: out of the routing, SIGTERM, gone, started, ready.

        Raises:
            RolloutStalledError: a replica did not stop or become ready within its bound.
        """
        for replica in self.replicas:
            router.take_out(replica.index)
            sigterm_ms = wall_ms()
            print(f"rollout: SIGTERM r{replica.index}", flush=True)
            try:
                stopped = await replica.stop(_STOP_S)
            except ReplicaTimeoutError as exc:
                replica.start()
                router.put_back(replica.index)
                self.steps.append(
                    Step(replica.index, sigterm_ms, _STOP_S, None, wall_ms(), None, None, str(exc))
                )
                raise RolloutStalledError(str(exc)) from exc
            started_ms = wall_ms()
            replica.start()
            router.put_back(replica.index)
            step = Step(
                replica.index, sigterm_ms, stopped.seconds, stopped.code, started_ms, None, None
            )
            try:
                ready_s = await replica.wait_ready(_READY_S, self.token)
            except ReplicaTimeoutError as exc:
                self.steps.append(dataclasses.replace(step, error=str(exc)))
                raise RolloutStalledError(str(exc)) from exc
            self.steps.append(
                dataclasses.replace(step, ready_ms=wall_ms(), ready_s=round(ready_s, 3))
            )
            print(
                f"rollout: r{replica.index} gone in {stopped.seconds:.1f} s (exit "
                f"{stopped.code}), ready {ready_s:.1f} s after its start",
                flush=True,
            )

    async def quiet(self, signaller: Signaller) -> set[tuple[str, str]]:
        """Every replica ready, every acknowledged signal's callback seen, the pending count
        steady; then every scope's pending operations, read through the HTTP API."""
        async with trio.open_nursery() as nursery:
            for replica in self.replicas:
                nursery.start_soon(replica.wait_ready, _READY_S, self.token)
        signaller.finish(_FLUSH_S)
        expected = {(s.target.scope, s.target.op_id) for s in signaller.sent if s.acked}
        self.reader = reader = TopicReader(
            self.broker.bootstrap_servers,
            self.topic("callbacks"),
            self.config.partitions,
            committed=self.config.delivery == "transactional",
        )
        missing = await trio.to_thread.run_sync(reader.wait_for, expected, _CALLBACKS_S)
        self.doc["callbacks_missing_after_wait"] = len(missing)
        if missing:
            print(
                f"rollout: {len(missing)} signalled operations had no callback after "
                f"{_CALLBACKS_S:.0f} s of waiting, e.g. {sorted(missing)[:3]}",
                flush=True,
            )
        self.doc["pending_metric"] = await self._steady_pending()
        pending: set[tuple[str, str]] = set()
        for n in range(self.config.scopes):
            pending |= await self._pending_of(f"s{n}", self.clients[n % len(self.clients)])
        return pending

    async def _steady_pending(self) -> int:
        """``purgatory_pending_operations`` summed over the replicas, once two reads a second
        apart agree (the last read when they never do within 60 s)."""
        last, began = -1, trio.current_time()
        while True:
            now = 0
            for client in self.clients:
                text = (await client.get("/metrics", timeout=30)).text
                now += round(sum(metric_samples(text, "purgatory_pending_operations").values()))
            if now == last or trio.current_time() - began > _STEADY_S:
                return now
            last = now
            await trio.sleep(1.0)

    async def _pending_of(self, scope: str, http: httpx.AsyncClient) -> set[tuple[str, str]]:
        found: set[tuple[str, str]] = set()
        cursor: str | None = None
        while True:
            params: dict[str, str | int] = {"scope": scope, "limit": _PAGE}
            if cursor is not None:
                params["cursor"] = cursor
            page = await _get_json(http, "/v1/operations", params)
            found.update((scope, op["op_id"]) for op in page["operations"])
            cursor = page["next_cursor"]
            if cursor is None:
                return found

    async def stop_all(self) -> list[int | None]:
        """SIGTERM every replica at once; their exit codes."""
        codes: list[int | None] = [None] * len(self.replicas)

        async def stop(replica: RolloutReplica) -> None:
            try:
                codes[replica.index] = (await replica.stop(_STOP_S)).code
            except ReplicaTimeoutError as exc:
                print(f"rollout: {exc}", flush=True)

        async with trio.open_nursery() as nursery:
            for replica in self.replicas:
                if replica.running:
                    nursery.start_soon(stop, replica)
        return codes

    # -- the whole run -------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        c = self.config
        began_ms = wall_ms()
        try:
            await self.start()
            print(
                f"rollout: broker and {c.replicas} replicas ready "
                f"({self.doc['cluster_ready_s']} s); work dir {c.work}",
                flush=True,
            )
            writer, signaller, router = await self.load_and_roll()
            print("rollout: load stopped; waiting for quiet", flush=True)
            pending = await self.quiet(signaller)
            self.doc["stop_codes"] = await self.stop_all()
            reader = self.reader
            assert reader is not None
            self.doc["callbacks_read_to_end"] = await trio.to_thread.run_sync(
                reader.read_to_end, _READ_S
            )
            callbacks = list(reader.records)
            self.save(writer, signaller, router, callbacks)
            doc = self.report(writer, signaller, router, pending, callbacks)
            doc["seconds"] = round((wall_ms() - began_ms) / 1000, 1)
            return doc
        finally:
            await self.close()

    def save(
        self, writer: Writer, signaller: Signaller, router: Router, callbacks: list[Callback]
    ) -> None:
        """The run's raw records in the work directory, for a second look."""
        work = self.config.work
        with (work / "writes.jsonl").open("w") as out:
            for w in writer.writes:
                out.write(json.dumps(dataclasses.asdict(w)) + "\n")
        with (work / "signals.jsonl").open("w") as out:
            for s in signaller.sent:
                doc = {
                    "target": dataclasses.asdict(s.target),
                    "at_ms": s.at_ms,
                    "acked": s.acked,
                    "error": s.error,
                }
                out.write(json.dumps(doc) + "\n")
        write_callbacks(work / "callbacks.jsonl", callbacks)
        with (work / "probes.jsonl").open("w") as out:
            for probe in router.probes:
                out.write(json.dumps(dataclasses.asdict(probe)) + "\n")

    def report(
        self,
        writer: Writer,
        signaller: Signaller,
        router: Router,
        pending: set[tuple[str, str]],
        callbacks: list[Callback],
    ) -> dict[str, Any]:
        c = self.config
        writes = writer.writes
        end_ms = wall_ms()
        roll_start = self.steps[0].sigterm_ms if self.steps else end_ms
        roll_end = max((s.ready_ms or end_ms for s in self.steps), default=end_ms)
        registrations = [*self.registrations, *(w.request() for w in writes)]
        events = log_events(c.work)
        (c.work / "log-events.json").write_text(json.dumps(events, indent=1) + "\n")
        no_ready_s, not_all_s = readiness_seconds(
            router.changes, self.load_began, self.load_ended, c.replicas
        )
        self.loads.append(os.getloadavg()[0])
        return {
            **self.doc,
            "command": c.command,
            "machine": machine_info(),
            "loadavg": {"start": self.loads[0], "max": max(self.loads), "end": self.loads[-1]},
            "replicas": c.replicas,
            "partitions": c.partitions,
            "scopes": c.scopes,
            "delivery": c.delivery,
            "pending_preloaded": c.pending,
            "write_rate": c.write_rate,
            "signal_rate": c.signal_rate,
            "target_share": c.target_share,
            "no_ready_s": no_ready_s,
            "not_all_ready_s": not_all_s,
            "writes": write_figures(writes),
            "rollout_writes": write_figures(in_window(writes, roll_start, roll_end)),
            "steps": [self._step(s, writes, events, end_ms) for s in self.steps],
            "correctness": correctness(
                registrations, signaller.sent, pending, callbacks, c.delivery
            ),
            "log": _log_summary(events),
            "harness_cpu_s": round(sum(resource.getrusage(resource.RUSAGE_SELF)[:2]), 1),
            "harness_nice": os.getpriority(os.PRIO_PROCESS, 0),
            "cpu_share_during_load": self.cpu_shares(self.load_ended - self.load_began),
            "work": str(c.work),
        }

    @staticmethod
    def _step(
        step: Step, writes: Sequence[Write], events: Sequence[dict[str, Any]], end_ms: int
    ) -> dict[str, Any]:
        """A step's figures: its writes, the attempts its stop dropped, and every partition
        restored from its SIGTERM to its ready (replica, partition, restore seconds)."""
        until_ms = step.ready_ms or end_ms
        restored = [
            f"r{e['replica'][1:]}/{e['incarnation']} p{e.get('partition')} {e.get('restore_s')} s"
            for e in events
            if e.get("event") == "partition_serving"
            and step.sigterm_ms <= (e.get("at_ms") or 0) <= until_ms
        ]
        return {
            **dataclasses.asdict(step),
            "writes": write_figures(in_window(writes, step.sigterm_ms, until_ms)),
            "dropped_at_stop": dropped_at_stop(writes, step.replica, step.sigterm_ms),
            "restored": restored,
        }

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
        for client in self.clients:
            await client.aclose()
        if self.producer is not None:
            self.producer.close(timeout=5)
        for replica in self.replicas:
            replica.close()
        self.broker.close()


async def _get_json(http: httpx.AsyncClient, path: str, params: dict[str, str | int]) -> Any:
    """GET ``path``, trying a 503 or no answer again for up to 60 s.

    Raises:
        RuntimeError: no 200 within 60 s (the last answer named).
    """
    began, last = trio.current_time(), ""
    while trio.current_time() - began < _READ_S:
        try:
            response = await http.get(path, params=params, timeout=30)
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code == 200:
                return response.json()
            last = f"HTTP {response.status_code} {response.text[:300]}"
        await trio.sleep(0.5)
    raise RuntimeError(f"GET {path} {params}: no 200 within {_READ_S:.0f} s; last: {last}")


def _log_summary(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The replicas' notable log events counted by name, and their warnings and errors."""
    counts: dict[str, int] = {}
    for event in events:
        name = str(event.get("event"))
        counts[name] = counts.get(name, 0) + 1
    serving = [
        {
            k: e.get(k)
            for k in (
                "replica",
                "incarnation",
                "partition",
                "restore_s",
                "records",
                "snapshot_pending",
                "void_records",
                "timestamp",
            )
        }
        for e in events
        if e.get("event") == "partition_serving"
    ]
    alarms = [e for e in events if e.get("level") in ("warning", "error", "critical")]
    return {"counts": counts, "partition_serving": serving, "warnings_and_errors": alarms[:40]}


def _parser() -> argparse.ArgumentParser:
    d = Config()
    parser = argparse.ArgumentParser(
        prog="python -m tests.nemesis.rollout",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--pending", type=int, default=d.pending, help=f"({d.pending})")
    parser.add_argument("--replicas", type=int, default=d.replicas, help=f"({d.replicas})")
    parser.add_argument("--partitions", type=int, default=d.partitions, help=f"({d.partitions})")
    parser.add_argument("--write-rate", type=float, default=d.write_rate, help="HTTP writes/s")
    parser.add_argument("--signal-rate", type=float, default=d.signal_rate, help="signals/s")
    parser.add_argument("--before-s", type=float, default=d.before_s, help="load before rolling")
    parser.add_argument("--after-s", type=float, default=d.after_s, help="load after rolling")
    parser.add_argument(
        "--delivery",
        choices=("acknowledged", "transactional"),
        default=d.delivery,
        help=f"({d.delivery})",
    )
    parser.add_argument("--seed", type=int, default=d.seed, help="which operations are signalled")
    parser.add_argument("--out", type=Path, default=d.out, help="where rollout.json goes (docs)")
    parser.add_argument("--work", type=Path, help="logs and records (default: a new /tmp dir)")
    return parser


def _prioritize_harness() -> list[str]:
    """Raise this process's priority (as root); the prefix that starts a child at the usual
    one (empty when it could not be raised)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, 0, _HARNESS_NICE)
    except OSError:
        return []
    return ["nice", "-n", str(before - _HARNESS_NICE)]


def _problems() -> list[str]:
    problems = []
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        problems.append("Java is missing: Apache Kafka needs Java 17 or later")
    if not any(any(libs.glob("kafka_2.13-*.jar")) for libs in default_libs()):
        problems.append("Apache Kafka's jars are missing: run `make kafka`")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    problems = _problems()
    if problems:
        print("rollout: cannot run:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 2
    work: Path = args.work or Path(tempfile.mkdtemp(prefix="rollout-"))
    work.mkdir(parents=True, exist_ok=True)
    given = sys.argv[1:] if argv is None else list(argv)
    config = Config(
        pending=args.pending,
        replicas=args.replicas,
        partitions=args.partitions,
        write_rate=args.write_rate,
        signal_rate=args.signal_rate,
        before_s=args.before_s,
        after_s=args.after_s,
        delivery=args.delivery,
        seed=args.seed,
        out=args.out,
        work=work,
        command=" ".join(["python -m tests.nemesis.rollout", *given]),
    )
    try:
        with quiet_kafka_warnings():
            doc = trio.run(_Run(config).run)
    except Exception:
        traceback.print_exc()
        print(f"rollout: the run could not be made (logs in {work})", file=sys.stderr)
        return 2
    failed = passed(doc)
    doc["passed"], doc["failed"] = not failed, failed
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "rollout.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(table(doc))
    print(f"\nrollout: {args.out / 'rollout.json'}; logs and records in {work}")
    print("rollout: passed" if not failed else "rollout: FAILED: " + "; ".join(failed))
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
