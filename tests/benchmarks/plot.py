"""The timer throughput picture: operations per CPU second against pending count (harness layer).

One panel per operation (schedule with construction, cancel, expire in 1 ms steps, expire in one
jump), one line per structure, both axes logarithmic, the DESIGN.md targets drawn as dashed
lines. Rendered with matplotlib's Agg backend, so no display is needed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt

from tests.benchmarks.bench_timer import IMPLS, TimerResult

__all__ = ["plot_timer"]

_STYLE: dict[str, tuple[str, str]] = {
    "wheel": ("tab:blue", "o"),
    "wheel-512": ("tab:green", "s"),
    "asyncio": ("tab:red", "^"),
    "heapq": ("tab:gray", "v"),
}

_LABELS = {
    "wheel": "Timer() (tick 1 ms, 20 slots)",
    "wheel-512": "Timer(wheel_size=512)",
    "asyncio": "asyncio call_later",
    "heapq": "heapq (deadline, seq, task)",
}

_PANELS: tuple[tuple[str, Callable[[TimerResult], float | None], float | None], ...] = (
    ("schedule, task construction included", lambda r: r.schedule_constructed_per_s, 500_000.0),
    ("cancel", lambda r: r.cancel_per_s, 2_000_000.0),
    ("expire, advance_clock in 1 ms steps", lambda r: r.expire_1ms_per_s, 1_000_000.0),
    ("expire, one jump (asyncio: one loop iteration)", lambda r: r.expire_jump_per_s, None),
)


def plot_timer(results: Sequence[TimerResult], path: Path, *, title: str = "") -> Path:
    """Draw the timer results into a PNG at ``path`` and return the path."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    for ax, (panel, metric, target) in zip(axes.flat, _PANELS, strict=True):
        for impl in IMPLS:
            points = [
                (r.pending, value)
                for r in results
                if r.impl == impl and (value := metric(r)) is not None
            ]
            if not points:
                continue
            color, marker = _STYLE[impl]
            xs, ys = zip(*sorted(points), strict=True)
            ax.plot(xs, ys, color=color, marker=marker, label=_LABELS[impl])
        if target is not None:
            ax.axhline(target, color="black", linestyle="--", linewidth=1, label="target")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(panel, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("pending timers")
    for ax in axes[:, 0]:
        ax.set_ylabel("operations per CPU second")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=9)
    fig.suptitle(title or "Timer throughput against pending count")
    fig.tight_layout(rect=(0, 0.05, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
