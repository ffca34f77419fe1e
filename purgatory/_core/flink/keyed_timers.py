"""Keyed timers with Flink semantics (core concept: keyed timers; sans-IO, stdlib only).

A timer is identified by ``(scope, key, namespace, timestamp_ms)`` in one of two domains:

* **processing time** fires when ``timestamp_ms <= now_ms`` (the clock told to :meth:`poll`);
  these timers live in a hierarchical :class:`~purgatory._core.wheel.timer.Timer`;
* **event time** fires when ``timestamp_ms <= watermark`` of its scope. Watermarks are per scope
  and monotonic: a watermark that goes backward is a documented no-op. Event-time timers sit in
  one heap per scope, since a watermark is not a clock that the wheel could follow.

Flink's rules hold: registering the same identity twice is one timer; deleting a missing timer
is a no-op; a timer registered in the past (or behind the watermark) fires at the next
:meth:`KeyedTimers.poll`, never inside the register call. :meth:`KeyedTimers.rearm` replaces every
timer of ``(scope, key, namespace)`` with one at the new time: the inactivity-timer pattern,
where each event pushes the timer later.

Order is deterministic and independent of registration order, so a replay fires at the same
logical points in the same order: one poll returns its timers sorted by ``(timestamp_ms, domain,
scope, key, namespace)``. Work per poll is bounded by ``max_fire_per_poll``: after a restart
with a million overdue timers, each poll fires at most that many (the earliest first, flagged
``late`` when they were overdue at restore) and the rest wait for the next poll, so catching up
never starves intake. Optional coalescing rounds every timestamp up to a multiple of
``coalesce_ms``, which batches callbacks and deduplicates timers that round to the same time.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from heapq import heappop, heappush

from purgatory._core.engine.validate import MAX_TIME_MS, check_ms, check_positive_int, check_text
from purgatory._core.wheel.timer import Timer, TimerTask

__all__ = ["FiredTimer", "KeyedTimers", "KeyedTimersStatistics", "TimeDomain"]


class TimeDomain(enum.StrEnum):
    """The clock a keyed timer follows."""

    PROCESSING_TIME = "processing_time"
    EVENT_TIME = "event_time"


@dataclass(frozen=True, slots=True, order=True)
class FiredTimer:
    """A keyed timer that fired (or, in a snapshot, that is registered)."""

    timestamp_ms: int
    domain: TimeDomain
    scope: str
    key: str
    namespace: str
    late: bool = False


@dataclass(frozen=True, slots=True)
class KeyedTimersStatistics:
    """Counts describing :class:`KeyedTimers` at one instant."""

    processing_timers: int
    event_timers: int
    scopes_with_watermark: int
    fired: int
    late_fired: int
    backlog: int


_Name = tuple[TimeDomain, str, str, str]  # (domain, scope, key, namespace)


class _Entry(TimerTask):
    """One registered timer; in the processing-time wheel when its domain is processing."""

    __slots__ = ("late", "name")

    def __init__(self, name: _Name, timestamp_ms: int, late: bool) -> None:
        super().__init__(deadline_ms=timestamp_ms)
        self.name = name
        self.late = late

    def fired(self) -> FiredTimer:
        domain, scope, key, namespace = self.name
        return FiredTimer(self._deadline_ms, domain, scope, key, namespace, self.late)


class KeyedTimers:
    """Processing-time and event-time timers keyed by ``(scope, key, namespace, timestamp)``.

    Args:
        coalesce_ms: round every timestamp up to a multiple of this (1 = exact, the default).
        max_fire_per_poll: the most timers one :meth:`poll` returns.
        timer: the wheel for processing-time timers (a new ``Timer`` if None).

    Raises:
        UsageError: (a ``ValueError``) naming the invalid argument.
    """

    def __init__(
        self, *, coalesce_ms: int = 1, max_fire_per_poll: int = 10_000, timer: Timer | None = None
    ) -> None:
        self.coalesce_ms = check_positive_int("coalesce_ms", coalesce_ms, maximum=MAX_TIME_MS)
        self.max_fire_per_poll = check_positive_int("max_fire_per_poll", max_fire_per_poll)
        self._timer = timer if timer is not None else Timer()
        self._by_name: dict[_Name, dict[int, _Entry]] = {}
        self._event_heaps: dict[str, list[tuple[int, str, str, int, _Entry]]] = {}
        self._event_seq = 0
        self._watermarks: dict[str, int] = {}
        self._ready_scopes: set[str] = set()
        self._backlog: list[_Entry] = []  # due, not yet returned: sorted, earliest last
        self._counts = {TimeDomain.PROCESSING_TIME: 0, TimeDomain.EVENT_TIME: 0}
        self._fired = 0
        self._late_fired = 0

    # -- registration ----------------------------------------------------------------------

    def register_processing_time_timer(
        self, scope: str, key: str, namespace: str, timestamp_ms: int
    ) -> bool:
        """Register a processing-time timer. Returns False if that identity already exists."""
        return self._register(TimeDomain.PROCESSING_TIME, scope, key, namespace, timestamp_ms)

    def register_event_time_timer(
        self, scope: str, key: str, namespace: str, timestamp_ms: int
    ) -> bool:
        """Register an event-time timer. Returns False if that identity already exists."""
        return self._register(TimeDomain.EVENT_TIME, scope, key, namespace, timestamp_ms)

    def delete_processing_time_timer(
        self, scope: str, key: str, namespace: str, timestamp_ms: int
    ) -> bool:
        """Delete a processing-time timer; a missing one is a no-op that returns False."""
        return self._delete(TimeDomain.PROCESSING_TIME, scope, key, namespace, timestamp_ms)

    def delete_event_time_timer(
        self, scope: str, key: str, namespace: str, timestamp_ms: int
    ) -> bool:
        """Delete an event-time timer; a missing one is a no-op that returns False."""
        return self._delete(TimeDomain.EVENT_TIME, scope, key, namespace, timestamp_ms)

    def rearm(
        self, domain: TimeDomain, scope: str, key: str, namespace: str, timestamp_ms: int
    ) -> None:
        """Replace every timer of ``(scope, key, namespace)`` in ``domain`` with one at the time.

        Re-arming to the same time keeps the timer (one identity); to another time moves it.
        """
        domain = TimeDomain(domain)
        timestamp = self._coalesce(check_ms("timestamp_ms", timestamp_ms))
        name = _checked_name(domain, scope, key, namespace)
        existing = self._by_name.get(name)
        if existing:
            for other in [t for t in existing if t != timestamp]:
                self._delete(domain, scope, key, namespace, other)
        self._register(domain, scope, key, namespace, timestamp)

    def timestamps(self, domain: TimeDomain, scope: str, key: str, namespace: str) -> list[int]:
        """The registered timestamps of ``(scope, key, namespace)`` in ``domain``, ascending."""
        return sorted(self._by_name.get((TimeDomain(domain), scope, key, namespace), ()))

    # -- time ------------------------------------------------------------------------------

    def advance_watermark(self, scope: str, watermark_ms: int) -> bool:
        """Move ``scope``'s watermark forward; due event-time timers fire at the next poll.

        Returns:
            True if the watermark moved; False (a no-op) if it would not move forward.
        """
        watermark = check_ms("watermark_ms", watermark_ms)
        scope = check_text("scope", scope)
        if watermark <= self._watermarks.get(scope, -1):
            return False
        self._watermarks[scope] = watermark
        heap = self._event_heaps.get(scope)
        if heap and heap[0][0] <= watermark:
            self._ready_scopes.add(scope)
        return True

    def current_watermark(self, scope: str) -> int | None:
        """``scope``'s watermark, or None before its first one."""
        return self._watermarks.get(scope)

    def watermarks(self) -> dict[str, int]:
        """Every scope's watermark (a copy)."""
        return dict(self._watermarks)

    def poll(self, now_ms: int) -> list[FiredTimer]:
        """Fire the due timers: processing time up to ``now_ms``, event time up to watermarks.

        Returns:
            At most ``max_fire_per_poll`` timers, sorted by (timestamp, domain, scope, key,
            namespace); the rest of what is due stays for the next poll.
        """
        now = check_ms("now_ms", now_ms)
        budget = self.max_fire_per_poll
        due: list[_Entry] = []
        timer = self._timer
        nxt = timer.next_expiration_ms()
        # Step through the wheel so that the work per poll stays near the budget.
        while nxt is not None and nxt <= now and len(due) < budget:
            due.extend(t for t in timer.advance_clock(nxt) if isinstance(t, _Entry))
            nxt = timer.next_expiration_ms()
        for scope in list(self._ready_scopes):
            heap = self._event_heaps[scope]
            watermark = self._watermarks.get(scope, -1)
            while heap and heap[0][0] <= watermark and len(due) < budget:
                entry = heappop(heap)[4]
                if self._by_name.get(entry.name, {}).get(entry._deadline_ms) is entry:
                    due.append(entry)
            if not heap:
                del self._event_heaps[scope]
            if not heap or heap[0][0] > watermark:
                self._ready_scopes.discard(scope)
        if due:
            due.sort(key=_sort_key, reverse=True)
            self._backlog = _merge_desc(self._backlog, due)
        fired: list[FiredTimer] = []
        backlog = self._backlog
        while backlog and len(fired) < budget:
            entry = backlog.pop()
            names = self._by_name.get(entry.name)
            if names is None or names.get(entry._deadline_ms) is not entry:
                continue  # deleted while it waited in the backlog
            self._forget(entry)
            fired.append(entry.fired())
            self._late_fired += entry.late
        self._fired += len(fired)
        return fired

    def next_expiration_ms(self, now_ms: int) -> int | None:
        """When :meth:`poll` has work next: ``now_ms`` if anything is due already."""
        if self._backlog or self._ready_scopes:
            return now_ms
        return self._timer.next_expiration_ms()

    # -- snapshot ----------------------------------------------------------------------------

    def registered(self) -> list[FiredTimer]:
        """Every registered timer (for snapshots), in firing order."""
        entries = [e for names in self._by_name.values() for e in names.values()]
        return [e.fired() for e in sorted(entries, key=_sort_key)]

    def restore(self, timers: list[FiredTimer], watermarks: dict[str, int], *, now_ms: int) -> None:
        """Load timers and watermarks from a snapshot; overdue ones are flagged ``late``."""
        now = check_ms("now_ms", now_ms)
        for scope, watermark in watermarks.items():
            self.advance_watermark(scope, watermark)
        for t in timers:
            if t.domain is TimeDomain.PROCESSING_TIME:
                late = t.timestamp_ms <= now
            else:
                late = t.timestamp_ms <= self._watermarks.get(t.scope, -1)
            self._register(t.domain, t.scope, t.key, t.namespace, t.timestamp_ms, late=late)

    def __len__(self) -> int:
        return sum(self._counts.values())

    def statistics(self) -> KeyedTimersStatistics:
        """A frozen record of the timers' counts."""
        return KeyedTimersStatistics(
            processing_timers=self._counts[TimeDomain.PROCESSING_TIME],
            event_timers=self._counts[TimeDomain.EVENT_TIME],
            scopes_with_watermark=len(self._watermarks),
            fired=self._fired,
            late_fired=self._late_fired,
            backlog=len(self._backlog),
        )

    # -- internals ---------------------------------------------------------------------------

    def _coalesce(self, timestamp: int) -> int:
        c = self.coalesce_ms
        return timestamp if c == 1 else min(-(-timestamp // c) * c, MAX_TIME_MS)

    def _register(
        self,
        domain: TimeDomain,
        scope: str,
        key: str,
        namespace: str,
        timestamp_ms: int,
        *,
        late: bool = False,
    ) -> bool:
        domain = TimeDomain(domain)
        name = _checked_name(domain, scope, key, namespace)
        timestamp = self._coalesce(check_ms("timestamp_ms", timestamp_ms))
        names = self._by_name.setdefault(name, {})
        if timestamp in names:
            return False
        entry = _Entry(name, timestamp, late)
        names[timestamp] = entry
        self._counts[domain] += 1
        if domain is TimeDomain.PROCESSING_TIME:
            self._timer.add(entry)
        else:
            self._event_seq += 1
            item = (timestamp, key, namespace, self._event_seq, entry)
            heappush(self._event_heaps.setdefault(scope, []), item)
            if timestamp <= self._watermarks.get(scope, -1):
                self._ready_scopes.add(scope)
        return True

    def _delete(
        self, domain: TimeDomain, scope: str, key: str, namespace: str, timestamp_ms: int
    ) -> bool:
        name = (TimeDomain(domain), scope, key, namespace)
        timestamp = self._coalesce(check_ms("timestamp_ms", timestamp_ms))
        entry = self._by_name.get(name, {}).get(timestamp)
        if entry is None:
            return False
        self._forget(entry)
        entry.cancel()  # event-time heap entries are skipped lazily
        return True

    def _forget(self, entry: _Entry) -> None:
        names = self._by_name[entry.name]
        del names[entry._deadline_ms]
        if not names:
            del self._by_name[entry.name]
        self._counts[entry.name[0]] -= 1


def _checked_name(domain: TimeDomain, scope: object, key: object, namespace: object) -> _Name:
    """A timer's name with each part validated (a UsageError names the bad one)."""
    return (
        domain,
        check_text("scope", scope),
        check_text("key", key),
        check_text("namespace", namespace),
    )


def _sort_key(entry: _Entry) -> tuple[int, str, str, str, str]:
    domain, scope, key, namespace = entry.name
    return (entry._deadline_ms, domain.value, scope, key, namespace)


def _merge_desc(backlog: list[_Entry], due: list[_Entry]) -> list[_Entry]:
    """Merge two lists sorted in descending firing order (the earliest is popped from the end)."""
    if not backlog:
        return due
    merged = backlog + due
    merged.sort(key=_sort_key, reverse=True)
    return merged
