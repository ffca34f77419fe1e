"""The chart's reply_to allow-list values and its Kafka security values, as the service reads
them: what the chart renders the service accepts, and what the service refuses the chart
refuses (the schema where JSON Schema can say it, the templates otherwise)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from purgatory._codec import RecordError
from purgatory._core import ConfigError
from purgatory.service.dispatch.reply_to import ReplyToPolicy
from purgatory.service.settings import Settings
from tests.helm._chart import chart, render
from tests.helm.test_values import _environment

pytestmark = pytest.mark.helm

_TLS_DIR = "/var/run/secrets/purgatory/kafka-tls/"
_SASL = {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "SCRAM-SHA-512"}
_SASL_SECRET = {"existingSecret": "kafka-user", "usernameKey": "user", "passwordKey": "pw"}


def _service_settings(values: dict[str, Any] | None, tmp_path: Path) -> Settings:
    """The settings a pod of the release starts with; the TLS files the chart mounts from a
    Secret are stand-ins written under ``tmp_path``."""
    environ = _environment(values, tmp_path)
    for name, value in environ.items():
        if value.startswith(_TLS_DIR):
            stand_in = tmp_path / value.removeprefix(_TLS_DIR)
            stand_in.write_text("-----BEGIN-----\n")
            environ[name] = str(stand_in)
    return Settings.from_env(environ)


def test_the_defaults_allow_the_prefix_and_list_no_topic(tmp_path: Path) -> None:
    settings = _service_settings(None, tmp_path)
    assert (settings.reply_to_prefix, settings.reply_to_topics) == ("purgatory.reply.", None)
    policy = ReplyToPolicy.from_settings(settings)
    policy.check("purgatory.reply.team")
    with pytest.raises(RecordError):
        policy.check("__consumer_offsets")


def test_exact_topics_and_no_prefix_reach_the_service(tmp_path: Path) -> None:
    values = {"config": {"reply_to_topics": "team.a, results", "reply_to_prefix": ""}}
    settings = _service_settings(values, tmp_path)
    assert (settings.reply_to_prefix, settings.reply_to_topics) == ("", ("team.a", "results"))
    policy = ReplyToPolicy.from_settings(settings)
    policy.check("team.a")
    with pytest.raises(RecordError):
        policy.check("purgatory.reply.team")


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"reply_to_topics": "__consumer_offsets"}, "/config/reply_to_topics"),
        ({"reply_to_topics": "ok, _schemas"}, "/config/reply_to_topics"),
        ({"reply_to_topics": "a b"}, "/config/reply_to_topics"),
        ({"reply_to_prefix": "_"}, "/config/reply_to_prefix"),
        ({"reply_to_prefix": "team/"}, "/config/reply_to_prefix"),
        ({"reply_to_prefix": None}, "missing property 'reply_to_prefix'"),
        ({"kafka_bootstrap_servers": "kafka:0"}, "/config/kafka_bootstrap_servers"),
        ({"kafka_bootstrap_servers": "kafka:65536"}, "/config/kafka_bootstrap_servers"),
        ({"kafka_bootstrap_servers": "a:9092, b:99999"}, "/config/kafka_bootstrap_servers"),
    ],
)
def test_the_schema_refuses_what_the_service_refuses(config: dict[str, Any], named: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        chart().validate_schema({"config": config})
    assert named in str(caught.value)
    environ = {f"PURGATORY_{k.upper()}": v for k, v in config.items() if v is not None}
    if environ:  # (a null setting is the chart's own concern: the service has a default)
        with pytest.raises(ConfigError):
            Settings.from_env(environ)


def test_the_highest_port_passes_both(tmp_path: Path) -> None:
    values = {"config": {"kafka_bootstrap_servers": "kafka:65535"}}
    assert _service_settings(values, tmp_path).kafka_bootstrap_servers == "kafka:65535"


# Kafka security values: (values, whether the chart and the service accept them). Refused ones
# are refused by the chart's templates with a message naming the value (tests/helm/test_render.py
# checks the messages); here, the environment the service would get says the same.
_SECURITY = {
    "ssl-system-cas": ({"config": {"kafka_security_protocol": "SSL"}}, True),
    "ssl-ca-from-a-secret": (
        {"config": {"kafka_security_protocol": "SSL"}, "kafka": {"tls": {"existingSecret": "t"}}},
        True,
    ),
    "mutual-tls": (
        {
            "config": {"kafka_security_protocol": "SSL"},
            "kafka": {"tls": {"existingSecret": "t", "certKey": "c", "keyKey": "k"}},
        },
        True,
    ),
    "sasl-ssl-mutual-tls": (
        {
            "config": _SASL,
            "kafka": {
                "sasl": _SASL_SECRET,
                "tls": {"existingSecret": "t", "certKey": "c", "keyKey": "k"},
            },
        },
        True,
    ),
    "certificate-without-key": (
        {
            "config": {"kafka_security_protocol": "SSL"},
            "kafka": {"tls": {"existingSecret": "t", "certKey": "c"}},
        },
        False,
    ),
    "key-without-certificate": (
        {
            "config": {"kafka_security_protocol": "SSL"},
            "kafka": {"tls": {"existingSecret": "t", "keyKey": "k"}},
        },
        False,
    ),
    "tls-files-without-ssl": ({"kafka": {"tls": {"existingSecret": "t"}}}, False),
    "sasl-without-mechanism": (
        {"config": {"kafka_security_protocol": "SASL_SSL"}, "kafka": {"sasl": _SASL_SECRET}},
        False,
    ),
    "mechanism-without-sasl": ({"config": {"kafka_sasl_mechanism": "PLAIN"}}, False),
}  # fmt: skip
# What the service gets for the refused ones, had the chart rendered them.
_REFUSED_ENVIRONMENTS = {
    "certificate-without-key": {"SECURITY_PROTOCOL": "SSL", "SSL_CERTFILE": "tls.crt"},
    "key-without-certificate": {"SECURITY_PROTOCOL": "SSL", "SSL_KEYFILE": "tls.key"},
    "tls-files-without-ssl": {"SSL_CAFILE": "ca.crt"},
    "sasl-without-mechanism": {
        "SECURITY_PROTOCOL": "SASL_SSL",
        "SASL_USERNAME": "u",
        "SASL_PASSWORD": "a-secret-of-at-least-16-characters",
    },
    "mechanism-without-sasl": {"SASL_MECHANISM": "PLAIN"},
}


@pytest.mark.parametrize(("values", "accepted"), _SECURITY.values(), ids=_SECURITY.keys())
def test_the_chart_and_the_service_agree_on_kafka_security(
    values: dict[str, Any], accepted: bool, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    if accepted:
        settings = _service_settings(values, tmp_path)
        assert settings.kafka_security_protocol == values["config"]["kafka_security_protocol"]
        return
    with pytest.raises((helm.HelmRenderError, helm.HelmValuesError)):
        render(values)
    case = request.node.callspec.id
    environ = {}
    for name, value in _REFUSED_ENVIRONMENTS[case].items():
        text = value
        if name.startswith("SSL_"):  # a readable file: only the rule under test may refuse
            (tmp_path / value).write_text("-----BEGIN-----\n")
            text = str(tmp_path / value)
        environ[f"PURGATORY_KAFKA_{name}"] = text
    with pytest.raises(ConfigError, match=r"^PURGATORY_KAFKA_"):
        Settings.from_env(environ)
