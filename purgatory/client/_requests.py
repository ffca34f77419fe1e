"""What each API call sends and how its answer is read (client concept: the calls, sans-IO).

Both clients (:mod:`purgatory.client._clients`, blocking and async) build their
requests here and read answers here, so the two differ only in how bytes travel.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from purgatory._codec import APPLIED_HEADER, RETRY_HEADER
from purgatory._core import PurgatoryError

__all__ = [
    "ApiError",
    "Call",
    "Tries",
    "answer",
    "call_cancel",
    "call_get",
    "call_pending",
    "call_register",
    "call_register_many",
    "call_signals",
    "call_wait",
    "call_watermarks",
    "operation",
    "retry_after_s",
]

#: The longest pause between two tries of a request the service asked to retry.
MAX_RETRY_PAUSE_S = 2.0


class ApiError(PurgatoryError):
    """The service answered an error: ``status``, the ``field`` it is about, and why."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"{status} {field + ': ' if field else ''}{message}")
        self.status = status
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request, not yet sent."""

    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    json: Any = None

    def request_args(self, timeout_s: float) -> dict[str, Any]:
        """The arguments of ``httpx.Client.request`` (and its async twin) for this call."""
        return {
            "method": self.method,
            "url": self.path,
            "params": self.params or None,
            "json": self.json,
            "timeout": timeout_s,
        }


def operation(
    *,
    scope: str,
    op_id: str,
    keys: Iterable[str] = (),
    timeout_ms: int | None = None,
    deadline_ms: int | None = None,
    condition: str = "all",
    count: int | None = None,
    time_domain: str = "processing_time",
    payload: Any = None,
    reply_to: str | None = None,
) -> dict[str, Any]:
    """The JSON body of one registration (the service validates it and names bad fields)."""
    body: dict[str, Any] = {
        "scope": scope,
        "op_id": op_id,
        "keys": list(keys),
        "condition": condition,
    }
    optional = {
        "timeout_ms": timeout_ms,
        "deadline_ms": deadline_ms,
        "count": count,
        "payload": payload,
        "reply_to": reply_to,
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if time_domain != "processing_time":
        body["time_domain"] = time_domain
    return body


def call_register(body: Mapping[str, Any]) -> Call:
    return Call("POST", "/v1/operations", json=dict(body))


def call_register_many(bodies: Iterable[Mapping[str, Any]]) -> Call:
    return Call("POST", "/v1/operations:batch", json={"operations": [dict(b) for b in bodies]})


def call_get(scope: str, op_id: str) -> Call:
    return Call("GET", "/v1/operation", {"scope": scope, "op_id": op_id})


def call_wait(scope: str, op_id: str, timeout_ms: int) -> Call:
    return Call(
        "GET", "/v1/operation/wait", {"scope": scope, "op_id": op_id, "timeout_ms": str(timeout_ms)}
    )


def call_cancel(scope: str, op_id: str) -> Call:
    return Call("DELETE", "/v1/operation", {"scope": scope, "op_id": op_id})


def call_pending(scope: str, limit: int | None = None, cursor: str | None = None) -> Call:
    query: dict[str, Any] = {"scope": scope}
    if limit is not None:
        query["limit"] = limit
    if cursor is not None:
        query["cursor"] = cursor
    return Call("GET", "/v1/operations", query)


def call_overview() -> Call:
    return Call("GET", "/v1/overview")


def call_signals(signals: Iterable[Mapping[str, Any]]) -> Call:
    return Call("POST", "/v1/signals", json={"signals": [dict(s) for s in signals]})


def call_watermarks(watermarks: Iterable[Mapping[str, Any]]) -> Call:
    return Call("POST", "/v1/watermarks", json={"watermarks": [dict(w) for w in watermarks]})


def answer(status: int, body: bytes) -> Any:
    """The decoded answer, or :class:`ApiError` for an error status."""
    try:
        data = json.loads(body) if body else None
    except ValueError:
        data = None
    if status >= 400:
        error = data.get("error") if isinstance(data, dict) else None
        if isinstance(error, dict):
            raise ApiError(status, str(error.get("message")), error.get("field"))
        raise ApiError(status, body[:200].decode("utf-8", "replace"))
    return data


def retry_after_s(status: int, headers: Mapping[str, str], left_s: float) -> float | None:
    """How long to wait before trying again, when the service says to (503 with Retry-After:
    the scope's partition is being restored, or its journal is not acknowledging) and the pause
    fits in the ``left_s`` seconds the caller has left; None when the answer is final."""
    if status != 503:
        return None
    value = headers.get("retry-after", "")
    try:
        seconds = float(value)
    except ValueError:
        return None
    pause = min(max(seconds, 0.05), MAX_RETRY_PAUSE_S)
    return pause if pause <= left_s else None


class Tries:
    """The tries of one call: when to try again, and how to mark a retry.

    A 503 with ``Retry-After`` is tried again, pausing as the service asks, while the pause fits
    in ``timeout_s`` from the first try (:func:`retry_after_s`). Once an answer says the write
    may have been applied (``Purgatory-Applied``), every later try carries ``Purgatory-Retry:
    1`` (:mod:`purgatory._codec._retry`).
    """

    def __init__(self, now_s: float, timeout_s: float) -> None:
        self._give_up_s = now_s + timeout_s
        self.headers: dict[str, str] = {}

    def pause(self, status: int, headers: Mapping[str, str], now_s: float) -> float | None:
        """The pause before the next try after this answer; None when the answer is final."""
        pause = retry_after_s(status, headers, self._give_up_s - now_s)
        if pause is not None and headers.get(APPLIED_HEADER):
            self.headers = {RETRY_HEADER: "1"}
        return pause
