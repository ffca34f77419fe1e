"""The rollout's load: what a Service routes to, HTTP writes that retry as a client does, and
Kafka signals, all recorded (trio, real time).

- :class:`Router` is the Service: it polls every replica's ``/readyz`` every 250 ms (a poll
  times out after 3 s, as the chart's probe does) and routes only to the replicas whose last
  poll answered 200, round robin. A replica being stopped is
  taken out at once (a terminating pod leaves the endpoints) until its next incarnation starts.
- :class:`Writer` sends single ``POST /v1/operations`` at a steady rate, each a task of its
  own so that a write that waits delays no other. A write goes to a ready replica; a 503 is
  tried again after its ``Retry-After``, a connection error, another 5xx or no ready replica
  after a short back-off, each time to a ready replica, with the same ``op_id`` (marked
  ``Purgatory-Retry: 1`` once a 503 said ``Purgatory-Applied: maybe``), until a 2xx or a 4xx,
  for about 30 s from its first send (each attempt ends by httpx's own timeouts, never by a
  cancellation: see :meth:`Writer._attempt`). At most 48 requests are in flight to a replica;
  the others wait their turn. Every attempt is recorded
  (:class:`Write`).
- :class:`Signaller` produces signals to the signals topic at a steady rate, each completing
  one operation registered before: alternately one of the preloaded ones and the oldest
  registration the writer had answered 2xx and no signal has named yet.
- :func:`preload` registers the pending operations through ``/v1/operations:batch``, spread
  over the replicas (any replica answers for any scope: it forwards each part to its owner).
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import trio
from kafka.errors import KafkaError

from purgatory._codec import APPLIED_HEADER, RETRY_HEADER
from tests.benchmarks.bench_service import signal_value
from tests.nemesis._clock import wall_ms
from tests.nemesis.history import Probe, Request, Result

__all__ = [
    "IN_FLIGHT",
    "PROBE_EVERY_S",
    "WRITE_BOUND_S",
    "Attempt",
    "Router",
    "SignalSent",
    "Signaller",
    "Target",
    "Write",
    "Writer",
    "preload",
    "preload_targets",
    "result_of",
    "shuffled",
]

PROBE_EVERY_S = 0.25
_PROBE_TIMEOUT_S = 3.0  # the chart's readiness probe's timeoutSeconds
WRITE_BOUND_S = 30.0
IN_FLIGHT = 48  # requests in flight to one replica (below the client's pool of 64)
_ATTEMPT_TIMEOUT_S = 10.0
_CONNECT_TIMEOUT_S = 3.0
_BACKOFF_S = 0.1
_SIGNAL_TICK_S = 0.05
_PRELOAD_BOUND_S = 120.0


def result_of(status: int | None) -> Result:
    """A final HTTP status as the nemesis's history reads it."""
    if status is not None and 200 <= status < 300:
        return "ok"
    return "fail" if status is not None and 400 <= status < 500 else "unknown"


@dataclass(frozen=True, slots=True)
class Target:
    """An operation a signal can complete: its scope, id and only watch key."""

    scope: str
    op_id: str
    key: str


class Router:
    """The Service in front of the replicas: routes to those whose last ``/readyz`` was 200.

    Args:
        urls: the replicas' base URLs, by index.
        token: the API token (``/readyz`` needs none; sent anyway, as a probe may).
    """

    def __init__(self, urls: Sequence[str], token: str) -> None:
        self._urls = list(urls)
        self.ready = [False] * len(urls)
        self._out = [False] * len(urls)
        self._generation = [0] * len(urls)
        self._turn = itertools.count()
        self._headers = {"authorization": f"Bearer {token}"}
        self._waiting: list[set[trio.CancelScope]] = [set() for _ in urls]
        self.probes: list[Probe] = []
        #: (monotonic seconds, how many replicas were routable from then on)
        self.changes: list[tuple[float, int]] = []

    def pick(self) -> int | None:
        """A routable replica, round robin (None: none is)."""
        routable = [i for i, ready in enumerate(self.ready) if ready]
        return routable[next(self._turn) % len(routable)] if routable else None

    def routable(self, index: int) -> bool:
        """Whether requests go to ``index`` now."""
        return self.ready[index]

    @contextlib.contextmanager
    def while_routable(self, index: int) -> Iterator[trio.CancelScope]:
        """A cancel scope that is cancelled as soon as ``index`` stops being routable (at once
        if it is not), so that a wait for it costs nothing while it lasts."""
        with trio.CancelScope() as scope:
            if not self.ready[index]:
                scope.cancel()
            self._waiting[index].add(scope)
            try:
                yield scope
            finally:
                self._waiting[index].discard(scope)

    def take_out(self, index: int) -> None:
        """Route nothing more to ``index`` until :meth:`put_back` (a terminating pod)."""
        self._out[index] = True
        self._generation[index] += 1
        self._set(index, False)

    def put_back(self, index: int) -> None:
        """``index`` runs again: its ``/readyz`` polls decide again."""
        self._out[index] = False
        self._generation[index] += 1

    def _set(self, index: int, ready: bool) -> None:
        if not ready:
            for scope in self._waiting[index]:
                scope.cancel()
        if self.ready[index] != ready:
            self.ready[index] = ready
            self.changes.append((trio.current_time(), sum(self.ready)))

    async def run(self) -> None:
        """Poll every replica every 250 ms until cancelled."""
        async with (
            httpx.AsyncClient(headers=self._headers, timeout=_PROBE_TIMEOUT_S) as http,
            trio.open_nursery() as nursery,
        ):
            for index in range(len(self._urls)):
                nursery.start_soon(self._poll, http, index)

    async def _poll(self, http: httpx.AsyncClient, index: int) -> None:
        while True:
            began, generation = trio.current_time(), self._generation[index]
            status: int | None = None
            if not self._out[index]:
                try:
                    status = (await http.get(f"{self._urls[index]}/readyz")).status_code
                except httpx.HTTPError:
                    status = None
                if generation == self._generation[index]:  # not taken out meanwhile
                    self._set(index, status == 200)
                self.probes.append(Probe(wall_ms(), index, status))
            await trio.sleep_until(began + PROBE_EVERY_S)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One try of a write: when, to which replica (None: none was ready), the status (None:
    no answer) and what went wrong, briefly; and when its request left (after its wait for a
    place among the requests in flight to the replica) and its answer came (None: it did
    not), so that the replica's time is told apart from the harness's queue."""

    at_ms: int
    replica: int | None
    status: int | None
    note: str = ""
    sent_ms: int | None = None
    answered_ms: int | None = None


@dataclass(slots=True)
class Write:
    """One registration over HTTP, from its first send to its final answer."""

    n: int
    target: Target
    deadline_ms: int
    first_ms: int = 0
    final_ms: int = 0
    latency_ms: int = 0  # monotonic, first send to final answer
    status: int | None = None
    applied_maybe: bool = False
    attempts: list[Attempt] = field(default_factory=list)

    def request(self) -> Request:
        """The write as one request of the nemesis's history."""
        first = self.attempts[0].replica if self.attempts else None
        return Request(
            kind="register",
            via="http",
            replica=first,
            scope=self.target.scope,
            op_id=self.target.op_id,
            keys=(self.target.key,),
            condition="all",
            count=None,
            deadline_ms=self.deadline_ms,
            invoke_ms=self.first_ms,
            complete_ms=self.final_ms,
            result=result_of(self.status),
            status=self.status,
            applied_maybe=self.applied_maybe,
        )

    def body(self) -> dict[str, Any]:
        t = self.target
        return {
            "scope": t.scope,
            "op_id": t.op_id,
            "keys": [t.key],
            "deadline_ms": self.deadline_ms,
        }


def _retry_after_s(response: httpx.Response) -> float:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return _BACKOFF_S


class Writer:
    """Registers one operation every ``1 / rate_per_s`` seconds over HTTP until stopped.

    Args:
        router: where to send.
        clients: one client per replica, by index (base URL and token set).
        rate_per_s: writes per second.
        scopes: write ``n`` goes to scope ``s<n % scopes>`` (the preload's scopes).
        deadline_ms: every write's deadline (far: nothing expires during the run).
        on_ok: called with each write answered 2xx.
    """

    def __init__(
        self,
        router: Router,
        clients: Sequence[httpx.AsyncClient],
        *,
        rate_per_s: float,
        scopes: int,
        deadline_ms: int,
        on_ok: Callable[[Write], None],
    ) -> None:
        self._router = router
        self._clients = list(clients)
        self._rate = rate_per_s
        self._scopes = scopes
        self._deadline_ms = deadline_ms
        self._on_ok = on_ok
        # The requests in flight to a replica are bounded here, not in the client's pool:
        # httpx's pool walks its whole queue on every release, so thousands of writes queued
        # there while a replica is slow would take the load generator's CPU.
        self._slots = [trio.Semaphore(IN_FLIGHT) for _ in clients]
        self.writes: list[Write] = []

    async def run(self, stop: trio.Event) -> None:
        """Send until ``stop`` is set, then wait for the writes in flight (each bounded)."""
        async with trio.open_nursery() as nursery:
            began = trio.current_time()
            for n in itertools.count():
                await trio.sleep_until(began + n / self._rate)
                if stop.is_set():
                    break
                target = Target(f"s{n % self._scopes}", f"w{n}", f"kw{n}")
                write = Write(n, target, self._deadline_ms)
                self.writes.append(write)
                nursery.start_soon(self._write, write)

    async def _write(self, write: Write) -> None:
        began = trio.current_time()
        write.first_ms = wall_ms()
        body = write.body()
        while True:
            status, pause_s = await self._attempt(write, body, began)
            write.status = status
            if status is not None and 200 <= status < 500:
                break
            if trio.current_time() + pause_s - began >= WRITE_BOUND_S:
                break
            await trio.sleep(pause_s)
        write.final_ms = wall_ms()
        write.latency_ms = round((trio.current_time() - began) * 1000)
        if result_of(write.status) == "ok":
            self._on_ok(write)

    async def _slot(self, index: int, began: float) -> bool:
        """Take a place among the requests in flight to ``index``, waiting while it stays
        routable and the write has time left; whether one was taken. The wait is one blocked
        task: nothing polls, however many writes wait (they would take the harness's CPU)."""
        with trio.move_on_after(self._left_s(began)), self._router.while_routable(index):
            await self._slots[index].acquire()
            return True
        return False

    @staticmethod
    def _left_s(began: float) -> float:
        """An attempt's bound: what is left of the write's 30 s, at most 10 s, at least 0.5."""
        return max(0.5, min(_ATTEMPT_TIMEOUT_S, WRITE_BOUND_S - (trio.current_time() - began)))

    async def _attempt(
        self, write: Write, body: dict[str, Any], began: float
    ) -> tuple[int | None, float]:
        """One try: its status (None: no answer) and the pause before the next."""
        at_ms, index = wall_ms(), self._router.pick()
        if index is None:  # a Service with no endpoint: tried again once the probes may tell
            write.attempts.append(Attempt(at_ms, None, None, "no ready replica"))
            return None, PROBE_EVERY_S
        headers = {RETRY_HEADER: "1"} if write.applied_maybe else {}
        slots = self._slots[index]
        if not await self._slot(index, began):
            if not self._router.routable(index):  # as a balancer does: route it elsewhere now
                write.attempts.append(Attempt(at_ms, index, None, "taken out while queued"))
                return None, 0.0
            write.attempts.append(Attempt(at_ms, index, None, "no free slot to the replica"))
            return None, _BACKOFF_S
        # Never cancelled from outside: httpcore 1.0.9 leaks a pool slot for good when a
        # request is cancelled at the wrong moment (encode/httpcore#1093). Its own timeouts
        # bound the attempt instead.
        left_s = self._left_s(began)
        timeout = httpx.Timeout(left_s, connect=min(_CONNECT_TIMEOUT_S, left_s))
        sent_ms = wall_ms()
        try:
            response = await self._clients[index].post(
                "/v1/operations", json=body, headers=headers, timeout=timeout
            )
        except httpx.HTTPError as exc:
            why = f"{type(exc).__name__}: {exc}"[:160]
            write.attempts.append(Attempt(at_ms, index, None, why, sent_ms))
            return None, _BACKOFF_S
        finally:
            slots.release()
        status = response.status_code
        maybe = response.headers.get(APPLIED_HEADER, "").lower() == "maybe"
        write.applied_maybe = write.applied_maybe or maybe
        note = "" if status < 300 else response.text[:160]
        write.attempts.append(Attempt(at_ms, index, status, note, sent_ms, wall_ms()))
        return status, _retry_after_s(response) if status == 503 else _BACKOFF_S


@dataclass(slots=True)
class SignalSent:
    """One signal produced: the operation it completes, when, and whether the broker took it."""

    target: Target
    at_ms: int
    future: Any = None
    acked: bool = False
    error: str = ""

    def request(self) -> Request:
        """The signal as one request of the nemesis's history."""
        t = self.target
        return Request(
            kind="signal",
            via="kafka",
            replica=None,
            scope=t.scope,
            op_id=t.op_id,
            keys=(t.key,),
            condition="all",
            count=None,
            deadline_ms=None,
            invoke_ms=self.at_ms,
            complete_ms=self.at_ms,
            result="ok" if self.acked else "unknown",
            error=self.error,
        )


class Signaller:
    """Produces ``rate_per_s`` signals a second to ``topic``, each completing one operation.

    Args:
        producer: a kafka-python producer (``acks=all``), its metadata for ``topic`` loaded.
        topic: the signals topic.
        preloaded: the preloaded operations, in the order to signal them.
        live: registrations answered 2xx, oldest first (the writer appends).
        rate_per_s: signals per second.
    """

    def __init__(
        self,
        producer: Any,
        topic: str,
        preloaded: Sequence[Target],
        live: deque[Target],
        *,
        rate_per_s: float,
    ) -> None:
        self._producer = producer
        self._topic = topic
        self._preloaded = iter(preloaded)
        self._live = live
        self._rate = rate_per_s
        self.sent: list[SignalSent] = []

    def _next(self, n: int) -> Target | None:
        if n % 2 and self._live:
            return self._live.popleft()
        return next(self._preloaded, None) or (self._live.popleft() if self._live else None)

    async def run(self, stop: trio.Event) -> None:
        """Send until ``stop`` is set."""
        began = trio.current_time()
        n = 0
        while not stop.is_set():
            await trio.sleep(_SIGNAL_TICK_S)
            while n < int((trio.current_time() - began) * self._rate):
                target = self._next(n)
                n += 1
                if target is not None:
                    self._send(target)

    def _send(self, target: Target) -> None:
        sent = SignalSent(target, wall_ms())
        try:
            sent.future = self._producer.send(
                self._topic, key=target.scope.encode(), value=signal_value(target.scope, target.key)
            )
        except KafkaError as exc:
            sent.error = f"{type(exc).__name__}: {exc}"[:200]
        self.sent.append(sent)

    def finish(self, timeout_s: float) -> None:
        """Flush the producer (bounded) and record which signals the broker acknowledged."""
        try:
            self._producer.flush(timeout=timeout_s)
        except KafkaError as exc:
            for sent in self.sent:
                sent.error = sent.error or f"flush: {type(exc).__name__}"
        for sent in self.sent:
            future = sent.future
            if future is not None and future.is_done:
                sent.acked = bool(future.succeeded())
                if not sent.acked:
                    sent.error = f"{future.exception!r}"[:200]
            elif future is not None:
                sent.error = sent.error or "not acknowledged when the flush ended"


def preload_targets(count: int, scopes: int) -> list[Target]:
    """Preloaded operation ``i``: scope ``s<i % scopes>``, id ``p<i>``, key ``k<i>``."""
    return [Target(f"s{i % scopes}", f"p{i}", f"k{i}") for i in range(count)]


async def preload(
    clients: Sequence[httpx.AsyncClient],
    targets: Sequence[Target],
    *,
    deadline_ms: int,
    batch: int,
) -> list[Request]:
    """Register ``targets`` through ``/v1/operations:batch``, one batch in flight per replica,
    batch ``b`` to replica ``b % replicas``; every operation as a request of the history.

    Raises:
        RuntimeError: a batch was not answered 200 within 120 s of retries, or an item was
            refused (the answer named).
    """
    done: list[Request] = []
    chunks = [targets[i : i + batch] for i in range(0, len(targets), batch)]
    queue = deque(enumerate(chunks))

    async def worker() -> None:
        while queue:
            number, chunk = queue.popleft()
            index = number % len(clients)
            done.extend(await _preload_batch(clients[index], index, chunk, deadline_ms))

    async with trio.open_nursery() as nursery:
        for _ in clients:
            nursery.start_soon(worker)
    return done


async def _preload_batch(
    http: httpx.AsyncClient, index: int, chunk: Sequence[Target], deadline_ms: int
) -> list[Request]:
    ops = [
        {"scope": t.scope, "op_id": t.op_id, "keys": [t.key], "deadline_ms": deadline_ms}
        for t in chunk
    ]
    began, invoke_ms, last = trio.current_time(), wall_ms(), ""
    while trio.current_time() - began < _PRELOAD_BOUND_S:
        try:
            response = await http.post("/v1/operations:batch", json={"operations": ops}, timeout=60)
        except httpx.HTTPError as exc:
            last = f"{type(exc).__name__}: {exc}"
        else:
            if response.status_code == 200:
                break
            last = f"HTTP {response.status_code} {response.text[:300]}"
        await trio.sleep(1.0)
    else:
        raise RuntimeError(f"preload: a batch to r{index} not taken within 120 s; last: {last}")
    complete_ms = wall_ms()
    results = response.json()["results"]
    bad = [r for r in results if r["http_status"] not in (200, 201)]
    if bad:
        raise RuntimeError(f"preload: {len(bad)} operations refused by r{index}, e.g. {bad[0]}")
    return [
        Request(
            "register",
            "http",
            index,
            t.scope,
            t.op_id,
            (t.key,),
            "all",
            None,
            deadline_ms,
            invoke_ms,
            complete_ms,
            "ok",
            200,
        )
        for t in chunk
    ]


def shuffled(targets: Sequence[Target], seed: int) -> list[Target]:
    """``targets`` in a seeded random order (which preloaded operations signals complete)."""
    order = list(targets)
    random.Random(seed).shuffle(order)
    return order
