"""The topics' partition counts (service layer): checked at start, watched while running.

A scope lives on partition ``murmur2(scope) % count`` of every topic keyed by it: its requests
and signals are read there, and that partition's journal (changelog) and snapshots hold its
operations. So the requests, signals, changelog (journal on) and snapshots (snapshots on)
topics must all have one partition count, and ``PURGATORY_TOPIC_PARTITIONS``'s when it is set.

**At start** :meth:`TopicLayout.check` reads every count and raises :class:`ConfigError` naming
each topic with its count, and how to fix it, unless they agree: nothing has started yet. An
unreadable snapshots topic is left out (a restore then replays the whole journal, as it would).

**While running** Kafka can add partitions to a live topic (never take them away). From then
on a producer puts a scope's new records on ``murmur2(scope) % new_count``, often another
partition than the one holding the scope's operations and journal: applied, such a record
would be journaled on one partition and its position on another, and a new partition has no
journal at all. So at the first change the service **stops taking inputs until it is
restarted**: no consumed record is applied (nor committed: a restart reads it again from the
journaled positions), an HTTP write answers 503, new partitions are not restored; reads,
expirations and the delivery of what was decided go on. It logs ``topic_partitions_changed``
(error) with the topic and the old and new counts, ``/readyz`` is 503 with ``inputs_stopped``
saying why, and ``purgatory_partition_count_mismatch`` is 1. A restart then meets the check
above. Applying the unchanged topics meanwhile would be no safer (a scope's requests and
signals belong together), and exiting would leave nobody to say why on ``/readyz`` and
``/metrics``, or to deliver what was decided.

The input topics' counts come from the consumer's own metadata (refreshed every few seconds,
read every second here); the changelog's and the snapshots' from a metadata request every
``logs_every_s`` (a change there does no harm until a restart).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import trio

from purgatory._core import ConfigError, TransportError
from purgatory.service.kafka.transport import LogReader, RecordSource
from purgatory.service.settings import Settings, env_name
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.stats import CountChange, LayoutStatus

__all__ = ["TopicLayout", "check_counts", "read_counts"]

_log = get_logger()

_DECLARED = env_name("topic_partitions")
_GUIDE = "docs/service.md, 'Partition counts'"


def check_counts(counts: Mapping[str, int], declared: int | None) -> int:
    """The one partition count of ``counts`` (and ``declared``, when set).

    Raises:
        ConfigError: the counts disagree, or differ from ``declared``; the message names every
            topic with its count and says how to fix it.
    """
    found = set(counts.values()) | ({declared} if declared is not None else set())
    if len(found) == 1:
        return found.pop()
    listed = ", ".join(f"{topic} has {count}" for topic, count in counts.items())
    if declared is not None:
        listed += f" ({_DECLARED} is {declared})"
    raise ConfigError(
        f"the topics keyed by scope must all have the same number of partitions: {listed}."
        f" A scope lives on partition murmur2(scope) % count of each of them (its records,"
        f" its journal, its snapshots). Kafka cannot take partitions away: give them all one"
        f" count (add partitions, or point PURGATORY_TOPIC_* at other topics)"
        + (f" and set {_DECLARED} to it" if declared is not None else "")
        + f"; a count that changed moved scopes away from the journals written before:"
        f" see {_GUIDE}"
    )


async def read_counts(settings: Settings, count: Callable[[str], Awaitable[int]]) -> dict[str, int]:
    """The partition count of every topic keyed by scope that ``settings`` use.

    The snapshots topic is left out when it cannot be read (logged): a restore then replays
    the whole journal.

    Raises:
        TransportError: an input topic or the changelog cannot be read.
    """
    counts = {t: await count(t) for t in (settings.topic_requests, settings.topic_signals)}
    if settings.journal:
        counts[settings.topic_changelog] = await count(settings.topic_changelog)
    if settings.journal and settings.snapshot_interval_ms:
        try:
            counts[settings.topic_snapshots] = await count(settings.topic_snapshots)
        except TransportError as exc:
            _log.warning(
                "snapshots_topic_unreadable", topic=settings.topic_snapshots, error=str(exc)
            )
    return counts


class TopicLayout:
    """Checks the topics' partition counts at start and watches them while running.

    Args:
        settings: which topics, and the declared count.
        source: the consumer of the input topics (its ``partition_count`` follows its metadata).
        reader: reads the other topics' metadata (None: no journal, so no other topic).
        on_change: told why, at each change seen while running (the service stops its inputs).
        inputs_every_s: how often the input topics' counts are read from the consumer.
        logs_every_s: how often the changelog's and snapshots' counts are asked for.
    """

    def __init__(
        self,
        settings: Settings,
        source: RecordSource,
        reader: LogReader | None,
        *,
        on_change: Callable[[str], None],
        inputs_every_s: float = 1.0,
        logs_every_s: float = 30.0,
    ) -> None:
        self._settings = settings
        self._source = source
        self._reader = reader
        self._on_change = on_change
        self._inputs = (settings.topic_requests, settings.topic_signals)
        self._inputs_every_s = inputs_every_s
        self._logs_every_s = logs_every_s
        self._status = LayoutStatus()

    def statistics(self) -> LayoutStatus:
        """The counts now, and whether the inputs are stopped."""
        return self._status

    async def check(self) -> int:
        """Read every count; returns the one they share.

        Raises:
            ConfigError: they disagree, or differ from ``PURGATORY_TOPIC_PARTITIONS``.
            TransportError: an input topic or the changelog cannot be read.
        """
        counts = await read_counts(self._settings, self._count)
        partitions = check_counts(counts, self._settings.topic_partitions)
        self._status = LayoutStatus(counts=counts, partitions=partitions)
        return partitions

    async def run(self) -> None:
        """Watch the counts until cancelled (after :meth:`check`)."""
        logs = [t for t in self._status.counts if t not in self._inputs]
        next_logs_s = trio.current_time() + self._logs_every_s
        while True:
            await trio.sleep(self._inputs_every_s)
            for topic in self._inputs:
                self._seen(topic, self._source.partition_count(topic))
            if logs and trio.current_time() >= next_logs_s:
                next_logs_s = trio.current_time() + self._logs_every_s
                for topic in logs:
                    try:
                        count = await self._count(topic)
                    except TransportError as exc:  # the broker away: look again next time
                        _log.warning("topic_partitions_unknown", topic=topic, error=str(exc))
                        continue
                    self._seen(topic, count)

    async def _count(self, topic: str) -> int:
        if topic in self._inputs or self._reader is None:
            return self._source.partition_count(topic)
        return await self._reader.partition_count(topic)

    def _seen(self, topic: str, count: int) -> None:
        status = self._status
        old = status.counts.get(topic)
        if old is None or count == old:
            return
        changes = (*status.changes, CountChange(topic, old, count))
        why = "; ".join(
            f"the partition count of {c.topic} changed from {c.old} to {c.new}" for c in changes
        )
        why += (
            " while the service ran, so a scope's records may land on another partition than"
            " its operations and journal: no input is taken until the service is restarted on"
            f" topics of one count (see {_GUIDE})"
        )
        self._status = LayoutStatus(
            counts={**status.counts, topic: count},
            partitions=status.partitions,
            changes=changes,
            inputs_stopped=why,
        )
        _log.error(
            "topic_partitions_changed",
            topic=topic,
            old=old,
            new=count,
            detail="no input is taken until the service is restarted on topics of one count",
        )
        self._on_change(why)
