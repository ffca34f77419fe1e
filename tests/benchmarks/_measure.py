"""Measurement helpers shared by the benchmarks (harness layer, outside the core).

Micro-benchmarks run with the cyclic garbage collector paused (as :mod:`timeit` does), so a full
collection triggered by a million freshly allocated objects is not charged to whichever structure
happened to be running; whole-workload simulations keep it running, as in production, but blind
to the harness's precomputed data. Every implementation is measured the same way. Times are CPU
seconds of this process (:func:`time.process_time`), which other processes on a shared machine
do not inflate; wall time (:func:`time.perf_counter`) is kept beside it. Memory is measured with
:mod:`tracemalloc`, as the growth of traced memory across one step.
"""

from __future__ import annotations

import gc
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = [
    "Elapsed",
    "MemoryProbe",
    "best_rate",
    "gc_paused",
    "gc_running_on_new_objects",
    "machine_info",
    "quiet_kafka_warnings",
    "timed",
]


@dataclass(slots=True)
class Elapsed:
    """CPU and wall seconds spent inside one :func:`timed` block (filled in when it exits)."""

    cpu_s: float = 0.0
    wall_s: float = 0.0


@contextmanager
def gc_paused() -> Iterator[None]:
    """Collect garbage, then keep the cyclic collector off for the block."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def gc_running_on_new_objects() -> Iterator[None]:
    """Keep the collector running for the block, blind to every object that exists before it.

    ``gc.freeze()`` moves the harness's own data (a precomputed event list of millions of
    objects) out of the collector's view, so a full collection during the block scans only what
    the code under test allocated, as it would in a service that holds no such list.
    """
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


@contextmanager
def timed(*, pause_gc: bool = True) -> Iterator[Elapsed]:
    """Measure the block's CPU and wall time, by default with the garbage collector paused.

    With ``pause_gc=False`` the collector runs, on the objects created inside the block only
    (see :func:`gc_running_on_new_objects`).
    """
    elapsed = Elapsed()
    with gc_paused() if pause_gc else gc_running_on_new_objects():
        cpu0 = time.process_time()
        wall0 = time.perf_counter()
        try:
            yield elapsed
        finally:
            elapsed.cpu_s = time.process_time() - cpu0
            elapsed.wall_s = time.perf_counter() - wall0


def best_rate(count: int, run: Callable[[], float], repeats: int) -> float:
    """Run ``run`` (which returns CPU seconds for ``count`` operations) and keep the best rate."""
    best = 0.0
    for _ in range(max(1, repeats)):
        seconds = run()
        rate = count / seconds if seconds > 0 else float("inf")
        best = max(best, rate)
    return best


class MemoryProbe:
    """Traced memory growth across steps: ``mark()`` before, ``growth()`` after."""

    def __init__(self) -> None:
        self._mark = 0

    def __enter__(self) -> MemoryProbe:
        gc.collect()
        tracemalloc.start()
        self.mark()
        return self

    def __exit__(self, *exc: object) -> None:
        tracemalloc.stop()

    def mark(self) -> None:
        """Remember the current traced memory."""
        gc.collect()
        self._mark = tracemalloc.get_traced_memory()[0]

    def growth(self) -> int:
        """Bytes allocated (and still alive) since the last :meth:`mark`."""
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - self._mark


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info() -> dict[str, str | int]:
    """The facts a reader needs to compare figures: CPU, core count, interpreter."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        usable = os.cpu_count() or 1
    return {
        "cpu_model": _cpu_model(),
        "cpus": usable,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "executable_bits": 64 if sys.maxsize > 2**32 else 32,
    }


@contextmanager
def quiet_kafka_warnings() -> Iterator[None]:
    """Silence the deprecation warnings kafka-python's protocol loading prints."""
    import warnings  # noqa: PLC0415

    with warnings.catch_warnings():
        for message in ("read_text is deprecated", "open_text is deprecated"):
            warnings.filterwarnings("ignore", message=message, category=DeprecationWarning)
        yield
