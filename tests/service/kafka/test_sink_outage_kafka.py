"""The sink sends again after a broker outage longer than its producer's delivery timeout.

kafka-python 3.0.12's idempotent producer drops its producer id when a batch that was already
sent expires, and never asks for a new one: it then sends nothing, ever (see the docstring of
:mod:`purgatory.service.kafka.sink`). With the sink's defaults that takes an outage of more than
120 s (the delivery timeout) with a request in flight when it began (it times out after 30 s and
is queued again). Here the same happens in seconds, through the sink's own arguments: a
delivery timeout of 5 s, of which the linger takes 2.5 s, which leaves 2.5 s to a request
(``request_timeout_ms`` is the delivery timeout less the linger); a flush sends at once, so the
request times out after 2.5 s, its batch is queued again, and expires at 5 s.

The broker is the session's Apache Kafka, stopped with SIGSTOP (it keeps its connections and
answers nothing, as an unreachable broker does) and resumed with SIGCONT.
"""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from types import SimpleNamespace

import pytest
import trio
from kafka.producer.transaction_manager import TransactionManager, TransactionState

from purgatory.devtools.kafka_broker import KafkaBroker
from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.sink import _renew_producer_id_after_reset, open_kafka_sink
from purgatory.service.kafka.transport import OutRecord
from tests.freeze import freeze

DELIVERY_MS = 5_000
LINGER_MS = 2_500  # leaves DELIVERY_MS - LINGER_MS to a request: it times out before expiry
#: From SIGCONT to the acknowledgement of records sent then, measured 0.01-0.17 s: the request
#: for a new producer id went out during the outage and is answered at once, then the records.
#: Had that request timed out already (after 2.5 s), it goes again first; the bound leaves that
#: room several times over. Without the renewal nothing is ever acknowledged.
RESUME_BOUND_S = 2 * DELIVERY_MS / 1000


@pytest.mark.kafka
async def test_the_sink_sends_again_after_a_sent_batch_expired_in_an_outage(
    apache_kafka: KafkaBroker, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kafka.producer.transaction_manager")
    topic = f"outage-{uuid.uuid4().hex[:12]}"
    apache_kafka.create_topics({topic: 1})
    config = KafkaClientConfig(bootstrap_servers=apache_kafka.bootstrap_servers, client_id="t")
    pid = apache_kafka.pid
    assert pid is not None
    stopped = False
    try:
        async with open_kafka_sink(
            config, linger_ms=LINGER_MS, delivery_timeout_ms=DELIVERY_MS
        ) as sink:
            await sink.send(topic, b"k", b"before")
            await sink.flush()

            freeze(pid)
            stopped = True
            began = time.perf_counter()
            during = await sink.send_batch([OutRecord(topic, b"k", b"during")])
            await sink.flush()  # sends it now; returns once it expired
            [failure] = await during.results()
            expired_s = time.perf_counter() - began
            assert failure is not None and failure.retriable, failure
            assert "Expiring 1 record(s)" in failure.reason, failure
            # The case under test happened: the producer dropped its id.
            assert "ProducerId set to -1" in caplog.text

            os.kill(pid, signal.SIGCONT)
            stopped = False
            back = time.perf_counter()
            with trio.fail_after(RESUME_BOUND_S):
                # What the journal does with a retriable failure: send the record again.
                again = await sink.send_batch([OutRecord(topic, b"k", b"during")])
                after = await sink.send_batch([OutRecord(topic, b"k", b"after")])
                await sink.flush()
                assert await again.results() == [None]
                assert await after.results() == [None]
            resumed_s = time.perf_counter() - back
        stats = sink.statistics()
        assert (stats.sent, stats.acked, stats.failed) == (4, 3, 1)
        print(
            f"\nsink-outage: a sent batch expired {expired_s:.2f} s into the outage"
            f" (delivery timeout {DELIVERY_MS / 1000:.1f} s); records sent after SIGCONT were"
            f" acknowledged {resumed_s:.2f} s after it (bound {RESUME_BOUND_S:.0f} s)"
        )
    finally:
        if stopped:
            os.kill(pid, signal.SIGCONT)  # never leave the session's broker stopped


def _ready_manager() -> TransactionManager:
    """An idempotent producer's transaction manager that holds producer id 7, as kafka-python's
    I/O thread leaves it once the broker has answered its first InitProducerId."""
    manager = TransactionManager(api_version=(4, 0))
    manager.init_producer_id()
    [(_, _, handler)] = manager._pending_requests
    manager._pending_requests.clear()
    with manager._lock:
        handler.handle_response(SimpleNamespace(error_code=0, producer_id=7, producer_epoch=0))
    assert manager.has_producer_id() and manager._current_state is TransactionState.READY
    return manager


def test_kafka_python_alone_never_asks_again_for_the_producer_id_it_dropped() -> None:
    # Why the sink renews the producer id itself: kafka-python 3.0.12's reset (a sent batch
    # expired) leaves the manager READY without an id, and the I/O thread's request for one
    # (init_producer_id, called while there is no id) does nothing outside UNINITIALIZED. If
    # this starts failing, the library renews the id itself and the sink's step may go.
    manager = _ready_manager()
    manager.reset_producer_id()
    manager.init_producer_id()
    assert not manager.has_producer_id()
    assert manager._current_state is TransactionState.READY
    assert not manager._pending_requests


def test_the_sink_has_the_dropped_producer_id_asked_for_again() -> None:
    manager = _ready_manager()
    _renew_producer_id_after_reset(SimpleNamespace(_transaction_manager=manager))
    manager.reset_producer_id()
    assert not manager.has_producer_id()
    assert manager._current_state is TransactionState.UNINITIALIZED
    manager.init_producer_id()  # what the I/O thread calls next
    [(_, _, handler)] = manager._pending_requests
    assert type(handler.request).__name__ == "InitProducerIdRequest"
    assert manager._current_state is TransactionState.INITIALIZING
    # A second reset while the new id is being asked for leaves that request to answer.
    manager.reset_producer_id()
    assert manager._current_state is TransactionState.INITIALIZING


def test_the_renewal_leaves_other_producers_alone() -> None:
    not_idempotent = SimpleNamespace(_transaction_manager=None)
    _renew_producer_id_after_reset(not_idempotent)
    transactional = TransactionManager(transactional_id="t", api_version=(4, 0))
    reset = transactional.reset_producer_id
    _renew_producer_id_after_reset(SimpleNamespace(_transaction_manager=transactional))
    assert transactional.reset_producer_id == reset
