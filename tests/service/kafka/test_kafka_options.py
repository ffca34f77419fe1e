"""One validator for the Kafka connection settings: each rule names the setting as its user
wrote it (the service's variable, KafkaClientConfig's field), and SSL files are read; one
builder of kafka-python's arguments from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from purgatory._core import ConfigError
from purgatory._kafka_options import (
    kafka_client_kwargs,
    kafka_connection_problems,
    service_variable,
)
from purgatory.service.kafka.config import KafkaClientConfig, no_topic_creation
from purgatory.service.settings import SecurityProtocol, Settings

SERVERS = {"bootstrap_servers": "kafka:9092"}
SASL = {"security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN"}
CREDENTIALS = {"sasl_username": "u", "sasl_password": "p"}


@pytest.fixture
def pem(tmp_path: Path) -> dict[str, str]:
    """Readable stand-ins for the three SSL files."""
    paths = {}
    for option in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        path = tmp_path / f"{option}.pem"
        path.write_text("-----BEGIN-----\n")
        paths[option] = str(path)
    return paths


@pytest.mark.parametrize(
    ("values", "problems"),
    [
        ({}, ["PURGATORY_KAFKA_BOOTSTRAP_SERVERS: required, a comma-separated list of host:port"]),
        (
            {"bootstrap_servers": "kafka:0"},
            [
                "PURGATORY_KAFKA_BOOTSTRAP_SERVERS: must be a comma-separated list of host:port"
                " (port 1 to 65535), got 'kafka:0'"
            ],
        ),
        (
            {**SERVERS, "security_protocol": "TLS", "ssl_certfile": "/c"},
            [
                "PURGATORY_KAFKA_SECURITY_PROTOCOL: must be one of PLAINTEXT, SSL,"
                " SASL_PLAINTEXT, SASL_SSL, got 'TLS'"
            ],
        ),
        (
            {**SERVERS, "security_protocol": "SASL_PLAINTEXT"},
            [
                "PURGATORY_KAFKA_SASL_MECHANISM: required when PURGATORY_KAFKA_SECURITY_PROTOCOL"
                " is SASL_PLAINTEXT (one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"
            ],
        ),
        (
            {**SERVERS, **SASL, "sasl_mechanism": "GSSAPI", **CREDENTIALS},
            [
                "PURGATORY_KAFKA_SASL_MECHANISM: must be one of PLAIN, SCRAM-SHA-256,"
                " SCRAM-SHA-512, got 'GSSAPI'"
            ],
        ),
        (
            {**SERVERS, **SASL, "sasl_password": "p"},
            ["PURGATORY_KAFKA_SASL_USERNAME: required with PURGATORY_KAFKA_SASL_MECHANISM PLAIN"],
        ),
        (
            {**SERVERS, **SASL, "sasl_username": "u", "sasl_password": ""},
            ["PURGATORY_KAFKA_SASL_PASSWORD: required with PURGATORY_KAFKA_SASL_MECHANISM PLAIN"],
        ),
        (
            {**SERVERS, "sasl_mechanism": "PLAIN", **CREDENTIALS},
            [
                "PURGATORY_KAFKA_SASL_MECHANISM: only used with SASL_PLAINTEXT or SASL_SSL, but"
                " PURGATORY_KAFKA_SECURITY_PROTOCOL is PLAINTEXT"
            ],
        ),
        (
            {**SERVERS, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "PLAIN",
             **CREDENTIALS, "ssl_cafile": "/ca.pem"},
            [
                "PURGATORY_KAFKA_SSL_CAFILE: only used with SSL or SASL_SSL, but"
                " PURGATORY_KAFKA_SECURITY_PROTOCOL is SASL_PLAINTEXT"
            ],
        ),
    ],
)  # fmt: skip
def test_each_rule_names_the_variable(values: dict[str, str], problems: list[str]) -> None:
    assert kafka_connection_problems(values) == problems


def test_a_certificate_needs_its_key_and_a_key_its_certificate(pem: dict[str, str]) -> None:
    cert_only = {**SERVERS, "security_protocol": "SSL", "ssl_certfile": pem["ssl_certfile"]}
    assert kafka_connection_problems(cert_only) == [
        "PURGATORY_KAFKA_SSL_CERTFILE: needs PURGATORY_KAFKA_SSL_KEYFILE as well"
    ]
    key_only = {**SERVERS, **SASL, **CREDENTIALS, "ssl_keyfile": pem["ssl_keyfile"]}
    assert kafka_connection_problems(key_only, name=str) == [
        "ssl_keyfile: needs ssl_certfile as well"
    ]


def test_files_must_be_readable_naming_the_variable_and_the_path(
    pem: dict[str, str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "nowhere" / "ca.pem")
    values = {**SERVERS, "security_protocol": "SSL", **pem, "ssl_cafile": missing}
    assert kafka_connection_problems(values) == [
        f"PURGATORY_KAFKA_SSL_CAFILE: must name a readable file, got {missing!r}"
        " (No such file or directory)"
    ]
    values["ssl_cafile"] = str(tmp_path)  # a directory
    [problem] = kafka_connection_problems(values)
    assert problem.startswith(
        f"PURGATORY_KAFKA_SSL_CAFILE: must name a readable file, got {str(tmp_path)!r} ("
    )
    assert kafka_connection_problems(values, check_files=False) == []


def test_consistent_settings_have_no_problem(pem: dict[str, str]) -> None:
    assert kafka_connection_problems(SERVERS) == []
    assert kafka_connection_problems({**SERVERS, "security_protocol": "SSL"}) == []
    assert kafka_connection_problems({**SERVERS, **SASL, **CREDENTIALS, **pem}) == []
    several = {"bootstrap_servers": "a:1, b:65535,[::1]:9092"}
    assert kafka_connection_problems(several) == []


def test_the_settings_use_it_reading_the_ssl_files(pem: dict[str, str]) -> None:
    environ = {service_variable(k): v for k, v in {**SASL, **CREDENTIALS, **pem}.items()}
    settings = Settings.from_env(environ)
    assert settings.kafka_ssl_keyfile == pem["ssl_keyfile"]
    # The case that passed the settings and failed at start: a certificate and no key.
    del environ["PURGATORY_KAFKA_SSL_KEYFILE"]
    environ["PURGATORY_KAFKA_SSL_CAFILE"] = "/no/such/ca.pem"
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(environ)
    assert str(caught.value).splitlines() == [
        "PURGATORY_KAFKA_SSL_CERTFILE: needs PURGATORY_KAFKA_SSL_KEYFILE as well",
        "PURGATORY_KAFKA_SSL_CAFILE: must name a readable file, got '/no/such/ca.pem'"
        " (No such file or directory)",
    ]


def test_the_client_config_names_its_fields_and_leaves_files_to_the_settings() -> None:
    with pytest.raises(ConfigError) as caught:
        KafkaClientConfig(
            bootstrap_servers="a:1", security_protocol="SSL", ssl_keyfile="/not/read.pem"
        )
    assert str(caught.value) == "ssl_keyfile: needs ssl_certfile as well"
    with pytest.raises(ConfigError, match=r"^client_id: must not be empty$"):
        KafkaClientConfig(bootstrap_servers="a:1", client_id="")
    KafkaClientConfig(bootstrap_servers="a:1", security_protocol="SSL", ssl_cafile="/not/read")


def test_the_builder_passes_what_is_set_under_kafka_pythons_names() -> None:
    assert kafka_client_kwargs({"bootstrap_servers": " a:1 , b:2,", "client_id": ""}) == {
        "bootstrap_servers": ["a:1", "b:2"]
    }
    values = {
        **SERVERS,
        **SASL,
        **CREDENTIALS,
        "security_protocol": SecurityProtocol.SASL_SSL,
        "ssl_cafile": "/ca.pem",
        "ssl_keyfile": None,
    }
    kwargs = kafka_client_kwargs(values)
    assert kwargs == {
        "bootstrap_servers": ["kafka:9092"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
        "ssl_cafile": "/ca.pem",
    }
    assert type(kwargs["security_protocol"]) is str


def test_the_builder_drops_credentials_without_a_mechanism_and_refuses_other_options() -> None:
    assert kafka_client_kwargs({**SERVERS, **CREDENTIALS}) == {"bootstrap_servers": ["kafka:9092"]}
    with pytest.raises(ValueError, match=r"^not Kafka connection options: acks, sasl_user$"):
        kafka_client_kwargs({**SERVERS, "sasl_user": "u", "acks": "all"})


def test_the_client_config_from_the_settings_connects_as_they_say(pem: dict[str, str]) -> None:
    environ = {service_variable(k): v for k, v in {**SASL, **CREDENTIALS, **pem}.items()}
    environ["PURGATORY_KAFKA_CLIENT_ID"] = "replica-0"
    config = KafkaClientConfig.from_settings(Settings.from_env(environ))
    assert config.kafka_kwargs() == {
        "bootstrap_servers": ["localhost:9092"],
        "client_id": "replica-0",
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
        **pem,
    }


@pytest.mark.parametrize(("short_lived", "backoff_ms"), [(False, 100), (True, 10)])
def test_a_client_made_for_one_read_looks_metadata_up_without_the_long_back_off(
    short_lived: bool, backoff_ms: int
) -> None:
    # kafka-python 3.0.12 waits the cluster's retry_backoff_ms before a new client's first
    # metadata lookup, and the client's own setting does not reach it: the reader's clients,
    # one per read, set it on the cluster; the long-lived clients keep kafka-python's default.
    factory = no_topic_creation(short_lived=short_lived)["kafka_client"]
    client = factory(bootstrap_servers=["127.0.0.1:1"])
    try:
        assert client.cluster.config["retry_backoff_ms"] == backoff_ms
        assert client.cluster.config["allow_auto_create_topics"] is False
    finally:
        client.close()
