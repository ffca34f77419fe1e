"""The rollout's verdict on hand-built records: what counts as lost, conflicting, fast enough.

No process and no broker: the writes, the signals, the pending list and the callbacks are the
few a run would record (:mod:`tests.nemesis.rollout_load`), and each test reads the figures
(:mod:`tests.nemesis.rollout_verdict`). ``python -m tests.nemesis.rollout`` runs the real thing.
"""

from __future__ import annotations

from tests.nemesis.history import Request
from tests.nemesis.rollout_load import Attempt, SignalSent, Target, Write
from tests.nemesis.rollout_verdict import (
    correctness,
    dropped_at_stop,
    readiness_seconds,
    write_figures,
)
from tests.nemesis.test_checker import DEADLINE, T, cb


def write(
    n: int, *attempts: tuple[int, int | None, int | None], took_ms: int, note: str = ""
) -> Write:
    """Write ``n`` to scope ``s``: its attempts as (ms after T, replica, status), each with
    ``note`` when it had no answer."""
    w = Write(n, Target("s", f"w{n}", f"k{n}"), DEADLINE, first_ms=T + attempts[0][0])
    w.attempts = [Attempt(T + at, replica, status, "" if status else note)
                  for at, replica, status in attempts]  # fmt: skip
    w.status, w.latency_ms, w.final_ms = attempts[-1][2], took_ms, w.first_ms + took_ms
    return w


def preloaded(op: str) -> Request:
    return Request("register", "http", 0, "s", op, (f"key-{op}",), "all", None, DEADLINE,
                   T - 5_000, T - 4_000, "ok", 200)  # fmt: skip


def test_write_figures_count_fast_writes_503s_and_what_attempts_met() -> None:
    writes = [
        write(0, (0, 0, 201), took_ms=40),
        write(1, (0, 1, 503), (1_000, 2, 201), took_ms=1_100),
        write(2, (0, None, None), (100, 0, None), (3_200, 1, 503), (4_300, 2, 201), took_ms=4_400),
        write(3, (0, 0, 409), took_ms=30),
    ]
    figures = write_figures(writes)
    assert figures["ok"] == 3 and figures["refused_4xx"] == 1 and figures["unanswered"] == 0
    assert figures["ok_within_2s"] == 2 and figures["share_ok_within_2s"] == 0.5
    assert (figures["p50_ms"], figures["p99_ms"], figures["max_ms"]) == (40, 4_400, 4_400)
    assert figures["answers_503"] == 2 and figures["writes_with_503"] == 2
    assert figures["no_answer"] == 1 and figures["no_ready_replica"] == 1
    assert figures["retried_writes"] == 2


def test_an_attempt_in_flight_at_the_sigterm_with_no_answer_is_dropped() -> None:
    cut = "RemoteProtocolError: Server disconnected without sending a response."
    refused = "ConnectError: all attempts to connect to 127.0.0.1:8080 failed"
    writes = [
        write(0, (0, 0, None), (600, 1, 201), took_ms=700, note=cut),  # in flight: dropped
        write(1, (0, 0, 201), took_ms=50),  # answered before the SIGTERM
        write(2, (600, 0, None), (700, 1, 201), took_ms=200, note=cut),  # sent after
        write(3, (0, 1, None), (600, 1, 201), took_ms=700, note=cut),  # another replica's
        write(4, (0, 0, None), (600, 1, 201), took_ms=700, note=refused),  # never connected
    ]
    assert dropped_at_stop(writes, 0, T + 500) == 1


def test_readiness_seconds_integrate_the_routable_count_within_the_load() -> None:
    changes = [(0.0, 1), (1.0, 2), (2.0, 3), (10.0, 2), (11.0, 0), (12.5, 1), (14.0, 3)]
    assert readiness_seconds(changes, 5.0, 20.0, 3) == (1.5, 4.0)
    assert readiness_seconds([], 0.0, 2.0, 3) == (2.0, 2.0)


def test_pending_operations_are_not_lost_and_signals_must_complete() -> None:
    registrations = [preloaded("p0"), preloaded("p1"), preloaded("p2"), write(0, (0, 0, 201),
                     took_ms=20).request()]  # fmt: skip
    signals = [SignalSent(Target("s", "p0", "key-p0"), T + 100, acked=True)]
    callbacks = [cb("p0", "completed", outcome_ms=T + 150, keys=("key-p0",),
                    registered_ms=T - 4_900)]  # fmt: skip
    pending = {("s", "p1"), ("s", "p2"), ("s", "w0")}
    found = correctness(registrations, signals, pending, callbacks, "acknowledged")
    assert (found["lost"], found["conflicting"], found["phantom_pending"]) == (0, 0, 0)
    assert found["early"] == found["contradicting"] == 0
    assert (found["pending"], found["decided_operations"]) == (3, 1)


def test_lost_registrations_lost_signals_and_pending_yet_decided_are_found() -> None:
    registrations = [preloaded("p0"), preloaded("p1"), preloaded("p2"), preloaded("p3")]
    signals = [
        SignalSent(Target("s", "p1", "key-p1"), T + 100, acked=True),  # its op stays pending
        SignalSent(Target("s", "p3", "key-p3"), T + 100, acked=False),  # not acked: no claim
    ]
    callbacks = [cb("p2", "completed", outcome_ms=T + 150, keys=("key-p2",),
                    registered_ms=T - 4_900)]  # fmt: skip
    pending = {("s", "p1"), ("s", "p2"), ("s", "p3"), ("s", "ghost")}
    found = correctness(registrations, signals, pending, callbacks, "acknowledged")
    # p0 is neither pending nor decided; p1's acknowledged signal completed nothing.
    assert (found["lost_registrations"], found["lost_signals"], found["lost"]) == (1, 1, 2)
    assert found["examples"]["lost_registrations"] == ["s/p0"]
    # p2 has its outcome yet is listed pending; "ghost" was never registered.
    assert (found["pending_but_decided"], found["conflicting"]) == (1, 1)
    assert found["phantom_pending"] == 1
    # p2 completed with no signal sent: the checker's own finding.
    assert found["early"] == 1


def test_two_outcomes_for_one_operation_conflict() -> None:
    registrations = [preloaded("p0")]
    signals = [SignalSent(Target("s", "p0", "key-p0"), T + 100, acked=True)]
    callbacks = [
        cb("p0", "completed", outcome_ms=T + 150, keys=("key-p0",), registered_ms=T - 4_900),
        cb("p0", "expired", outcome_ms=DEADLINE, keys=(), missing=("key-p0",),
           registered_ms=T - 4_900, sequence=2, offset=1),
    ]  # fmt: skip
    found = correctness(registrations, signals, set(), callbacks, "acknowledged")
    assert found["conflicting_outcomes"] >= 1 and found["conflicting"] >= 1
