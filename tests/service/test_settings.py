"""Settings from the environment: types, ranges, secrets, typos, cross-field rules, the engine."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from purgatory._core import ConfigError, EngineConfig
from purgatory.service.settings import (
    LogFormat,
    LogLevel,
    SaslMechanism,
    SecurityProtocol,
    Settings,
    _Bool,
    env_name,
)

TOKEN = "t0ken-with-enough-characters"
SASL = {
    "PURGATORY_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
    "PURGATORY_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
    "PURGATORY_KAFKA_SASL_USERNAME": "svc",
    "PURGATORY_KAFKA_SASL_PASSWORD": "hunter2-password",
}


def error_of(environ: dict[str, str], **overrides: object) -> str:
    with pytest.raises(ConfigError) as caught:
        Settings.from_env(environ, **overrides)
    return str(caught.value)


def test_defaults_are_the_documented_ones() -> None:
    s = Settings.from_env({})
    assert s == Settings()
    assert (s.http_host, s.http_port) == ("127.0.0.1", 8080)
    assert s.kafka_bootstrap_servers == "localhost:9092"
    assert s.kafka_security_protocol is SecurityProtocol.PLAINTEXT
    assert s.kafka_sasl_mechanism is None and s.kafka_static_partitions is None
    assert s.topic_dead_letters == "purgatory.dead-letters"
    assert s.max_deadline_ahead_ms == 366 * 86_400_000
    assert s.signal_ttl_ms == 7 * 86_400_000 and s.outcome_ttl_ms == 86_400_000
    assert (s.max_pending, s.max_pending_per_scope) == (10_000_000, 1_000_000)
    assert s.api_token is None
    assert (s.log_level, s.log_format) == (LogLevel.INFO, LogFormat.JSON)


def test_every_field_has_a_variable_and_help() -> None:
    names = Settings.env_names()
    assert len(names) == len(set(names))
    for f in dataclasses.fields(Settings):
        assert env_name(f.name) == "PURGATORY_" + f.name.upper() in names
        assert f.metadata["spec"].help.strip()
    assert "PURGATORY_API_TOKEN_FILE" in names
    assert "PURGATORY_KAFKA_SASL_PASSWORD_FILE" in names
    assert [row[0] for row in Settings.describe()] == names
    assert all(re.fullmatch(r"PURGATORY_[A-Z0-9_]+", name) for name in names)


def test_described_defaults_read_back_as_the_defaults() -> None:
    environ = {name: default for name, default, _ in Settings.describe() if default}
    assert Settings.from_env(environ) == Settings()


def test_values_are_parsed_by_type() -> None:
    s = Settings.from_env(
        {
            "PURGATORY_HTTP_PORT": " 9000 ",
            "PURGATORY_KAFKA_BOOTSTRAP_SERVERS": " k1:9092, [::1]:9093 ",
            "PURGATORY_KAFKA_STATIC_PARTITIONS": "3, 1,2",
            "PURGATORY_LOG_LEVEL": "DEBUG",
            "PURGATORY_LOG_FORMAT": "console",
            "PURGATORY_API_TOKEN": TOKEN,
            **SASL,
        }
    )
    assert s.http_port == 9000
    assert s.kafka_bootstrap_servers == "k1:9092,[::1]:9093"
    assert s.kafka_static_partitions == (3, 1, 2)
    assert s.log_level is LogLevel.DEBUG and s.log_format is LogFormat.CONSOLE
    assert s.kafka_security_protocol is SecurityProtocol.SASL_SSL
    assert s.kafka_sasl_mechanism is SaslMechanism.SCRAM_SHA_512
    assert s.api_token == TOKEN


def test_bool_form() -> None:
    kind = _Bool()
    for text, value in [("true", True), ("YES", True), ("1", True), ("False", False)]:
        assert kind.parse(text) is value
    for text in ["no", "0"]:
        assert kind.parse(text) is False
    with pytest.raises(LookupError):
        kind.parse("maybe")
    assert kind.format(True) == "true"


def test_a_bad_value_names_the_variable_and_the_expected_form() -> None:
    assert error_of({"PURGATORY_HTTP_PORT": "abc"}) == (
        "PURGATORY_HTTP_PORT: must be an integer between 1 and 65535, got 'abc'"
    )
    assert error_of({"PURGATORY_HTTP_PORT": "0"}) == (
        "PURGATORY_HTTP_PORT: must be an integer between 1 and 65535, got '0'"
    )
    assert error_of({"PURGATORY_KAFKA_SECURITY_PROTOCOL": "TLS"}) == (
        "PURGATORY_KAFKA_SECURITY_PROTOCOL: must be one of PLAINTEXT, SSL, SASL_PLAINTEXT,"
        " SASL_SSL, got 'TLS'"
    )
    assert "PURGATORY_KAFKA_STATIC_PARTITIONS: must be a comma-separated list" in error_of(
        {"PURGATORY_KAFKA_STATIC_PARTITIONS": "1,1"}
    )
    assert "PURGATORY_TOPIC_SIGNALS: must be a Kafka topic name" in error_of(
        {"PURGATORY_TOPIC_SIGNALS": "bad topic"}
    )
    for servers in ("k1:9092,,k2:9092", "k1:99999", "k1", "k1:9092,"):
        assert error_of({"PURGATORY_KAFKA_BOOTSTRAP_SERVERS": servers}) == (
            "PURGATORY_KAFKA_BOOTSTRAP_SERVERS: must be a comma-separated list of host:port,"
            f" got {servers!r}"
        )


@given(st.integers(min_value=-(10**6), max_value=10**6))
def test_integers_are_accepted_exactly_in_range(port: int) -> None:
    environ = {"PURGATORY_HTTP_PORT": str(port)}
    if 1 <= port <= 65535:
        assert Settings.from_env(environ).http_port == port
    else:
        with pytest.raises(ConfigError, match=r"^PURGATORY_HTTP_PORT: "):
            Settings.from_env(environ)


def test_every_problem_is_reported_at_once() -> None:
    lines = error_of(
        {"PURGATORY_HTTP_PORT": "x", "PURGATORY_TICK_MS": "-1", "PURGATORY_WHEEL_SIZEE": "8"}
    ).splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "PURGATORY_WHEEL_SIZEE",
        "PURGATORY_HTTP_PORT",
        "PURGATORY_TICK_MS",
    ]


def test_unknown_variables_are_errors_with_a_suggestion() -> None:
    message = error_of({"PURGATORY_HTP_PORT": "8080", "PURGATORY_NONSENSE": "1", "HOME": "/"})
    assert message.splitlines() == [
        "PURGATORY_HTP_PORT: unknown setting (did you mean PURGATORY_HTTP_PORT?)",
        "PURGATORY_NONSENSE: unknown setting",
    ]
    assert "PURGATORY_HTTP_PORT_FILE: unknown setting" in error_of(
        {"PURGATORY_HTTP_PORT_FILE": "/port"}
    )


def test_kubernetes_service_links_are_not_typos() -> None:
    links = {
        "PURGATORY_SERVICE_HOST": "10.0.0.7",
        "PURGATORY_SERVICE_PORT": "8080",
        "PURGATORY_SERVICE_PORT_HTTP": "8080",
        "PURGATORY_PORT": "tcp://10.0.0.7:8080",
        "PURGATORY_PORT_8080_TCP": "tcp://10.0.0.7:8080",
        "PURGATORY_PORT_8080_TCP_PROTO": "tcp",
        "PURGATORY_PORT_8080_TCP_PORT": "8080",
        "PURGATORY_PORT_8080_TCP_ADDR": "10.0.0.7",
        "PURGATORY_HEADLESS_SERVICE_HOST": "10.0.0.8",
    }
    assert Settings.from_env(links) == Settings()
    # A link that collides with a setting is still an error, with a hint.
    assert "enableServiceLinks" in error_of({"PURGATORY_HTTP_PORT": "tcp://10.0.0.7:8080"})


def test_empty_means_unset_for_optional_settings_only() -> None:
    s = Settings.from_env({"PURGATORY_KAFKA_STATIC_PARTITIONS": "", "PURGATORY_API_TOKEN": ""})
    assert s.kafka_static_partitions is None and s.api_token is None
    assert error_of({"PURGATORY_KAFKA_CLIENT_ID": ""}).startswith("PURGATORY_KAFKA_CLIENT_ID: ")


def test_secrets_come_from_files(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    password_file = tmp_path / "password"
    password_file.write_text("p4ss word\n")
    environ = {**SASL, "PURGATORY_API_TOKEN_FILE": str(token_file)}
    del environ["PURGATORY_KAFKA_SASL_PASSWORD"]
    environ["PURGATORY_KAFKA_SASL_PASSWORD_FILE"] = str(password_file)
    s = Settings.from_env(environ)
    assert s.api_token == TOKEN
    assert s.kafka_sasl_password == "p4ss word"


def test_secret_file_errors(tmp_path: Path) -> None:
    both = {"PURGATORY_API_TOKEN": TOKEN, "PURGATORY_API_TOKEN_FILE": str(tmp_path / "t")}
    assert error_of(both) == (
        "PURGATORY_API_TOKEN: set either PURGATORY_API_TOKEN or PURGATORY_API_TOKEN_FILE, not both"
    )
    missing = error_of({"PURGATORY_API_TOKEN_FILE": str(tmp_path / "absent")})
    assert missing.startswith("PURGATORY_API_TOKEN_FILE: must name a readable UTF-8 file")


def test_secrets_never_show() -> None:
    s = Settings.from_env({**SASL, "PURGATORY_API_TOKEN": TOKEN})
    for text in (repr(s), str(s)):
        assert TOKEN not in text and "hunter2" not in text
        assert "api_token=<redacted>" in text and "kafka_sasl_username='svc'" in text
    assert "api_token=None" in repr(Settings())
    bad = error_of({"PURGATORY_API_TOKEN": "short secret"})
    assert "short secret" not in bad and bad.endswith("got <redacted>")
    with pytest.raises(ConfigError) as caught:
        Settings(api_token="tiny")
    assert "tiny" not in str(caught.value)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"PURGATORY_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT"},
            "PURGATORY_KAFKA_SASL_MECHANISM: required when PURGATORY_KAFKA_SECURITY_PROTOCOL is"
            " SASL_PLAINTEXT (one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
        ),
        (
            {**SASL, "PURGATORY_KAFKA_SASL_USERNAME": ""},
            "PURGATORY_KAFKA_SASL_USERNAME: required with PURGATORY_KAFKA_SASL_MECHANISM"
            " SCRAM-SHA-512",
        ),
        (
            {**SASL, "PURGATORY_KAFKA_SECURITY_PROTOCOL": "SSL"},
            "PURGATORY_KAFKA_SASL_MECHANISM: only used with SASL_PLAINTEXT or SASL_SSL, but"
            " PURGATORY_KAFKA_SECURITY_PROTOCOL is SSL",
        ),
        (
            {"PURGATORY_KAFKA_SSL_CAFILE": "/ca.pem"},
            "PURGATORY_KAFKA_SSL_CAFILE: only used with SSL or SASL_SSL, but"
            " PURGATORY_KAFKA_SECURITY_PROTOCOL is PLAINTEXT",
        ),
        (
            {"PURGATORY_KAFKA_SECURITY_PROTOCOL": "SSL", "PURGATORY_KAFKA_SSL_KEYFILE": __file__},
            "PURGATORY_KAFKA_SSL_KEYFILE: needs PURGATORY_KAFKA_SSL_CERTFILE as well",
        ),
        (
            {"PURGATORY_TOPIC_CHANGELOG": "purgatory.signals"},
            "PURGATORY_TOPIC_CHANGELOG: must differ from PURGATORY_TOPIC_SIGNALS, both are"
            " 'purgatory.signals'",
        ),
        (
            {"PURGATORY_MAX_PENDING": "10", "PURGATORY_MAX_PENDING_PER_SCOPE": "11"},
            "PURGATORY_MAX_PENDING_PER_SCOPE: must not exceed PURGATORY_MAX_PENDING (10), got 11",
        ),
        (
            {
                "PURGATORY_MAX_PAYLOAD_BYTES": "2048",
                "PURGATORY_MAX_RECORD_BYTES": "2048",
                "PURGATORY_MAX_SIGNAL_BYTES_PER_OPERATION": "1024",
            },
            "PURGATORY_MAX_PAYLOAD_BYTES: must be less than PURGATORY_MAX_RECORD_BYTES (2048),"
            " got 2048",
        ),
        (
            {"PURGATORY_MAX_RECORD_BYTES": "4096", "PURGATORY_MAX_PAYLOAD_BYTES": "1024"},
            "PURGATORY_MAX_SIGNAL_BYTES_PER_OPERATION: must be less than"
            " PURGATORY_MAX_RECORD_BYTES (4096), got 524288",
        ),
    ],
)
def test_cross_field_rules(environ: dict[str, str], message: str) -> None:
    assert error_of(environ) == message


def test_plain_sasl_and_mutual_tls_pass(tmp_path: Path) -> None:
    files = {}
    for name in ("ca", "crt", "key"):  # the files must exist and be readable
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text("-----BEGIN-----\n")
    s = Settings.from_env(
        {
            **SASL,
            "PURGATORY_KAFKA_SASL_MECHANISM": "PLAIN",
            "PURGATORY_KAFKA_SSL_CAFILE": str(files["ca"]),
            "PURGATORY_KAFKA_SSL_CERTFILE": str(files["crt"]),
            "PURGATORY_KAFKA_SSL_KEYFILE": str(files["key"]),
        }
    )
    assert s.kafka_sasl_mechanism is SaslMechanism.PLAIN
    assert s.kafka_ssl_keyfile == str(files["key"])


def test_overrides_win_and_are_validated() -> None:
    s = Settings.from_env(
        {"PURGATORY_HTTP_PORT": "not even read", "PURGATORY_LOG_LEVEL": "error"},
        http_port=9100,
        kafka_bootstrap_servers="127.0.0.1:39092, 127.0.0.1:39093",
        log_format="console",
    )
    assert s.http_port == 9100 and s.log_level is LogLevel.ERROR
    assert s.kafka_bootstrap_servers == "127.0.0.1:39092,127.0.0.1:39093"
    assert s.log_format is LogFormat.CONSOLE
    assert error_of({}, http_prot=1) == "unknown setting override 'http_prot'"
    assert error_of({}, http_port=True).startswith("PURGATORY_HTTP_PORT: must be an integer")
    assert error_of({}, max_batch="10").startswith("PURGATORY_MAX_BATCH: must be an integer")


def test_settings_are_frozen_and_slotted() -> None:
    s = Settings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.http_port = 1  # type: ignore[misc]
    assert not hasattr(s, "__dict__")
    assert dataclasses.replace(s, http_port=1).http_port == 1
    with pytest.raises(ConfigError):
        dataclasses.replace(s, http_port=-1)


def test_engine_config() -> None:
    s = Settings.from_env(
        {
            "PURGATORY_TICK_MS": "5",
            "PURGATORY_WHEEL_SIZE": "64",
            "PURGATORY_PURGE_INTERVAL": "0",
            "PURGATORY_SIGNAL_TTL_MS": "60000",
            "PURGATORY_OUTCOME_TTL_MS": "1000",
            "PURGATORY_MAX_FIRE_PER_STEP": "7",
            "PURGATORY_MAX_PENDING": "100",
            "PURGATORY_MAX_PENDING_PER_SCOPE": "10",
        }
    )
    config = s.to_engine_config()
    assert isinstance(config, EngineConfig)
    assert (config.tick_ms, config.wheel_size, config.purge_interval) == (5, 64, 0)
    assert config.signal_ttl.ttl_ms == 60_000 and config.outcome_ttl_ms == 1000
    assert (config.max_fire_per_step, config.max_pending, config.max_pending_per_scope) == (
        7,
        100,
        10,
    )
    assert Settings().to_engine_config() == EngineConfig()


ENGINE_FIELDS = (
    "tick_ms",
    "wheel_size",
    "purge_interval",
    "signal_ttl_ms",
    "outcome_ttl_ms",
    "max_fire_per_step",
    "max_pending",
    "max_pending_per_scope",
)


@pytest.mark.parametrize("end", ["minimum", "maximum"])
def test_every_accepted_value_fits_the_engine(end: str) -> None:
    """The engine's own checks never reject what the settings accepted."""
    kinds = {f.name: f.metadata["spec"].kind for f in dataclasses.fields(Settings)}
    values = {name: getattr(kinds[name], end) for name in ENGINE_FIELDS}
    Settings(**values).to_engine_config()
