"""The operators' overview (service layer): the data of the page at ``/ui``, served as
``GET /v1/overview``, and the page itself.

Theory of operation
-------------------
The overview describes the replica that answers: the partitions it holds and their restore
(``/readyz``'s data), how many operations and scopes are pending, the busiest scopes, the
earliest processing-time deadlines, and the last outcomes and dead letters it settled
(:mod:`purgatory.service.ops.recent`). A scope's pending operations are paged by
``GET /v1/operations`` instead, which any replica forwards to the scope's owner.

Every list is bounded, and what a request reads is bounded too. Counts and rings are read at
each request. The two parts whose cost grows with the state, the busiest scopes and the
earliest deadlines, are the engines' views (:meth:`~purgatory._core.Engine.busiest_scopes`,
:meth:`~purgatory._core.Engine.next_deadlines`), driven step by step with a trio checkpoint
between two steps (each reads at most ``step`` items, a few milliseconds), so intake, HTTP and
the reaper go on meanwhile. One computation serves every request that arrives while it runs,
and its answer is kept for ``max(min_age_s, share * its duration)``: 1 s and 20 by default, so
a watched page takes at most about 5 % of the event loop's time, and an unwatched one nothing.
A view that found its collection changing under it (a busy engine with more than ``step``
scopes, or a huge far bucket of the wheel) says so: the overview's ``complete`` is then false.

The page is one static file, ``ui/index.html``, with its script and style inline; it is served
with a Content-Security-Policy that allows exactly those (by their SHA-256) and fetches to this
origin, nothing else.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Any, Protocol, TypeVar

import trio

from purgatory._core import OperationSpec, UsageError
from purgatory._core.engine.views import View
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.ops.recent import Recent

__all__ = ["MAX_DEADLINES", "MAX_SCOPES", "Overview", "Page", "ui_page"]

T = TypeVar("T")

#: The most busiest scopes, and the most earliest deadlines, an overview lists.
MAX_SCOPES = 100
MAX_DEADLINES = 50


@dataclass(frozen=True, slots=True)
class _Views:
    """The costly parts of an overview, as computed at ``computed_ms``."""

    scopes: list[dict[str, Any]]
    deadlines: list[dict[str, Any]]
    complete: bool
    computed_ms: int = 0
    took_ms: float = 0.0


class Now(Protocol):
    """A clock in epoch milliseconds."""

    def now_ms(self) -> int: ...


class Readable(Protocol):
    """What ``/readyz`` says (``ready`` and ``partitions``)."""

    def readiness(self) -> Mapping[str, object]: ...


class Overview:
    """What the operators' page shows, for one replica.

    Args:
        table: the partition table (its engines).
        clock: the service's clock (epoch ms).
        status: ``/readyz``'s data (``ready`` and ``partitions``).
        recent: the rings of recent outcomes and dead letters.
        scopes: how many busiest scopes to list (1 to :data:`MAX_SCOPES`).
        deadlines: how many earliest deadlines to list (1 to :data:`MAX_DEADLINES`).
        step: the most items one step of a view reads.
        min_age_s: the least time the costly parts are kept.
        share: they are kept for at least this many times what computing them took.

    Raises:
        UsageError: ``scopes`` or ``deadlines`` out of range.
    """

    def __init__(
        self,
        table: PartitionTable,
        *,
        clock: Now,
        status: Readable,
        recent: Recent,
        scopes: int = MAX_SCOPES,
        deadlines: int = MAX_DEADLINES,
        step: int = 10_000,
        min_age_s: float = 1.0,
        share: float = 20.0,
    ) -> None:
        if not 1 <= scopes <= MAX_SCOPES:
            raise UsageError(f"scopes must be in [1, {MAX_SCOPES}], got {scopes}")
        if not 1 <= deadlines <= MAX_DEADLINES:
            raise UsageError(f"deadlines must be in [1, {MAX_DEADLINES}], got {deadlines}")
        self._table = table
        self._now_ms = clock.now_ms
        self._readiness = status.readiness
        self._recent = recent
        self._scopes = scopes
        self._deadlines = deadlines
        self._step = step
        self._min_age_s = min_age_s
        self._share = share
        self._latest: _Views | None = None
        self._fresh_until_s = 0.0
        self._computing: trio.Event | None = None

    async def snapshot(self) -> dict[str, Any]:
        """The overview now (the costly parts as last computed, at most a little old)."""
        views = await self._views()
        readiness = self._readiness()
        engines = list(self._table.engines())
        recent = self._recent
        return {
            "now_ms": self._now_ms(),
            "ready": bool(readiness.get("ready")),
            "partitions": readiness.get("partitions", {}),
            "pending": sum(engine.pending_operations for engine in engines),
            "scope_count": sum(engine.pending_scopes for engine in engines),
            "scopes": views.scopes,
            "deadlines": views.deadlines,
            "computed_ms": views.computed_ms,
            "compute_ms": views.took_ms,
            "complete": views.complete,
            "outcomes": [dataclasses.asdict(o) for o in recent.latest_outcomes()],
            "outcomes_total": recent.outcomes_added,
            "dead_letters": [dataclasses.asdict(d) for d in recent.dead_letters.latest()],
            "dead_letters_total": recent.dead_letters.added,
        }

    async def _views(self) -> _Views:
        """The costly parts: kept ones if fresh, else computed once for every caller."""
        while True:
            latest = self._latest
            if latest is not None and trio.current_time() < self._fresh_until_s:
                return latest
            if self._computing is None:
                break
            await self._computing.wait()  # then fresh, unless that computation was cancelled
        self._computing = done = trio.Event()
        try:
            started_s = trio.current_time()
            views = await self._compute()
            took_s = trio.current_time() - started_s
            latest = dataclasses.replace(
                views, computed_ms=self._now_ms(), took_ms=round(took_s * 1000, 3)
            )
            self._latest = latest
            self._fresh_until_s = trio.current_time() + max(self._min_age_s, self._share * took_s)
            return latest
        finally:
            self._computing = None
            done.set()

    async def _compute(self) -> _Views:
        scopes: list[tuple[str, int, int]] = []
        deadlines: list[tuple[OperationSpec, int]] = []
        complete = True
        for engine in self._table.engines():
            partition = engine.partition
            busiest, whole = await _drive(engine.busiest_scopes(self._scopes, step=self._step))
            scopes += [(scope, count, partition) for scope, count in busiest]
            earliest, all_read = await _drive(
                engine.next_deadlines(self._deadlines, step=self._step)
            )
            deadlines += [(spec, partition) for spec in earliest]
            complete = complete and whole and all_read
        serving = self._table.serving()  # a partition dropped meanwhile is left out
        scopes = [s for s in scopes if s[2] in serving]
        deadlines = [d for d in deadlines if d[1] in serving]
        scopes.sort(key=lambda s: (-s[1], s[0]))
        deadlines.sort(key=lambda d: d[0].deadline_ms)
        return _Views(
            scopes=[
                {"scope": scope, "pending": count, "partition": partition}
                for scope, count, partition in scopes[: self._scopes]
            ],
            deadlines=[
                {
                    "scope": spec.scope,
                    "op_id": spec.op_id,
                    "deadline_ms": spec.deadline_ms,
                    "partition": partition,
                }
                for spec, partition in deadlines[: self._deadlines]
            ],
            complete=complete,
        )


async def _drive(view: View[T]) -> tuple[list[T], bool]:
    """Run a view's steps, letting every other task run between two of them."""
    while True:
        try:
            next(view)
        except StopIteration as done:
            answer: tuple[list[T], bool] = done.value
            return answer
        await trio.lowlevel.checkpoint()


# -- the page -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Page:
    """The page's bytes and the headers it is served with."""

    body: bytes
    headers: dict[str, str]


_INLINE = re.compile(r"<(script|style)>(.*?)</\1>", re.DOTALL)


@functools.cache
def ui_page() -> Page:
    """The operators' page (read once from the package), with a Content-Security-Policy that
    allows its inline script and style by their SHA-256, and fetches to this origin only."""
    text = (
        resources.files("purgatory.service.ingress.http")
        .joinpath("ui", "index.html")
        .read_text("utf-8")
    )
    allowed: dict[str, list[str]] = {"script": [], "style": []}
    for kind, content in _INLINE.findall(text):
        digest = base64.b64encode(hashlib.sha256(content.encode("utf-8")).digest()).decode()
        allowed[kind].append(f"'sha256-{digest}'")
    policy = (
        f"default-src 'none'; script-src {' '.join(allowed['script'])};"
        f" style-src {' '.join(allowed['style'])}; connect-src 'self'; img-src 'self' data:;"
        " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )
    return Page(
        text.encode("utf-8"),
        {
            "Content-Security-Policy": policy,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )
