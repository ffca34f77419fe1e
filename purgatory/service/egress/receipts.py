"""The outbox's receipts (service layer: egress): what an acknowledgement means, once it came.

A callback the broker acknowledged is *delivered*: only now is it counted (the delivered total,
the produced records, the outcomes' histograms, an expiration's lateness), its outcome handed to
``on_delivered`` (the waiters and the recent outcomes, through the acknowledgements) and its log
line written. A dead letter acknowledged is counted per input topic and reason and handed to
``on_dead_lettered``. A callback dead-lettered instead is handed to ``on_delivered`` too (its
waiters must not wait for ever) but counted nowhere as delivered. Callbacks acknowledged in a row
are reported together (:meth:`Receipts.delivered`): the metrics are counted once per run, not
once per callback, which is most of the outbox's cost per callback otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

from purgatory._core import Outcome, OutcomeKind, TimeDomain
from purgatory.service.egress.records import Ref, due_ms
from purgatory.service.kafka.transport import OutRecord
from purgatory.service.telemetry.logging import get_logger, logs_enabled
from purgatory.service.telemetry.metrics import Metrics
from reaper import Clock

__all__ = ["Receipts"]

_log = get_logger()


class Receipts:
    """Counts each acknowledgement and tells the listeners.

    Args:
        clock: for the outcomes' latency and an expiration's lateness.
        on_delivered: called with each outcome once its callback is acknowledged (or
            dead-lettered).
        on_dead_lettered: called with each dead letter once the broker acknowledged it.
        metrics: where deliveries are counted (None: nowhere).
    """

    def __init__(
        self,
        clock: Clock,
        *,
        on_delivered: Callable[[Outcome], None],
        on_dead_lettered: Callable[[OutRecord], None],
        metrics: Metrics | None,
    ) -> None:
        self._clock = clock
        self._on_delivered = on_delivered
        self._on_dead_lettered = on_dead_lettered
        self._metrics = metrics
        #: callbacks acknowledged, and dead letters acknowledged, since the start
        self.delivered_count = 0
        self.dead_lettered_count = 0

    def acknowledged(self, ref: Ref) -> None:
        """``ref`` (a callback or a dead letter) is acknowledged, as ``ref.record``."""
        if ref.outcome is None:  # a dead letter
            self.dead_lettered_count += 1
            metrics = self._metrics
            if metrics is not None and ref.source_topic is not None:
                metrics.dead_lettered(ref.source_topic, ref.reason)
            self._on_dead_lettered(ref.record)
            return
        self.delivered([ref])

    def undelivered(self, outcome: Outcome) -> None:
        """``outcome``'s callback was dead-lettered instead: settled, not delivered."""
        self._on_delivered(outcome)

    def delivered(self, refs: list[Ref]) -> None:
        """The callbacks of ``refs`` (outcomes, in order) are acknowledged: count them, wake
        their waiters. Metrics are counted per call, not per callback (the acknowledger calls
        this once per run of acknowledged callbacks)."""
        if not refs:
            return
        self.delivered_count += len(refs)
        metrics = self._metrics
        if metrics is not None:
            now_ms = self._clock.now_ms()
            topics: dict[str, int] = {}
            for ref in refs:
                topic = ref.record.topic
                topics[topic] = topics.get(topic, 0) + 1
            for topic, count in topics.items():
                metrics.records_produced(topic, count)
            sent = [ref.outcome for ref in refs if ref.outcome is not None]
            metrics.outcomes(sent, now_ms=now_ms)
            for done in sent:
                if (
                    done.outcome is OutcomeKind.EXPIRED
                    and done.time_domain is TimeDomain.PROCESSING_TIME
                ):
                    metrics.reaper_lateness(max(0, now_ms - due_ms(done)))
        debug = logs_enabled("debug")
        for ref in refs:
            outcome = ref.outcome
            assert outcome is not None
            self._on_delivered(outcome)
            if not debug:
                continue
            _log.debug(
                "operation_" + outcome.outcome.value,
                op_id=outcome.op_id,
                scope=outcome.scope,
                sequence=outcome.sequence,
                late=outcome.late,
            )
            if outcome.outcome is OutcomeKind.EXPIRED and outcome.late:
                # After a restore they come by the thousand: the restore logs their count
                # (partition_serving, overdue=...) and purgatory_late_expirations counts them.
                _log.debug("operation_expired_late", op_id=outcome.op_id, scope=outcome.scope)
