"""The nemesis proper: sets one planned fault on the lab or on a replica, and heals it.

Each kind of :data:`tests.nemesis.plan.KINDS` is a pair of calls, set and heal, on the lab's
bridge and qdiscs (:class:`tests.nemesis.lab.Net`) or on a replica's process group
(:class:`tests.nemesis.replicas.Replica`). Every fault is recorded in the history once healed,
with the moments it was set and healed; a slow link also notes the packets its token buckets
dropped. :meth:`Nemesis.heal_all` puts everything back as the lab was made, whatever is still
set: it runs after the last round and in the orchestration's ``finally``.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

from tests.nemesis._clock import wall_ms
from tests.nemesis.history import Fault, HistoryWriter
from tests.nemesis.lab import REPLICAS, Net
from tests.nemesis.plan import Step
from tests.nemesis.replicas import Replica

__all__ = ["Nemesis"]


class Nemesis:
    """Sets and heals the planned faults.

    Args:
        net: the lab.
        replicas: the replicas, by index.
        history: where each fault is recorded.
    """

    def __init__(self, net: Net, replicas: Sequence[Replica], history: HistoryWriter) -> None:
        self._net = net
        self._replicas = replicas
        self._history = history
        self._on: tuple[Step, int] | None = None  # the fault set, and when

    def _replica(self, step: Step) -> Replica:
        return self._replicas[REPLICAS.index(step.target.split("+")[0])]

    def set(self, step: Step) -> None:
        """Set ``step``'s fault (one at a time)."""
        assert self._on is None, self._on
        self._on = (step, wall_ms())
        net, kind = self._net, step.kind
        if kind == "cut-replica-broker":
            net.isolate(step.target.split("+"), True)
        elif kind == "cut-broker":
            net.link("broker", False)
        elif kind == "cut-replicas":
            net.isolate(REPLICAS, True)
        elif kind == "cut-replica":
            net.link(step.target, False)
        elif kind == "slow-link":
            net.shape(step.target, True)
        elif kind == "pause":
            self._replica(step).signal(signal.SIGSTOP)
        elif kind == "kill":
            self._replica(step).kill()
        else:
            raise AssertionError(f"unknown fault kind {kind!r}")

    def heal(self) -> None:
        """Heal the fault that is set (a killed replica is started again), and record it."""
        if self._on is None:
            return
        step, start_ms = self._on
        net, kind, note = self._net, step.kind, ""
        if kind == "cut-replica-broker":
            net.isolate(step.target.split("+"), False)
        elif kind == "cut-broker":
            net.link("broker", True)
        elif kind == "cut-replicas":
            net.isolate(REPLICAS, False)
        elif kind == "cut-replica":
            net.link(step.target, True)
        elif kind == "slow-link":
            note = f"{net.drops(step.target)} packets dropped"
            net.shape(step.target, False)
        elif kind == "pause":
            self._replica(step).signal(signal.SIGCONT)
        elif kind == "kill":
            self._replica(step).start()
        self._history.add(Fault(kind, step.target, start_ms, wall_ms(), note))
        self._on = None

    def heal_all(self) -> None:
        """Heal what is set, then reset the lab and wake every replica, whatever is left."""
        self.heal()
        self._net.heal()
        for replica in self._replicas:
            if replica.paused:
                replica.signal(signal.SIGCONT)
