"""Whether this replica serves, and why not (service layer: ops): ``/readyz`` and the gauges.

Ready means: started and not stopping, taking inputs (the topics' partition counts did not
change), and ready once already: given its partitions (a group's first join, which may give it
none) and every one of them restored. From then on a rebalance does not make it unready: while
a partition moves, its scopes answer 503 with Retry-After here as at every other replica, and
the replica still answers for the rest and forwards to their owners. A replica unready for
each move (every member of a group at once, for a rebalance) would leave a Service no
endpoint, refusing connections for every scope where a 503 for a few is due; and a rollout,
which waits for the new pod to be ready, still waits for its first restore. A member given no
partition (more replicas than partitions, a surge pod in a rollout) is ready: it forwards.
``/readyz`` also tells each held partition's state, its restore's progress and, when it waits,
why; the topics' partition counts; and the journal's state.

A stalled journal leaves the replica ready (``/readyz`` 200): the broker is usually
unreachable for every replica at once, and a failing readiness probe would take them all out of
the Service, turning the writes' 503 with Retry-After, which clients retry, into refused
connections; and no other replica could take this one's partitions anyway. The body and
``purgatory_journal_stalled`` say it instead.
"""

from __future__ import annotations

import trio

from purgatory.service.dispatch.follow import Follower
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.journal.changelog import Changelog
from purgatory.service.ownership.layout import TopicLayout
from purgatory.service.ownership.life import PartitionState
from purgatory.service.telemetry.metrics import PartitionStatus

__all__ = ["Readiness"]


class Readiness:
    """Reads the partitions' lives, the layout and the journal; says whether to serve.

    Args:
        follower: the owner of the partitions' lives (what is held, what is restored).
        table: the partition table (whether inputs are stopped).
        layout: the topics' partition counts.
        changelog: the journal (None: off).
    """

    def __init__(
        self,
        follower: Follower,
        table: PartitionTable,
        layout: TopicLayout,
        changelog: Changelog | None,
    ) -> None:
        self._follower = follower
        self._table = table
        self._layout = layout
        self._changelog = changelog
        self.started = False  # serving, until the stop begins
        self._restored_once = False  # given its partitions, and every one of them restored

    def is_ready(self) -> bool:
        """Started, taking inputs, and ready once already (see the module docstring)."""
        if not self._restored_once:
            follower = self._follower
            self._restored_once = follower.joined() and follower.caught_up()
        return self.started and self._table.inputs_stopped is None and self._restored_once

    def partition_status(self) -> list[PartitionStatus]:
        """The input partitions held now, each in its state (``/readyz``, the metrics)."""
        now = trio.current_time()
        statuses = []
        for life in self._follower.table.held():
            progress = self._follower.progress.get(life.partition)
            records, seconds = 0, 0.0
            if progress is not None:
                records = progress.records
                done = progress.seconds
                seconds = done if done is not None else now - progress.started_s
            serving = life.state is PartitionState.SERVING
            statuses.append(
                PartitionStatus(
                    life.partition,
                    serving,
                    records,
                    seconds,
                    state=life.state.value,
                    fenced=life.fences,
                    reason=None if serving else life.reason,
                )
            )
        return statuses

    def standby_status(self) -> dict[int, bool]:
        """The warm standbys kept for the group (``/readyz``, the metrics): whether each is
        warm yet."""
        return self._follower.standbys.states()

    def readiness(self) -> dict[str, object]:
        """``/readyz``: whether the service serves, each held partition's restore, the topics'
        partition counts, once a count changed why no input is taken, and the journal's
        state."""
        layout = self._layout.statistics()
        return {
            "ready": self.is_ready(),
            "journal": self.journal_status(),
            "topics": dict(layout.counts),
            "inputs_stopped": layout.inputs_stopped,
            "partitions": {
                str(s.partition): {
                    "state": s.state,
                    "restore_records": s.records,
                    "restore_seconds": round(s.seconds, 3),
                    "fenced": s.fenced,
                    **({"reason": s.reason} if s.reason else {}),
                }
                for s in self.partition_status()
            },
            "standbys": {
                str(p): "warm" if warm else "warming" for p, warm in self.standby_status().items()
            },
        }

    def journal_status(self) -> dict[str, object]:
        """The journal in ``/readyz``: ``ok``, ``stalled`` (its oldest unacknowledged entry has
        waited ``PURGATORY_JOURNAL_WAIT_MS`` or longer) or ``off``, and that wait in seconds."""
        if self._changelog is None:
            return {"state": "off", "unacknowledged_seconds": 0.0}
        stats = self._changelog.statistics()
        return {
            "state": "stalled" if stats.stalled else "ok",
            "unacknowledged_seconds": round(stats.unacknowledged_s, 3),
        }
