"""The bridge's Kafka client options follow the service's rules, named as the bridge's options
(no Spark session and no broker: the options are checked before either is reached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from purgatory._core import ConfigError
from purgatory._kafka_options import OPTIONS, kafka_connection_problems, service_variable
from spark_bridge._callbacks_source import _settings
from spark_bridge._writer import client_options, kafka_target

SERVERS = {"bootstrap_servers": "h:9092"}
CASES = {
    "sasl-without-mechanism": {"security_protocol": "SASL_SSL"},
    "mechanism-without-sasl": {
        "sasl_mechanism": "PLAIN",
        "sasl_username": "u",
        "sasl_password": "p",
    },
    "sasl-without-password": {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_username": "u",
    },
    "ssl-files-without-ssl": {"ssl_cafile": "/ca.pem"},
    "certificate-without-key": {"security_protocol": "SSL", "ssl_certfile": "CERT"},
    "missing-file": {"security_protocol": "SSL", "ssl_cafile": "/no/such/ca.pem"},
    "unknown-protocol": {"security_protocol": "ssl"},
    "bad-servers": {"bootstrap_servers": "h"},
}


def _problems_of(options: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        client_options(options)
    return str(caught.value).splitlines()


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_bridge_and_the_service_refuse_the_same_naming_their_own_options(
    case: dict[str, str], tmp_path: Path
) -> None:
    cert = tmp_path / "cert.pem"
    cert.write_text("pem")
    options = {**SERVERS, **{k: str(cert) if v == "CERT" else v for k, v in case.items()}}
    bridge = _problems_of(options)
    assert bridge and all(line.startswith("option ") for line in bridge)
    service = kafka_connection_problems(options)
    renamed = list(service)
    for option in OPTIONS:
        renamed = [line.replace(service_variable(option), f"option {option}") for line in renamed]
    assert bridge == renamed


def test_every_format_refuses_them_alike() -> None:
    options = {**SERVERS, "security_protocol": "SSL", "ssl_keyfile": "/k.pem"}
    expected = [
        "option ssl_keyfile: needs option ssl_certfile as well",
        "option ssl_keyfile: must name a readable file, got '/k.pem' (No such file or directory)",
    ]
    assert _problems_of(options) == expected
    with pytest.raises(ConfigError) as sink:
        kafka_target(options, "t")
    with pytest.raises(ConfigError) as source:
        _settings(options)
    assert str(sink.value).splitlines() == str(source.value).splitlines() == expected


def test_consistent_options_pass_through_to_kafka_python(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    options = {
        **SERVERS,
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_username": "u",
        "sasl_password": "p",
        "ssl_cafile": str(ca),
    }
    assert kafka_target(options, "t").kafka_kwargs() == {
        "bootstrap_servers": ["h:9092"],
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "u",
        "sasl_plain_password": "p",
        "ssl_cafile": str(ca),
    }
