"""Per-key state with a time-to-live (core concept: Flink's StateTtlConfig; sans-IO, stdlib only).

It remembers signals ("key k signalled at t with payload p") so that a signal that arrives
before its waiter still counts, and bounds the memory those facts take.

Semantics, as Flink's. ``last_access_ms`` is set by every write and, under
``ON_READ_AND_WRITE``, by every read that finds the entry unexpired. An entry expires at
``expires_at_ms = min(last_access_ms + ttl_ms, MAX_TIME_MS)`` (saturating) and is *expired*
once ``expires_at_ms <= now_ms``: at exactly ``last_access_ms + ttl_ms`` it is gone.
``NEVER_RETURN_EXPIRED`` never returns an expired entry; ``RETURN_EXPIRED_IF_NOT_CLEANED_UP``
returns it while it is still stored. A read that finds an expired entry removes it (so it is
returned at most once). Snapshots (``items``) never hold expired state; ``restore`` drops
what expired while the snapshot was at rest.

Cleanup, never a full scan: under ``TIMERS`` each entry is its own task in a private timing
wheel at ``expires_at_ms``; a write or refreshing read moves it in O(1) and ``advance_clock``
removes exactly the due entries, O(1) each (``next_expiration_ms`` tells the reaper when).
Under ``INCREMENTAL`` there are no timers: every access (``put``, ``get``, ``get_entry``,
``advance_clock``) also examines up to ``cleanup_budget`` entries round-robin and removes the
expired ones, so memory is reclaimed in proportion to traffic.

Time need not be monotonic: each call judges expiry against the ``now_ms`` it is given, a
write at an earlier ``now_ms`` sets ``last_access_ms`` to that earlier time, and a removal is
never undone. Every time argument is checked: a bad one raises ``UsageError`` naming it.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

from purgatory._core._errors import UsageError
from purgatory._core.engine.validate import MAX_TIME_MS, check_ms, check_positive_int
from purgatory._core.wheel.timer import Timer, TimerTask

__all__ = [
    "CleanupStrategy",
    "StateVisibility",
    "TtlConfig",
    "TtlEntry",
    "TtlState",
    "TtlStatistics",
    "UpdateType",
]

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

_WHEEL_SIZE = 512
#: Java's Long.MAX_VALUE: any longer TTL means "forever" anyway, and expiry saturates.
_MAX_TTL_MS = (1 << 63) - 1


class UpdateType(enum.StrEnum):
    """Which accesses refresh an entry's ``last_access_ms``."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


class StateVisibility(enum.StrEnum):
    """Whether a read may return an expired entry that is still stored."""

    NEVER_RETURN_EXPIRED = "never_return_expired"
    RETURN_EXPIRED_IF_NOT_CLEANED_UP = "return_expired_if_not_cleaned_up"


class CleanupStrategy(enum.StrEnum):
    """How expired entries are removed: by timers (exact) or incrementally (budgeted)."""

    TIMERS = "timers"
    INCREMENTAL = "incremental"


@dataclass(frozen=True, slots=True)
class TtlConfig:
    """How long entries live and how they are refreshed, shown and cleaned up.

    Args:
        ttl_ms: the time to live after the last access, >= 1.
        update_type, visibility, cleanup: enum members, or their string values.
        cleanup_budget: entries examined per access by ``INCREMENTAL`` cleanup, >= 1.

    Raises:
        UsageError: naming the field that is invalid.
    """

    ttl_ms: int
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    visibility: StateVisibility = StateVisibility.NEVER_RETURN_EXPIRED
    cleanup: CleanupStrategy = CleanupStrategy.TIMERS
    cleanup_budget: int = 8

    def __post_init__(self) -> None:
        check_positive_int("ttl_ms", self.ttl_ms, maximum=_MAX_TTL_MS)
        check_positive_int("cleanup_budget", self.cleanup_budget, maximum=1 << 20)
        kinds: dict[str, type[enum.StrEnum]] = {
            "update_type": UpdateType,
            "visibility": StateVisibility,
            "cleanup": CleanupStrategy,
        }
        for name, kind in kinds.items():
            value = getattr(self, name)
            if not isinstance(value, str) or value not in {member.value for member in kind}:
                allowed = ", ".join(kind)
                raise UsageError(f"{name} must be one of {allowed}, got {value!r}")
            object.__setattr__(self, name, kind(value))


@dataclass(frozen=True, slots=True)
class TtlEntry(Generic[V]):
    """One stored value with its access time and (saturated) expiration time."""

    value: V
    last_access_ms: int
    expires_at_ms: int


@dataclass(frozen=True, slots=True)
class TtlStatistics:
    """Counts describing a :class:`TtlState` at one instant."""

    entries: int
    expired_removed: int
    reads: int
    writes: int


class _Slot(TimerTask, Generic[K, V]):
    """A stored entry; under ``TIMERS`` it is also its own expiration task."""

    __slots__ = ("key", "last_access_ms", "value")

    def __init__(self, key: K, value: V, last_access_ms: int, expires_at_ms: int) -> None:
        super().__init__(deadline_ms=expires_at_ms)
        self.key, self.value, self.last_access_ms = key, value, last_access_ms

    def entry(self) -> TtlEntry[V]:
        return TtlEntry(self.value, self.last_access_ms, self.deadline_ms)


class TtlState(Generic[K, V]):
    """A map from keys to values that expire ``ttl_ms`` after their last access.

    Args:
        config: the :class:`TtlConfig`.
        on_change: called as ``on_change(key, old, new)`` whenever the value stored under a key
            changes: created (``old`` None), overwritten, or removed (``new`` None) whatever
            removed it (expiry, cleanup, :meth:`delete`); so an owner can keep totals of what
            is stored without scanning it. A refresh of ``last_access_ms`` alone is no change.

    Raises:
        UsageError: if ``config`` is not a :class:`TtlConfig`.
    """

    def __init__(
        self, config: TtlConfig, *, on_change: Callable[[K, V | None, V | None], None] | None = None
    ) -> None:
        if not isinstance(config, TtlConfig):
            raise UsageError(f"config must be a TtlConfig, got {type(config).__name__}")
        self._on_change = on_change
        self._budget = config.cleanup_budget
        self._ttl_ms = config.ttl_ms
        self._refresh_on_read = config.update_type is UpdateType.ON_READ_AND_WRITE
        self._return_expired = config.visibility is StateVisibility.RETURN_EXPIRED_IF_NOT_CLEANED_UP
        self._timer = (
            Timer(tick_ms=1, wheel_size=_WHEEL_SIZE)
            if config.cleanup is CleanupStrategy.TIMERS
            else None
        )
        self._slots: OrderedDict[K, _Slot[K, V]] = OrderedDict()
        self._expired_removed = self._reads = self._writes = 0

    def __len__(self) -> int:
        """Stored entries, including expired ones not yet cleaned up."""
        return len(self._slots)

    def put(self, key: K, value: V, *, now_ms: int) -> None:
        """Create or overwrite ``key``; its ``last_access_ms`` becomes ``now_ms``."""
        now = check_ms("now_ms", now_ms)
        self._writes += 1
        self._store(key, value, now)
        self._sweep(now)

    def get(self, key: K, *, now_ms: int) -> V | None:
        """The value of ``key``, or None when it is absent (or expired, per the visibility)."""
        slot = self._read(key, now_ms)
        return None if slot is None else slot.value

    def get_entry(self, key: K, *, now_ms: int) -> TtlEntry[V] | None:
        """The entry of ``key`` with its times, or None; refreshes it under ``ON_READ_AND_WRITE``.

        An expired entry found here is removed; it is returned only under
        ``RETURN_EXPIRED_IF_NOT_CLEANED_UP``.
        """
        slot = self._read(key, now_ms)
        return None if slot is None else slot.entry()

    def peek(self, key: K) -> V | None:
        """The value stored under ``key`` (expired or not), or None; not an access: nothing is
        refreshed, removed or counted."""
        slot = self._slots.get(key)
        return None if slot is None else slot.value

    def peek_live(self, key: K, *, now_ms: int) -> V | None:
        """The value stored under ``key`` if it has not expired at ``now_ms``, else None; not
        an access: nothing is refreshed, removed or counted."""
        slot = self._slots.get(key)
        return None if slot is None or slot.deadline_ms <= now_ms else slot.value

    def remove_expired(self, now_ms: int) -> int:
        """Remove every entry expired at ``now_ms``, whatever the cleanup strategy.

        Under ``TIMERS`` this is :meth:`advance_clock`; under ``INCREMENTAL`` it scans every
        entry (for rare use: before a decision that must not count expired state).

        Returns:
            How many entries this call removed.
        """
        now = check_ms("now_ms", now_ms)
        if self._timer is not None:
            return self.advance_clock(now)
        due = [slot for slot in self._slots.values() if slot.deadline_ms <= now]
        for slot in due:
            self._remove(slot)
        self._expired_removed += len(due)
        return len(due)

    def delete(self, key: K) -> bool:
        """Remove ``key``, expired or not.

        Returns:
            True if it was stored.
        """
        slot = self._slots.get(key)
        if slot is None:
            return False
        self._remove(slot)
        return True

    def advance_clock(self, now_ms: int) -> int:
        """Remove the entries that are due at ``now_ms``.

        Under ``TIMERS`` no stored entry is expired at ``now_ms`` afterwards; under
        ``INCREMENTAL`` this is one budgeted sweep.

        Returns:
            How many entries this call removed.

        Raises:
            UsageError: naming ``now_ms`` when it is not a valid time.
        """
        now = check_ms("now_ms", now_ms)
        if self._timer is None:
            return self._sweep(now)
        due = self._timer.advance_clock(now)
        on_change = self._on_change
        for task in due:
            assert isinstance(task, _Slot)
            del self._slots[task.key]
            if on_change is not None:
                on_change(task.key, task.value, None)
        self._expired_removed += len(due)
        return len(due)

    def next_expiration_ms(self) -> int | None:
        """When the reaper should next call :meth:`advance_clock` (``TIMERS`` only).

        The wheel's earliest bucket: never after the earliest expiration, earlier for a far
        one in a coarse bucket (that call then removes nothing, and the answer gets finer).

        Returns:
            A time in ms (possibly already past), or None when nothing is scheduled (always
            None under ``INCREMENTAL``).
        """
        return None if self._timer is None else self._timer.next_expiration_ms()

    def items(self, *, now_ms: int) -> list[tuple[K, TtlEntry[V]]]:
        """A snapshot of the entries unexpired at ``now_ms``, in storage order; not an access."""
        now = check_ms("now_ms", now_ms)
        return [(key, slot.entry()) for key, slot in self._slots.items() if slot.deadline_ms > now]

    def restore(self, key: K, value: V, *, last_access_ms: int, now_ms: int) -> bool:
        """Re-insert an entry from a snapshot, keeping its ``last_access_ms``.

        Returns:
            False (and nothing is stored) if the entry is already expired at ``now_ms``.

        Raises:
            UsageError: naming ``last_access_ms`` or ``now_ms`` when it is not a valid time.
        """
        last_access = check_ms("last_access_ms", last_access_ms)
        now = check_ms("now_ms", now_ms)
        if self._expires_at(last_access) <= now:
            return False
        self._store(key, value, last_access)
        return True

    def statistics(self) -> TtlStatistics:
        """A frozen record of the state's counts."""
        return TtlStatistics(len(self._slots), self._expired_removed, self._reads, self._writes)

    # -- internals -------------------------------------------------------------------------

    def _read(self, key: K, now_ms: int) -> _Slot[K, V] | None:
        """One read of ``key`` (counted, refreshed, an expired entry removed): the slot whose
        value and times the read returns, or None. The engine reads every key of an operation
        each time it is tried, so :meth:`get` returns the value without building an entry."""
        now = check_ms("now_ms", now_ms)
        self._reads += 1
        slot = self._slots.get(key)
        result: _Slot[K, V] | None = None
        if slot is not None and slot.deadline_ms <= now:
            self._remove(slot)
            self._expired_removed += 1
            result = slot if self._return_expired else None
        elif slot is not None:
            if self._refresh_on_read:
                self._touch(slot, now)
            result = slot
        self._sweep(now)
        return result

    def _expires_at(self, last_access: int) -> int:
        return min(last_access + self._ttl_ms, MAX_TIME_MS)

    def _touch(self, slot: _Slot[K, V], last_access: int) -> None:
        slot.last_access_ms = last_access
        slot.deadline_ms = self._expires_at(last_access)  # moves a scheduled task in O(1)

    def _store(self, key: K, value: V, last_access: int) -> None:
        slot = self._slots.get(key)
        if slot is not None:
            old, slot.value = slot.value, value
            self._touch(slot, last_access)
            if self._on_change is not None:
                self._on_change(key, old, value)
            return
        slot = self._slots[key] = _Slot(key, value, last_access, self._expires_at(last_access))
        if self._timer is not None:
            self._timer.add(slot)
        if self._on_change is not None:
            self._on_change(key, None, value)

    def _remove(self, slot: _Slot[K, V]) -> None:
        slot.cancel()
        del self._slots[slot.key]
        if self._on_change is not None:
            self._on_change(slot.key, slot.value, None)

    def _sweep(self, now: int) -> int:
        """Examine up to ``cleanup_budget`` entries round-robin (``INCREMENTAL`` only)."""
        if self._timer is not None:
            return 0
        slots, removed = self._slots, 0
        for _ in range(min(self._budget, len(slots))):
            key, slot = slots.popitem(last=False)
            if slot.deadline_ms <= now:
                removed += 1
                if self._on_change is not None:
                    self._on_change(key, slot.value, None)
            else:
                slots[key] = slot
        self._expired_removed += removed
        return removed
