"""The chart rendered by Helm for its defaults and for each optional feature.

Each scenario is linted strictly, and every object it renders is validated offline: built-in
kinds against the Kubernetes OpenAPI schemas that ``kubernetes-validate`` ships, in strict mode
(unknown fields rejected), for the oldest Kubernetes the chart supports and the newest known;
the Prometheus Operator kinds (ServiceMonitor, PrometheusRule), whose CRD schemas that package
does not ship, against the structural schemas below, which cover the fields the chart uses.
"""

from __future__ import annotations

import base64
import copy
import os
import subprocess
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema  # type: ignore[import-untyped, unused-ignore]
import kubernetes_validate
import pytest

from purgatory._core import ConfigError, key_group_range_for_operator
from purgatory.service.settings import Settings
from purgatory.service.settings import env_name as setting_env
from tests.helm._chart import (
    CHART_DIR,
    FULLNAME,
    NAMESPACE,
    RELEASE,
    SCENARIOS,
    containers,
    kind,
    load_values_file,
    manifests,
    pod_specs,
    render,
)

pytestmark = pytest.mark.helm

# The chart's kubeVersion floor and the newest schemas kubernetes-validate ships.
KUBE_VERSIONS = ("1.25", kubernetes_validate.latest_version())

_DURATION = {"type": "string", "pattern": r"^([0-9]+(ms|s|m|h|d|w|y))+$"}
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_METADATA = {
    "type": "object",
    "required": ["name", "namespace", "labels"],
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "additionalProperties": False,
}
# Minimal structural schemas of the monitoring.coreos.com/v1 objects the chart renders: the
# fields it uses, typed as in the Prometheus Operator's CRDs, and nothing else.
CRD_SCHEMAS: dict[str, dict[str, Any]] = {
    "ServiceMonitor": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "additionalProperties": False,
                "properties": {
                    "selector": {
                        "type": "object",
                        "required": ["matchLabels"],
                        "additionalProperties": False,
                        "properties": {"matchLabels": _STRING_MAP},
                    },
                    "namespaceSelector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "matchNames": {"type": "array", "items": {"type": "string"}}
                        },
                    },
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["port"],
                            "additionalProperties": False,
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string", "pattern": "^/"},
                                "scheme": {"enum": ["http", "https"]},
                                "interval": _DURATION,
                                "scrapeTimeout": _DURATION,
                            },
                        },
                    },
                },
            },
        },
        "additionalProperties": False,
    },
    "PrometheusRule": {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": _METADATA,
            "spec": {
                "type": "object",
                "required": ["groups"],
                "additionalProperties": False,
                "properties": {
                    "groups": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "rules": {
                                    "type": "array",
                                    "minItems": 1,
                                    "items": {
                                        "type": "object",
                                        "required": ["alert", "expr"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "alert": {"type": "string", "pattern": "^[A-Za-z]+$"},
                                            "expr": {"type": "string", "minLength": 1},
                                            "for": _DURATION,
                                            "labels": _STRING_MAP,
                                            "annotations": _STRING_MAP,
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            },
        },
        "additionalProperties": False,
    },
}

REQUIRED_LABELS = (
    "helm.sh/chart",
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/managed-by",
)
SELECTOR = {"app.kubernetes.io/name": "purgatory", "app.kubernetes.io/instance": RELEASE}
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}

scenarios = pytest.mark.parametrize("values", SCENARIOS.values(), ids=SCENARIOS.keys())


@scenarios
def test_lint_strict_passes(values: dict[str, Any] | None) -> None:
    report = helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    # Severity 2 is a warning, 3 an error; strict lint fails on both. Info (1) is advice.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@scenarios
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(
    values: dict[str, Any] | None, kube_version: str
) -> None:
    objects = manifests(values)
    assert objects
    for obj in objects:
        if obj["kind"] in CRD_SCHEMAS:
            jsonschema.validate(obj, CRD_SCHEMAS[obj["kind"]])
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(str(p) for p in exc.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} at {where}: {exc.message}")


def test_strict_validation_rejects_an_unknown_field() -> None:
    # The check above has teeth: an unknown field fails in strict mode.
    deployment = copy.deepcopy(kind(manifests(None), "Deployment")[0])
    deployment["spec"]["template"]["spec"]["containers"][0]["enviroment"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBE_VERSIONS[-1], strict=True)
    rule = kind(manifests(SCENARIOS["prometheus-rule"]), "PrometheusRule")[0]
    rule["spec"]["groups"][0]["rules"][0]["severity"] = "page"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(rule, CRD_SCHEMAS["PrometheusRule"])


@scenarios
def test_every_object_is_labelled_and_namespaced(values: dict[str, Any] | None) -> None:
    for obj in manifests(values):
        meta = obj["metadata"]
        assert meta["namespace"] == NAMESPACE, meta["name"]
        missing = [label for label in REQUIRED_LABELS if label not in meta["labels"]]
        assert missing == [], f"{obj['kind']}/{meta['name']} lacks {missing}"
        assert meta["labels"]["app.kubernetes.io/instance"] == RELEASE


@scenarios
def test_every_container_runs_under_the_restricted_profile(values: dict[str, Any] | None) -> None:
    specs = list(pod_specs(manifests(values)))
    assert len(specs) == 2  # the workload and the helm test pod
    for name, spec in specs:
        assert spec["automountServiceAccountToken"] is False, name
        assert spec["enableServiceLinks"] is False, name
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True, name
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert pod.get("runAsUser", 1) != 0, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID"), name
        for container in containers(spec):
            context = container["securityContext"]
            assert context == RESTRICTED_CONTAINER, f"{name} {container['name']}"
            assert "resources" in container, f"{name} {container['name']}"
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        assert all("hostPath" not in v for v in volumes.values()), name


@scenarios
def test_the_read_only_root_has_a_writable_tmp(values: dict[str, Any] | None) -> None:
    (workload,) = [o for o in manifests(values) if o["kind"] in ("Deployment", "StatefulSet")]
    spec = workload["spec"]["template"]["spec"]
    tmp = {v["name"]: v for v in spec["volumes"]}["tmp"]
    assert "emptyDir" in tmp
    mounts = {m["mountPath"]: m["name"] for m in spec["containers"][0]["volumeMounts"]}
    assert mounts["/tmp"] == "tmp"


@scenarios
def test_probes_ports_and_service(values: dict[str, Any] | None) -> None:
    objects = manifests(values)
    (workload,) = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    assert workload["spec"]["selector"]["matchLabels"] == SELECTOR
    container = workload["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    for probe, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert container[probe]["httpGet"] == {"path": path, "port": "http"}, probe
    service = next(s for s in kind(objects, "Service") if s["metadata"]["name"] == FULLNAME)
    assert service["spec"]["selector"] == SELECTOR
    ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert ports == {"http": (8080, "http"), "metrics": (9090, "http")}
    for pdb in kind(objects, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"] == SELECTOR
    spread = workload["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} == {
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    }
    assert all(c["labelSelector"] == {"matchLabels": SELECTOR} for c in spread)


def test_defaults_are_a_deployment_in_a_consumer_group() -> None:
    objects = manifests(None)
    assert [o["kind"] for o in objects if o["kind"] in ("Deployment", "StatefulSet")] == [
        "Deployment"
    ]
    assert {o["kind"] for o in objects} == {
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Pod",
        "Secret",  # the generated API token: the API is closed by default
        "Service",
        "ServiceAccount",
    }
    (deployment,) = kind(objects, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container  # the image's entry point: purgatory serve
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}


@pytest.mark.parametrize(("replicas", "partitions"), [(1, 4), (3, 4), (4, 4), (6, 4), (4, 12)])
def test_a_group_rollout_starts_the_new_pod_before_it_stops_an_old_one(
    replicas: int, partitions: int
) -> None:
    # maxUnavailable 0 waits for the surge pod to be ready; one the group gives no partition
    # (a replica per partition already) is ready too, since it forwards (ops/readiness.py).
    values = {"replicaCount": replicas, "partitionAssignment": {"partitions": partitions}}
    (deployment,) = kind(manifests(values), "Deployment")
    rolling = deployment["spec"]["strategy"]["rollingUpdate"]
    assert rolling == {"maxSurge": 1, "maxUnavailable": 0}


def test_ordinal_mode_is_a_statefulset_owning_flink_ranges_of_partitions() -> None:
    values = SCENARIOS["ordinal"]
    objects = manifests(values)
    assert kind(objects, "Deployment") == []
    (statefulset,) = kind(objects, "StatefulSet")
    assert statefulset["spec"]["replicas"] == 3
    assert statefulset["spec"]["serviceName"] == f"{FULLNAME}-headless"
    # One pod at a time, the old pod N gone before the new pod N starts: one owner per range
    # through a rollout at a constant count (no maxUnavailable above 1, no surge: StatefulSets
    # never run two pods of one ordinal).
    assert statefulset["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    headless = next(s for s in kind(objects, "Service") if s["spec"].get("clusterIP") == "None")
    assert headless["metadata"]["name"] == f"{FULLNAME}-headless"
    (owned,) = [
        c for c in kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-partitions")
    ]
    expected = {
        str(i): ",".join(str(p) for p in key_group_range_for_operator(8, 3, i)) for i in range(3)
    }
    peers = owned["data"].pop("peers").split(",")
    assert owned["data"] == expected == {"0": "0,1,2", "1": "3,4,5", "2": "6,7"}
    # Every pod's stable name through the headless Service, by ordinal: where to forward.
    assert peers == [
        f"http://{FULLNAME}-{i}.{FULLNAME}-headless.{NAMESPACE}.svc:8080" for i in range(3)
    ]
    pod = statefulset["spec"]["template"]
    assert "checksum/partitions" in pod["metadata"]["annotations"]
    script = pod["spec"]["containers"][0]["command"]
    assert script[:2] == ["/bin/sh", "-c"]
    assert "exec purgatory serve" in script[2]


def test_an_ordinal_pod_gets_its_partitions_from_its_host_name(tmp_path: Path) -> None:
    objects = manifests(SCENARIOS["ordinal"])
    (statefulset,) = kind(objects, "StatefulSet")
    (owned,) = [
        c for c in kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-partitions")
    ]
    script = statefulset["spec"]["template"]["spec"]["containers"][0]["command"][2]
    mounted = tmp_path / "partitions"
    mounted.mkdir()
    for ordinal, partitions in owned["data"].items():
        (mounted / ordinal).write_text(partitions)
    # Run the pod's script with the mount moved here and `purgatory serve` replaced by env.
    script = script.replace("/etc/purgatory/partitions", str(mounted))
    script = script.replace("exec purgatory serve", "exec env")
    for host, expected in ((f"{FULLNAME}-1", "3,4,5"), (f"{FULLNAME}-2", "6,7")):
        done = subprocess.run(
            ["/bin/sh", "-c", script],
            env={"HOSTNAME": host, "PATH": os.environ["PATH"]},
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        lines = done.stdout.splitlines()
        assert f"PURGATORY_KAFKA_STATIC_PARTITIONS={expected}" in lines
        assert f"PURGATORY_REPLICA_ORDINAL={host.rsplit('-', 1)[1]}" in lines
        assert f"PURGATORY_PEER_URLS={owned['data']['peers']}" in lines
    done = subprocess.run(
        ["/bin/sh", "-c", script],
        env={"HOSTNAME": f"{FULLNAME}-7", "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert done.returncode == 1
    assert "no partitions for pod ordinal 7" in done.stderr


def _pre_stop(values: dict[str, Any] | None) -> dict[str, Any] | None:
    """The service container's preStop hook (None without one); the helm test pod has none."""
    objects = manifests(values)
    (workload,) = [o for o in objects if o["kind"] in ("Deployment", "StatefulSet")]
    (test_pod,) = kind(objects, "Pod")
    assert all("lifecycle" not in c for c in containers(test_pod["spec"]))
    (container,) = containers(workload["spec"]["template"]["spec"])
    hook: dict[str, Any] | None = container.get("lifecycle", {}).get("preStop")
    return hook


@pytest.mark.parametrize("mode", ["group", "ordinal"])
def test_a_stopping_pod_keeps_serving_until_the_services_forget_it(mode: str) -> None:
    # Kubernetes takes a stopping pod out of the endpoints while it sends SIGTERM, not before:
    # without the pause, the proxies still route new connections to a closed port for a moment.
    # An exec of the image's sleep, as the native sleep action needs Kubernetes 1.30.
    assignment = {"partitionAssignment": {"mode": mode}}
    assert _pre_stop(assignment) == {"exec": {"command": ["/bin/sleep", "5"]}}
    longer = _pre_stop({**assignment, "lifecycle": {"preStopSleepSeconds": 12}})
    assert longer == {"exec": {"command": ["/bin/sleep", "12"]}}
    assert _pre_stop({**assignment, "lifecycle": {"preStopSleepSeconds": 0}}) is None
    # The kubelet runs the command without a shell; the argument is one sleep accepts.
    assert longer is not None
    program, _ = longer["exec"]["command"]
    done = subprocess.run([program, "0"], capture_output=True, timeout=10, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("pre_stop_s", "grace_ms", "snapshots", "fits"),
    [
        (5, 24_999, True, True),
        (5, 25_000, True, False),
        (0, 29_999, True, True),
        (30, 0, True, False),
        (29, 999, True, True),
        (5, 34_999, False, True),
        (5, 35_000, False, False),
    ],
)
def test_the_pause_the_graceful_stop_and_the_last_snapshots_fit_in_the_grace_period(
    pre_stop_s: int, grace_ms: int, snapshots: bool, fits: bool
) -> None:
    # The grace period counts from the hook: what the pause takes, the graceful stop loses; with
    # snapshots on, the snapshotter's last snapshots take up to 10 s after the service stopped.
    values = {
        "lifecycle": {"preStopSleepSeconds": pre_stop_s},
        "config": {
            "shutdown_grace_ms": grace_ms,
            "snapshot_interval_ms": 60_000 if snapshots else 0,
        },
    }
    if fits:
        assert kind(manifests(values), "Deployment")
    else:
        with pytest.raises(helm.HelmRenderError, match=r"terminationGracePeriodSeconds \(55s\)"):
            render(values)


def test_secrets_are_mounted_from_existing_secrets_never_rendered() -> None:
    objects = manifests(SCENARIOS["everything"])
    assert kind(objects, "Secret") == []
    (statefulset,) = kind(objects, "StatefulSet")
    spec = statefulset["spec"]["template"]["spec"]
    env = {e["name"]: e for e in spec["containers"][0]["env"]}
    assert env["PURGATORY_KAFKA_SASL_USERNAME"]["valueFrom"] == {
        "secretKeyRef": {"name": "kafka-user", "key": "user"}
    }
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for env_name, volume, secret, key in (
        ("PURGATORY_KAFKA_SASL_PASSWORD_FILE", "kafka-sasl", "kafka-user", "pw"),
        ("PURGATORY_API_TOKEN_FILE", "api-token", "purgatory-api", "bearer"),
    ):
        path = env[env_name]["value"]
        assert mounts[volume]["readOnly"] is True
        directory, _, file_name = path.rpartition("/")
        assert mounts[volume]["mountPath"] == directory
        assert volumes[volume]["secret"]["secretName"] == secret
        assert volumes[volume]["secret"]["items"] == [{"key": key, "path": file_name}]
    (config,) = [c for c in kind(objects, "ConfigMap") if c["metadata"]["name"] == FULLNAME]
    tls_dir = mounts["kafka-tls"]["mountPath"]
    assert config["data"]["PURGATORY_KAFKA_SSL_CAFILE"] == f"{tls_dir}/ca.crt"
    assert config["data"]["PURGATORY_KAFKA_SSL_CERTFILE"] == f"{tls_dir}/tls.crt"
    assert config["data"]["PURGATORY_KAFKA_SSL_KEYFILE"] == f"{tls_dir}/tls.key"
    assert [i["path"] for i in volumes["kafka-tls"]["secret"]["items"]] == [
        "ca.crt",
        "tls.crt",
        "tls.key",
    ]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"config": {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "PLAIN"}},
            "kafka.sasl.existingSecret: required when config.kafka_security_protocol is SASL_SSL",
        ),
        (
            {"kafka": {"sasl": {"existingSecret": "s"}}},
            "kafka.sasl.existingSecret: only used with config.kafka_security_protocol",
        ),
        (
            {"kafka": {"tls": {"existingSecret": "t"}}},
            "kafka.tls.existingSecret: only used with config.kafka_security_protocol SSL",
        ),
        (
            {
                "config": {"kafka_security_protocol": "SSL"},
                "kafka": {"tls": {"existingSecret": "t", "keyKey": "tls.key"}},
            },
            "kafka.tls.keyKey: needs kafka.tls.certKey",
        ),
        (
            {
                "config": {
                    "kafka_security_protocol": "SASL_PLAINTEXT",
                    "kafka_sasl_mechanism": "PLAIN",
                    "kafka_sasl_username": "u",
                },
                "kafka": {"sasl": {"existingSecret": "s"}},
            },
            "config.kafka_sasl_username: set either it or kafka.sasl.usernameKey",
        ),
        (
            {"partitionAssignment": {"mode": "ordinal", "partitions": 2}, "replicaCount": 3},
            "replicaCount: at most partitionAssignment.partitions (2) in ordinal mode, got 3",
        ),
        (
            {"config": {"shutdown_grace_ms": 30000}, "lifecycle": {"preStopSleepSeconds": 0}},
            "config.shutdown_grace_ms (+ 10 s for the last snapshots with config.journal and "
            "config.snapshot_interval_ms on): must stay below terminationGracePeriodSeconds "
            "(55s), got 0s + 15000 ms + 30000 ms + 10000 ms",
        ),
        (
            {"config": {"shutdown_grace_ms": 26000}},
            "lifecycle.preStopSleepSeconds + config.hand_over_ms (group mode) + "
            "config.shutdown_grace_ms (+ 10 s for the last snapshots with config.journal and "
            "config.snapshot_interval_ms on): must stay below terminationGracePeriodSeconds "
            "(55s), got 5s + 15000 ms + 26000 ms + 10000 ms",
        ),
        (
            {
                "config": {"kafka_security_protocol": "SASL_SSL"},
                "kafka": {"sasl": {"existingSecret": "s"}},
            },
            "config.kafka_sasl_mechanism: required when config.kafka_security_protocol is SASL",
        ),
        (
            {
                "config": {"kafka_security_protocol": "SASL_SSL", "kafka_sasl_mechanism": "PLAIN"},
                "kafka": {"sasl": {"existingSecret": "s", "usernameKey": ""}},
            },
            "kafka.sasl.usernameKey: required (or config.kafka_sasl_username)",
        ),
        (
            {
                "config": {"kafka_bootstrap_servers": "b-1:9092, b-2:9096"},
                "networkPolicy": {"enabled": True},
            },
            "networkPolicy.egress.kafkaPorts: must include 9096, the port of b-2:9096",
        ),
        (
            {"service": {"metricsPort": 8080}},
            "service.metricsPort: must differ from service.port (8080)",
        ),
    ],
    ids=[
        "sasl-without-secret",
        "sasl-secret-without-sasl",
        "tls-secret-without-ssl",
        "tls-key-without-cert",
        "username-twice",
        "ordinal-replicas-over-partitions",
        "grace-over-termination",
        "pre-stop-and-grace-over-termination",
        "sasl-without-mechanism",
        "sasl-without-username",
        "network-policy-closing-a-broker-port",
        "one-service-port-twice",
    ],
)
def test_the_templates_refuse_inconsistent_values(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmRenderError) as caught:
        render(values)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("config", "named"),
    [
        ({"kafka_sasl_mechanism": "PLAIN"}, "kafka_sasl_mechanism"),
        ({"topic_callbacks": "purgatory.signals"}, "topic_callbacks"),
        ({"max_pending_per_scope": 500_001}, "max_pending_per_scope"),
        ({"max_payload_bytes": 1_048_576}, "max_payload_bytes"),
        ({"max_signal_bytes_per_operation": 1_048_576}, "max_signal_bytes_per_operation"),
    ],
)
def test_the_templates_refuse_what_the_service_would_refuse_at_start(
    config: dict[str, Any], named: str
) -> None:
    # Without the check, every pod would render, start, and exit on the same ConfigError.
    given = {**load_values_file()["config"], **config}
    environ = {setting_env(k): str(v) for k, v in given.items() if v is not None}
    environ["PURGATORY_API_TOKEN"] = "the-generated-secret-token"  # the pod's, from the Secret
    with pytest.raises(ConfigError, match=f"^{setting_env(named)}: "):
        Settings.from_env(environ)
    with pytest.raises(helm.HelmRenderError, match=f"config.{named}: "):
        render({"config": config})


def test_the_helm_test_pod_checks_readiness_through_the_service() -> None:
    objects = manifests(None)
    (pod,) = kind(objects, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    (container,) = pod["spec"]["containers"]
    assert container["command"][0] == "wget"
    assert container["command"][-1] == f"http://{FULLNAME}:8080/readyz"
    # It must not look like a replica: nothing selects it.
    labels = pod["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in SELECTOR.items())


@pytest.mark.parametrize("ids", [None, SCENARIOS["platform-chosen-ids"]])
def test_the_helm_test_pod_runs_as_the_workload_does(ids: dict[str, Any] | None) -> None:
    # A fixed id of its own would be refused where the platform assigns them (OpenShift).
    specs = dict(pod_specs(manifests(ids)))
    test_pod = specs[f"Pod/{FULLNAME}-test-readiness"]["securityContext"]
    workload = specs[f"Deployment/{FULLNAME}"]["securityContext"]
    for key in ("runAsNonRoot", "runAsUser", "runAsGroup"):
        assert test_pod.get(key) == workload.get(key), key


def test_network_policy_opens_the_http_port_dns_and_kafka() -> None:
    (policy,) = kind(manifests(SCENARIOS["network-policy"]), "NetworkPolicy")
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": SELECTOR}
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    (ingress,) = spec["ingress"]
    assert ingress["ports"] == [{"port": "http", "protocol": "TCP"}]
    (test_pod,) = kind(manifests(SCENARIOS["network-policy"]), "Pod")
    assert len(ingress["from"]) == 3
    assert ingress["from"][1]["podSelector"]["matchLabels"].items() <= (
        test_pod["metadata"]["labels"].items()
    )
    egress_ports = [p["port"] for rule in spec["egress"] for p in rule["ports"]]
    assert egress_ports == [53, 53, 9092, 443]
    brokers = {"kafka_bootstrap_servers": "b-1:9096,b-2:9096"}
    opened = {"enabled": True, "egress": {"kafkaPorts": [9096]}}
    assert kind(manifests({"config": brokers, "networkPolicy": opened}), "NetworkPolicy")
    (default_policy,) = kind(manifests({"networkPolicy": {"enabled": True}}), "NetworkPolicy")
    assert default_policy["spec"]["ingress"][0]["from"] == [{"podSelector": {}}]


def test_service_monitor_scrapes_the_metrics_port() -> None:
    (monitor,) = kind(manifests(SCENARIOS["service-monitor"]), "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["selector"]["matchLabels"] == SELECTOR
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["port"], endpoint["path"]) == ("metrics", "/metrics")


def test_the_default_budget_lets_a_drain_evict_the_single_replica() -> None:
    (pdb,) = kind(manifests(None), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert "minAvailable" not in pdb["spec"]
    assert "lets no pod be evicted" not in render(None)["purgatory/templates/NOTES.txt"]


@pytest.mark.parametrize(
    ("replicas", "budget", "blocks"),
    [
        (1, {"minAvailable": 1}, True),
        (1, {"minAvailable": "50%"}, True),  # rounded up: 1 of 1
        (3, {"minAvailable": "50%"}, False),
        (2, {"minAvailable": 2}, True),
        (2, {"minAvailable": 1}, False),
        (1, {"maxUnavailable": 0}, True),
        (4, {"maxUnavailable": "0%"}, True),
        (1, {"maxUnavailable": "10%"}, False),  # rounded up: 1
        (0, {"maxUnavailable": 0}, False),  # no pod to evict
        (1, {"enabled": False, "minAvailable": 1}, False),
    ],
)
def test_notes_warn_when_the_budget_blocks_every_eviction(
    replicas: int, budget: dict[str, Any], blocks: bool
) -> None:
    values = {"replicaCount": replicas, "podDisruptionBudget": budget}
    notes = render(values)["purgatory/templates/NOTES.txt"]
    assert ("lets no pod be evicted" in notes) == blocks


def test_notes_tell_how_to_reach_and_test_the_release() -> None:
    notes = render(None)["purgatory/templates/NOTES.txt"]
    assert f"helm test {RELEASE}" in notes
    assert f"port-forward svc/{FULLNAME}" in notes
    assert "deployment/" in notes
    ordinal = render(SCENARIOS["ordinal"])["purgatory/templates/NOTES.txt"]
    assert "statefulset/" in ordinal
    assert "replicaCount=0 first" in ordinal  # resizing changes every range: they overlap
    assert "(serving, and holding partitions to consume)" in notes  # no restore in this release


def test_the_api_is_closed_by_default_with_a_generated_token() -> None:
    objects = manifests(None)
    (secret,) = kind(objects, "Secret")
    assert secret["metadata"]["name"] == f"{FULLNAME}-api-token"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert len(token) == 40 and token.isalnum()
    ((_, spec),) = [s for s in pod_specs(objects) if not s[0].startswith("Pod/")]
    (container,) = containers(spec)
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["PURGATORY_API_TOKEN_FILE"].endswith("/token")
    assert "PURGATORY_ALLOW_UNAUTHENTICATED" not in env
    (volume,) = [v for v in spec["volumes"] if v["name"] == "api-token"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert volume["secret"]["items"] == [{"key": "token", "path": "token"}]


def test_an_existing_secret_replaces_the_generated_one() -> None:
    objects = manifests({"apiToken": {"existingSecret": "ours", "key": "bearer"}})
    assert kind(objects, "Secret") == []
    ((_, spec),) = [s for s in pod_specs(objects) if not s[0].startswith("Pod/")]
    (volume,) = [v for v in spec["volumes"] if v["name"] == "api-token"]
    assert volume["secret"]["secretName"] == "ours"
    assert volume["secret"]["items"] == [{"key": "bearer", "path": "token"}]


def test_an_open_api_is_asked_for_explicitly() -> None:
    objects = manifests({"apiToken": {"generate": False}})
    assert kind(objects, "Secret") == []
    ((_, spec),) = [s for s in pod_specs(objects) if not s[0].startswith("Pod/")]
    (container,) = containers(spec)
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["PURGATORY_ALLOW_UNAUTHENTICATED"] == "true"
    assert "PURGATORY_API_TOKEN_FILE" not in env
    assert all(v["name"] != "api-token" for v in spec["volumes"])
