"""The alerts and the dashboard: what they watch, and that every series they query is served.

The last test runs the real service against the session's embedded broker and reads its
``/metrics``: each ``purgatory_*`` (and prometheus-client's ``process_*``) name in a rendered
alert or dashboard query must be a series that the scrape declares (a counter ``x_total``; a
histogram ``x_bucket``, ``x_sum``, ``x_count``; a gauge ``x``).
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

import helm_python as helm
import httpx
import pytest
import trio
import trio.testing

from purgatory._core import Engine, EngineConfig, EngineStatistics
from purgatory.devtools.broker import EmbeddedBroker, free_port
from purgatory.service.app import run_service
from purgatory.service.settings import Settings
from purgatory.service.telemetry.metrics import Metrics, PartitionStatus
from purgatory.service.telemetry.stats import OutboxStatistics
from reaper import Clock, CompletionExecutor, Reaper
from tests.helm._chart import (
    FULLNAME,
    NAMESPACE,
    SCENARIOS,
    kind,
    load_objects,
    manifests,
    render,
)

pytestmark = pytest.mark.helm

# The service's own series, and the process collector's (resident memory, CPU, file descriptors).
_METRIC = re.compile(r"\b(?:purgatory|process)_[a-z0-9_]+\b")
ALERTS = {
    "PurgatoryExecutorLagHigh": "purgatory_executor_lag_seconds",
    "PurgatoryExecutorQueueDepthHigh": "purgatory_executor_queue_depth",
    "PurgatoryReaperLate": "purgatory_reaper_lateness_seconds_bucket",
    "PurgatoryDeadLetters": "purgatory_records_dead_lettered_total",
    "PurgatoryConsumerLagHigh": "purgatory_consumer_lag",
    "PurgatoryCallbackErrors": "purgatory_callback_errors_total",
    "PurgatoryPendingNearLimit": "purgatory_pending_operations",
    "PurgatoryMemoryNearLimit": "process_resident_memory_bytes",
    "PurgatoryNotReady": "purgatory_ready",
    "PurgatorySnapshotStale": "purgatory_snapshot_age_seconds",
    "PurgatorySnapshotterRestarting": "purgatory_snapshotter_restarts_total",
    "PurgatoryPartitionFenced": "purgatory_partition_fenced_total",
    "PurgatoryJournalStalled": "purgatory_journal_stalled",
}


def _rules(values: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    (rule,) = kind(manifests(values), "PrometheusRule")
    return {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}


def _dashboard_configmap() -> dict[str, Any]:
    (config,) = [
        c
        for c in kind(manifests(SCENARIOS["grafana-dashboard"]), "ConfigMap")
        if c["metadata"]["name"] == f"{FULLNAME}-dashboard"
    ]
    return config


def _dashboard() -> dict[str, Any]:
    config = _dashboard_configmap()
    loaded: dict[str, Any] = json.loads(config["data"]["purgatory.json"])
    return loaded


def _queries(node: Any) -> Iterator[str]:
    """Every PromQL text of a dashboard: panel targets and template variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            else:
                yield from _queries(value)
    elif isinstance(node, list):
        for item in node:
            yield from _queries(item)


def test_the_alerts_watch_what_operators_need() -> None:
    rules = _rules(SCENARIOS["prometheus-rule"])
    assert set(rules) == set(ALERTS)
    selector = f'job="{FULLNAME}",namespace="{NAMESPACE}"'
    for name, metric in ALERTS.items():
        expr = rules[name]["expr"]
        assert f"{metric}{{{selector}}}" in expr, name
        assert rules[name]["labels"]["team"] == "data", name
        assert rules[name]["labels"]["severity"] in ("warning", "critical"), name
        assert rules[name]["annotations"]["summary"], name
        assert "{{ $labels." in rules[name]["annotations"]["summary"], name
        assert len(rules[name]["annotations"]["description"]) > 40, name
        # A level (gauge, quantile) must hold a while before it pages; a count of events in a
        # window (dead letters, callback errors) is already an incident.
        if "increase(" not in rules[name]["expr"]:
            assert rules[name]["for"], name


def test_alert_thresholds_follow_the_values() -> None:
    rules = _rules({"prometheusRule": {"enabled": True}})
    assert rules["PurgatoryPendingNearLimit"]["expr"].endswith("> 0.8 * 500000")
    assert "> 5) and on (namespace, pod)" in rules["PurgatoryExecutorLagHigh"]["expr"]
    assert rules["PurgatoryConsumerLagHigh"]["expr"].endswith("> 10000")
    assert rules["PurgatoryExecutorLagHigh"]["for"] == "5m"
    assert rules["PurgatoryMemoryNearLimit"]["expr"].endswith("> 0.8 * 1073741824")  # 1Gi
    assert rules["PurgatoryMemoryNearLimit"]["for"] == "10m"
    assert rules["PurgatorySnapshotStale"]["expr"].endswith("> 10 * 60")  # 10 intervals of 60 s
    assert rules["PurgatorySnapshotStale"]["for"] == "5m"
    assert rules["PurgatorySnapshotterRestarting"]["expr"].endswith("[15m]))) > 2")
    assert rules["PurgatoryPartitionFenced"]["expr"].endswith("[15m]))) > 3")
    assert "for" not in rules["PurgatoryPartitionFenced"]
    rules = _rules(
        {
            "config": {"max_pending": 20_000_000, "snapshot_interval_ms": 1_500},
            "prometheusRule": {
                "enabled": True,
                "selector": 'service="purgatory"',
                "thresholds": {
                    "pendingRatio": 0.5,
                    "executorLagSeconds": 0.25,
                    "memoryFraction": 0.9,
                    "snapshotAgeIntervals": 4,
                    "snapshotterRestarts": 5,
                    "partitionFences": 10,
                },
                "for": "2m",
            },
        }
    )
    expr = rules["PurgatoryPendingNearLimit"]["expr"]
    assert expr == (
        'max by (namespace, pod) (purgatory_pending_operations{service="purgatory"})'
        " > 0.5 * 20000000"
    )
    assert "> 0.25) and on (namespace, pod)" in rules["PurgatoryExecutorLagHigh"]["expr"]
    assert rules["PurgatoryExecutorLagHigh"]["for"] == "2m"
    assert rules["PurgatoryMemoryNearLimit"]["expr"] == (
        'max by (namespace, pod) (process_resident_memory_bytes{service="purgatory"})'
        " > 0.9 * 1073741824"
    )
    assert rules["PurgatorySnapshotStale"]["expr"] == (
        'max by (namespace, partition) (purgatory_snapshot_age_seconds{service="purgatory"}'
        ' * (purgatory_snapshot_lag_records{service="purgatory"} > bool 0)) > 4 * 1.5'
    )
    assert rules["PurgatorySnapshotStale"]["for"] == "2m"
    assert rules["PurgatorySnapshotterRestarting"]["expr"] == (
        "floor(sum by (namespace, pod) (increase("
        'purgatory_snapshotter_restarts_total{service="purgatory"}[15m]))) > 5'
    )
    assert rules["PurgatoryPartitionFenced"]["expr"] == (
        "floor(sum by (namespace, pod, partition) (increase("
        'purgatory_partition_fenced_total{service="purgatory"}[15m]))) > 10'
    )


@pytest.mark.parametrize(
    "config",
    [{"snapshot_interval_ms": 0}, {"journal": False}],
    ids=["no-snapshots", "no-journal"],
)
def test_without_snapshots_there_is_no_snapshot_alert(config: dict[str, Any]) -> None:
    rules = _rules({"config": config, "prometheusRule": {"enabled": True}})
    assert "PurgatorySnapshotStale" not in rules
    assert "PurgatorySnapshotterRestarting" not in rules
    assert "PurgatoryNotReady" in rules
    # Only the journal fences a partition or stalls: those alerts need the journal.
    assert ("PurgatoryPartitionFenced" in rules) == config.get("journal", True)
    assert ("PurgatoryJournalStalled" in rules) == config.get("journal", True)


def test_the_journal_alert_pages_and_says_the_pod_stays_ready_on_purpose() -> None:
    # The pod stays ready while its journal is stalled, so only this alert sees it: it pages
    # after a minute, and names the bound from the values.
    rule = _rules({"prometheusRule": {"enabled": True}, "config": {"journal_wait_ms": 2_500}})[
        "PurgatoryJournalStalled"
    ]
    assert rule["labels"] == {"severity": "critical"}
    assert rule["for"] == "1m"
    assert rule["expr"].endswith(") == 1")
    description = re.sub(r"\s+", " ", rule["annotations"]["description"])
    assert "config.journal_wait_ms (2500 ms)" in description
    assert "answers 503 with Retry-After" in description
    assert "stays ready on purpose" in description and "docs/kubernetes.md" in description


def test_the_fence_alert_names_the_other_writer_and_where_to_look() -> None:
    # One fence is a zombie of a rebalance or a rollout; fences that go on are a second writer
    # configured onto the same partitions, counted per partition and whole (increase()
    # extrapolates 3 fences to 3.07).
    rule = _rules(SCENARIOS["prometheus-rule"])["PurgatoryPartitionFenced"]
    assert rule["labels"] == {"severity": "warning", "team": "data"}
    assert rule["expr"].startswith("floor(sum by (namespace, pod, partition) (increase(")
    assert "{{ $labels.partition }}" in rule["annotations"]["summary"]
    description = re.sub(r"\s+", " ", rule["annotations"]["description"])
    assert "the same ordinal or the same static partitions" in description
    assert "a zombie" in description
    assert "partition_fenced events" in description
    assert "docs/replicas.md" in description


@pytest.mark.parametrize(
    ("limit", "limit_bytes"),
    [
        ("1Gi", 1 << 30),
        ("512Mi", 512 << 20),
        ("7Ki", 7 << 10),
        ("3Ti", 3 << 40),
        ("64k", 64 * 10**3),
        ("5M", 5 * 10**6),
        ("2G", 2 * 10**9),
        ("1T", 10**12),
        ("1500000000", 1_500_000_000),
        (1_073_741_824, 1 << 30),  # a YAML number: plain bytes
        ("010Mi", 10 << 20),  # base 10, as Kubernetes reads it, not octal
        ("999999999999999999", 999_999_999_999_999_999),
    ],
)
def test_the_memory_alert_is_a_fraction_of_the_containers_limit(
    limit: str | int, limit_bytes: int
) -> None:
    # The kernel kills the container at its limit, and it loses every pending operation it holds.
    values = {"prometheusRule": {"enabled": True}, "resources": {"limits": {"memory": limit}}}
    (workload,) = kind(manifests(values), "Deployment")
    container = workload["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] == limit  # the limit the alert reads
    rule = _rules(values)["PurgatoryMemoryNearLimit"]
    assert rule["expr"].endswith(f"> 0.8 * {limit_bytes}")
    assert f"memory limit ({limit})" in rule["annotations"]["description"]


@pytest.mark.parametrize(
    "limits", [{"memory": None}, {"memory": None, "cpu": "2"}], ids=["none", "cpu-only"]
)
def test_without_a_memory_limit_there_is_no_memory_alert(limits: dict[str, Any]) -> None:
    values = {"prometheusRule": {"enabled": True}, "resources": {"limits": limits}}
    (workload,) = kind(manifests(values), "Deployment")
    assert "memory" not in workload["spec"]["template"]["spec"]["containers"][0]["resources"].get(
        "limits", {}
    )
    assert set(_rules(values)) == set(ALERTS) - {"PurgatoryMemoryNearLimit"}


@pytest.mark.parametrize(
    "limit", ["1.5Gi", "500m", "1Pi", "2Ei", "0", 0, 1.5, "99999999999999999Ti"]
)
def test_the_memory_alert_refuses_a_limit_it_cannot_read_naming_it(limit: str | float) -> None:
    # A fraction of a misread limit is a threshold that never fires, or always does.
    values = {"prometheusRule": {"enabled": True}, "resources": {"limits": {"memory": limit}}}
    with pytest.raises(helm.HelmRenderError) as caught:
        render(values)
    message = str(caught.value)
    assert "resources.limits.memory: the PurgatoryMemoryNearLimit alert needs" in message
    assert message.endswith(f"got {limit}")
    # Without the alert the chart does not read the limit: Kubernetes takes any quantity.
    assert kind(manifests({"resources": {"limits": {"memory": limit}}}), "Deployment")


def test_the_memory_alert_tells_what_to_do() -> None:
    rule = _rules(SCENARIOS["prometheus-rule"])["PurgatoryMemoryNearLimit"]
    assert rule["labels"] == {"severity": "warning", "team": "data"}
    description = re.sub(r"\s+", " ", rule["annotations"]["description"])
    assert "{{ $value | humanize1024 }}B" in description
    assert "Raise resources.limits.memory, or lower config.max_pending (500000," in description
    assert "holds in memory" in description


class _Engines:
    """One engine, as the service's partition table sums them."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def engine_statistics(self) -> EngineStatistics:
        return self._engine.statistics()


class _Idle:
    """A ready replica's source (no lag, no partitions) and an empty outbox."""

    def statistics(self) -> OutboxStatistics:
        return OutboxStatistics(0, 0, 0, 0, 0, 0, 0)

    def lag(self) -> dict[tuple[str, int], int]:
        return {}

    def is_ready(self) -> bool:
        return True

    def partition_status(self) -> list[PartitionStatus]:
        return []

    def standby_status(self) -> dict[int, bool]:
        return {}


def _scrape(metrics: Metrics) -> dict[str, float]:
    """The unlabelled samples of a scrape: name -> value."""
    samples: dict[str, float] = {}
    for line in metrics.render()[0].decode().splitlines():
        name, _, value = line.partition(" ")
        if name.startswith("purgatory_") and "{" not in name:
            samples[name] = float(value)
    return samples


async def test_the_executor_lag_alert_stays_quiet_once_the_executor_is_idle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The lag gauge is the last started callback's lag, and it keeps that value while nothing
    # runs: the alert must also see callbacks waiting, or it fires on an idle service.
    executor = CompletionExecutor(Clock(), capacity=8)
    metrics = Metrics()
    engine = Engine(EngineConfig(), start_ms=0)
    metrics.bind(
        engines=_Engines(engine),
        executor=executor,
        reaper=Reaper(engine, executor, Clock()),
        outbox=_Idle(),
        source=_Idle(),
        status=_Idle(),
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(executor.run)
        executor.submit_nowait(functools.partial(trio.sleep, 6), due_ms=0)
        executor.submit_nowait(lambda: None, due_ms=0)
        await trio.sleep(3)
        busy = _scrape(metrics)
        await executor.aclose()
    await trio.sleep(3600)
    idle = _scrape(metrics)
    assert busy["purgatory_executor_queue_depth"] == 1
    assert idle["purgatory_executor_lag_seconds"] == 6.0  # an hour later, with nothing to run
    assert idle["purgatory_executor_queue_depth"] == 0
    expr = _rules({"prometheusRule": {"enabled": True}})["PurgatoryExecutorLagHigh"]["expr"]
    gate = "and on (namespace, pod) (max by (namespace, pod) (purgatory_executor_queue_depth{"
    assert gate in expr
    assert expr.endswith("}) > 0)")


def test_the_dead_letter_alert_sees_the_first_dead_letter() -> None:
    # The series of a (topic, reason) is born at its first dead letter, already at 1: increase()
    # has no earlier sample to compare with, so the alert also counts series younger than 10m.
    metrics = Metrics()
    name = "purgatory_records_dead_lettered_total"
    assert f"\n{name}{{" not in metrics.render()[0].decode()
    metrics.dead_lettered("purgatory.signals", "invalid")
    first = f'{name}{{reason="invalid",topic="purgatory.signals"}} 1.0'
    assert first in metrics.render()[0].decode().splitlines()
    expr = _rules(SCENARIOS["prometheus-rule"])["PurgatoryDeadLetters"]["expr"]
    series = f'{name}{{job="{FULLNAME}",namespace="{NAMESPACE}"}}'
    assert f"increase({series}[10m]) > 0 or ({series} unless {series} offset 10m)" in expr


def test_alert_labels_may_override_the_severity() -> None:
    # manifests() refuses a repeated key: "severity" is rendered once, with the value given.
    rules = _rules({"prometheusRule": {"enabled": True, "alertLabels": {"severity": "page"}}})
    assert {r["labels"]["severity"] for r in rules.values()} == {"page"}
    with pytest.raises(ValueError, match=r"repeats \.a"):
        load_objects("a: 1\nb: 2\na: 3\n", "text")


def test_the_pending_alert_is_a_ratio_of_the_limit_the_pods_get() -> None:
    objects = manifests(SCENARIOS["prometheus-rule"])
    (config,) = [c for c in kind(objects, "ConfigMap") if c["metadata"]["name"] == FULLNAME]
    limit = Settings.from_env(
        {**config["data"], "PURGATORY_ALLOW_UNAUTHENTICATED": "true"}
    ).max_pending
    assert _rules(SCENARIOS["prometheus-rule"])["PurgatoryPendingNearLimit"]["expr"].endswith(
        f"> 0.8 * {limit}"
    )


def test_the_dashboard_shows_pending_outcomes_latencies_and_lag() -> None:
    config = _dashboard_configmap()
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config["metadata"]["annotations"] == {"grafana_folder": "Pipelines"}
    dashboard = _dashboard()
    panels = {p["title"]: p for p in dashboard["panels"] if p["type"] != "row"}
    used = {name for query in _queries(dashboard) for name in _METRIC.findall(query)}
    for title, metric in (
        ("Pending operations", "purgatory_pending_operations"),
        ("Outcomes", "purgatory_outcomes_total"),
        ("Registration to outcome", "purgatory_registration_to_outcome_seconds_bucket"),
        ("Signal to callback", "purgatory_signal_to_callback_seconds_bucket"),
        ("Reaper lateness", "purgatory_reaper_lateness_seconds_bucket"),
        ("Completion executor", "purgatory_executor_lag_seconds"),
        ("Consumer lag", "purgatory_consumer_lag"),
    ):
        assert metric in json.dumps(panels[title]["targets"]), title
        assert metric in used
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in dashboard["templating"]["list"]} == {
        "datasource",
        "namespace",
        "job",
        "pod",
    }


def _unit(panel: dict[str, Any], ref_id: str) -> str:
    """The unit a panel shows one of its targets in: an override for its refId, or the default."""
    unit: str = panel["fieldConfig"]["defaults"]["unit"]
    for override in panel["fieldConfig"]["overrides"]:
        if override["matcher"] == {"id": "byFrameRefID", "options": ref_id}:
            for prop in override["properties"]:
                if prop["id"] == "unit":
                    unit = prop["value"]
    return unit


def test_the_dashboard_shows_durations_in_seconds_and_counts_as_counts() -> None:
    # A p99 of 0.012 s on the axis of 500 requests/s is a flat line at zero.
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            seconds = "histogram_quantile(" in expr or (
                "rate(" not in expr and re.search(r"_seconds\{", expr) is not None
            )
            unit = _unit(panel, target["refId"])
            assert (unit == "s") == seconds, f"{panel['title']} {target['refId']}: {unit}"


def _calls(expr: str, function: str) -> Iterator[str]:
    """The argument text of every call of ``function`` in a PromQL expression."""
    for match in re.finditer(rf"\b{function}\(", expr):
        depth = 0
        for end in range(match.end() - 1, len(expr)):
            depth += {"(": 1, ")": -1}.get(expr[end], 0)
            if depth == 0:
                yield expr[match.end() : end]
                break
        else:
            pytest.fail(f"unbalanced call of {function} in {expr}")


def _metric_types() -> dict[str, str]:
    """Each series name the service exports, as a query names it -> its metric type."""
    metrics = Metrics()
    types = dict.fromkeys(metrics.names(), "gauge")
    for family in metrics.registry.collect():
        if family.type == "gauge":  # the process collector's, beside the scrape-time ones
            types[family.name] = "gauge"
        elif family.type == "counter":
            types[f"{family.name}_total"] = "counter"
        elif family.type == "histogram":
            del types[family.name]
            types.update({f"{family.name}{s}": "histogram" for s in ("_bucket", "_sum", "_count")})
    return types


def _all_queries() -> list[str]:
    rules = _rules(SCENARIOS["prometheus-rule"])
    return [rule["expr"] for rule in rules.values()] + list(_queries(_dashboard()))


def test_every_query_applies_functions_to_the_right_metric_types() -> None:
    types = _metric_types()
    assert types["purgatory_outcomes_total"] == "counter"
    assert types["purgatory_reaper_lateness_seconds_bucket"] == "histogram"
    assert types["purgatory_pending_operations"] == "gauge"
    assert types["process_resident_memory_bytes"] == "gauge"
    assert types["process_cpu_seconds_total"] == "counter"
    for expr in _all_queries():
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), expr
        used = _METRIC.findall(expr)
        assert all(name in types for name in used), expr
        in_rates = {
            name
            for function in ("rate", "irate", "increase")
            for argument in _calls(expr, function)
            for name in _METRIC.findall(argument)
        }
        # rate() and increase() take counters (and histogram buckets), never gauges.
        assert all(types[name] in ("counter", "histogram") for name in in_rates), expr
        # Buckets are only read as a rate, by histogram_quantile, summed by le.
        if any(name.endswith("_bucket") for name in used):
            (argument,) = _calls(expr, "histogram_quantile")
            assert set(_METRIC.findall(argument)) <= in_rates, expr
            (by,) = re.findall(r"\bby \(([^)]*)\)", argument)
            assert "le" in [label.strip() for label in by.split(",")], expr
        for quantile in _calls(expr, "histogram_quantile"):
            assert re.match(r"0\.[0-9]+, ", quantile), expr


def _served(exposition: str) -> set[str]:
    """Every series name a scrape declares, as a query would name it."""
    names: set[str] = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind_ = line.split()
            if kind_ == "histogram":
                names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
            elif kind_ == "counter":
                names.add(name if name.endswith("_total") else f"{name}_total")
            else:
                names.add(name)
        elif line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    return names


@pytest.mark.kafka
async def test_every_metric_in_the_alerts_and_the_dashboard_is_served(
    kafka_broker: EmbeddedBroker,
) -> None:
    rules = _rules(SCENARIOS["prometheus-rule"])
    queried = {name for rule in rules.values() for name in _METRIC.findall(rule["expr"])}
    queried |= {name for query in _queries(_dashboard()) for name in _METRIC.findall(query)}
    assert len(queried) >= 20

    prefix = f"h{uuid.uuid4().hex[:10]}"
    topics = {
        f"topic_{role}": f"{prefix}.{role.replace('_', '-')}"
        for role in ("requests", "signals", "callbacks", "dead_letters", "changelog")
    }
    kafka_broker.create_topics(dict.fromkeys(topics.values(), 1))
    settings = Settings.from_env(
        {},
        kafka_bootstrap_servers=kafka_broker.bootstrap_servers,
        kafka_group_id=f"{prefix}-group",
        kafka_static_partitions=(0,),
        topic_partitions=1,
        http_port=free_port(),
        **topics,
    )
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        with trio.fail_after(30):
            await nursery.start(
                lambda task_status: run_service(settings, stop=stop, task_status=task_status)
            )
        url = f"http://{settings.http_host}:{settings.http_port}"
        async with httpx.AsyncClient(base_url=url, timeout=10) as client:
            alive = await client.get("/healthz")
            scrape = await client.get("/metrics")
        stop.set()
    assert alive.status_code == 200
    assert scrape.status_code == 200
    served = _served(scrape.text)
    assert "purgatory_ready" in served
    assert queried - served == set()
