"""A run's plan, all of it from one seed: the requests the workload sends and the faults the
nemesis sets, each at an offset from the start of the load (pure: no I/O, no clock).

The load: registrations arrive at ``rate_per_s`` (3 a second, so about 7 requests a second
with their signals and cancels) over HTTP (to a replica picked at random, so two in three are
forwarded to the scope's owner) or over Kafka (the requests topic), on scopes that cover every
partition. Each has 1-3 watch keys (mostly ``all``, some ``any`` or ``count``) and an absolute
processing-time deadline (``deadline_ms``, epoch ms, computed when the load starts) a few
seconds to ``deadline_s[1]`` ahead. Half are completed by signals sent before the deadline, a
quarter get their last signal after the deadline (the rest of their keys in time), and the
rest are left to expire, with some of their keys signalled; one in ten of those is cancelled
before its deadline. Signals go over HTTP or the signals topic; each key has its own moment.

The faults, in rounds after a fault-free warm-up: each round sets one fault kind (a seeded
order of :data:`KINDS`, or the kinds asked for), holds it for its duration, heals it, and waits
``gap_s`` before the next. Registrations stop when the last round's gap ends; signals go on as
planned (the late ones up to ``late_s[1]`` past their deadlines); then the run settles.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from purgatory.service.ownership.partitioning import partition_for
from tests.nemesis.lab import REPLICAS

__all__ = ["KINDS", "PARTITIONS", "Action", "Plan", "Shape", "Step", "make_plan"]

PARTITIONS = 6
#: Every fault kind the nemesis sets, by the name the report uses.
KINDS = (
    "cut-replica-broker",  # one replica's and the broker's bridge ports isolated
    "cut-broker",  # the broker's port down: cut from all
    "cut-replicas",  # the three replicas' ports isolated: apart, each still with the broker
    "cut-replica",  # one replica's port down: cut from everything
    "slow-link",  # a slow lossy token bucket on both directions of one replica's link
    "pause",  # SIGSTOP one replica past the consumer's session timeout, then SIGCONT
    "kill",  # SIGKILL one replica, restart it after a while
)
_SCOPES_PER_PARTITION = 3


@dataclass(frozen=True, slots=True)
class Shape:
    """How long and how dense a run is (seconds; pairs are uniform ranges)."""

    rounds: int = len(KINDS)
    rate_per_s: float = 3.0
    warmup_s: float = 5.0
    fault_s: tuple[float, float] = (9.0, 13.0)
    pause_s: tuple[float, float] = (13.0, 16.0)  # past the 10 s session timeout
    down_s: tuple[float, float] = (3.0, 6.0)  # a killed replica's time down
    gap_s: float = 7.0
    deadline_s: tuple[float, float] = (3.0, 20.0)
    late_s: tuple[float, float] = (0.3, 4.0)
    settle_margin_s: float = 5.0


@dataclass(frozen=True, slots=True)
class Action:
    """One request of the workload, ``at_s`` after the load starts."""

    at_s: float
    kind: str  # register | signal | cancel
    via: str  # http | kafka
    replica: int | None
    scope: str
    op_id: str
    keys: tuple[str, ...]
    condition: str = "all"
    count: int | None = None
    deadline_s: float | None = None  # registrations: the deadline's offset


@dataclass(frozen=True, slots=True)
class Step:
    """One round's fault: its kind, its target, when it is set and for how long."""

    kind: str
    target: str
    at_s: float
    hold_s: float


@dataclass(frozen=True, slots=True)
class Plan:
    """Everything a run does, in order."""

    seed: int
    shape: Shape
    actions: tuple[Action, ...]
    steps: tuple[Step, ...]
    load_end_s: float

    @property
    def settle_s(self) -> float:
        """When every deadline and every planned signal has passed, with a margin."""
        times = [a.at_s for a in self.actions]
        times += [a.deadline_s for a in self.actions if a.deadline_s is not None]
        return max([*times, self.load_end_s]) + self.shape.settle_margin_s


def scopes(seed: int) -> list[str]:
    """Scopes covering every partition evenly, named after the seed."""
    found: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    i = 0
    while any(len(names) < _SCOPES_PER_PARTITION for names in found.values()):
        name = f"n{seed}-{i}"
        bucket = found[partition_for(name, PARTITIONS)]
        if len(bucket) < _SCOPES_PER_PARTITION:
            bucket.append(name)
        i += 1
    return sorted(name for names in found.values() for name in names)


def _steps(rng: random.Random, shape: Shape, kinds: Sequence[str]) -> tuple[list[Step], float]:
    order = list(kinds) if kinds else rng.sample(KINDS, len(KINDS))
    steps, t = [], shape.warmup_s
    for i in range(shape.rounds):
        kind = order[i % len(order)]
        span = {"pause": shape.pause_s, "kill": shape.down_s}.get(kind, shape.fault_s)
        hold = round(rng.uniform(*span), 1)
        replica = rng.choice(REPLICAS)
        target = {
            "cut-replica-broker": f"{replica}+broker",
            "cut-broker": "broker",
            "cut-replicas": ",".join(REPLICAS),
        }.get(kind, replica)
        steps.append(Step(kind, target, round(t, 1), hold))
        t += hold + shape.gap_s
    return steps, t


def _operation(rng: random.Random, n: int, at: float, scope: str, shape: Shape) -> list[Action]:
    op_id = f"op{n}"
    width = rng.choice((1, 2, 3))
    keys = tuple(f"{op_id}.k{j}" for j in range(width))
    condition, count = "all", None
    if width > 1 and rng.random() < 0.15:
        condition, count = ("any", None) if rng.random() < 0.5 else ("count", width - 1)
    deadline = at + rng.uniform(*shape.deadline_s)

    def send(kind: str, when: float, keys: tuple[str, ...] = ()) -> Action:
        via = "http" if rng.random() < (0.6 if kind == "register" else 0.5) else "kafka"
        replica = rng.randrange(len(REPLICAS)) if via == "http" else None
        return Action(round(when, 3), kind, via, replica, scope, op_id, keys)

    register = send("register", at, keys)
    actions = [replace(register, condition=condition, count=count, deadline_s=deadline)]
    fate = rng.random()
    in_time = (at + 0.2, max(at + 0.3, deadline - 0.8))
    if fate < 0.5:  # completed by signals in time
        actions += [send("signal", rng.uniform(*in_time), (k,)) for k in keys]
    elif fate < 0.75:  # the last key comes late
        actions += [send("signal", rng.uniform(*in_time), (k,)) for k in keys[:-1]]
        actions.append(send("signal", deadline + rng.uniform(*shape.late_s), (keys[-1],)))
    else:  # left to expire: fewer keys than it needs, and now and then a cancel
        needed = 1 if condition == "any" else count or width
        some = rng.sample(keys, rng.randrange(needed))
        actions += [send("signal", rng.uniform(*in_time), (k,)) for k in some]
        if rng.random() < 0.1:
            actions.append(send("cancel", rng.uniform(at + 0.5, max(at + 0.6, deadline - 0.5))))
    return actions


def make_plan(seed: int, shape: Shape, kinds: Sequence[str] = ()) -> Plan:
    """The run of ``seed``: its faults (``kinds`` in this order, or a seeded order of all),
    then its load until the last round's gap ends.

    Raises:
        ValueError: an unknown fault kind.
    """
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(KINDS)}")
    rng = random.Random(seed)
    steps, load_end = _steps(rng, shape, kinds)
    names = scopes(seed)
    actions: list[Action] = []
    at, n = rng.uniform(0, 0.2), 0
    while at < load_end:
        actions += _operation(rng, n, at, rng.choice(names), shape)
        n += 1
        at += rng.expovariate(shape.rate_per_s)
    actions.sort(key=lambda a: a.at_s)
    return Plan(seed, shape, tuple(actions), tuple(steps), load_end)
