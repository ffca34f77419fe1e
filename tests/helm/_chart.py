"""Rendering the chart with the real Helm SDK, and reading what it renders.

``helm_python`` (PyPI ``helm-python-sdk``) binds Helm's own Go SDK through a native library
shipped inside its wheel, so rendering, schema validation and lint here are Helm's, offline.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

__all__ = [
    "CHART_DIR",
    "FULLNAME",
    "NAMESPACE",
    "RELEASE",
    "SCENARIOS",
    "chart",
    "containers",
    "kind",
    "load_objects",
    "load_values_file",
    "manifests",
    "pod_specs",
    "render",
    "schema",
]

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "purgatory"
RELEASE = "rel"
NAMESPACE = "pipelines"
FULLNAME = f"{RELEASE}-purgatory"

_SASL_SSL = {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "SCRAM-SHA-512"}
_KAFKA_SECRETS = {
    "sasl": {"existingSecret": "kafka-user", "usernameKey": "user", "passwordKey": "pw"},
    "tls": {"existingSecret": "kafka-tls", "certKey": "tls.crt", "keyKey": "tls.key"},
}

# One scenario per optional feature, plus one with everything on: name -> values.
SCENARIOS: dict[str, dict[str, Any] | None] = {
    "defaults": None,
    "ordinal": {"partitionAssignment": {"mode": "ordinal", "partitions": 8}, "replicaCount": 3},
    "ordinal-scaled-to-zero": {"partitionAssignment": {"mode": "ordinal"}, "replicaCount": 0},
    "group-scaled-out": {"replicaCount": 4, "podDisruptionBudget": {"minAvailable": "50%"}},
    "kafka-sasl-tls": {"config": _SASL_SSL, "kafka": _KAFKA_SECRETS},
    "kafka-sasl-plain-username": {
        "config": {
            "kafka_security_protocol": "SASL_PLAINTEXT",
            "kafka_sasl_mechanism": "PLAIN",
            "kafka_sasl_username": "purgatory",
        },
        "kafka": {"sasl": {"existingSecret": "kafka-user", "usernameKey": ""}},
    },
    "api-token": {"apiToken": {"existingSecret": "purgatory-api", "key": "bearer"}},
    "service-monitor": {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}},
    "prometheus-rule": {"prometheusRule": {"enabled": True, "alertLabels": {"team": "data"}}},
    "network-policy": {
        "networkPolicy": {
            "enabled": True,
            "ingress": {
                "from": [{"podSelector": {"matchLabels": {"role": "spark-driver"}}}],
                "metricsFrom": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "mon"}}}
                ],
            },
            "egress": {
                "kafkaTo": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
                "extraRules": [{"ports": [{"port": 443, "protocol": "TCP"}]}],
            },
        }
    },
    "grafana-dashboard": {
        "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Pipelines"}}
    },
    "platform-chosen-ids": {
        "securityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None},
        "image": {"digest": "sha256:" + "ab" * 32},
        "serviceAccount": {"create": False},
    },
}
SCENARIOS["everything"] = {
    "replicaCount": 2,
    "partitionAssignment": {"mode": "ordinal", "partitions": 6},
    "config": _SASL_SSL,
    "kafka": _KAFKA_SECRETS,
    **{
        key: value
        for name in (
            "api-token",
            "service-monitor",
            "prometheus-rule",
            "network-policy",
            "grafana-dashboard",
        )
        for key, value in (SCENARIOS[name] or {}).items()
    },
}


@functools.cache
def chart() -> helm.Chart:
    """The chart, loaded once per test process (a handle into Helm's native library)."""
    return helm.Chart.load(CHART_DIR)


def schema() -> dict[str, Any]:
    """``values.schema.json`` as a dictionary."""
    loaded: dict[str, Any] = json.loads((CHART_DIR / "values.schema.json").read_text())
    return loaded


def load_values_file() -> dict[str, Any]:
    """``values.yaml`` as a dictionary."""
    loaded: dict[str, Any] = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    return loaded


@functools.cache
def _render_json(values_json: str) -> str:
    values = json.loads(values_json)
    rendered = chart().render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return json.dumps(rendered)


def render(values: Mapping[str, Any] | None) -> dict[str, str]:
    """Render like ``helm install``: template path -> rendered text (NOTES.txt included).

    Raises:
        helm_python.HelmValuesError: values the schema rejects.
        helm_python.HelmRenderError: a template failed (``fail`` with its message).
    """
    rendered: dict[str, str] = json.loads(_render_json(json.dumps(values, sort_keys=True)))
    return rendered


def _repeated_keys(node: Any, where: str = "") -> Iterator[str]:
    """Paths of the keys that a YAML node's mappings repeat.

    PyYAML keeps the last of two equal keys silently, while the API server may keep either or
    refuse the object: a rendered manifest must never repeat a key.
    """
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            path = f"{where}.{key.value}"
            if key.value in seen:
                yield path
            seen.add(key.value)
            yield from _repeated_keys(value, path)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            yield from _repeated_keys(item, f"{where}[{i}]")


def manifests(values: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """Every Kubernetes object rendered, in template order.

    Raises:
        ValueError: a mapping of a rendered manifest repeats a key.
    """
    found: list[dict[str, Any]] = []
    for path, text in sorted(render(values).items()):
        if path.endswith(".yaml"):
            found.extend(load_objects(text, path))
    return found


def load_objects(text: str, source: str) -> list[dict[str, Any]]:
    """The YAML documents of ``text`` (empty ones left out), read from ``source``.

    Raises:
        ValueError: a mapping repeats a key.
    """
    for node in yaml.compose_all(text, Loader=yaml.SafeLoader):
        repeated = list(_repeated_keys(node))
        if repeated:
            raise ValueError(f"{source} repeats {', '.join(repeated)}")
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kind(objects: list[dict[str, Any]], wanted: str) -> list[dict[str, Any]]:
    """The objects of one kind."""
    return [obj for obj in objects if obj["kind"] == wanted]


def pod_specs(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(kind/name, pod spec)`` of every workload and bare pod."""
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in ("Deployment", "StatefulSet"):
            yield name, obj["spec"]["template"]["spec"]
        elif obj["kind"] == "Pod":
            yield name, obj["spec"]


def containers(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every container of a pod spec, init containers included."""
    found: list[dict[str, Any]] = [*spec.get("initContainers", []), *spec["containers"]]
    return found
