"""The orchestration of one run, inside the lab's client namespace (``python -m
tests.nemesis.inside CONFIG``).

Only a process inside the lab reaches the broker and the replicas, so this one does everything
that talks to them, in order: start Apache Kafka in the broker's namespace and create the run's
six topics (6 partitions each); start the three replicas in theirs and wait until each is ready;
start the workload; set and heal the planned faults on time, restarting any replica that exits
on its own (a finding, recorded); heal everything when the load ends and let the run settle
until every deadline and planned signal has passed; wait (bounded) for a callback of every
acknowledged registration; stop the replicas; read the callbacks topic from its start to its
end, ``read_committed`` and ``read_uncommitted``. It writes ``history.jsonl``,
``callbacks-committed.jsonl``, ``callbacks-uncommitted.jsonl``, ``inside.json`` and the logs in
the run's directory; the root side checks them. Every child is started from the main thread
with ``die_with_parent`` and killed in the ``finally``.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from purgatory.devtools.child import own_names
from purgatory.devtools.kafka_broker import KafkaBroker
from tests.nemesis._clock import elapsed_s, pause, wall_ms
from tests.nemesis.config import RunConfig
from tests.nemesis.faults import Nemesis
from tests.nemesis.history import HistoryWriter, Request, write_callbacks
from tests.nemesis.lab import ADDRESSES, REPLICAS, Net
from tests.nemesis.plan import PARTITIONS
from tests.nemesis.replicas import Replica
from tests.nemesis.topic import TopicReader
from tests.nemesis.workload import Workload

__all__ = ["main"]

_READY_S = 120.0
_CALLBACKS_WAIT_S = 45.0
_READ_S = 60.0
_SNAPSHOT_INTERVAL_MS = 5_000


class _Run:
    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.plan = config.plan()
        self.net = Net(config.prefix)
        self.out = config.out
        self.history = HistoryWriter(self.out / "history.jsonl")
        self.token = secrets.token_urlsafe(24)
        self.names = own_names("nemesis.", f"{config.seed}-{config.delivery}")
        self.broker = KafkaBroker(
            host=ADDRESSES["broker"],
            command_prefix=self.net.exec_prefix("broker"),
            data_dir=self.out / "broker",
            log_path=self.out / "broker.log",
            die_with_parent=True,
            start_timeout_s=90,
        )
        self.replicas: list[Replica] = []
        self.exits: dict[int, int] = {}  # unexpected exits so far, by replica
        self.restart_at: dict[int, float] = {}  # when a replica that exited starts again
        self.summary: dict[str, Any] = {"seed": config.seed, "delivery": config.delivery}

    def topic(self, kind: str) -> str:
        return self.names[f"PURGATORY_TOPIC_{kind.upper()}"]

    def env(self) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith("PURGATORY_")}
        return {
            **base,
            **self.names,
            "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": self.broker.bootstrap_servers,
            "PURGATORY_API_TOKEN": self.token,
            "PURGATORY_DELIVERY": self.config.delivery,
            "PURGATORY_TOPIC_PARTITIONS": str(PARTITIONS),
            "PURGATORY_SNAPSHOT_INTERVAL_MS": str(_SNAPSHOT_INTERVAL_MS),
        }

    def watch_until(self, at_s: float) -> None:
        """Wait until ``at_s`` (monotonic), restarting any replica that exits on its own (after
        1 s, doubling to 16 s while it keeps exiting)."""
        while (left := at_s - elapsed_s()) > 0:
            for replica in self.replicas:
                if replica.exited_on_its_own():
                    exits = self.exits[replica.index] = self.exits.get(replica.index, 0) + 1
                    self.restart_at[replica.index] = elapsed_s() + min(2 ** (exits - 1), 16)
                restart_at = self.restart_at.get(replica.index)
                if restart_at is not None and elapsed_s() >= restart_at:
                    del self.restart_at[replica.index]
                    if not replica.running:  # the nemesis may have restarted it meanwhile
                        replica.start()
            pause(min(left, 0.2))

    def start(self) -> None:
        self.broker.start()
        kinds = ("requests", "signals", "callbacks", "dead_letters", "changelog", "snapshots")
        self.broker.create_topics({self.topic(kind): PARTITIONS for kind in kinds})
        env = self.env()
        self.replicas = [
            Replica(i, self.net, env, self.out / host, self.history)
            for i, host in enumerate(REPLICAS)
        ]
        for replica in self.replicas:
            replica.start()
        began = elapsed_s()
        for replica in self.replicas:
            if not replica.wait_ready(_READY_S, self.token):
                raise RuntimeError(f"replica {replica.host} was not ready within {_READY_S} s")
        self.summary["ready_s"] = round(elapsed_s() - began, 1)

    def faults(self, workload: Workload, nemesis: Nemesis) -> None:
        start_s = elapsed_s()
        for step in self.plan.steps:
            self.watch_until(start_s + step.at_s)
            nemesis.set(step)
            self.watch_until(start_s + step.at_s + step.hold_s)
            nemesis.heal()
        self.watch_until(start_s + self.plan.load_end_s)
        nemesis.heal_all()
        self.watch_until(start_s + self.plan.settle_s)
        self.summary["dispatched_all"] = workload.dispatched()
        workload.stop()

    def read_back(self) -> None:
        acked = {
            (e.scope, e.op_id)
            for e in self.history.events
            if isinstance(e, Request) and e.kind == "register" and e.result == "ok"
        }
        committed = self.config.delivery == "transactional"
        servers, topic = self.broker.bootstrap_servers, self.topic("callbacks")
        waiting = TopicReader(servers, topic, PARTITIONS, committed=committed)
        try:
            missing = waiting.wait_for(acked, _CALLBACKS_WAIT_S)
        finally:
            waiting.close()
        self.summary["missing_after_wait"] = len(missing)
        self.summary["stop_codes"] = [replica.stop() for replica in self.replicas]
        for name, read_committed in (("committed", True), ("uncommitted", False)):
            reader = TopicReader(servers, topic, PARTITIONS, committed=read_committed)
            try:
                self.summary[f"read_{name}_to_end"] = reader.read_to_end(_READ_S)
                write_callbacks(self.out / f"callbacks-{name}.jsonl", reader.records)
            finally:
                reader.close()

    def run(self) -> int:
        self.summary["began_ms"] = wall_ms()
        workload: Workload | None = None
        nemesis = Nemesis(self.net, [], self.history)
        try:
            self.start()
            nemesis = Nemesis(self.net, self.replicas, self.history)
            workload = Workload(
                self.plan,
                bootstrap_servers=self.broker.bootstrap_servers,
                urls=[replica.url for replica in self.replicas],
                token=self.token,
                topics={"requests": self.topic("requests"), "signals": self.topic("signals")},
                history=self.history,
            )
            workload.start()
            self.summary["load_start_ms"] = workload.start_ms
            self.faults(workload, nemesis)
            self.read_back()
            return 0
        except Exception:
            self.summary["error"] = traceback.format_exc()
            print(self.summary["error"], file=sys.stderr)
            return 1
        finally:
            self.close(workload, nemesis)

    def close(self, workload: Workload | None, nemesis: Nemesis) -> None:
        try:
            if workload is not None:
                workload.stop()
            nemesis.heal_all()
        finally:
            for replica in self.replicas:
                replica.close()
            self.broker.stop()
            self.history.close()
            self.summary["ended_ms"] = wall_ms()
            (self.out / "inside.json").write_text(json.dumps(self.summary, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the configuration at ``argv[0]``; 0 when the run went through (whatever it found)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m tests.nemesis.inside CONFIG.json", file=sys.stderr)
        return 2
    return _Run(RunConfig.load(Path(args[0]))).run()


if __name__ == "__main__":
    sys.exit(main())
