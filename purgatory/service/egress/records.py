"""What the outbox writes (service layer: egress): a callback per outcome, a dead letter per
refused record, each within ``max_record_bytes``.

:class:`Records` is the one home of that policy: a callback goes to its operation's
``reply_to`` topic, else to the callbacks topic, keyed by its scope; one larger than
``max_record_bytes`` is not sent but dead-lettered; a dead letter always fits the limit (it keeps
only prefixes of what it wraps, with their sizes and hashes) and comes with a *bare* twin without
those prefixes, sent if a broker with a lower limit refuses the first. It does no I/O: the
sender, the settler and the transactional changelog send what it builds.

What the backlog holds is an :data:`Entry`: an outcome (its callback is encoded at hand-over,
on the completion lane), a :class:`Ref` (a dead letter, encoded when it was refused), a commit
marker (the offsets a consumed batch reached) or a barrier (a :class:`trio.Event` set once
everything before it is settled). :meth:`Records.encode` sorts one chunk of them into a
:class:`Chunk`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import trio

from purgatory._codec import (
    DEFAULT_MAX_DEAD_LETTER_KEY_BYTES,
    DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES,
    dead_letter_key,
    encode_callback,
    encode_dead_letter,
)
from purgatory._core import Outcome
from purgatory.service.kafka.transport import OutRecord, Refusal, SendFailure

__all__ = ["Chunk", "Entry", "Offsets", "Records", "Ref", "due_ms"]

#: Input offsets a consumed batch reached, per (topic, partition): a commit marker.
Offsets = dict[tuple[str, int], int]


def due_ms(outcome: Outcome) -> int:
    """When an outcome's callback was due: its outcome time, or its registration if later.

    An operation registered with a deadline already past is due when it arrives, not at its
    deadline: the client's lateness is not the service's lag.
    """
    return max(outcome.outcome_ms, outcome.registered_ms)


# Not frozen: one is built per callback on the hot path, and a frozen dataclass's __init__
# costs twice as much. Nothing changes one after it is built.
@dataclass(slots=True)
class Ref:
    """One record to send and what to do once it is acknowledged."""

    record: OutRecord
    outcome: Outcome | None = None  # a callback's outcome
    source_topic: str | None = None  # a dead letter's input topic
    reason: str = ""  # a dead letter's metric reason
    fallback: OutRecord | None = None  # the same dead letter without the prefixes


#: What the backlog holds, in decision order (an Event: a barrier).
Entry = Outcome | Ref | Offsets | trio.Event


@dataclass(slots=True)
class Chunk:
    """One chunk of entries, sorted for the sink: the records to send, in order, and what
    rides behind them."""

    #: what is sent, in order (``records[i]`` is ``refs[i].record``)
    refs: list[Ref]
    records: list[OutRecord]
    #: the chunk's commit markers, merged (a later marker's offset wins)
    offsets: Offsets
    barriers: list[trio.Event]
    #: callbacks over ``max_record_bytes``: not sent, refused as they are
    oversized: list[tuple[Ref, SendFailure]]


class Records:
    """Builds the records the outbox writes.

    Args:
        callbacks_topic: where a callback goes unless its operation names ``reply_to``.
        dead_letters_topic: where refused records go.
        max_record_bytes: a callback larger than this is dead-lettered; every dead letter fits.
    """

    def __init__(self, *, callbacks_topic: str, dead_letters_topic: str, max_record_bytes: int):
        self.callbacks_topic = callbacks_topic
        self.dead_letters_topic = dead_letters_topic
        self.max_record_bytes = max_record_bytes

    def encode(self, entries: Sequence[Entry]) -> Chunk:
        """Sort a chunk of the backlog: encode each outcome's callback, keep each dead letter,
        merge the commit markers, collect the barriers.

        The hot path: one call per chunk, every callback encoded inline.
        """
        callbacks_topic, limit = self.callbacks_topic, self.max_record_bytes
        refs: list[Ref] = []
        records: list[OutRecord] = []
        offsets: Offsets = {}
        barriers: list[trio.Event] = []
        oversized: list[tuple[Ref, SendFailure]] = []
        for entry in entries:
            if isinstance(entry, dict):
                offsets.update(entry)
                continue
            if isinstance(entry, trio.Event):
                barriers.append(entry)
                continue
            if isinstance(entry, Outcome):
                value = encode_callback(entry)
                topic = entry.reply_to or callbacks_topic
                ref = Ref(OutRecord(topic, entry.scope.encode(), value), entry)
                if len(value) > limit:
                    failure = SendFailure(_over_limit(len(value), limit), retriable=False)
                    oversized.append((ref, failure))
                    continue
            else:
                ref = entry
            refs.append(ref)
            records.append(ref.record)
        return Chunk(refs, records, offsets, barriers, oversized)

    def callback(self, outcome: Outcome) -> OutRecord:
        """The callback record of ``outcome`` (see :meth:`too_large`)."""
        topic = outcome.reply_to or self.callbacks_topic
        return OutRecord(topic, outcome.scope.encode(), encode_callback(outcome))

    def too_large(self, record: OutRecord) -> str | None:
        """Why ``record`` may not be sent (its value is over ``max_record_bytes``), or None."""
        size = len(record.value)
        return _over_limit(size, self.max_record_bytes) if size > self.max_record_bytes else None

    def input_letters(self, refusal: Refusal) -> tuple[OutRecord, OutRecord]:
        """The dead letter of a refused input record (its reason, the field at fault, its scope
        as the letter's Kafka key when it decoded that far), and its bare twin."""
        record = refusal.record
        return self._letters(
            scope=refusal.scope,
            reason=refusal.reason,
            field=refusal.field,
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            timestamp_ms=record.timestamp_ms,
            key=record.key,
            value=record.value,
        )

    def callback_letters(
        self,
        record: OutRecord,
        failure: SendFailure,
        *,
        scope: str | None,
        timestamp_ms: int | None,
    ) -> tuple[OutRecord, OutRecord]:
        """The dead letter of a callback ``record`` that cannot be delivered, and its bare twin.

        Args:
            record: the callback.
            failure: why it was not delivered.
            scope: its operation's scope, when known (the letter's Kafka key).
            timestamp_ms: its outcome's time, when known.
        """
        return self._letters(
            scope=scope,
            reason=f"callback not delivered to topic {record.topic!r}: {failure.reason}",
            field=None,
            topic=record.topic,
            partition=-1,
            offset=-1,
            timestamp_ms=timestamp_ms,
            key=record.key,
            value=record.value,
        )

    def _letters(
        self,
        *,
        scope: str | None,
        reason: str,
        field: str | None,
        topic: str,
        partition: int,
        offset: int,
        timestamp_ms: int | None,
        key: bytes | None,
        value: bytes | None,
    ) -> tuple[OutRecord, OutRecord]:
        """A dead letter, and the same without the refused record's key and value prefixes
        (sent if the broker refuses the first as too large: its limit is below ours). Both fit
        ``max_record_bytes`` whatever the refused record holds (see ``_codec._dead_letters``);
        their Kafka key is the scope when known, else the record's key, bounded."""
        limit = self.max_record_bytes
        letter_key = dead_letter_key(scope, key, max_record_bytes=limit)

        def letter(max_key_bytes: int, max_value_bytes: int) -> OutRecord:
            encoded = encode_dead_letter(
                reason=reason,
                field=field,
                topic=topic,
                partition=partition,
                offset=offset,
                timestamp_ms=timestamp_ms,
                key=key,
                value=value,
                max_key_bytes=max_key_bytes,
                max_value_bytes=max_value_bytes,
                max_record_bytes=limit,
            )
            return OutRecord(self.dead_letters_topic, letter_key, encoded)

        full = letter(DEFAULT_MAX_DEAD_LETTER_KEY_BYTES, DEFAULT_MAX_DEAD_LETTER_VALUE_BYTES)
        return full, letter(0, 0)


def _over_limit(size: int, limit: int) -> str:
    return f"{size} bytes, over max_record_bytes ({limit})"
