"""The intake (service layer): consumed records in, decoded, applied; dead letters and commits out.

Each consumed batch is applied record by record through the one state machine (the outcomes it
decides go, through the journal, to the outbox). A record that does not decode, breaks a limit or
that the state refuses is queued as a dead letter with the reason, in the same order (a limit,
the memory budget included, is named in the reason and as the field; the records of the input
topics are the client ``kafka`` for the quotas of :mod:`purgatory.service.dispatch.admission`).
After the
batch, the input positions it reached are journaled with its entries, and a commit marker with
its offsets follows everything it caused: the outbox commits them only once the journal and all
of it are acknowledged. The intake never waits for a commit: it waits only for room in the
outbox and in the journal (back-pressure). While the broker does not acknowledge the journal,
what the batches decided is held back, not queued in the outbox, so the journal's own room is
what stops the intake: consumed records then simply wait in their topics, neither applied nor
committed, and nothing is lost.

A record of a partition this replica does not serve (taken away, or not yet restored), or
before the position its journal reached (already applied), is skipped: the journal's positions,
not the group's committed offsets, say where each partition's inputs resume. Once the state's
inputs are stopped (a topic's partition count changed, see
:mod:`purgatory.service.ownership.layout`),
every batch is left unapplied and uncommitted: a restart reads it again.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from purgatory._codec import (
    Limits,
    RecordError,
    decode_requests_record,
    decode_signal,
)
from purgatory._core import LimitError, SizeLimitError, UsageError
from purgatory.service.dispatch.admission import KAFKA_CLIENT
from purgatory.service.dispatch.partitions import ServiceState
from purgatory.service.errors import UnavailableError
from purgatory.service.journal.changelog import Gate, NoJournal
from purgatory.service.journal.release import Release
from purgatory.service.kafka.transport import ConsumedRecord, RecordSource
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.metrics import Metrics

__all__ = ["run_intake"]

_log = get_logger()


async def run_intake(
    source: RecordSource,
    state: ServiceState,
    release: Release,
    *,
    requests_topic: str,
    signals_topic: str,
    limits: Limits,
    metrics: Metrics | None = None,
    gate: Gate | None = None,
    room: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Apply consumed batches until the source ends (or this task is cancelled).

    Dead letters and the offsets reached go to ``release``; ``room`` waits for room in egress
    (the outbox's back-pressure) after each batch."""
    gate = gate if gate is not None else NoJournal()
    decoders: dict[str, Callable[[bytes, Limits], object]] = {
        requests_topic: decode_requests_record,
        signals_topic: decode_signal,
    }
    async for batch in source.receive:
        if state.inputs_stopped is not None:
            continue  # neither applied nor committed: read again after the restart
        offsets: dict[tuple[str, int], int] = {}
        counts: dict[str, int] = {}
        for record in batch:
            if not state.expects(record.topic, record.partition, record.offset, record.epoch):
                continue
            offsets[(record.topic, record.partition)] = record.offset + 1
            counts[record.topic] = counts.get(record.topic, 0) + 1
            gate.consuming(record.partition, record.topic, record.offset)
            refused = _apply(record, state, decoders[record.topic], limits)
            if refused is not None:
                reason, field, label, scope = refused
                release.refused(record, reason=reason, field=field, label=label, scope=scope)
                invalid_registration = (
                    refused[2] == "invalid"
                    and record.topic == requests_topic
                    and _is_registration(record)
                )
                if metrics is not None and invalid_registration:
                    metrics.registration("invalid")
            state.reached(record.topic, record.partition, record.offset + 1)
            # After each record, not after the batch: a journal record cut at the size limit
            # mid-batch must carry the positions of exactly the entries it holds.
            gate.position(record.partition, record.topic, record.offset + 1)
        if metrics is not None:
            for topic, count in counts.items():
                metrics.records_consumed(topic, count)
        # One commit per partition: a partition fenced before its entries are acknowledged
        # must not commit offsets its void entries reached (the others still do).
        for partition in sorted({p for _t, p in offsets}):
            mine = {tp: o for tp, o in offsets.items() if tp[1] == partition}
            release.consumed(partition, mine)
        if room is not None:
            await room()
        await gate.wait_for_room()


def _apply(
    record: ConsumedRecord,
    state: ServiceState,
    decode: Callable[[bytes, Limits], object],
    limits: Limits,
) -> tuple[str, str | None, str, str | None] | None:
    """Apply one consumed record; the (reason, field, metric reason, scope if it decoded) to
    dead-letter it, or None.

    A record is applied only if its key is its scope and it sits on its scope's partition (the
    default partitioner's): its scope's engine journals its effect, and this partition's journal
    its position, and a restore replays each from its own partition. A null key, another key,
    or a partition a producer chose itself is dead-lettered naming ``key`` or ``partition``.
    """
    try:
        item = decode(record.value if record.value is not None else b"", limits)
    except RecordError as exc:
        return (str(exc), exc.field, "invalid", None)
    scope: str = item.scope  # type: ignore[attr-defined]  # every input record has one
    if record.key is None:
        return (
            "key: the message key is null; it must be the record's scope",
            "key",
            "invalid",
            scope,
        )
    if record.key != scope.encode("utf-8", "surrogatepass"):
        return ("key: the message key must be the record's scope", "key", "invalid", scope)
    home = state.partition_of(scope)
    if record.partition != home:
        # Applied, its effect would be journaled on its scope's partition and its position on
        # this one: a restore of either would disagree with the other.
        reason = (
            f"partition: the record is on partition {record.partition}, but its scope"
            f" {scope!r} belongs on partition {home} (Kafka's default partitioner of the key)"
        )
        return (reason, "partition", "invalid", scope)
    try:
        state.apply(item, client=KAFKA_CLIENT)  # type: ignore[arg-type]
    except RecordError as exc:  # well-formed, but a field the state refuses (a reply_to)
        return (str(exc), exc.field, "invalid", scope)
    except SizeLimitError as exc:  # the callback would outgrow its record: bad input
        return (str(exc), exc.field, "invalid", scope)
    except UnavailableError as exc:  # not served here now (inputs stopped): refused, named
        return (str(exc), None, "refused", scope)
    except UsageError as exc:  # a conflict, a limit, a deadline out of range
        _log.warning("record_refused", topic=record.topic, offset=record.offset, error=str(exc))
        # A limit's field names it (max_memory_bytes, ...): the dead letter says which.
        return (str(exc), exc.field if isinstance(exc, LimitError) else None, "refused", scope)
    return None


def _is_registration(record: ConsumedRecord) -> bool:
    """Whether an invalid record of the requests topic was meant as a registration (for
    ``purgatory_registrations_total{result="invalid"}``): it names the type ``register``."""
    value = record.value or b""
    return b'"register"' in value[:4096]
