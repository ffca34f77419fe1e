"""Apache Kafka out of reach for 30 s (SIGSTOP), under ``purgatory serve``: writes answer 503.

The broker keeps its connections and its log but answers nothing while stopped, which is what
an unreachable broker looks like to its clients. One ``purgatory serve`` child runs against it
with the default ``PURGATORY_JOURNAL_WAIT_MS``. While the broker is stopped:

* an HTTP write answers 503 with ``Retry-After`` and the journal error within the bound
  (measured), instead of hanging for the client's whole timeout;
* ``/readyz`` answers 200 and says ``journal: stalled`` with the seconds, and
  ``purgatory_journal_stalled`` is 1;
* a Python client with a long timeout keeps retrying a registration and a signal.

Then SIGCONT: the retrying client succeeds (its registration a duplicate of its first try), the
journal is ``ok`` again, and every operation acknowledged before, during (through the retries)
and the one answered 503 get their callback, each once; SIGTERM exits 0. The figures are
printed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from purgatory.client import operation
from purgatory.devtools.kafka_broker import KafkaBroker
from purgatory.service.ownership.partitioning import partition_for
from tests.bounds import bound
from tests.freeze import freeze
from tests.service.end_to_end.test_e2e import PARTITIONS, _settings
from tests.service.end_to_end.test_sigkill import READY_BOUND_S, CallbackReader, Child, _pause

pytestmark = pytest.mark.kafka

OUTAGE_S = 30.0
WAIT_S = 5.0  # PURGATORY_JOURNAL_WAIT_MS's default
CLIENT_TIMEOUT_S = 120.0  # outlasts the outage: the client retries the 503s
LONG_MS = 600_000  # the barriers complete long before their deadline
SCOPES = ("stall-a", "stall-b", "stall-c", "stall-d")


def _gone(service: Child) -> str:
    """Whether the child still runs, and its log's tail: what a failure must show (a replica
    that exited during the outage, with the error it exited on)."""
    assert service.proc is not None
    code = service.proc.poll()
    if code is None:
        state = f"the service (pid {service.proc.pid}) still runs"
    elif code < 0:
        state = f"the service exited on {signal.Signals(-code).name}"
    else:
        state = f"the service exited with status {code}"
    return f"{state}\n{service.log_tail(chars=12_000)}"


def _get(service: Child, path: str) -> httpx.Response:
    """GET ``path`` from the child; when it cannot be reached, fail with its exit status and
    log, not a bare connection error."""
    try:
        return httpx.get(f"{service.url}{path}", timeout=5)
    except httpx.TransportError as exc:
        raise AssertionError(f"GET {path}: {exc!r}; {_gone(service)}") from exc


def _journal(service: Child) -> dict[str, Any]:
    response = _get(service, "/readyz")
    assert response.status_code == 200, response.text
    journal: dict[str, Any] = response.json()["journal"]
    return journal


def _stalled_gauge(service: Child) -> float:
    text = _get(service, "/metrics").text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "purgatory_journal_stalled":
                return float(sample.value)
    raise AssertionError("purgatory_journal_stalled is not served")


class Retrying:
    """A client call in a thread: its answer (or error) and when it returned."""

    def __init__(self, call: Any) -> None:
        self.answer: Any = None
        self.error: BaseException | None = None
        self.done_at: float | None = None

        def run() -> None:
            try:
                self.answer = call()
            except BaseException as exc:
                self.error = exc
            self.done_at = time.perf_counter()

        self._thread = threading.Thread(target=run, daemon=True)
        self._thread.start()

    def join(self, timeout_s: float, service: Child) -> Any:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), f"the retrying client did not return; {_gone(service)}"
        if self.error is not None:
            failed = f"the retrying client failed: {self.error!r}; {_gone(service)}"
            raise AssertionError(failed) from self.error
        return self.answer


def test_a_broker_out_of_reach_for_30_s_gets_503s_then_everything_through(
    apache_kafka: KafkaBroker, tmp_path: Path
) -> None:
    assert {partition_for(s, PARTITIONS) for s in SCOPES} == set(range(PARTITIONS))
    broker: Any = apache_kafka  # the helpers are typed for the embedded broker; same contract
    settings = _settings(broker)
    service = Child(settings, tmp_path)
    pid = apache_kafka.pid
    assert pid is not None
    stopped = False
    try:
        service.start()
        service.wait_ready(timeout_s=bound(READY_BOUND_S))
        before = [
            operation(scope=s, op_id=f"before-{s}", keys=[f"k-{s}"], timeout_ms=LONG_MS)
            for s in SCOPES
        ]
        with service.client(timeout_s=30) as client:
            for body in before:
                assert client.register(**body)["status"] == "pending"

        freeze(pid)  # the broker answers nothing from now on
        stopped = True
        stopped_at = time.perf_counter()

        # A write without retries: 503 with Retry-After within the bound, not a hang.
        began = time.perf_counter()
        try:
            refused = httpx.post(
                f"{service.url}/v1/operations",
                json=operation(
                    scope=SCOPES[0], op_id="refused", keys=["k-refused"], timeout_ms=LONG_MS
                ),
                timeout=CLIENT_TIMEOUT_S,
            )
        except httpx.TransportError as exc:
            raise AssertionError(f"POST /v1/operations: {exc!r}; {_gone(service)}") from exc
        refused_s = time.perf_counter() - began
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["status"] == 503 and error["field"] is None, error
        assert error["message"].startswith("the journal is not acknowledging"), error
        assert WAIT_S <= refused_s < WAIT_S + 2, refused_s

        # Clients with a long timeout keep retrying: a registration, and the signals that
        # complete the barriers registered before the outage.
        with service.client(timeout_s=CLIENT_TIMEOUT_S) as retrying_client:
            registration = Retrying(
                lambda: retrying_client.register(
                    scope=SCOPES[1], op_id="retried", keys=["k-retried"], timeout_ms=LONG_MS
                )
            )
            with service.client(timeout_s=CLIENT_TIMEOUT_S) as signalling_client:
                signals = Retrying(
                    lambda: signalling_client.signals(
                        [{"scope": s, "key": f"k-{s}"} for s in SCOPES]
                    )
                )

                # The replica stays ready and says the journal is stalled.
                journal = _journal(service)
                assert journal["state"] == "stalled", journal
                assert journal["unacknowledged_seconds"] >= WAIT_S, journal
                assert _stalled_gauge(service) == 1
                stalled_seen_s = journal["unacknowledged_seconds"]

                _pause(max(0.0, OUTAGE_S - (time.perf_counter() - stopped_at)))
                assert registration.done_at is None and signals.done_at is None, (
                    f"a retrying client returned during the outage: {registration.error!r},"
                    f" {signals.error!r}; {_gone(service)}"
                )
                journal = _journal(service)
                assert journal["state"] == "stalled", journal
                os.kill(pid, signal.SIGCONT)
                stopped = False
                back_at = time.perf_counter()
                outage_s = back_at - stopped_at

                registered = registration.join(CLIENT_TIMEOUT_S, service)
                signalled = signals.join(CLIENT_TIMEOUT_S, service)
        # Its first try was applied before the outage ended and became durable after it.
        assert registered["status"] == "duplicate", registered
        assert signalled["accepted"] == len(SCOPES), signalled
        assert registration.done_at is not None and signals.done_at is not None
        client_s = registration.done_at - stopped_at

        while _journal(service)["state"] != "ok":
            assert time.perf_counter() - back_at < 60, service.log_tail()
            _pause(0.1)
        journal_ok_s = time.perf_counter() - back_at
        assert _stalled_gauge(service) == 0
        began = time.perf_counter()
        with service.client(timeout_s=30) as client:
            after = client.register(
                scope=SCOPES[2], op_id="after", keys=["k-after"], timeout_ms=LONG_MS
            )
            assert after["status"] == "pending", after
            write_s = time.perf_counter() - began
            # The operation answered 503 was applied: it stays recorded and is durable now.
            assert client.get(SCOPES[0], "refused")["status"] == "pending"
            client.signals(
                [
                    {"scope": SCOPES[0], "key": "k-refused"},
                    {"scope": SCOPES[1], "key": "k-retried"},
                    {"scope": SCOPES[2], "key": "k-after"},
                ]
            )

        expected = {(b["scope"], b["op_id"]) for b in before}
        expected |= {(SCOPES[0], "refused"), (SCOPES[1], "retried"), (SCOPES[2], "after")}
        reader = CallbackReader(broker, settings.topic_callbacks)
        try:
            missing = reader.wait_for(expected, timeout_s=60)
            assert not missing, f"no callback for {sorted(missing)}\n{service.log_tail()}"
            reader.read_to_end(timeout_s=20)
        finally:
            reader.close()
        outcomes: dict[tuple[str, str], set[bytes]] = {}
        for cb in reader.records:
            outcomes.setdefault(cb.ident, set()).add(cb.raw)
            assert cb.doc["outcome"] == "completed", cb.doc
        assert set(outcomes) == expected
        assert all(len(copies) == 1 for copies in outcomes.values()), outcomes
        print(
            f"\njournal-stall: broker stopped {outage_s:.1f} s; a write answered 503 after"
            f" {refused_s:.2f} s (bound {WAIT_S:.0f} s); /readyz said stalled for"
            f" {stalled_seen_s:.1f} s; the retrying client registered {client_s:.1f} s after the"
            f" stop, {registration.done_at - back_at:.2f} s after the broker's return; the"
            f" journal was ok {journal_ok_s:.2f} s after it; a new write took {write_s:.3f} s;"
            f" {len(reader.records)} callbacks for {len(expected)} operations, each once"
        )
        assert service.terminate() == 0, service.log_tail()
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)  # never leave the session's broker stopped
        service.close()
