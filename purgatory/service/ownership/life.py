"""A partition's life on this replica: its states, the events that move it, and what each
state allows (service layer: ownership).

One table holds every input partition this replica was given, in one of these states::

    event \\ state   taken       restoring    serving        fenced      handing over
    --------------  ----------  -----------  -------------  ----------  -------------
    begin           restoring   -            -              restoring   -
    restored        -           serving      -              -           -
    failed          -           taken (1)    -              -           -
    fenced          taken (2)   fenced       fenced         fenced      handing over
    revoked         h. over     h. over      handing over   h. over     handing over
    handed over     -           -            -              -           dropped

(1) a restore that failed on the broker's weather (a timeout, a refused connection, a
coordinator loading) waits out a back-off and begins again: a timeout is not a reason to
exit. (2) a fence seen before the restore began (a transaction of an earlier life that failed
late) is counted, and holds the restore back as a fence does.

``fenced``: another writer appended to the partition's changelog (or took its transactional
id); it waits out a back-off that doubles while the fences go on (two writers on one partition
then take turns instead of fencing each other on every batch), then is restored again from the
changelog, whose order is the truth. ``revoked`` is the group taking the partition away,
cleanly or not (its session expired while a link was cut): what it recorded settles
(acknowledged where this writer expected it, or void), what it decided is delivered, and it is
dropped. A dropped partition leaves the table; given back later, it is ``taken`` anew. Any
other event in any state is a bug (:class:`~purgatory._core.InvariantError`).

What each state allows: only ``serving`` applies inputs and answers reads; every other state
answers 503 with Retry-After, and only ``serving`` counts towards readiness. The table is what
``/readyz``, the metrics, the operator page and the release path read; nobody rebuilds a
partition's state from sets and flags. It is told the time (trio's clock, in seconds) and does
no I/O: :mod:`purgatory.service.dispatch.follow` drives it.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from purgatory._core import InvariantError
from purgatory._core._backoff import Backoff

__all__ = [
    "FENCE_BACKOFF",
    "RESTORE_BACKOFF",
    "Life",
    "LifeEvent",
    "LifeTable",
    "PartitionState",
]

#: After a fence, a partition waits this long (doubling per fence in a row, up to the most;
#: with jitter) before it is restored again.
FENCE_BACKOFF = Backoff(first_s=0.5, max_s=10.0)
#: After a restore that failed on the broker's weather, the wait before the next one.
RESTORE_BACKOFF = Backoff(first_s=0.5, max_s=15.0)
_STREAK_RESET_S = 300.0  # fences further apart than this start the doubling again


class PartitionState(enum.Enum):
    """Where a partition is in its life on this replica."""

    TAKEN = "taken"
    RESTORING = "restoring"
    SERVING = "serving"
    FENCED = "fenced"
    HANDING_OVER = "handing_over"
    DROPPED = "dropped"


class LifeEvent(enum.Enum):
    """What moves a partition from one state to the next."""

    BEGIN = "begin"  # its restore begins
    RESTORED = "restored"
    FAILED = "failed"  # its restore failed on the broker's weather
    FENCED = "fenced"  # another writer wrote to it
    REVOKED = "revoked"  # the group took it away (or it was lost with the session)
    HANDED_OVER = "handed_over"


_S, _E = PartitionState, LifeEvent
_TRANSITIONS: dict[tuple[PartitionState, LifeEvent], PartitionState] = {
    (_S.TAKEN, _E.BEGIN): _S.RESTORING,
    (_S.FENCED, _E.BEGIN): _S.RESTORING,
    (_S.RESTORING, _E.RESTORED): _S.SERVING,
    (_S.RESTORING, _E.FAILED): _S.TAKEN,
    (_S.TAKEN, _E.FENCED): _S.TAKEN,
    (_S.RESTORING, _E.FENCED): _S.FENCED,
    (_S.SERVING, _E.FENCED): _S.FENCED,
    (_S.FENCED, _E.FENCED): _S.FENCED,
    (_S.HANDING_OVER, _E.FENCED): _S.HANDING_OVER,
    (_S.TAKEN, _E.REVOKED): _S.HANDING_OVER,
    (_S.RESTORING, _E.REVOKED): _S.HANDING_OVER,
    (_S.SERVING, _E.REVOKED): _S.HANDING_OVER,
    (_S.FENCED, _E.REVOKED): _S.HANDING_OVER,
    (_S.HANDING_OVER, _E.REVOKED): _S.HANDING_OVER,
    (_S.HANDING_OVER, _E.HANDED_OVER): _S.DROPPED,
}


@dataclass(slots=True)
class Life:
    """One partition's life on this replica.

    Attributes:
        partition: its number.
        state: where it is now.
        since_s: when it entered ``state`` (trio's clock).
        reason: why it is not serving, when it is not (a restore's error, a fence).
        until_s: before this time it is not restored (a back-off); 0: whenever.
        fences: times it was fenced since this replica started.
        failures: restores that failed in a row (reset once it serves).
        streak: fences in a row (the fence back-off doubles with them).
        last_fence_s: when it was last fenced.
        restores: restores begun since it was taken.
    """

    partition: int
    state: PartitionState
    since_s: float
    reason: str | None = None
    until_s: float = 0.0
    fences: int = 0
    failures: int = 0
    streak: int = 0
    last_fence_s: float | None = None
    restores: int = 0


class LifeTable:
    """Every partition this replica holds, and its life.

    Args:
        jitter: draws the factor that keeps two writers from retrying in step.
    """

    def __init__(self, jitter: random.Random) -> None:
        self._jitter = jitter
        self._lives: dict[int, Life] = {}
        self._fences: dict[int, int] = {}  # partition -> times fenced, across its lives

    def take(self, partition: int, now_s: float) -> Life:
        """This replica was given ``partition`` (``taken``).

        Raises:
            InvariantError: it holds the partition already.
        """
        if partition in self._lives:
            raise InvariantError(f"partition {partition} is taken twice")
        life = Life(partition, PartitionState.TAKEN, now_s, fences=self._fences.get(partition, 0))
        self._lives[partition] = life
        return life

    def on(self, partition: int, event: LifeEvent, now_s: float, *, reason: str = "") -> Life:
        """Move ``partition`` by ``event`` (``reason``: what failed, for ``failed``).

        Raises:
            InvariantError: the event cannot happen in the partition's state, or the
                partition is not held.
        """
        life = self._lives.get(partition)
        if life is None:
            raise InvariantError(f"{event.value} for partition {partition}, which is not held")
        new = _TRANSITIONS.get((life.state, event))
        if new is None:
            raise InvariantError(
                f"{event.value} for partition {partition} in state {life.state.value}"
            )
        if event is LifeEvent.FENCED:
            self._fenced(life, now_s)
        elif event is LifeEvent.FAILED:
            life.failures += 1
            life.reason = reason
            life.until_s = now_s + RESTORE_BACKOFF.delay_s(life.failures - 1, self._jitter)
        elif event is LifeEvent.BEGIN:
            life.restores += 1
        elif event is LifeEvent.RESTORED:
            life.failures = 0
            life.reason = None
        elif event is LifeEvent.REVOKED and life.state is not PartitionState.HANDING_OVER:
            life.reason = "handed over to its next owner"
        if new is not life.state:
            life.state, life.since_s = new, now_s
        if new is PartitionState.DROPPED:
            del self._lives[partition]
        return life

    def _fenced(self, life: Life, now_s: float) -> None:
        life.fences = self._fences[life.partition] = self._fences.get(life.partition, 0) + 1
        recent = life.last_fence_s is not None and now_s - life.last_fence_s < _STREAK_RESET_S
        life.streak = life.streak + 1 if recent else 1
        life.last_fence_s = now_s
        life.until_s = now_s + FENCE_BACKOFF.delay_s(life.streak - 1, self._jitter)
        life.reason = "another writer appended to its changelog"

    def get(self, partition: int) -> Life | None:
        """``partition``'s life (None: not held)."""
        return self._lives.get(partition)

    def state(self, partition: int) -> PartitionState:
        """``partition``'s state (``dropped``: not held)."""
        life = self._lives.get(partition)
        return PartitionState.DROPPED if life is None else life.state

    def held(self) -> list[Life]:
        """Every partition held, in partition order."""
        return [self._lives[p] for p in sorted(self._lives)]

    def in_state(self, *states: PartitionState) -> frozenset[int]:
        """The partitions in any of ``states``."""
        return frozenset(p for p, life in self._lives.items() if life.state in states)

    def due(self, now_s: float) -> list[int]:
        """The partitions whose restore may begin now (``taken`` or ``fenced``, with their
        back-off over), in partition order."""
        ready = (PartitionState.TAKEN, PartitionState.FENCED)
        return sorted(
            p for p, life in self._lives.items() if life.state in ready and now_s >= life.until_s
        )

    def fences(self) -> dict[int, int]:
        """Partition -> times it was fenced since this replica started (held or not)."""
        return dict(self._fences)
