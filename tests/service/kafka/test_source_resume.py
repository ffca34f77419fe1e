"""A resume that needs the broker's answer waits for it, and never ends the consumer thread.

A partition taken again while it was read (a fence restored it) is read again from the group's
committed offset, which only the broker knows. kafka-python's ``committed`` waited for its
answer without a bound, and its error (the broker away, or moving its leaders) ended the
consumer thread, the source, and with it ``purgatory serve``. The request now waits, whole, for
the next turn of the thread's loop. A stub stands in for kafka-python's consumer here.
"""

from __future__ import annotations

from typing import Any

import trio
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.kafka.source import _ConsumerThread, _ResumeRequest

TP = TopicPartition("req", 0)


class _Consumer:
    """kafka-python's consumer, with a broker that does not answer ``failures`` times."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.asked_with: list[Any] = []
        self.seeks: list[tuple[Any, int]] = []
        self.resumed: list[Any] = []

    def assignment(self) -> set[Any]:
        return {TP}

    def committed(self, tp: Any, timeout_ms: int | None = None) -> int:
        self.asked_with.append(timeout_ms)
        if self.failures:
            self.failures -= 1
            raise KafkaTimeoutError("Failed to get offsets by timeout")
        return 42

    def seek(self, tp: Any, offset: int) -> None:
        self.seeks.append((tp, offset))

    def resume(self, tp: Any) -> None:
        self.resumed.append(tp)


async def test_a_resume_the_broker_cannot_answer_waits_whole_for_the_next_turn() -> None:
    thread = _ConsumerThread(
        KafkaClientConfig(bootstrap_servers="kafka:9092"), {}, ["req"], None, "committed", 10
    )
    thread._reading.add(TP)  # read when the fence took it: read again from the committed offset
    thread._held.add(TP)
    done = trio.Event()
    thread.request_resume(
        _ResumeRequest(
            {("req", 0): None}, {("req", 0): 2}, done, trio.lowlevel.current_trio_token()
        )
    )
    consumer = _Consumer(failures=2)
    for _ in range(2):  # the broker away: nothing resumed, nothing lost, the thread carries on
        thread._serve_resumes(consumer)
        assert (consumer.seeks, consumer.resumed, thread.held) == ([], [], frozenset())
        assert TP in thread._held
    thread._serve_resumes(consumer)  # answered: the same request, whole
    assert consumer.seeks == [(TP, 42)] and consumer.resumed == [TP]
    assert TP not in thread._held and thread._epochs[TP] == 2
    assert all(timeout is not None for timeout in consumer.asked_with)  # every wait bounded
    with trio.fail_after(1):
        await done.wait()
    thread._serve_resumes(consumer)  # nothing left to serve
    assert consumer.seeks == [(TP, 42)]
