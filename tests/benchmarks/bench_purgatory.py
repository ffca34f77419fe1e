"""Kafka's TestPurgatoryPerformance in simulated time: the purgatory's CPU capacity (harness).

The workload follows Kafka's test. Requests arrive as a Poisson process at ``rate_per_s``; each
watches 3 keys drawn from 100 shared keys plus one private key, and has a deadline 200 ms after
its arrival. Its completion latency is log-normal, given by its median and 75th percentile
(``mu = ln(pct50)``, ``sigma = (ln(pct75) - mu) / 0.6745``); Kafka's two published cases are
20/60 ms and 200/400 ms. A request whose latency is below the timeout is completed from outside at
``arrival + latency``: its "done" flag is set and ``check_and_complete`` is called on its private
key, so ``try_complete`` (which returns ``force_complete()`` once the flag is set) is measured
without trying hundreds of watchers of the shared keys. The other requests expire.

Nothing sleeps: the whole event list (arrivals and completions, integer milliseconds) is drawn
beforehand, then replayed in order. At each distinct event time the purgatory's clock is advanced
first, and every expired operation's ``run()`` is invoked, as the executor would. The replay is
timed in CPU seconds with the garbage collector running, as it would in the service (blind to
the precomputed event list, which the service would not hold). The figure of merit is requests
per CPU second; a rate is *sustained* when replaying ``duration_ms`` of traffic took less than
``duration_ms`` of CPU; single runs vary by about 10 % on a shared machine. The same event list
drives :class:`purgatory.DelayedOperationPurgatory` and the heapq baseline
(:class:`~tests.benchmarks._baselines.HeapqPurgatory`), so both see identical work; the counts of
completed and expired operations must add up to the requests, and match the event list.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol

from purgatory import DelayedOperation, DelayedOperationPurgatory, TimerTask
from tests.benchmarks._baselines import HeapqPurgatory
from tests.benchmarks._measure import timed

__all__ = [
    "CASES",
    "PURGATORIES",
    "SHARED_KEYS",
    "TIMEOUT_MS",
    "SimResult",
    "Workload",
    "make_workload",
    "run_purgatory_benchmarks",
    "simulate",
]

TIMEOUT_MS = 200
SHARED_KEYS = 100
KEYS_PER_REQUEST = 3
#: Kafka's two published latency cases, ``(pct50_ms, pct75_ms)``.
CASES: tuple[tuple[int, int], ...] = ((20, 60), (200, 400))

_ARRIVAL = 0
_COMPLETION = 1


class _Purgatory(Protocol):
    def try_complete_else_watch(self, op: DelayedOperation, keys: Iterable[Hashable]) -> bool: ...

    def check_and_complete(self, key: Hashable) -> int: ...

    def advance_clock(self, now_ms: int) -> Sequence[TimerTask]: ...


#: The purgatories compared, by name: a factory for a fresh, empty one.
PURGATORIES: dict[str, Callable[[], _Purgatory]] = {
    "wheel": lambda: DelayedOperationPurgatory("bench"),
    "heapq": HeapqPurgatory,
}


class SimOp(DelayedOperation):
    """A request: completes once its latency has passed and its private key is checked."""

    __slots__ = ("done",)

    #: Operations expired since the counter was last reset (``on_expiration`` calls).
    expirations: ClassVar[int] = 0

    def __init__(self, *, deadline_ms: int) -> None:
        super().__init__(deadline_ms=deadline_ms)
        self.done = False

    def try_complete(self) -> bool:
        """Complete once the simulated work is done."""
        return self.done and self.force_complete()

    def on_expiration(self) -> None:
        """Count the expiry."""
        SimOp.expirations += 1


@dataclass(frozen=True, slots=True)
class Workload:
    """A precomputed event list of ``(time_ms, kind, request)``, sorted, arrivals first."""

    rate_per_s: int
    duration_ms: int
    pct50_ms: int
    pct75_ms: int
    timeout_ms: int
    events: list[tuple[int, int, int]]
    keys: list[tuple[str, ...]]
    private_keys: list[str]
    completes: list[bool]
    end_ms: int

    @property
    def requests(self) -> int:
        """How many requests arrive."""
        return len(self.keys)

    @property
    def expected_completed(self) -> int:
        """Requests whose latency is below the timeout (all others must expire)."""
        return sum(self.completes)


@dataclass(frozen=True, slots=True)
class SimResult:
    """One purgatory replaying one workload."""

    impl: str
    pct50_ms: int
    pct75_ms: int
    rate_per_s: int
    duration_ms: int
    requests: int
    cpu_s: float
    wall_s: float
    requests_per_cpu_s: float
    cpu_us_per_request: float
    #: CPU seconds per simulated second: below 1 means the rate is sustained on one core.
    load: float
    sustained: bool
    completed: int
    expired: int
    expected_completed: int


def make_workload(
    rate_per_s: int,
    duration_ms: int,
    *,
    pct50_ms: int,
    pct75_ms: int,
    timeout_ms: int = TIMEOUT_MS,
    seed: int = 7,
) -> Workload:
    """Draw the arrivals, keys and latencies of ``duration_ms`` of traffic at ``rate_per_s``."""
    rng = random.Random(seed)
    mu = math.log(pct50_ms)
    sigma = (math.log(pct75_ms) - mu) / 0.6745
    shared = [f"shared-{k}" for k in range(SHARED_KEYS)]
    per_ms = rate_per_s / 1000
    events: list[tuple[int, int, int]] = []
    keys: list[tuple[str, ...]] = []
    private_keys: list[str] = []
    completes: list[bool] = []
    arrival = rng.expovariate(per_ms)
    while arrival < duration_ms:
        index = len(keys)
        at_ms = int(arrival)
        private = f"request-{index}"
        picked = rng.sample(shared, KEYS_PER_REQUEST)
        keys.append((*picked, private))
        private_keys.append(private)
        events.append((at_ms, _ARRIVAL, index))
        latency_ms = int(rng.lognormvariate(mu, sigma))
        done = latency_ms < timeout_ms
        completes.append(done)
        if done:
            events.append((at_ms + latency_ms, _COMPLETION, index))
        arrival += rng.expovariate(per_ms)
    events.sort()
    end_ms = (events[-1][0] if events else 0) + timeout_ms
    return Workload(
        rate_per_s=rate_per_s,
        duration_ms=duration_ms,
        pct50_ms=pct50_ms,
        pct75_ms=pct75_ms,
        timeout_ms=timeout_ms,
        events=events,
        keys=keys,
        private_keys=private_keys,
        completes=completes,
        end_ms=end_ms,
    )


def simulate(impl: str, workload: Workload) -> SimResult:
    """Replay ``workload`` through a fresh purgatory named ``impl`` (a key of PURGATORIES)."""
    purgatory = PURGATORIES[impl]()
    try_complete_else_watch = purgatory.try_complete_else_watch
    check_and_complete = purgatory.check_and_complete
    advance_clock = purgatory.advance_clock
    keys = workload.keys
    private_keys = workload.private_keys
    completes = workload.completes
    timeout_ms = workload.timeout_ms
    ops: list[SimOp | None] = [None] * workload.requests
    completed = 0
    SimOp.expirations = 0
    now_ms = -1
    with timed(pause_gc=False) as elapsed:
        for time_ms, kind, index in workload.events:
            if time_ms != now_ms:
                now_ms = time_ms
                for task in advance_clock(time_ms):
                    task.run()
            if kind == _ARRIVAL:
                op = SimOp(deadline_ms=time_ms + timeout_ms)
                if completes[index]:
                    ops[index] = op
                if try_complete_else_watch(op, keys[index]):
                    completed += 1
            else:
                pending = ops[index]
                ops[index] = None
                assert pending is not None
                pending.done = True
                completed += check_and_complete(private_keys[index])
        for task in advance_clock(workload.end_ms):
            task.run()
    requests = workload.requests
    sim_s = workload.duration_ms / 1000
    return SimResult(
        impl=impl,
        pct50_ms=workload.pct50_ms,
        pct75_ms=workload.pct75_ms,
        rate_per_s=workload.rate_per_s,
        duration_ms=workload.duration_ms,
        requests=requests,
        cpu_s=elapsed.cpu_s,
        wall_s=elapsed.wall_s,
        requests_per_cpu_s=requests / elapsed.cpu_s if elapsed.cpu_s > 0 else float("inf"),
        cpu_us_per_request=elapsed.cpu_s * 1e6 / requests if requests else 0.0,
        load=elapsed.cpu_s / sim_s,
        sustained=elapsed.cpu_s <= sim_s,
        completed=completed,
        expired=SimOp.expirations,
        expected_completed=workload.expected_completed,
    )


def run_purgatory_benchmarks(
    rates_per_s: Sequence[int],
    duration_ms: int,
    *,
    cases: Sequence[tuple[int, int]] = CASES,
    impls: Sequence[str] = tuple(PURGATORIES),
    progress: Callable[[str], None] | None = None,
) -> list[SimResult]:
    """Every purgatory on the same event list, for every latency case and arrival rate."""
    results: list[SimResult] = []
    for pct50_ms, pct75_ms in cases:
        for rate in rates_per_s:
            workload = make_workload(rate, duration_ms, pct50_ms=pct50_ms, pct75_ms=pct75_ms)
            for impl in impls:
                if progress is not None:
                    progress(f"purgatory {impl} {pct50_ms}/{pct75_ms} ms at {rate:,}/s")
                results.append(simulate(impl, workload))
    return results
