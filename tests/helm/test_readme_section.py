"""The Kubernetes page (docs/kubernetes.md): its install example installs, and the values it
names exist.

The section is what an operator follows; these tests render its example exactly as written and
hold its names and defaults to the chart's.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm._chart import chart, load_objects, load_values_file

pytestmark = pytest.mark.helm

SECTION = (Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md").read_text("utf-8")
FLAT = re.sub(r"\s+", " ", SECTION)  # prose wraps anywhere
_VALUE_ROOTS = (
    "apiToken",
    "config",
    "grafanaDashboard",
    "image",
    "kafka",
    "lifecycle",
    "networkPolicy",
    "partitionAssignment",
    "podDisruptionBudget",
    "probes",
    "prometheusRule",
    "resources",
    "service",
    "serviceMonitor",
)


def _example_values() -> dict[str, Any]:
    (block,) = re.findall(r"```yaml\n\s*# values-prod\.yaml\n(.*?)```", SECTION, re.DOTALL)
    loaded: dict[str, Any] = yaml.safe_load(block)
    return loaded


def test_the_install_example_renders_what_the_section_then_checks() -> None:
    release, namespace = "purgatory", "pipelines"
    assert f"helm install {release} ./helm/purgatory -n {namespace} -f values-prod.yaml" in SECTION
    rendered = chart().render(_example_values(), name=release, namespace=namespace, is_install=True)
    objects = [
        obj
        for path, text in sorted(rendered.items())
        if path.endswith(".yaml")
        for obj in load_objects(text, path)
    ]
    (workload,) = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    name = f"{workload['kind'].lower()}/{workload['metadata']['name']}"
    assert f"kubectl -n {namespace} rollout status {name}" in SECTION
    assert f"helm test {release} -n {namespace}" in SECTION
    kinds = {o["kind"] for o in objects}
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds


def test_the_secrets_it_creates_are_the_ones_the_example_references() -> None:
    values = _example_values()
    defaults = load_values_file()
    created = dict(
        re.findall(r"create secret generic (\S+) \\?\s*((?:--from-\S+\s*\\?\s*)+)", SECTION)
    )
    keys = {
        name: set(re.findall(r"--from-\w+=([^=\s]+)=", flags)) for name, flags in created.items()
    }
    sasl, tls, token = values["kafka"]["sasl"], values["kafka"]["tls"], values["apiToken"]
    sasl_defaults = defaults["kafka"]["sasl"]
    assert keys[sasl["existingSecret"]] == {
        sasl_defaults["usernameKey"],
        sasl_defaults["passwordKey"],
    }
    assert keys[tls["existingSecret"]] == {defaults["kafka"]["tls"]["caKey"]}
    assert keys[token["existingSecret"]] == {defaults["apiToken"]["key"]}


def test_every_value_it_names_exists() -> None:
    values = load_values_file()
    roots = "|".join(_VALUE_ROOTS)
    named = set(re.findall(rf"`((?:{roots})\.[A-Za-z_.]+)`", SECTION))
    assert len(named) > 20
    for path in sorted(named):
        node: Any = values
        for part in path.rstrip(".").split("."):
            assert isinstance(node, dict) and part in node, path
            node = node[part]


def test_the_defaults_it_quotes_are_the_chart_defaults() -> None:
    values = load_values_file()
    config = values["config"]
    rows = {
        "`replicaCount`": f"`{values['replicaCount']}`",
        "`partitionAssignment.mode`": f"`{values['partitionAssignment']['mode']}`",
        "`partitionAssignment.partitions`": f"`{values['partitionAssignment']['partitions']}`",
        "`config.kafka_bootstrap_servers`": f"`{config['kafka_bootstrap_servers']}`",
        "`config.max_pending`, `config.max_pending_per_scope`": (
            f"`{config['max_pending']}`, `{config['max_pending_per_scope']}`"
        ),
        "`terminationGracePeriodSeconds`, `config.hand_over_ms`, `config.shutdown_grace_ms`": (
            f"`{values['terminationGracePeriodSeconds']}`, `{config['hand_over_ms']}`, "
            f"`{config['shutdown_grace_ms']}`"
        ),
        "`lifecycle.preStopSleepSeconds`": f"`{values['lifecycle']['preStopSleepSeconds']}`",
    }
    for value, default in rows.items():
        assert f"| {value} | {default}" in SECTION, value
    assert f"`service.port`, {values['service']['port']}" in FLAT
    assert f"`service.metricsPort`, {values['service']['metricsPort']}" in FLAT
    fraction = values["prometheusRule"]["thresholds"]["memoryFraction"]
    assert f"`prometheusRule.thresholds.memoryFraction` ({fraction})" in FLAT
