"""The workload: sends the plan's requests on time, over HTTP and Kafka, and records each answer.

A dispatcher thread releases each :class:`~tests.nemesis.plan.Action` at its offset from the
start of the load into a pool of worker threads, so a request that hangs on a cut link delays
no other (a request waits for a free worker only when all are hung; its ``invoke_ms`` is when it
was really sent). Every request is tried once, without the client's retries, and recorded as
one :class:`~tests.nemesis.history.Request`: HTTP answers are ``ok`` (2xx), ``fail`` (4xx) or
``unknown`` (5xx, a timeout, a connection error); a Kafka record is ``ok`` once the broker
acknowledged it (``acks=all``) and ``unknown`` otherwise. A prober samples every replica's
``/readyz`` each second. Every wait is bounded; ``stop`` ends both threads and the pool.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from kafka import KafkaProducer
from kafka.errors import KafkaError

from purgatory._codec import (
    APPLIED_HEADER,
    CancelRequest,
    RegisterRequest,
    SignalRecord,
    encode_request,
    encode_signal,
)
from purgatory._core import Condition
from tests.nemesis._clock import elapsed_s, pause, wall_ms
from tests.nemesis.history import HistoryWriter, Probe, Request, Result
from tests.nemesis.plan import Action, Plan

__all__ = ["Workload"]

_WORKERS = 64
_HTTP_TIMEOUT = httpx.Timeout(10.0, connect=3.0)
_KAFKA_WAIT_S = 15.0
_PROBE_EVERY_S = 1.0
_JOIN_S = 30.0


def _http_result(status: int) -> Result:
    if 200 <= status < 300:
        return "ok"
    return "fail" if 400 <= status < 500 else "unknown"


class Workload:
    """Sends ``plan``'s requests and records them in ``history``.

    Args:
        plan: what to send, when.
        bootstrap_servers: the broker, for the Kafka requests.
        urls: each replica's base URL, by index.
        token: the API token.
        topics: ``requests`` and ``signals`` topic names.
        history: where every request and probe is recorded.
    """

    def __init__(
        self,
        plan: Plan,
        *,
        bootstrap_servers: str,
        urls: Sequence[str],
        token: str,
        topics: dict[str, str],
        history: HistoryWriter,
    ) -> None:
        self._plan = plan
        self._urls = list(urls)
        self._topics = topics
        self._history = history
        headers = {"authorization": f"Bearer {token}"}
        limits = httpx.Limits(max_connections=_WORKERS, max_keepalive_connections=8)
        self._http = [
            httpx.Client(base_url=url, headers=headers, timeout=_HTTP_TIMEOUT, limits=limits)
            for url in urls
        ]
        self._probe_http = httpx.Client(headers=headers, timeout=0.8)
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap_servers,
            acks="all",
            request_timeout_ms=5_000,
            delivery_timeout_ms=12_000,
            max_block_ms=5_000,
            # kafka-python's idempotent producer never sends again once a batch expired while
            # the broker was cut (seen with 3.0.12): the load must outlive that, and the service
            # takes a duplicate record as a duplicate.
            enable_idempotence=False,
        )
        self._pool = ThreadPoolExecutor(max_workers=_WORKERS, thread_name_prefix="nemesis-load")
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._start_s = 0.0
        self.start_ms = 0
        self.sent = 0

    def start(self) -> None:
        """Start sending: the plan's offsets count from now."""
        self._start_s, self.start_ms = elapsed_s(), wall_ms()
        for target in (self._dispatch, self._probe):
            thread = threading.Thread(target=target, daemon=True, name=target.__name__)
            thread.start()
            self._threads.append(thread)

    def deadline_ms(self, action: Action) -> int:
        assert action.deadline_s is not None
        return self.start_ms + round(action.deadline_s * 1000)

    def _dispatch(self) -> None:
        for action in self._plan.actions:
            while not self._stop.is_set():
                left = self._start_s + action.at_s - elapsed_s()
                if left <= 0:
                    break
                pause(min(left, 0.2))
            if self._stop.is_set():
                return
            self._pool.submit(self._send, action)
            self.sent += 1

    def _probe(self) -> None:
        while not self._stop.is_set():
            began = elapsed_s()
            for index, url in enumerate(self._urls):
                status: int | None = None
                try:
                    status = self._probe_http.get(f"{url}/readyz").status_code
                except httpx.HTTPError:
                    status = None
                self._history.add(Probe(wall_ms(), index, status))
            pause(_PROBE_EVERY_S - (elapsed_s() - began))

    def dispatched(self) -> bool:
        """Whether every action has been handed to a worker."""
        return self.sent == len(self._plan.actions)

    def stop(self) -> None:
        """Stop sending, wait (bounded) for the requests in flight, close the clients;
        idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        for thread in self._threads:
            thread.join(_JOIN_S)
        self._pool.shutdown(wait=True, cancel_futures=True)
        for client in [*self._http, self._probe_http]:
            client.close()
        with contextlib.suppress(KafkaError):  # records still unsent were recorded unknown
            self._producer.close(timeout=5)

    # -- one request ---------------------------------------------------------------------------

    def _send(self, action: Action) -> None:
        invoke_ms = wall_ms()
        send: Callable[[Action], tuple[Result, int | None, bool, str]]
        send = self._over_http if action.via == "http" else self._over_kafka
        try:
            result, status, maybe, error = send(action)
        except Exception as exc:  # recorded as an unknown answer: the load must go on
            result, status, maybe, error = "unknown", None, False, f"harness: {exc!r}"
        self._history.add(
            Request(
                kind=action.kind,
                via=action.via,
                replica=action.replica,
                scope=action.scope,
                op_id=action.op_id,
                keys=action.keys,
                condition=action.condition,
                count=action.count,
                deadline_ms=self.deadline_ms(action) if action.kind == "register" else None,
                invoke_ms=invoke_ms,
                complete_ms=wall_ms(),
                result=result,
                status=status,
                applied_maybe=maybe,
                error=error[:300],
            )
        )

    def _over_http(self, action: Action) -> tuple[Result, int | None, bool, str]:
        assert action.replica is not None
        client = self._http[action.replica]
        try:
            response = self._http_call(client, action)
        except httpx.HTTPError as exc:
            return "unknown", None, False, f"{type(exc).__name__}: {exc}"
        status = response.status_code
        maybe = response.headers.get(APPLIED_HEADER, "").lower() == "maybe"
        error = "" if 200 <= status < 300 else response.text[:300]
        return _http_result(status), status, maybe, error

    def _http_call(self, client: httpx.Client, action: Action) -> httpx.Response:
        if action.kind == "register":
            body: dict[str, Any] = {
                "scope": action.scope,
                "op_id": action.op_id,
                "keys": list(action.keys),
                "condition": action.condition,
                "deadline_ms": self.deadline_ms(action),
            }
            if action.count is not None:
                body["count"] = action.count
            return client.post("/v1/operations", json=body)
        if action.kind == "signal":
            signals = [{"scope": action.scope, "key": action.keys[0]}]
            return client.post("/v1/signals", json={"signals": signals})
        return client.delete("/v1/operation", params={"scope": action.scope, "op_id": action.op_id})

    def _over_kafka(self, action: Action) -> tuple[Result, int | None, bool, str]:
        if action.kind == "register":
            record = RegisterRequest(
                op_id=action.op_id,
                scope=action.scope,
                keys=action.keys,
                condition=Condition(action.condition),
                count=action.count,
                deadline_ms=self.deadline_ms(action),
            )
            topic, value = self._topics["requests"], encode_request(record)
        elif action.kind == "signal":
            topic = self._topics["signals"]
            value = encode_signal(SignalRecord(action.scope, action.keys[0]))
        else:
            cancel = CancelRequest(op_id=action.op_id, scope=action.scope)
            topic, value = self._topics["requests"], encode_request(cancel)
        try:
            future = self._producer.send(topic, value=value, key=action.scope.encode())
            future.get(timeout=_KAFKA_WAIT_S)
        except KafkaError as exc:
            return "unknown", None, False, f"{type(exc).__name__}: {exc}"
        return "ok", None, False, ""
