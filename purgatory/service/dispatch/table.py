"""The partition table (service layer: dispatch): which engine serves which partition here.

One engine per input partition: a scope's partition is Kafka's murmur2 of it
(:func:`~purgatory.service.ownership.partitioning.partition_for`), so its operations, signals and
watermarks, and the partition's outcome sequence, live in one engine that is restored and moved
as a unit. The table holds, per partition served, its engine, the input positions its journal
reached (records before them were applied already), the least record epoch to apply (records
fetched before the source's latest seek are skipped), and the highest outcome sequence whose
callback was acknowledged (the journal's delivered mark).

A partition this replica does not serve, or is still restoring, refuses an input with
:class:`~purgatory.service.errors.NotServingError` (HTTP 503 with Retry-After); so does every
partition once the inputs are stopped (a topic's partition count changed, see
:mod:`purgatory.service.ownership.layout`).

The table changes only when the partition's owner (:mod:`purgatory.service.dispatch.follow`)
serves or drops a partition, when the intake reaches a position, and when a callback is
acknowledged; the dispatcher (:mod:`purgatory.service.dispatch.dispatcher`) and the read model
(:mod:`purgatory.service.dispatch.reads`) look engines up in it.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator, Mapping

from purgatory._core import (
    Engine,
    EngineConfig,
    EngineStatistics,
    JournalEntry,
    Outcome,
    UsageError,
)
from purgatory.service.dispatch.admission import Admission
from purgatory.service.errors import NotServingError
from purgatory.service.ownership.life import LifeTable, PartitionState
from purgatory.service.ownership.partitioning import partition_for

__all__ = ["Journals", "PartitionTable"]

#: The journal of a partition's engine (None: nothing is journaled).
Journals = Callable[[int], Callable[[JournalEntry], None]]


class PartitionTable:
    """The engines of the partitions served here, and where each partition's inputs stand.

    Args:
        config: the configuration of every partition's engine.
        partitions: how many partitions the input topics have.
        journals: the journal of each partition's engine (None: nothing is journaled).
        life: the partitions' lives (read only: a partition held and not serving answers
            503 as restoring).
        max_pending_per_client: operations one client may hold pending, across scopes and
            partitions (0: no limit; see :mod:`purgatory.service.dispatch.admission`, whose
            :class:`~purgatory.service.dispatch.admission.Admission` follows the engines here).
        max_pending_bytes_per_client: estimated bytes of them (0: no limit).
        max_memory_bytes: the replica's memory budget in estimated bytes, base included (0:
            none); registrations and signals nobody awaits are refused beyond it.
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        partitions: int,
        journals: Journals | None = None,
        life: LifeTable | None = None,
        max_pending_per_client: int = 0,
        max_pending_bytes_per_client: int = 0,
        max_memory_bytes: int = 0,
    ) -> None:
        if partitions < 1:
            raise UsageError(f"partitions must be >= 1, got {partitions}")
        self.config = config
        self.partitions = partitions
        self.journals = journals
        self._engines: dict[int, Engine] = {}
        self.admission = Admission(
            self._engines.values,
            max_pending_per_client=max_pending_per_client,
            max_pending_bytes_per_client=max_pending_bytes_per_client,
            max_memory_bytes=max_memory_bytes,
        )
        self._life = life
        self._acked: dict[int, int] = {}  # partition -> highest acknowledged outcome sequence
        self._positions: dict[tuple[str, int], int] = {}  # (topic, partition) -> next offset
        self._epochs: dict[tuple[str, int], int] = {}  # (topic, partition) -> least epoch
        self.inputs_stopped: str | None = None  # why no input is taken (None: they are)

    # -- the partitions -------------------------------------------------------------------------

    def partition_of(self, scope: str) -> int:
        """The input partition of ``scope``."""
        return partition_for(scope, self.partitions)

    def journal(self, partition: int) -> Callable[[JournalEntry], None] | None:
        """The journal of ``partition``'s engine (None: not journaled)."""
        return None if self.journals is None else self.journals(partition)

    def new_engine(self, partition: int, *, start_ms: int) -> Engine:
        """A new, empty engine for ``partition``, journaled if the table has journals."""
        return Engine(
            self.config, start_ms=start_ms, partition=partition, journal=self.journal(partition)
        )

    def serve(
        self,
        partition: int,
        engine: Engine,
        *,
        acked: int = 0,
        positions: Mapping[str, int] | None = None,
        epochs: Mapping[str, int] | None = None,
    ) -> None:
        """Serve ``partition`` with ``engine`` (new, or restored).

        Args:
            acked: the highest outcome sequence known to be delivered.
            positions: per input topic, the next offset to apply (the journal's); records
                before it were applied already and are skipped.
            epochs: per input topic, the least record ``epoch`` to apply: records fetched
                before the source's seek to ``positions`` carry a lower one and are skipped
                (they may lie past records the seek reads again).
        """
        for topic, offset in (positions or {}).items():
            self._positions[(topic, partition)] = offset
        for topic, epoch in (epochs or {}).items():
            self._epochs[(topic, partition)] = epoch
        self._engines[partition] = engine
        self._acked[partition] = acked
        self.admission.served(partition, engine)

    def drop(self, partition: int, *, keep_acked: bool = False) -> None:
        """Stop serving ``partition`` (it was revoked); its engine is forgotten.

        Args:
            keep_acked: go on following its delivered outcomes (while it is handed over) until
                :meth:`forget_acked`.
        """
        if self._engines.pop(partition, None) is not None:
            # Its engine is cyclic garbage, which the collector never scans while frozen (a
            # restore freezes what it built): back to the oldest generation, to be collected.
            gc.unfreeze()
        self.admission.dropped(partition)
        if not keep_acked:
            self._acked.pop(partition, None)
        for tp in [tp for tp in self._positions if tp[1] == partition]:
            del self._positions[tp]
        for tp in [tp for tp in self._epochs if tp[1] == partition]:
            del self._epochs[tp]

    def forget_acked(self, partition: int) -> None:
        """Stop following ``partition``'s delivered outcomes (unless it is served again)."""
        if partition not in self._engines:
            self._acked.pop(partition, None)

    def serving(self) -> frozenset[int]:
        """The partitions served now."""
        return frozenset(self._engines)

    def restoring_now(self) -> frozenset[int]:
        """The partitions held here and not serving yet (restoring, or waiting to)."""
        if self._life is None:
            return frozenset()
        return self._life.in_state(
            PartitionState.TAKEN, PartitionState.RESTORING, PartitionState.FENCED
        )

    def engines(self) -> Iterator[Engine]:
        """The engines of the partitions served now."""
        return iter(list(self._engines.values()))

    def engine_of(self, scope: str) -> Engine:
        """The engine of ``scope``'s partition.

        Raises:
            NotServingError: the partition is not served here (or not yet).
        """
        partition = partition_for(scope, self.partitions)
        engine = self._engines.get(partition)
        if engine is None:
            raise NotServingError(partition, restoring=partition in self.restoring_now())
        return engine

    def engine_for_input(self, scope: str) -> Engine:
        """The engine of ``scope``'s partition, to apply an input to.

        Raises:
            NotServingError: the partition is not served here, or inputs are stopped.
        """
        engine = self.engine_of(scope)
        self.check_inputs(engine.partition)
        return engine

    def engine_statistics(self) -> EngineStatistics:
        """The engines' counts, summed (the clock: the latest of them)."""
        stats = [engine.statistics() for engine in self._engines.values()]
        if not stats:
            return Engine(self.config).statistics()
        summed = {
            name: sum(getattr(s, name) for s in stats)
            for name in EngineStatistics.__dataclass_fields__
        }
        summed["clock_ms"] = max(s.clock_ms for s in stats)
        summed["sequence"] = max(s.sequence for s in stats)
        summed["timer_levels"] = max(s.timer_levels for s in stats)
        return EngineStatistics(**summed)

    # -- the inputs' positions ------------------------------------------------------------------

    def stop_inputs(self, why: str) -> None:
        """Take no input any more (the topics' partition counts changed while running, see
        :mod:`purgatory.service.ownership.layout`): every write raises
        :class:`~purgatory.service.errors.NotServingError` saying ``why``, and the intake
        applies nothing; reads, expirations and deliveries go on."""
        self.inputs_stopped = why

    def check_inputs(self, partition: int) -> None:
        """Raise :class:`NotServingError` if inputs are stopped (``partition``: the scope's)."""
        if self.inputs_stopped is not None:
            raise NotServingError(partition, restoring=False, stopped=self.inputs_stopped)

    def expects(self, topic: str, partition: int, offset: int, epoch: int = 0) -> bool:
        """Whether a consumed record is to be applied: its partition is served here, the
        record is not before the position reached (not applied already), and it was fetched
        after the source's latest seek of the partition (``epoch``)."""
        tp = (topic, partition)
        return (
            partition in self._engines
            and offset >= self._positions.get(tp, 0)
            and epoch >= self._epochs.get(tp, 0)
        )

    def reached(self, topic: str, partition: int, offset: int) -> None:
        """The intake applied ``topic``'s records of ``partition`` up to ``offset`` (next)."""
        self._positions[(topic, partition)] = offset

    # -- deliveries -----------------------------------------------------------------------------

    def acked(self, partition: int) -> int:
        """The highest outcome sequence of ``partition`` whose callback was acknowledged."""
        return self._acked.get(partition, 0)

    def delivered(self, outcome: Outcome) -> None:
        """The outcome's callback was acknowledged: its partition's delivered mark moves."""
        acked = self._acked.get(outcome.partition)
        if acked is not None and outcome.sequence > acked:  # a served partition's, in order
            self._acked[outcome.partition] = outcome.sequence
