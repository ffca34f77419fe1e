"""The memory estimate: the module's worked example, and the formula against ``tracemalloc``.

The constants of :mod:`purgatory._core.engine.footprint` were measured once; this test measures
again,
the same way, and fails when the engine's objects drift more than 30 % from the formula (then
measure again and update the constants and their comment).
"""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import Callable

import pytest

from purgatory._core.engine.engine import Engine
from purgatory._core.engine.footprint import (
    finished_bytes,
    operation_bytes,
    signal_bytes,
    utf8_len,
)
from purgatory._core.engine.model import OperationSpec, SignalFact
from purgatory._core.flink.keyed_timers import TimeDomain

NIGHT = "ingest@2026-11-22"
KEYS = ("ingest/orders", "ingest/users", "ingest/stock")


def test_the_worked_example() -> None:
    spec = OperationSpec(
        op_id="nightly", scope=NIGHT, keys=KEYS, deadline_ms=6_000, payload='{"job": "report"}'
    )
    assert utf8_len(spec.payload or "") == 17
    assert operation_bytes(spec) == 1_039
    assert finished_bytes(spec) == 1_382
    assert signal_bytes(NIGHT, "ingest/orders", SignalFact(0, None, "o")) == 560


def test_utf8_lengths_count_bytes_not_characters() -> None:
    assert utf8_len("abc") == 3
    assert utf8_len("é") == 2
    assert utf8_len("€") == 3
    assert utf8_len("\ud800") == 3  # a lone surrogate, as JSON may carry one


def test_the_engine_totals_follow_the_formula() -> None:
    engine = Engine()
    spec = OperationSpec(op_id="nightly", scope=NIGHT, keys=KEYS, deadline_ms=6_000)
    engine.register(spec, now_ms=0)
    engine.signal(NIGHT, "ingest/orders", now_ms=1, payload="o")
    stats = engine.statistics()
    assert stats.pending_bytes == operation_bytes(spec)
    assert (stats.remembered_signals, stats.remembered_bytes) == (1, 560)
    assert stats.finished_bytes == 0
    engine.cancel(NIGHT, "nightly", now_ms=2)
    stats = engine.statistics()
    assert (stats.pending_bytes, stats.finished_bytes) == (0, finished_bytes(spec))
    assert engine.memory_bytes == 560 + finished_bytes(spec)


# -- the constants, measured again -------------------------------------------------------------

_N = 3_000


def _fresh(text: str) -> str:
    """A new string object, as a JSON decode gives it (nothing interned or shared)."""
    value = json.loads(json.dumps(text))
    assert isinstance(value, str)
    return value


def _spec(i: int, keys: int, payload: int, domain: TimeDomain) -> OperationSpec:
    return OperationSpec(
        op_id=_fresh(f"op-{i:08d}"),
        scope=_fresh(f"scope-{i % 10:04d}"),
        keys=tuple(_fresh(f"key-{i:07d}-{j:02d}") for j in range(keys)),
        deadline_ms=10_000_000 + 7 * i,
        payload=_fresh("p" * payload) if payload else None,
        time_domain=domain,
    )


def _traced(fill: Callable[[Engine], None]) -> tuple[int, Engine]:
    """The bytes ``fill`` adds to an empty engine (the engine's own fixed cost excluded)."""
    engine = Engine()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fill(engine)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before, engine
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    ("keys", "payload", "domain"),
    [
        (0, 0, TimeDomain.PROCESSING_TIME),
        (1, 0, TimeDomain.PROCESSING_TIME),
        (3, 1_000, TimeDomain.PROCESSING_TIME),
        (10, 0, TimeDomain.PROCESSING_TIME),
        (3, 0, TimeDomain.EVENT_TIME),
    ],
)
def test_pending_and_finished_operations_within_30_percent_of_tracemalloc(
    keys: int, payload: int, domain: TimeDomain
) -> None:
    def pending(engine: Engine) -> None:
        for i in range(_N):
            engine.register(_spec(i, keys, payload, domain), now_ms=0)

    def finished(engine: Engine) -> None:
        for i in range(_N):
            spec = _spec(i, keys, payload, domain)
            engine.register(spec, now_ms=0)
            engine.cancel(spec.scope, spec.op_id, now_ms=0)
        engine.purgatory.purge_completed()

    measured, engine = _traced(pending)
    estimated = engine.statistics().pending_bytes
    assert 0.7 <= measured / estimated <= 1.3, (measured / _N, estimated / _N)
    measured, engine = _traced(finished)
    estimated = engine.statistics().finished_bytes
    assert 0.7 <= measured / estimated <= 1.3, (measured / _N, estimated / _N)


@pytest.mark.parametrize("payload", [0, 100, 1_000])
def test_remembered_signals_within_30_percent_of_tracemalloc(payload: int) -> None:
    def remembered(engine: Engine) -> None:
        for i in range(_N):
            text = _fresh("x" * payload) if payload else None
            engine.signal(_fresh(f"scope-{i % 10:04d}"), _fresh(f"key-{i:07d}"), now_ms=1,
                          payload=text)  # fmt: skip

    measured, engine = _traced(remembered)
    estimated = engine.statistics().remembered_bytes
    assert 0.7 <= measured / estimated <= 1.3, (measured / _N, estimated / _N)
