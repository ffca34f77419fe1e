"""The records the outbox writes: callbacks by topic and size, dead letters within the limit."""

from __future__ import annotations

import json

import trio
from hypothesis import given
from hypothesis import strategies as st

from purgatory._codec import encode_callback
from purgatory.service.egress.records import Ref, due_ms
from purgatory.service.kafka.transport import ConsumedRecord, OutRecord, Refusal, SendFailure
from tests.service.egress.parts import CALLBACKS, DEAD, INPUT, REPLY, outcome, records


def test_a_chunk_is_sorted_into_records_in_order_merged_offsets_and_barriers() -> None:
    letter = Ref(OutRecord(DEAD, b"s", b"{}"), None, INPUT, "invalid")
    barrier = trio.Event()
    a, b = outcome(1), outcome(2, reply_to=REPLY, scope="t")
    chunk = records().encode(
        [a, {(INPUT, 0): 3}, letter, barrier, b, {(INPUT, 0): 5, (INPUT, 1): 1}]
    )
    assert [r.record for r in chunk.refs] == chunk.records
    assert chunk.records == [
        OutRecord(CALLBACKS, b"s", encode_callback(a)),
        letter.record,
        OutRecord(REPLY, b"t", encode_callback(b)),
    ]
    assert [r.outcome for r in chunk.refs] == [a, None, b]
    assert chunk.refs[1] is letter
    assert chunk.offsets == {(INPUT, 0): 5, (INPUT, 1): 1}  # the later marker wins
    assert chunk.barriers == [barrier]
    assert chunk.oversized == []


def test_a_callback_of_exactly_max_record_bytes_is_sent_and_one_byte_more_is_not() -> None:
    small, big = outcome(1, payload='"a"'), outcome(2, payload='"ab"')
    limit = len(encode_callback(small))
    assert len(encode_callback(big)) == limit + 1
    chunk = records(limit).encode([small, big])
    assert [r.outcome for r in chunk.refs] == [small]
    [(ref, failure)] = chunk.oversized
    assert ref.outcome is big and ref.record.value == encode_callback(big)
    size = len(encode_callback(big))
    assert failure == SendFailure(f"{size} bytes, over max_record_bytes ({limit})", False)
    assert records(limit).too_large(ref.record) == failure.reason
    assert records(limit).too_large(chunk.records[0]) is None


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=8), st.integers(150, 400))
def test_one_record_at_a_time_follows_the_chunks_policy(
    shapes: list[tuple[int, bool]], limit: int
) -> None:
    """``callback`` and ``too_large`` (transactional delivery) decide as ``encode`` does."""
    made = records(limit)
    outcomes = [
        outcome(i, payload=f'"{"x" * size * 40}"', reply_to=REPLY if reply else None)
        for i, (size, reply) in enumerate(shapes)
    ]
    chunk = made.encode(outcomes)
    sent = [made.callback(o) for o in outcomes if made.too_large(made.callback(o)) is None]
    refused = [made.callback(o) for o in outcomes if made.too_large(made.callback(o)) is not None]
    assert chunk.records == sent
    assert [ref.record for ref, _ in chunk.oversized] == refused


def test_an_input_letter_names_its_record_and_its_bare_twin_drops_the_prefixes() -> None:
    record = ConsumedRecord(INPUT, 1, 7, b"k" * 50, b"v" * 5_000, 1_000)
    full, bare = records().input_letters(Refusal(record, "bad", "keys", "invalid", "s"))
    assert full.topic == bare.topic == DEAD and full.key == bare.key == b"s"
    letter, twin = json.loads(full.value), json.loads(bare.value)
    for wrapped in (letter, twin):
        assert (wrapped["topic"], wrapped["partition"], wrapped["offset"]) == (INPUT, 1, 7)
        assert (wrapped["reason"], wrapped["field"]) == ("bad", "keys")
        assert wrapped["value_bytes"] == 5_000
    assert letter["value"].startswith("v") and twin["value"] == "" and twin["key"] == ""


def test_a_letter_without_a_scope_is_keyed_by_the_records_key() -> None:
    record = ConsumedRecord(INPUT, 0, 0, b"raw", b"not json", 1_000)
    full, bare = records().input_letters(Refusal(record, "bad", None, "invalid"))
    assert full.key == bare.key == b"raw"


@given(st.binary(max_size=3_000), st.binary(max_size=3_000), st.text(max_size=500))
def test_every_letter_fits_max_record_bytes(key: bytes, value: bytes, reason: str) -> None:
    limit = 2_048
    record = ConsumedRecord(INPUT, 0, 0, key, value, 1_000)
    for letter in records(limit).input_letters(Refusal(record, reason, None, "invalid")):
        assert len(letter.key or b"") + len(letter.value) <= limit


def test_a_callback_letter_names_the_topic_it_was_for_and_why() -> None:
    done = outcome(3, reply_to=REPLY, outcome_ms=1_234)
    callback = records().callback(done)
    full, bare = records().callback_letters(
        callback, SendFailure("UnknownTopicOrPartitionError", False), scope="s", timestamp_ms=1_234
    )
    letter = json.loads(full.value)
    assert full.topic == DEAD and full.key == b"s"
    assert (
        letter["reason"]
        == f"callback not delivered to topic {REPLY!r}: UnknownTopicOrPartitionError"
    )
    assert (letter["topic"], letter["partition"], letter["offset"]) == (REPLY, -1, -1)
    assert letter["timestamp_ms"] == 1_234
    assert json.loads(letter["value"])["op_id"] == "op3"
    assert json.loads(bare.value)["value"] == ""


def test_a_callback_is_due_at_its_outcome_or_its_registration_if_later() -> None:
    assert due_ms(outcome(1, registered_ms=10, outcome_ms=50)) == 50
    assert due_ms(outcome(1, registered_ms=90, outcome_ms=50)) == 90
