"""docs/kafka.md: the ``kafka-topics.sh`` commands it shows create the service's six topics, with
settings Apache Kafka takes and that hold what the page says.

The commands are read from the page, checked against the service's defaults (names, one
partition count for the topics keyed by scope, ``max.message.bytes`` against
``PURGATORY_MAX_RECORD_BYTES``), and then run on the session's Apache Kafka through the admin
API with the same arguments (one node: replication factor 1, one in-sync replica), under names of
their own. A record of the largest size the service produces, with the longest key, goes into
each; the broker's default limit refuses it, as the page says.
"""

from __future__ import annotations

import argparse
import shlex
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from kafka.errors import MessageSizeTooLargeError

from purgatory.service.kafka.config import no_topic_creation
from purgatory.service.settings import Settings
from tests.test_docs import _blocks, _commands

if TYPE_CHECKING:
    from purgatory.devtools.kafka_broker import KafkaBroker

PAGE = Path(__file__).parent.parent / "docs" / "kafka.md"
SETTINGS = Settings()
KEYED = ("topic_requests", "topic_signals", "topic_changelog", "topic_snapshots")
# What the service's producer allows beyond a record (KafkaTransport.from_settings).
REQUEST_ROOM = 4096


def _shown() -> dict[str, argparse.Namespace]:
    """Each ``kafka-topics.sh --create`` of the page, parsed, by topic."""
    parser = argparse.ArgumentParser(prog="kafka-topics.sh", exit_on_error=False)
    parser.add_argument("--bootstrap-server", required=True)
    parser.add_argument("--create", action="store_true", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--partitions", type=int, required=True)
    parser.add_argument("--replication-factor", type=int, required=True)
    parser.add_argument("--config", action="append", default=[])
    found = {}
    for info, script in _blocks(PAGE.read_text("utf-8")):
        for command in _commands(script) if info == "sh" else ():
            words = shlex.split(command)
            if words[0] == "kafka-topics.sh":
                args = parser.parse_args(words[1:])
                args.configs = dict(item.split("=", 1) for item in args.config)
                assert args.topic not in found, args.topic
                found[args.topic] = args
    return found


def test_the_commands_create_the_six_topics_as_the_service_needs_them() -> None:
    shown = _shown()
    names = {field: getattr(SETTINGS, field) for field in type(SETTINGS).__dataclass_fields__}
    topics = {v for k, v in names.items() if k.startswith("topic_") and k != "topic_partitions"}
    assert set(shown) == topics
    assert len({shown[names[field]].partitions for field in KEYED}) == 1  # one count, N
    for topic, args in shown.items():
        assert (args.replication_factor, args.configs["min.insync.replicas"]) == (3, "2"), topic
        assert int(args.configs["max.message.bytes"]) >= SETTINGS.max_record_bytes + REQUEST_ROOM
    for field in ("topic_changelog", "topic_snapshots"):
        assert shown[names[field]].configs["cleanup.policy"] == "delete"  # never compacted
    snapshots = shown[SETTINGS.topic_snapshots].configs
    assert snapshots["retention.ms"] == "-1" and int(snapshots["retention.bytes"]) > 0


@pytest.mark.kafka
def test_kafka_takes_the_topics_and_the_largest_record_the_service_sends(
    apache_kafka: KafkaBroker,
) -> None:
    servers, tag = apache_kafka.bootstrap_servers, uuid.uuid4().hex[:8]
    shown = _shown()
    ours = {topic: f"doc-{tag}-{topic}" for topic in shown}
    plain = f"doc-{tag}-broker-default"
    admin = KafkaAdminClient(bootstrap_servers=servers, **no_topic_creation(admin=True))
    try:
        new = [
            NewTopic(
                ours[topic],
                args.partitions,
                1,  # one node here
                topic_configs={**args.configs, "min.insync.replicas": "1"},
            )
            for topic, args in shown.items()
        ]
        answer = admin.create_topics([*new, NewTopic(plain, 1, 1)], raise_errors=False)
    finally:
        admin.close()
    assert all(t["error_code"] == 0 for t in answer["topics"]), answer
    # What the topics were created with, as the broker answers (Kafka refuses unknown names).
    created = {
        t["name"]: {name: entry["value"] for name, entry in t["configs"].items()}
        for t in answer["topics"]
    }
    for topic, args in shown.items():
        for name, value in args.configs.items():
            if name != "min.insync.replicas":
                assert created[ours[topic]][name] == value, (topic, name)
    assert int(created[plain]["max.message.bytes"]) < SETTINGS.max_record_bytes + REQUEST_ROOM
    key, value = b"s" * SETTINGS.max_scope_bytes, b"v" * SETTINGS.max_record_bytes
    for topic in [*ours.values(), plain]:
        # A producer of its own for each: kafka-python's idempotent producer fails every later
        # record once the broker refused one as too large.
        producer = KafkaProducer(
            bootstrap_servers=servers,
            acks="all",
            max_request_size=SETTINGS.max_record_bytes + REQUEST_ROOM,
            **no_topic_creation(),
        )
        try:
            sent = producer.send(topic, key=key, value=value, partition=0)
            if topic == plain:
                with pytest.raises(MessageSizeTooLargeError):
                    sent.get(timeout=30)
            else:
                assert sent.get(timeout=30).offset == 0, topic
        finally:
            producer.close()
