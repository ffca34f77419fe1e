"""values.yaml and values.schema.json: every value typed and documented, bad values rejected, and
the ``config`` section one-to-one with the service's ``PURGATORY_*`` settings.

The service's settings are the reference: ``purgatory.service.settings.Settings`` knows every
variable, its type, range and default, and ``Settings.from_env`` is the parser the pods run.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

from purgatory.service.settings import Settings, env_name
from purgatory.service.settings_env import Bool
from tests.helm._chart import (
    FULLNAME,
    SCENARIOS,
    chart,
    containers,
    kind,
    load_values_file,
    manifests,
    pod_specs,
    render,
    schema,
)

pytestmark = pytest.mark.helm

# Settings the chart sets from other values, never from ``config``: secrets come from existing
# Secrets as *_FILE, TLS paths from the mounted Secret, partitions from the pod's ordinal.
MANAGED = {
    "api_token",
    "api_tokens",
    "allow_unauthenticated",
    "kafka_sasl_password",
    "kafka_ssl_cafile",
    "kafka_ssl_certfile",
    "kafka_ssl_keyfile",
    "kafka_static_partitions",
    "peer_urls",
    "replica_ordinal",
    "advertised_url",
    "kafka_group_instance_id",
}
# Defaults the chart changes on purpose: to listen beyond loopback, to find a Kafka Service, and
# to refuse operations (429) before the memory limit kills the pod with all its state.
CHART_DEFAULTS = {
    "http_host": "0.0.0.0",
    "kafka_bootstrap_servers": "kafka:9092",
    "max_pending": 500_000,
    "max_pending_per_scope": 100_000,  # the service's tenth of max_pending, and at most it
    # The chart runs against the users' Apache Kafka: exactly once. The service's own default
    # (acknowledged) is the one every broker can do, the embedded development broker included.
    "delivery": "transactional",
}
# Memory a pending operation takes, engine and service included: 902 B measured with 1M pending
# (README, performance), rounded up.
BYTES_PER_PENDING = 1024
_QUANTITY = re.compile(r"([0-9]+)(Ki|Mi|Gi|Ti|k|M|G|T)?")
_UNITS = {None: 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_UNITS.update({"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40})
# Objects handed to the pod spec as they are: Kubernetes validates them, not this schema.
PASS_THROUGH = {
    "affinity.nodeAffinity",
    "affinity.podAffinity",
    "affinity.podAntiAffinity",
}
SETTINGS = {f.name: f for f in dataclasses.fields(Settings)}


def _walk(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from _walk(child, f"{path}.{name}" if path else name)
    for key in ("items", "additionalProperties"):
        child = node.get(key)
        if isinstance(child, dict):
            yield from _walk(child, f"{path}[]" if key == "items" else f"{path}.*")
    for i, child in enumerate(node.get("anyOf", [])):
        yield from _walk(child, f"{path}|{i}")


def test_every_value_is_typed_and_described() -> None:
    for path, node in _walk(schema(), ""):
        if not path or path.endswith((".*", "[]")) or "|" in path.rpartition(".")[2]:
            continue
        assert node.get("description", "").strip(), f"{path} has no description"
        assert "type" in node or "anyOf" in node or "enum" in node, f"{path} has no type"


def test_every_object_rejects_unknown_keys() -> None:
    for path, node in _walk(schema(), ""):
        types = node.get("type")
        if types != "object" and not (isinstance(types, list) and "object" in types):
            continue
        if path in PASS_THROUGH:
            continue
        extra = node.get("additionalProperties")
        assert extra is False or isinstance(extra, dict), f"{path} accepts unknown keys"
        if "properties" in node:
            assert extra is False, f"{path} has properties and accepts others"


def _leaves(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        yield path
        if isinstance(value, dict) and value and path not in _MAPS:
            yield from _leaves(value, path + ".")


_MAPS = {"resources.requests", "resources.limits", "grafanaDashboard.labels"}


def test_values_yaml_shows_every_value_of_the_schema() -> None:
    declared = {path for path, _ in _walk(schema(), "") if path and not _is_nested_item(path)}
    shown = set(_leaves(load_values_file()))
    assert declared - shown - PASS_THROUGH == set()
    assert shown - declared == set()


def _is_nested_item(path: str) -> bool:
    return any(mark in path for mark in ("[]", ".*", "|"))


def test_the_defaults_pass_the_schema() -> None:
    chart().validate_schema(None)
    chart().validate_schema(load_values_file())


def test_config_is_one_to_one_with_the_service_settings() -> None:
    config = schema()["properties"]["config"]["properties"]
    assert set(config) == set(SETTINGS) - MANAGED
    assert not MANAGED & set(load_values_file()["config"])
    for name, node in config.items():
        assert node["description"].startswith(env_name(name) + ": "), name


def test_config_defaults_are_the_service_defaults() -> None:
    shown = load_values_file()["config"]
    assert set(shown) == set(SETTINGS) - MANAGED
    defaults = Settings()
    for name, value in shown.items():
        expected = CHART_DEFAULTS.get(name, getattr(defaults, name))
        if expected is not None and not isinstance(expected, int | str):
            expected = str(expected)
        assert value == expected, name


def _bytes(quantity: str) -> int:
    match = _QUANTITY.fullmatch(quantity)
    assert match, quantity
    return int(match[1]) * _UNITS[match[2]]


def test_max_pending_fits_in_the_memory_limit() -> None:
    # State is in memory: a replica that fills past its limit is OOM-killed and loses every
    # pending operation, so the limit refuses registrations (429, PendingNearLimit) long before.
    values = load_values_file()
    limit = _bytes(values["resources"]["limits"]["memory"])
    assert values["config"]["max_pending"] * BYTES_PER_PENDING <= limit // 2
    assert Settings().max_pending * BYTES_PER_PENDING > limit  # why the chart lowers it
    (config,) = [c for c in kind(manifests(None), "ConfigMap") if c["metadata"]["name"] == FULLNAME]
    assert config["data"]["PURGATORY_MAX_PENDING"] == str(values["config"]["max_pending"])


def test_config_types_and_ranges_are_the_service_ones() -> None:
    config = schema()["properties"]["config"]["properties"]
    for name, node in config.items():
        spec = SETTINGS[name].metadata["spec"]
        kind_ = spec.kind
        types = node["type"] if isinstance(node["type"], list) else [node["type"]]
        assert ("null" in types) == spec.optional, name
        if hasattr(kind_, "minimum"):
            assert types[0] == "integer", name
            assert (node["minimum"], node["maximum"]) == (kind_.minimum, kind_.maximum), name
        elif hasattr(kind_, "kind"):  # a choice
            choices = [member.value for member in kind_.kind]
            assert [c for c in node["enum"] if c is not None] == choices, name
        elif isinstance(kind_, Bool):
            assert types[0] == "boolean", name
        else:
            assert types[0] == "string", name


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"replicaCount": -1}, "/replicaCount"),
        ({"replicaCount": "3"}, "/replicaCount"),
        ({"replicaCount": 1.5}, "/replicaCount"),
        ({"replicas": 3}, "'replicas'"),
        ({"image": {"tags": "1.0"}}, "'tags'"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"partitionAssignment": {"mode": "static"}}, "/partitionAssignment/mode"),
        ({"config": {"max_pendin": 10}}, "'max_pendin'"),
        ({"config": {"max_pending": 0}}, "/config/max_pending"),
        ({"config": {"max_pending": "lots"}}, "/config/max_pending"),
        ({"config": {"http_port": 70000}}, "/config/http_port"),
        ({"config": {"log_level": "loud"}}, "/config/log_level"),
        ({"config": {"kafka_security_protocol": "TLS"}}, "/config/kafka_security_protocol"),
        ({"config": {"topic_signals": "signals topic"}}, "/config/topic_signals"),
        ({"config": {"kafka_bootstrap_servers": "kafka"}}, "/config/kafka_bootstrap_servers"),
        ({"config": {"tick_ms": None}}, "missing property 'tick_ms'"),
        ({"config": {"api_token": "s3cr3t-s3cr3t-s3cr3t"}}, "'api_token'"),
        ({"config": {"kafka_sasl_password": "hunter2"}}, "'kafka_sasl_password'"),
        ({"kafka": {"sasl": {"password": "hunter2"}}}, "'password'"),
        ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
        ({"resources": {"limits": {"memory": "lots"}}}, "/resources/limits/memory"),
        ({"lifecycle": {"preStopSleepSeconds": -1}}, "/lifecycle/preStopSleepSeconds"),
        ({"lifecycle": {"preStopSleepSeconds": "5"}}, "/lifecycle/preStopSleepSeconds"),
        ({"lifecycle": {"preStopSleepSeconds": 2.5}}, "/lifecycle/preStopSleepSeconds"),
        ({"lifecycle": {"postStart": {}}}, "'postStart'"),
        ({"podDisruptionBudget": {"maxUnavailable": "half"}}, "/podDisruptionBudget"),
        ({"serviceMonitor": {"enabled": "yes"}}, "/serviceMonitor/enabled"),
        ({"serviceMonitor": {"interval": "soon"}}, "/serviceMonitor/interval"),
        ({"prometheusRule": {"thresholds": {"pendingRatio": 2}}}, "pendingRatio"),
        ({"prometheusRule": {"thresholds": {"memoryFraction": 1.5}}}, "memoryFraction"),
        ({"prometheusRule": {"thresholds": {"memoryFraction": 0}}}, "memoryFraction"),
        ({"prometheusRule": {"thresholds": {"memoryFraction": "80%"}}}, "memoryFraction"),
        ({"prometheusRule": {"thresholds": {"snapshotAgeIntervals": 0}}}, "snapshotAgeIntervals"),
        ({"prometheusRule": {"thresholds": {"snapshotterRestarts": 1.5}}}, "snapshotterRestarts"),
        ({"prometheusRule": {"thresholds": {"partitionFences": -1}}}, "partitionFences"),
        ({"prometheusRule": {"thresholds": {"partitionFences": "3"}}}, "partitionFences"),
        ({"topologySpreadConstraints": [{"maxSkew": 1}]}, "/topologySpreadConstraints/0"),
        ({"networkPolicy": {"egress": {"kafkaPorts": [0]}}}, "/networkPolicy/egress/kafkaPorts"),
        ({"podAnnotations": {"a": 1}}, "/podAnnotations/a"),
    ],
)
def test_the_schema_rejects_bad_values_naming_them(values: dict[str, Any], named: str) -> None:
    with pytest.raises(helm.HelmValuesError) as caught:
        chart().validate_schema(values)
    assert named in str(caught.value)
    with pytest.raises(helm.HelmValuesError):  # an install renders nothing with them
        render(values)


def test_replicas_may_be_zero() -> None:
    chart().validate_schema({"replicaCount": 0})


def _environment(values: dict[str, Any] | None, secrets: Path) -> dict[str, str]:
    """What the service process sees in the pod: the ConfigMap, env and the ordinal's partitions.

    Secret values (env from secretKeyRef, *_FILE files) are stand-ins written under ``secrets``.
    """
    objects = manifests(values)
    configmaps = {c["metadata"]["name"]: c.get("data") or {} for c in kind(objects, "ConfigMap")}
    ((_, spec),) = [s for s in pod_specs(objects) if not s[0].startswith("Pod/")]
    (container,) = containers(spec)
    environ: dict[str, str] = {}
    for source in container.get("envFrom", []):
        environ.update(configmaps[source["configMapRef"]["name"]])
    for item in container.get("env", []):
        if "fieldRef" in item.get("valueFrom", {}):
            environ[item["name"]] = "10.1.2.3"  # the downward API's stand-in (the pod IP)
        elif "value" not in item:
            environ[item["name"]] = "from-a-secret"
        elif item["name"].endswith("_FILE"):
            stand_in = secrets / item["name"]
            stand_in.write_text("a-secret-of-at-least-16-characters\n")
            environ[item["name"]] = str(stand_in)
        else:
            environ[item["name"]] = item["value"]
    for name in ("CAFILE", "CERTFILE", "KEYFILE"):  # mounted from the TLS Secret in the pod
        variable = f"PURGATORY_KAFKA_SSL_{name}"
        if variable in environ:
            assert environ[variable].startswith("/var/run/secrets/purgatory/kafka-tls/")
            stand_in = secrets / variable
            stand_in.write_text("-----BEGIN CERTIFICATE-----\n")
            environ[variable] = str(stand_in)
    for name, value in environ.items():  # Kubernetes expands $(NAME) of earlier entries
        expanded = value
        for ref, seen in environ.items():
            expanded = expanded.replace(f"$({ref})", seen)
        environ[name] = expanded
    if "command" in container:
        partitions = configmaps.get(f"{FULLNAME}-partitions", {})
        if partitions:
            environ["PURGATORY_KAFKA_STATIC_PARTITIONS"] = partitions["0"]
    return environ


@pytest.mark.parametrize("values", SCENARIOS.values(), ids=SCENARIOS.keys())
def test_every_variable_the_chart_sets_is_a_setting_the_service_accepts(
    values: dict[str, Any] | None, tmp_path: Path
) -> None:
    environ = _environment(values, tmp_path)
    known = set(Settings.env_names())
    ours = {name for name in environ if name.startswith("PURGATORY_")}
    assert ours <= known, ours - known
    assert set(environ) - ours <= {"POD_IP"}  # the only other variable: for the URL below
    objects = manifests(values)
    for _, spec in pod_specs(objects):
        for container in containers(spec):
            script = " ".join(container.get("command", []) + container.get("args", []))
            for word in script.replace("=", " ").replace('"', " ").split():
                if word.startswith("PURGATORY_"):
                    assert word in known, word
    # The service parses the whole environment the pod gets (a typo or bad value would raise).
    settings = Settings.from_env(environ)
    assert settings.http_host == "0.0.0.0"
    given = values or {}
    ordinal = given.get("partitionAssignment", {}).get("mode") == "ordinal"
    if ordinal and given["replicaCount"]:
        assert settings.kafka_static_partitions is not None
    if not ordinal:  # group mode: the group shares each member's address, the pod's IP
        assert settings.advertised_url == f"http://10.1.2.3:{settings.http_port}"


def test_config_values_reach_the_service_unchanged(tmp_path: Path) -> None:
    values = {
        "config": {
            "max_pending": 12_345_678,
            "max_deadline_ahead_ms": 253_402_300_799_999,
            "log_level": "debug",
            "kafka_bootstrap_servers": "b-1.kafka:9092,b-2.kafka:9092",
        }
    }
    settings = Settings.from_env(_environment(values, tmp_path))
    assert settings.max_pending == 12_345_678  # not 1.2345678e+07: Helm's numbers are floats
    assert settings.max_deadline_ahead_ms == 253_402_300_799_999
    assert settings.log_level.value == "debug"
    assert settings.kafka_bootstrap_servers == "b-1.kafka:9092,b-2.kafka:9092"
