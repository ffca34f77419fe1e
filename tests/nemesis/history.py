"""A nemesis run's history: every request and its answer, every fault, every replica exit.

The history is what a client could observe, Jepsen's way: each request is one event with the
moment it was invoked and the moment it completed (wall-clock epoch ms, the service's clock) and
its answer, ``ok`` (a 2xx, or the broker acknowledged the record), ``fail`` (a definite refusal:
a 4xx) or ``unknown`` (a timeout, a broken connection, a 503: it may or may not have happened).
Faults are events with the moment they were set and healed; readiness probes sample each
replica's ``/readyz``; every replica exit says whether the nemesis caused it. The callbacks
read back from the topic are records of their own. All of it is written as JSON lines, one
object per line with a ``type``, so a run can be checked again offline.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

__all__ = [
    "Callback",
    "Event",
    "Exit",
    "Fault",
    "HistoryWriter",
    "Probe",
    "Request",
    "read_callbacks",
    "read_history",
    "write_callbacks",
]

Result = Literal["ok", "fail", "unknown"]


@dataclass(frozen=True, slots=True)
class Request:
    """One request and its answer.

    Attributes:
        kind: ``register``, ``signal`` or ``cancel``.
        via: ``http`` or ``kafka``.
        replica: the replica an HTTP request was sent to (None over Kafka).
        scope: the operation's scope.
        op_id: the operation (a signal names the one it is meant for).
        keys: a registration's watch keys; a signal's one key; none for a cancel.
        condition: ``all``, ``any`` or ``count`` (registrations).
        count: the keys ``count`` needs, else None.
        deadline_ms: a registration's absolute deadline (epoch ms), else None.
        invoke_ms: when the request was sent.
        complete_ms: when its answer (or its failure) came.
        result: ``ok``, ``fail`` or ``unknown``.
        status: the HTTP status, or None.
        applied_maybe: a 503 said ``Purgatory-Applied: maybe``.
        error: why it was not ``ok``, briefly.
    """

    kind: str
    via: str
    replica: int | None
    scope: str
    op_id: str
    keys: tuple[str, ...]
    condition: str
    count: int | None
    deadline_ms: int | None
    invoke_ms: int
    complete_ms: int
    result: Result
    status: int | None = None
    applied_maybe: bool = False
    error: str = ""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: what, on which host(s), from when until its heal (None: never healed)."""

    kind: str
    target: str
    start_ms: int
    heal_ms: int | None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Probe:
    """One readiness sample: a replica's ``/readyz`` status (None: no answer)."""

    at_ms: int
    replica: int
    status: int | None


@dataclass(frozen=True, slots=True)
class Exit:
    """A replica incarnation's end: its exit code (``-N``: signal N), whether the nemesis
    caused it (SIGKILL), whether it was the final stop (SIGTERM), and its log's tail."""

    replica: int
    incarnation: int
    at_ms: int
    code: int
    by_nemesis: bool
    final_stop: bool = False
    tail: str = ""


Event = Request | Fault | Probe | Exit
_TYPES: dict[str, type[Any]] = {
    "request": Request,
    "fault": Fault,
    "probe": Probe,
    "exit": Exit,
}
_NAMES = {cls: name for name, cls in _TYPES.items()}


def _line(event: Event) -> str:
    return json.dumps({"type": _NAMES[type(event)], **dataclasses.asdict(event)}) + "\n"


def _event(doc: dict[str, Any]) -> Event:
    cls = _TYPES[doc.pop("type")]
    if cls is Request:
        doc["keys"] = tuple(doc["keys"])
    event: Event = cls(**doc)
    return event


class HistoryWriter:
    """Appends events to a JSON-lines file as they happen, from any thread."""

    def __init__(self, path: Path) -> None:
        self._lock = threading.Lock()
        self._file: IO[str] = path.open("a", encoding="utf-8")
        self.events: list[Event] = []

    def add(self, event: Event) -> None:
        with self._lock:
            self.events.append(event)
            self._file.write(_line(event))
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_history(path: Path) -> list[Event]:
    """Every event of a history file, in the order written."""
    with path.open(encoding="utf-8") as lines:
        return [_event(json.loads(line)) for line in lines if line.strip()]


@dataclass(frozen=True, slots=True)
class Callback:
    """One record read from the callbacks topic: where, its timestamp, and its bytes."""

    partition: int
    offset: int
    timestamp_ms: int
    value: bytes

    def doc(self) -> dict[str, Any]:
        """The record's JSON fields."""
        parsed: dict[str, Any] = json.loads(self.value)
        return parsed


def write_callbacks(path: Path, callbacks: Iterable[Callback]) -> None:
    """Write callbacks as JSON lines (the value as text: callbacks are UTF-8 JSON)."""
    with path.open("w", encoding="utf-8") as out:
        for cb in callbacks:
            doc = dataclasses.asdict(cb)
            doc["value"] = cb.value.decode("utf-8")
            out.write(json.dumps(doc) + "\n")


def read_callbacks(path: Path) -> list[Callback]:
    """The callbacks :func:`write_callbacks` wrote."""
    return list(_callbacks(path))


def _callbacks(path: Path) -> Iterator[Callback]:
    with path.open(encoding="utf-8") as lines:
        for line in lines:
            if line.strip():
                doc = json.loads(line)
                doc["value"] = doc["value"].encode("utf-8")
                yield Callback(**doc)
