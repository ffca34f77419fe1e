"""Timer micro-benchmarks: the timing wheel beside asyncio's and heapq's timers (harness layer).

For each pending count N the same N deadlines, uniform over ``1..60_000`` ms, are scheduled in
four structures: the wheel with its defaults (``Timer()``: tick 1 ms, 20 buckets per level), a
wider wheel (``Timer(tick_ms=1, wheel_size=512)``), ``asyncio``'s ``loop.call_later`` on a new,
non-running event loop, and a plain :mod:`heapq` queue of ``[deadline, seq, task]``
(:class:`~tests.benchmarks._baselines.HeapTimer`). Measured, in operations per CPU second:

* ``schedule_prebuilt``: the scheduling call alone, the task objects built beforehand (wheel:
  ``timer.add(task)``; heapq: ``add(deadline, task)``). asyncio has no such figure: its entry, the
  ``TimerHandle``, is always built inside ``call_later``;
* ``schedule_constructed``: building the task and scheduling it (``add(TimerTask(...))``);
  for asyncio this is ``call_later(delay, callback)`` with one shared callback, which builds one
  ``TimerHandle`` per call, so it is the like-for-like comparison;
* ``cancel``: cancelling all N in the order they were added. asyncio's ``handle.cancel()`` and the
  heapq queue are lazy (the entry stays in the heap until it reaches the top); the wheel's is an
  actual ``O(1)`` removal;
* ``expire_1ms`` / ``expire_10ms``: ``advance_clock`` through ``0..60_000`` ms in 1 ms or 10 ms
  steps, tasks returned per second (the cost of the empty steps included);
* ``expire_jump``: one ``advance_clock(60_000)`` returning all N. For asyncio this is one
  iteration of ``loop.run_forever()`` over N handles scheduled with ``call_at`` in the past, which
  pops every handle and runs its (no-op) callback. asyncio cannot be stepped through simulated
  time: its loop reads its own monotonic clock and expires only inside a running loop, so this
  single iteration, its best case, is the only expire figure it gets;
* ``bytes_per_entry`` (tracemalloc): memory of the N tasks once scheduled minus the N tasks
  alone. For asyncio the handle is both the task and the entry, so its figure is the whole
  ``TimerHandle`` plus its heap slot.

Pending counts are the size reached: schedule fills an empty structure up to N, cancel and expire
drain it from N. Each figure is the best of a few repeats (one at a million).
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from purgatory import Timer, TimerTask
from tests.benchmarks._baselines import HeapTimer
from tests.benchmarks._measure import MemoryProbe, best_rate, timed

__all__ = [
    "HORIZON_MS",
    "IMPLS",
    "TimerResult",
    "bench_timer",
    "default_repeats",
    "make_deadlines",
    "run_timer_benchmarks",
]

#: Deadlines are uniform over ``1..HORIZON_MS`` milliseconds.
HORIZON_MS = 60_000
#: The structures measured, in the order they are reported.
IMPLS = ("wheel", "wheel-512", "asyncio", "heapq")

_WHEELS: dict[str, Callable[[], Timer]] = {
    "wheel": Timer,
    "wheel-512": lambda: Timer(tick_ms=1, wheel_size=512),
}


@dataclass(frozen=True, slots=True)
class TimerResult:
    """One structure at one pending count; rates are operations per CPU second."""

    impl: str
    pending: int
    schedule_prebuilt_per_s: float | None
    schedule_constructed_per_s: float
    cancel_per_s: float
    expire_1ms_per_s: float | None
    expire_10ms_per_s: float | None
    expire_jump_per_s: float
    bytes_per_entry: float | None
    #: tasks returned by each expire variant (each must equal ``pending``).
    returned: dict[str, int] = field(default_factory=dict)


def make_deadlines(count: int, seed: int = 1) -> list[int]:
    """``count`` deadlines uniform over ``1..HORIZON_MS``, reproducible from ``seed``."""
    rng = random.Random(seed)
    return [rng.randint(1, HORIZON_MS) for _ in range(count)]


def _noop() -> None:
    """The callback every asyncio handle carries."""


# -- the wheel --------------------------------------------------------------------------------


def _wheel_schedule_prebuilt(make: Callable[[], Timer], deadlines: Sequence[int]) -> float:
    tasks = [TimerTask(deadline_ms=d) for d in deadlines]
    timer = make()
    add = timer.add
    with timed() as elapsed:
        for task in tasks:
            add(task)
    return elapsed.cpu_s


def _wheel_schedule_constructed(make: Callable[[], Timer], deadlines: Sequence[int]) -> float:
    timer = make()
    add = timer.add
    with timed() as elapsed:
        for deadline in deadlines:
            add(TimerTask(deadline_ms=deadline))
    return elapsed.cpu_s


def _wheel_filled(
    make: Callable[[], Timer], deadlines: Sequence[int]
) -> tuple[Timer, list[TimerTask]]:
    tasks = [TimerTask(deadline_ms=d) for d in deadlines]
    timer = make()
    for task in tasks:
        timer.add(task)
    return timer, tasks


def _wheel_cancel(make: Callable[[], Timer], deadlines: Sequence[int]) -> float:
    timer, tasks = _wheel_filled(make, deadlines)
    with timed() as elapsed:
        for task in tasks:
            task.cancel()
    assert len(timer) == 0
    return elapsed.cpu_s


def _wheel_expire(
    make: Callable[[], Timer], deadlines: Sequence[int], step_ms: int
) -> tuple[float, int]:
    timer, _ = _wheel_filled(make, deadlines)
    advance = timer.advance_clock
    returned = 0
    with timed() as elapsed:
        for now in range(step_ms, HORIZON_MS + step_ms, step_ms):
            returned += len(advance(now))
    return elapsed.cpu_s, returned


def _wheel_memory(make: Callable[[], Timer], deadlines: Sequence[int]) -> int:
    with MemoryProbe() as probe:
        tasks = [TimerTask(deadline_ms=d) for d in deadlines]
        probe.mark()
        timer = make()
        add = timer.add
        for task in tasks:
            add(task)
        return probe.growth()


# -- heapq ------------------------------------------------------------------------------------


def _heap_schedule_prebuilt(deadlines: Sequence[int]) -> float:
    tasks = [TimerTask(deadline_ms=d) for d in deadlines]
    pairs = list(zip(deadlines, tasks, strict=True))
    heap = HeapTimer()
    add = heap.add
    with timed() as elapsed:
        for deadline, task in pairs:
            add(deadline, task)
    return elapsed.cpu_s


def _heap_schedule_constructed(deadlines: Sequence[int]) -> float:
    heap = HeapTimer()
    add = heap.add
    with timed() as elapsed:
        for deadline in deadlines:
            add(deadline, TimerTask(deadline_ms=deadline))
    return elapsed.cpu_s


def _heap_cancel(deadlines: Sequence[int]) -> float:
    heap = HeapTimer()
    entries = [heap.add(d, TimerTask(deadline_ms=d)) for d in deadlines]
    cancel = heap.cancel
    with timed() as elapsed:
        for entry in entries:
            cancel(entry)
    assert len(heap) == 0
    return elapsed.cpu_s


def _heap_expire(deadlines: Sequence[int], step_ms: int) -> tuple[float, int]:
    heap = HeapTimer()
    for d in deadlines:
        heap.add(d, TimerTask(deadline_ms=d))
    advance = heap.advance_clock
    returned = 0
    with timed() as elapsed:
        for now in range(step_ms, HORIZON_MS + step_ms, step_ms):
            returned += len(advance(now))
    return elapsed.cpu_s, returned


def _heap_memory(deadlines: Sequence[int]) -> int:
    with MemoryProbe() as probe:
        pairs = [(d, TimerTask(deadline_ms=d)) for d in deadlines]
        probe.mark()
        heap = HeapTimer()
        add = heap.add
        for deadline, task in pairs:
            add(deadline, task)
        return probe.growth()


# -- asyncio ----------------------------------------------------------------------------------


def _asyncio_schedule(deadlines: Sequence[int]) -> float:
    delays = [d / 1000 for d in deadlines]
    loop = asyncio.new_event_loop()
    try:
        call_later = loop.call_later
        with timed() as elapsed:
            for delay in delays:
                call_later(delay, _noop)
    finally:
        loop.close()
    return elapsed.cpu_s


def _asyncio_cancel(deadlines: Sequence[int]) -> float:
    loop = asyncio.new_event_loop()
    try:
        handles = [loop.call_later(d / 1000, _noop) for d in deadlines]
        with timed() as elapsed:
            for handle in handles:
                handle.cancel()
    finally:
        loop.close()
    return elapsed.cpu_s


def _asyncio_expire(deadlines: Sequence[int]) -> tuple[float, int]:
    loop = asyncio.new_event_loop()
    try:
        counter = itertools.count()
        tick = counter.__next__
        base = loop.time() - HORIZON_MS / 1000 - 1.0
        call_at = loop.call_at
        for d in deadlines:
            call_at(base + d / 1000, tick)
        with timed() as elapsed:
            loop.stop()
            loop.run_forever()
        returned = next(counter)
    finally:
        loop.close()
    return elapsed.cpu_s, returned


def _asyncio_memory(deadlines: Sequence[int]) -> int:
    delays = [d / 1000 for d in deadlines]
    loop = asyncio.new_event_loop()
    try:
        with MemoryProbe() as probe:
            call_later = loop.call_later
            for delay in delays:
                call_later(delay, _noop)
            return probe.growth()
    finally:
        loop.close()


# -- driver -----------------------------------------------------------------------------------


def _rate_and_count(
    count: int, run: Callable[[], tuple[float, int]], repeats: int
) -> tuple[float, int]:
    best = 0.0
    returned = count
    for _ in range(max(1, repeats)):
        seconds, got = run()
        if got != count:
            returned = got
        best = max(best, count / seconds if seconds > 0 else float("inf"))
    return best, returned


def bench_timer(
    impl: str, deadlines: Sequence[int], *, repeats: int = 1, memory: bool = True
) -> TimerResult:
    """Measure one structure on ``deadlines`` (see the module docstring for each figure).

    Args:
        impl: one of :data:`IMPLS`.
        deadlines: the deadlines to schedule, in ms (the pending count is their number).
        repeats: runs per figure; the best is kept.
        memory: whether to measure bytes per entry (tracemalloc makes it the slowest part).

    Raises:
        ValueError: for an unknown ``impl``.
    """
    n = len(deadlines)
    returned: dict[str, int] = {}
    prebuilt: float | None
    step_1: float | None
    step_10: float | None
    mem: int | None
    if impl in _WHEELS:
        make = _WHEELS[impl]
        prebuilt = best_rate(n, lambda: _wheel_schedule_prebuilt(make, deadlines), repeats)
        constructed = best_rate(n, lambda: _wheel_schedule_constructed(make, deadlines), repeats)
        cancel = best_rate(n, lambda: _wheel_cancel(make, deadlines), repeats)
        step_1, returned["1ms"] = _rate_and_count(
            n, lambda: _wheel_expire(make, deadlines, 1), repeats
        )
        step_10, returned["10ms"] = _rate_and_count(
            n, lambda: _wheel_expire(make, deadlines, 10), repeats
        )
        jump, returned["jump"] = _rate_and_count(
            n, lambda: _wheel_expire(make, deadlines, HORIZON_MS), repeats
        )
        mem = _wheel_memory(make, deadlines) if memory else None
    elif impl == "heapq":
        prebuilt = best_rate(n, lambda: _heap_schedule_prebuilt(deadlines), repeats)
        constructed = best_rate(n, lambda: _heap_schedule_constructed(deadlines), repeats)
        cancel = best_rate(n, lambda: _heap_cancel(deadlines), repeats)
        step_1, returned["1ms"] = _rate_and_count(n, lambda: _heap_expire(deadlines, 1), repeats)
        step_10, returned["10ms"] = _rate_and_count(n, lambda: _heap_expire(deadlines, 10), repeats)
        jump, returned["jump"] = _rate_and_count(
            n, lambda: _heap_expire(deadlines, HORIZON_MS), repeats
        )
        mem = _heap_memory(deadlines) if memory else None
    elif impl == "asyncio":
        prebuilt = None
        constructed = best_rate(n, lambda: _asyncio_schedule(deadlines), repeats)
        cancel = best_rate(n, lambda: _asyncio_cancel(deadlines), repeats)
        step_1 = step_10 = None
        jump, returned["jump"] = _rate_and_count(n, lambda: _asyncio_expire(deadlines), repeats)
        mem = _asyncio_memory(deadlines) if memory else None
    else:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    return TimerResult(
        impl=impl,
        pending=n,
        schedule_prebuilt_per_s=prebuilt,
        schedule_constructed_per_s=constructed,
        cancel_per_s=cancel,
        expire_1ms_per_s=step_1,
        expire_10ms_per_s=step_10,
        expire_jump_per_s=jump,
        bytes_per_entry=None if mem is None else mem / n,
        returned=returned,
    )


def default_repeats(pending: int) -> int:
    """Best of 5 for small counts, fewer as they grow, one at a million."""
    return max(1, min(5, 300_000 // pending))


def run_timer_benchmarks(
    sizes: Sequence[int],
    *,
    impls: Sequence[str] = IMPLS,
    memory: bool = True,
    repeats: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[TimerResult]:
    """Every structure at every pending count, side by side on the same deadlines."""
    results: list[TimerResult] = []
    for n in sizes:
        deadlines = make_deadlines(n, seed=n)
        for impl in impls:
            if progress is not None:
                progress(f"timer {impl} at {n:,} pending")
            reps = repeats if repeats is not None else default_repeats(n)
            results.append(bench_timer(impl, deadlines, repeats=reps, memory=memory))
    return results
