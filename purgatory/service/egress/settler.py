"""The outbox's settler (service layer: egress): a refused record, settled alone.

A record the broker refused never affects another: the acknowledger hands it here, with the
failure, and waits. While retrying can help (the failure is *retriable*: a timeout, a leader
change, a broker away) it is sent again after a back-off: for ever to the configured topics
(callbacks, dead letters), for at most ``reply_to_timeout_ms`` to a client's ``reply_to`` topic,
which may never exist. Otherwise:

* a callback is dead-lettered (reason ``undeliverable``), the dead letter settled the same way,
  and its outcome settled as not delivered (its waiters must not wait for ever);
* a dead letter the broker refuses for good (too large for a broker with a lower limit than
  ours) is sent once more as its bare twin, without the refused record's key and value;
* a bare dead letter refused for good is lost, loudly (``dead_letter_lost``).

:meth:`Settler.settle` returns what was settled, in order, and the caller counts it: each
:class:`~purgatory.service.egress.records.Ref` acknowledged (as the record that was taken), each
:class:`~purgatory._core.Outcome` whose callback was dead-lettered instead.

Worked example (back-off 0.1 s doubling, ``reply_to_timeout_ms`` 1000, a broker that answers
at once): a callback to ``reply.x``, refused as retriable at 0 ms, is sent again at 100, 300, 700
and 1500 ms, each time refused; at 1500 ms the timeout is past: it is dead-lettered, and
``settle`` returns ``[Ref(its dead letter), its outcome]``.
"""

from __future__ import annotations

import dataclasses

import trio

from purgatory._core import Outcome
from purgatory._core._backoff import Backoff
from purgatory.service.egress.records import Records, Ref
from purgatory.service.kafka.transport import OutRecord, RecordSink, SendFailure
from purgatory.service.telemetry.logging import get_logger
from purgatory.service.telemetry.metrics import Metrics
from reaper import Clock

__all__ = ["Settler"]

_log = get_logger()


class Settler:
    """Retries a refused record while that can help; otherwise dead-letters it, alone.

    Args:
        sink: where records go again.
        clock: for the ``reply_to`` timeout.
        records: builds the dead letter of a callback.
        backoff: the pause before each retry.
        reply_to_timeout_ms: how long a callback to a client's ``reply_to`` topic is retried
            before it is dead-lettered.
        metrics: where undeliverable callbacks are counted (None: nowhere).
    """

    def __init__(
        self,
        sink: RecordSink,
        clock: Clock,
        records: Records,
        *,
        backoff: Backoff,
        reply_to_timeout_ms: int,
        metrics: Metrics | None,
    ) -> None:
        self._sink = sink
        self._clock = clock
        self._records = records
        self._backoff = backoff
        self._reply_to_timeout_ms = reply_to_timeout_ms
        self._metrics = metrics
        #: records sent again after a failure
        self.retries = 0

    async def settle(self, ref: Ref, failure: SendFailure) -> list[Ref | Outcome]:
        """Settle ``ref``, refused with ``failure``.

        Returns:
            What was settled, in order: a :class:`Ref` acknowledged (its ``record`` the one
            taken: ``ref.fallback`` when the bare twin was), an outcome whose callback was
            dead-lettered instead. Empty if the record was lost.
        """
        records = self._records
        topic = ref.record.topic
        configured = topic in (records.callbacks_topic, records.dead_letters_topic)
        give_up_ms = None if configured else self._clock.now_ms() + self._reply_to_timeout_ms
        attempt = 0
        record = ref.record
        while True:
            if not failure.retriable:
                if ref.outcome is None and ref.fallback is not None and record is not ref.fallback:
                    record = ref.fallback  # the same letter, without the input's key and value
                elif ref.outcome is not None:
                    return await self._dead_letter(ref, failure)
                else:
                    _log.error("dead_letter_lost", topic=topic, reason=failure.reason)
                    return []
            elif give_up_ms is not None and self._clock.now_ms() >= give_up_ms:
                return await self._dead_letter(ref, failure)
            else:
                await trio.sleep(self._backoff.delay_s(attempt))
                attempt += 1
            self.retries += 1
            [failure_or_none] = await self._send(record)
            if failure_or_none is None:
                return [ref if record is ref.record else dataclasses.replace(ref, record=record)]
            failure = failure_or_none

    async def _dead_letter(self, ref: Ref, failure: SendFailure) -> list[Ref | Outcome]:
        """Dead-letter the callback of ``ref`` (refused for good, or past its timeout)."""
        outcome = ref.outcome
        assert outcome is not None
        record = ref.record
        _log.error(
            "callback_dead_lettered",
            op_id=outcome.op_id,
            scope=outcome.scope,
            topic=record.topic,
            reason=failure.reason,
        )
        if self._metrics is not None:
            self._metrics.callback_error()
        full, bare = self._records.callback_letters(
            record, failure, scope=outcome.scope, timestamp_ms=outcome.outcome_ms
        )
        dead = Ref(full, None, record.topic, "undeliverable", bare)
        [failure_or_none] = await self._send(dead.record)
        settled = [dead] if failure_or_none is None else await self.settle(dead, failure_or_none)
        return [*settled, outcome]

    async def _send(self, record: OutRecord) -> list[SendFailure | None]:
        return await (await self._sink.send_batch([record])).results()
