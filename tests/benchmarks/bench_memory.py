"""What a pending operation holds, by component (harness).

``python -m tests.benchmarks.bench_memory [--pending N]`` registers ``N`` operations (1,000,000
by default) into one :class:`~purgatory._core.engine.engine.Engine` as the service does: each
decoded from its own JSON (so its strings are fresh objects, as an HTTP batch gives them), one
watch key each, 64 scopes, a relative timeout of an hour, the operations of one batch of 10,000
registered at the same millisecond. ``tracemalloc`` traces every allocation that is still held
afterwards, and each is charged to the component whose code made it:

- **decoded texts and ints**: the op_id, key and scope strings and the timeout's int, as the
  JSON decoder made them, where they are kept;
- **deadline ints**: the deadline computed for each operation, where it is kept;
- **operation**: the pending operation's object (``_Op``, a timer task), and what it keeps
  (the spec and its keys tuple, where they are kept);
- **index**: the engine's index of pending operations (its dict and ``(scope, op_id)`` keys)
  and its sorted pages of op_ids;
- **watches**: the purgatory's watch lists (their dict, ``(scope, key)`` keys and lists);
- **wheel**: the timing wheel's buckets and each task's sequence number.

Beside them: the process's RSS growth per operation (``VmRSS``, the collector run first), a
full ``gc.collect()``'s seconds with the operations held, and the registrations per second.
It prints a markdown table; run it from a checkout of another commit to compare.
"""

from __future__ import annotations

import argparse
import gc
import json
import linecache
import time
import tracemalloc
from collections import defaultdict
from collections.abc import Sequence

from purgatory._core import Engine, OperationSpec

_T0 = 1_798_761_600_000
_TIMEOUT_MS = 3_600_000
_BATCH = 10_000

#: (file name's end, a fragment of the source line or "", component): the first that matches the
#: allocation's innermost frame wins.
_COMPONENTS = (
    ("json/decoder.py", "", "decoded texts and ints"),
    ("bench_memory.py", "deadline_ms=", "deadline ints"),
    ("bench_memory.py", "", "operation"),
    ("engine/sorted_ids.py", "", "index"),
    ("wheel/purgatory.py", "", "watches"),
    ("wheel/timer.py", "", "wheel"),
    ("engine/lifecycle.py", "for k in", "watches"),
    ("engine/lifecycle.py", "ident", "index"),
    ("engine/lifecycle.py", "_ops[", "index"),
    ("engine/lifecycle.py", "", "operation"),
    ("engine/engine_types.py", "", "operation"),
    ("engine/engine.py", "", "operation"),
)


def _rss_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _component(trace: tracemalloc.Traceback) -> str:
    """The component of one allocation, from its innermost frame."""
    frame = trace[-1]  # a traceback runs from the oldest frame to the most recent
    line = linecache.getline(frame.filename, frame.lineno)
    for end, fragment, name in _COMPONENTS:
        if frame.filename.endswith(end) and fragment in line:
            return name
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}"


def _register(engine: Engine, texts: Sequence[bytes]) -> float:
    began = time.perf_counter()
    for first in range(0, len(texts), _BATCH):
        now = _T0 + first // _BATCH
        for text in texts[first : first + _BATCH]:
            raw = json.loads(text)
            timeout = raw["timeout_ms"]
            spec = OperationSpec(
                op_id=raw["op_id"],
                scope=raw["scope"],
                keys=tuple(raw["keys"]),
                deadline_ms=now + timeout,
                timeout_ms=timeout,
            )
            engine.register(spec, now_ms=now)
    return time.perf_counter() - began


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pending", type=int, default=1_000_000)
    parser.add_argument("--traced", type=int, default=200_000, help="operations traced")
    args = parser.parse_args(argv)
    texts = [
        json.dumps({
            "scope": f"s{i % 64}", "op_id": f"o{i}", "keys": [f"k{i}"], "timeout_ms": _TIMEOUT_MS
        }).encode()
        for i in range(args.pending)
    ]  # fmt: skip

    # RSS and the registration rate at full size, without tracing.
    gc.collect()
    engine = Engine(start_ms=_T0)
    before = _rss_bytes()
    seconds = _register(engine, texts)
    gc.collect()
    rss = (_rss_bytes() - before) / args.pending
    began = time.perf_counter()
    gc.collect()
    collect_s = time.perf_counter() - began
    del engine
    gc.collect()

    # Each component's bytes, traced on a smaller engine (tracing is slow).
    traced = texts[: args.traced]
    engine = Engine(start_ms=_T0)
    tracemalloc.start(4)
    start = tracemalloc.take_snapshot()
    _register(engine, traced)
    gc.collect()
    held = tracemalloc.take_snapshot().compare_to(start, "traceback")
    tracemalloc.stop()
    by_component: dict[str, float] = defaultdict(float)
    for stat in held:
        if stat.size_diff > 0:
            by_component[_component(stat.traceback)] += stat.size_diff / len(traced)
    print(f"| pending | {args.pending:,} |")
    print(f"| RSS per operation | {rss:.0f} B |")
    print(f"| registrations per second | {args.pending / seconds:,.0f} |")
    print(f"| a full gc.collect() | {collect_s:.3f} s |")
    print(f"| traced per operation ({len(traced):,} traced) | {sum(by_component.values()):.0f} B |")
    for name, size in sorted(by_component.items(), key=lambda kv: -kv[1]):
        if size >= 1:
            print(f"| {name} | {size:.0f} B |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
