"""The intake (service layer): consumed records in, decoded, applied; dead letters and commits out.

Each consumed batch is applied record by record, each record in one line of steps: tell the
journal which consumed record the next entries come from, decode it, apply it through the
flow (dispatch, release, wake: :mod:`purgatory.service.ingress.flow`), record the position it
reached. A record that does not decode, breaks a limit or that dispatch refuses becomes a
:class:`~purgatory.service.kafka.transport.Refusal`, queued as a dead letter with the reason, in
the same order (a limit, the memory budget included, is named in the reason and as the field;
the records of the input topics are the client ``kafka`` for the quotas of
:mod:`purgatory.service.dispatch.admission`). After the batch, the input positions it reached
are journaled with its entries, and a commit marker with its offsets follows everything it
caused: the outbox commits them only once the journal and all of it are acknowledged. The
intake never waits for a commit: it waits only for room in the outbox and in the journal
(back-pressure). While the broker does not acknowledge the journal,
what the batches decided is held back, not queued in the outbox, so the journal's own room is
what stops the intake: consumed records then simply wait in their topics, neither applied nor
committed, and nothing is lost.

A record of a partition this replica does not serve (taken away, or not yet restored), or
before the position its journal reached (already applied), is skipped: the journal's positions,
not the group's committed offsets, say where each partition's inputs resume. Once the inputs
are stopped (a topic's partition count changed, see :mod:`purgatory.service.ownership.layout`),
every batch is left unapplied and uncommitted: a restart reads it again.
"""

from __future__ import annotations

from collections.abc import Callable

from purgatory._codec import (
    Limits,
    RecordError,
    decode_requests_record,
    decode_signal,
)
from purgatory._core import LimitError, SizeLimitError, UsageError
from purgatory.service.dispatch.admission import KAFKA_CLIENT
from purgatory.service.dispatch.table import PartitionTable
from purgatory.service.errors import UnavailableError
from purgatory.service.ingress.flow import Flow, Room
from purgatory.service.journal.changelog import Gate
from purgatory.service.journal.release import Release
from purgatory.service.kafka.transport import ConsumedRecord, RecordSource, Refusal
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.metrics import Metrics

__all__ = ["Intake"]

_log = get_logger()

Decoder = Callable[[bytes, Limits], object]


class Intake:
    """Applies the batches the source consumes, until it ends.

    Args:
        source: the input topics' consumer.
        flow: applies each decoded input (dispatch, release, wake).
        release: takes the dead letters of refused records and the offsets reached.
        gate: the journal (which consumed record its next entries come from; its room).
        requests_topic: the topic of registrations and cancels.
        signals_topic: the topic of signals and watermarks.
        limits: the record limits of the codec.
        egress: waits for room there after each batch (the outbox's back-pressure).
        metrics: where consumed records and invalid registrations are counted.
    """

    def __init__(
        self,
        source: RecordSource,
        flow: Flow,
        release: Release,
        gate: Gate,
        *,
        requests_topic: str,
        signals_topic: str,
        limits: Limits,
        egress: Room,
        metrics: Metrics | None = None,
    ) -> None:
        self._source = source
        self._flow = flow
        self._table: PartitionTable = flow.dispatcher.table
        self._release = release
        self._gate = gate
        self._requests_topic = requests_topic
        self._decoders: dict[str, Decoder] = {
            requests_topic: decode_requests_record,
            signals_topic: decode_signal,
        }
        self._limits = limits
        self._egress = egress
        self._metrics = metrics

    async def run(self) -> None:
        """Apply consumed batches until the source ends (or this task is cancelled)."""
        async for batch in self._source.receive:
            if self._table.inputs_stopped is not None:
                continue  # neither applied nor committed: read again after the restart
            self._take(batch)
            await self._egress.wait_for_room()
            await self._gate.wait_for_room()

    def _take(self, batch: list[ConsumedRecord]) -> None:
        """Apply one batch, then ask for its offsets to be committed after what it caused."""
        offsets: dict[tuple[str, int], int] = {}
        counts: dict[str, int] = {}
        for record in batch:
            if not self._table.expects(record.topic, record.partition, record.offset, record.epoch):
                continue
            offsets[(record.topic, record.partition)] = record.offset + 1
            counts[record.topic] = counts.get(record.topic, 0) + 1
            self._apply(record)
        if self._metrics is not None:
            for topic, count in counts.items():
                self._metrics.records_consumed(topic, count)
        # One commit per partition: a partition fenced before its entries are acknowledged
        # must not commit offsets its void entries reached (the others still do).
        for partition in sorted({p for _t, p in offsets}):
            mine = {tp: o for tp, o in offsets.items() if tp[1] == partition}
            self._release.consumed(partition, mine)

    def _apply(self, record: ConsumedRecord) -> None:
        """One record: journal where its entries come from, decode, apply (or refuse), and
        record the position it reached."""
        topic, partition, after = record.topic, record.partition, record.offset + 1
        self._gate.consuming(partition, topic, record.offset)
        refusal = self._refusal(record)
        if refusal is not None:
            self._release.refused(refusal)
            if self._metrics is not None and self._invalid_registration(refusal):
                self._metrics.registration("invalid")
        self._table.reached(topic, partition, after)
        # After each record, not after the batch: a journal record cut at the size limit
        # mid-batch must carry the positions of exactly the entries it holds.
        self._gate.position(partition, topic, after)

    def _refusal(self, record: ConsumedRecord) -> Refusal | None:
        """Apply one consumed record; why it is refused (its dead letter), or None.

        A record is applied only if its key is its scope and it sits on its scope's partition
        (the default partitioner's): its scope's engine journals its effect, and this
        partition's journal its position, and a restore replays each from its own partition.
        A null key, another key, or a partition a producer chose itself is dead-lettered
        naming ``key`` or ``partition``.
        """
        decode = self._decoders[record.topic]
        try:
            item = decode(record.value if record.value is not None else b"", self._limits)
        except RecordError as exc:
            return Refusal(record, str(exc), exc.field, "invalid")
        scope: str = item.scope  # type: ignore[attr-defined]  # every input record has one
        if record.key is None:
            reason = "key: the message key is null; it must be the record's scope"
            return Refusal(record, reason, "key", "invalid", scope)
        if record.key != scope.encode("utf-8", "surrogatepass"):
            reason = "key: the message key must be the record's scope"
            return Refusal(record, reason, "key", "invalid", scope)
        home = self._table.partition_of(scope)
        if record.partition != home:
            # Applied, its effect would be journaled on its scope's partition and its position
            # on this one: a restore of either would disagree with the other.
            reason = (
                f"partition: the record is on partition {record.partition}, but its scope"
                f" {scope!r} belongs on partition {home} (Kafka's default partitioner of the"
                f" key)"
            )
            return Refusal(record, reason, "partition", "invalid", scope)
        try:
            self._flow.apply(item, client=KAFKA_CLIENT)  # type: ignore[arg-type]
        except RecordError as exc:  # well-formed, but a field dispatch refuses (a reply_to)
            return Refusal(record, str(exc), exc.field, "invalid", scope)
        except SizeLimitError as exc:  # the callback would outgrow its record: bad input
            return Refusal(record, str(exc), exc.field, "invalid", scope)
        except UnavailableError as exc:  # not served here now (inputs stopped): refused, named
            return Refusal(record, str(exc), None, "refused", scope)
        except UsageError as exc:  # a conflict, a limit, a deadline out of range
            _log.warning("record_refused", topic=record.topic, offset=record.offset, error=str(exc))
            # A limit's field names it (max_memory_bytes, ...): the dead letter says which.
            field = exc.field if isinstance(exc, LimitError) else None
            return Refusal(record, str(exc), field, "refused", scope)
        return None

    def _invalid_registration(self, refusal: Refusal) -> bool:
        """Whether an invalid record of the requests topic was meant as a registration (for
        ``purgatory_registrations_total{result="invalid"}``): it names the type
        ``register``."""
        record = refusal.record
        if refusal.label != "invalid" or record.topic != self._requests_topic:
            return False
        return b'"register"' in (record.value or b"")[:4096]
