"""One way from the settings to a component's configuration (see ``purgatory.service.settings``):
a service component's by its ``from_settings``, the core's and the codec's by a ``Settings``
method."""

from __future__ import annotations

import pytest

from purgatory._codec import Limits
from purgatory._core import ConfigError
from purgatory.service.app import kafka_transport
from purgatory.service.dispatch.follow import FollowerConfig
from purgatory.service.kafka.clients import KafkaTransport
from purgatory.service.kafka.config import KafkaClientConfig
from purgatory.service.settings import Settings

ENVIRON = {
    "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": "k1:9092,k2:9092",
    "PURGATORY_KAFKA_CLIENT_ID": "replica-0",
    "PURGATORY_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
    "PURGATORY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
    "PURGATORY_KAFKA_SASL_USERNAME": "svc",
    "PURGATORY_KAFKA_SASL_PASSWORD": "hunter2-password",
    "PURGATORY_KAFKA_GROUP_INSTANCE_ID": "pod-0",
    "PURGATORY_ADVERTISED_URL": "http://pod-0:8080",
    "PURGATORY_KAFKA_LINGER_MS": "5",
    "PURGATORY_MAX_RECORD_BYTES": "2000000",
    "PURGATORY_MAX_KEY_BYTES": "64",
    "PURGATORY_DELIVERY": "transactional",
    "PURGATORY_SHUTDOWN_GRACE_MS": "2500",
    "PURGATORY_TOPIC_CHANGELOG": "journal",
    "PURGATORY_TOPIC_SNAPSHOTS": "snaps",
}


@pytest.fixture
def settings() -> Settings:
    return Settings.from_env(ENVIRON)


def test_the_kafka_clients_connect_as_the_settings_say(settings: Settings) -> None:
    config = KafkaClientConfig.from_settings(settings)
    assert config.kafka_kwargs() == {
        "bootstrap_servers": ["k1:9092", "k2:9092"],
        "client_id": "replica-0",
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "svc",
        "sasl_plain_password": "hunter2-password",
    }


def test_the_transport_takes_its_bounds_from_the_settings(settings: Settings) -> None:
    transport = KafkaTransport.from_settings(settings, read_committed=True)
    assert transport.config == KafkaClientConfig.from_settings(settings)
    assert (transport.linger_ms, transport.max_request_bytes) == (5, 2_004_096)
    assert transport.group_instance_id == "pod-0"
    assert transport.advertised_url == "http://pod-0:8080"
    assert (transport.close_timeout_ms, transport.read_committed) == (2500, True)
    assert kafka_transport(settings) == transport
    assert KafkaTransport.from_settings(settings).read_committed is False


def test_the_follower_hands_over_within_the_grace(settings: Settings) -> None:
    assert FollowerConfig.from_settings(settings) == FollowerConfig(
        changelog_topic="journal",
        snapshots_topic="snaps",
        input_topics=("purgatory.requests", "purgatory.signals"),
        grace_s=2.5,
    )
    unsnapped = Settings.from_env({"PURGATORY_SNAPSHOT_INTERVAL_MS": "0"})
    assert FollowerConfig.from_settings(unsnapped).snapshots_topic is None


def test_the_codec_limits_come_from_a_settings_method(settings: Settings) -> None:
    limits = settings.to_limits()
    assert limits == Limits(max_key_bytes=64, max_record_bytes=2_000_000)


def test_limits_the_codec_refuses_are_a_config_error() -> None:
    settings = Settings.from_env({"PURGATORY_MAX_PAYLOAD_BYTES": "0"})
    with pytest.raises(ConfigError, match=r"^record limit settings: max_payload_bytes"):
        settings.to_limits()
