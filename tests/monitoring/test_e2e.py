"""A real Prometheus scrapes a real ``purgatory serve`` under a scripted workload.

The service runs as a child process on each of the session's brokers (topics of its own, two
partitions); Prometheus scrapes it every second as job ``rel-purgatory`` with the target labels
``namespace="pipelines"`` and ``pod="rel-purgatory-0"`` (what the chart's ServiceMonitor gives a
release ``rel``), and evaluates the chart's rendered alert rules every second.

A warm-up first: a barrier registered and signalled over HTTP, one registered and cancelled, and
one registered and signalled through Kafka. Series labelled by what they count (an HTTP status,
a topic) are born with their first increment, which ``rate()`` cannot see; after the warm-up
they exist, as they do on any service that has run a while. Then the workload:

* 6 barriers registered over HTTP and completed by their signals;
* 4 barriers left waiting (their deadline is beyond the test);
* 2 barriers registered and cancelled;
* 3 timers of 1 s that expire;
* 1 registration whose deadline had passed a minute before it arrived: it expires at once, is
  counted overdue, and adds no lateness;
* 1 record on the requests topic that does not decode: a dead letter.

Then every query of the shipped dashboard (its variables set as Grafana would, all pods) and
every alert's expression is asked of Prometheus' HTTP API, and each must return the series it
is meant to, with values that fit the workload: outcome counts as registered, rates never
negative, the ready gauge 1. Of the alerts, only ``PurgatoryDeadLetters`` fires, and the
server's own evaluation of every rule is healthy; ``promtool check metrics`` passes the
exposition. Then the service restarts: its counters start again at 0, yet no panel shows a value
below 0, ``increase()`` still counts the workload's outcomes, the waiting barriers are restored,
and the alerts stand as they were. The values seen before the restart are written to
``docs/monitoring-e2e.json`` (and the table of ``docs/monitoring.md``) when
``PURGATORY_RECORD_MONITORING=1``.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from kafka import KafkaProducer

from purgatory._codec import RegisterRequest, SignalRecord, encode_request, encode_signal
from purgatory.client import PurgatoryClient
from purgatory.devtools.broker import Broker
from purgatory.service.settings import Settings
from tests.helm._chart import FULLNAME, NAMESPACE, SCENARIOS, kind, manifests
from tests.monitoring._prometheus import Prometheus, Sample, binary, pause, run_prometheus
from tests.monitoring.render_rules import rules_spec, write_rules
from tests.service.end_to_end.test_e2e import _settings
from tests.service.end_to_end.test_sigkill import Child

pytestmark = [pytest.mark.kafka, pytest.mark.helm, pytest.mark.prometheus]

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "docs" / "monitoring-e2e.json"
TABLE = ROOT / "docs" / "monitoring.md"
TABLE_BEGIN = "<!-- panels: generated from monitoring-e2e.json by tests/monitoring/test_e2e.py -->"
TABLE_END = "<!-- /panels -->"

JOB = FULLNAME
POD = f"{FULLNAME}-0"
SELECTOR = f'job="{JOB}",namespace="{NAMESPACE}"'
# Grafana's $__rate_interval is at least four scrape intervals; one minute covers the run.
RATE_WINDOW_S = 60
RATE_INTERVAL = f"{RATE_WINDOW_S}s"
VARIABLES = {
    "$namespace": NAMESPACE,
    "$job": JOB,
    "$pod": ".*",  # "All"
    "$__rate_interval": RATE_INTERVAL,
}

SCOPE = "monitoring"
LONG_MS = 600_000
COMPLETED = 6
WAITING = 4
CANCELLED = 2
TIMERS = 3
TIMER_MS = 1_000
OVERDUE = 1
INVALID = 1
WARM_UP = {"completed": 2, "expired": 0, "cancelled": 1}
WARM_UP_REGISTERED = 3
REGISTERED = WARM_UP_REGISTERED + COMPLETED + WAITING + CANCELLED + TIMERS + OVERDUE
EXPECTED_OUTCOMES = {
    "completed": WARM_UP["completed"] + COMPLETED,
    "expired": TIMERS + OVERDUE,
    "cancelled": WARM_UP["cancelled"] + CANCELLED,
}


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _produce(broker: Broker, records: list[tuple[str, bytes]]) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap_servers, linger_ms=0)
    try:
        for topic, value in records:
            producer.send(topic, key=SCOPE.encode(), value=value)
        producer.flush(timeout=10)
    finally:
        producer.close(timeout=5)


def _warm_up(url: str, broker: Broker, settings: Settings) -> None:
    with PurgatoryClient(url, timeout_s=10) as client:
        client.register(scope=SCOPE, op_id="warm-done", keys=["warm"], timeout_ms=LONG_MS)
        client.signals([{"scope": SCOPE, "key": "warm"}])
        client.register(scope=SCOPE, op_id="warm-cancel", keys=["warm-c"], timeout_ms=LONG_MS)
        client.cancel(SCOPE, "warm-cancel")
    request = RegisterRequest(op_id="warm-kafka", scope=SCOPE, keys=("warm-k",), timeout_ms=LONG_MS)
    _produce(broker, [(settings.topic_requests, encode_request(request))])
    _produce(broker, [(settings.topic_signals, encode_signal(SignalRecord(SCOPE, "warm-k")))])


def _workload(url: str, broker: Broker, settings: Settings) -> None:
    with PurgatoryClient(url, timeout_s=10) as client:
        for i in range(COMPLETED):
            client.register(scope=SCOPE, op_id=f"done-{i}", keys=[f"k{i}"], timeout_ms=LONG_MS)
        for i in range(WAITING):
            client.register(scope=SCOPE, op_id=f"waits-{i}", keys=[f"w{i}"], timeout_ms=LONG_MS)
        for i in range(CANCELLED):
            client.register(scope=SCOPE, op_id=f"cancel-{i}", keys=[f"c{i}"], timeout_ms=LONG_MS)
            client.cancel(SCOPE, f"cancel-{i}")
        for i in range(TIMERS):
            client.register(scope=SCOPE, op_id=f"timer-{i}", timeout_ms=TIMER_MS)
        client.register(
            scope=SCOPE, op_id="overdue-0", keys=["o0"], deadline_ms=_wall_ms() - 60_000
        )
        client.signals([{"scope": SCOPE, "key": f"k{i}"} for i in range(COMPLETED)])
    _produce(broker, [(settings.topic_requests, b"{not json")] * INVALID)


# -- the dashboard and the alerts, as shipped -------------------------------------------------


def _dashboard() -> dict[str, Any]:
    (config,) = [
        c
        for c in kind(manifests(SCENARIOS["grafana-dashboard"]), "ConfigMap")
        if c["metadata"]["name"] == f"{FULLNAME}-dashboard"
    ]
    loaded: dict[str, Any] = json.loads(config["data"]["purgatory.json"])
    return loaded


def _unit(panel: dict[str, Any], ref_id: str) -> str:
    unit: str = panel["fieldConfig"]["defaults"]["unit"]
    for override in panel["fieldConfig"]["overrides"]:
        if override["matcher"] == {"id": "byFrameRefID", "options": ref_id}:
            unit = next((p["value"] for p in override["properties"] if p["id"] == "unit"), unit)
    return unit


def _targets() -> list[dict[str, Any]]:
    """Every panel query: title, refId, legend, unit and the PromQL Grafana would send."""
    found = []
    for panel in _dashboard()["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            assert "$" not in expr, expr
            found.append(
                {
                    "title": panel["title"],
                    "ref": target["refId"],
                    "legend": target.get("legendFormat", ""),
                    "unit": _unit(panel, target["refId"]),
                    "expr": expr,
                }
            )
    return found


def _legend(legend: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m[1], ""), legend)


# An alert's expression: a level, compared with a threshold (a product of numbers).
_COMPARISON = re.compile(r"^(?P<level>.+) (?P<op>>|==) (?P<threshold>[0-9.e+]+(?: \* [0-9.e+]+)*)$")


def _conditions(expr: str) -> list[tuple[str, str, float]]:
    """``[(level query, operator, threshold)]``: one, or two joined by ``and on (...)``."""
    found = []
    for joined in expr.split(" and on (namespace, pod) "):
        part = joined[1:-1] if joined.startswith("(") and joined.endswith(")") else joined
        match = _COMPARISON.match(part)
        assert match is not None, part
        threshold = math.prod(float(x) for x in match["threshold"].split(" * "))
        found.append((match["level"], match["op"], threshold))
    return found


def _holds(value: float, op: str, threshold: float) -> bool:
    return value > threshold if op == ">" else value == threshold


# -- what the scrape must show ---------------------------------------------------------------


def _values(samples: list[Sample]) -> list[float]:
    return [s.value for s in samples]


def _by(samples: list[Sample], label: str) -> dict[str, float]:
    return {s.labels.get(label, ""): s.value for s in samples}


def _counted(rate: float, count: float, *, whole_run: bool) -> bool:
    """Whether a rate over ``RATE_INTERVAL`` fits ``count`` events (all in it if ``whole_run``).

    Every series starts at 0 before the workload, so ``rate()`` extrapolates only towards the
    window's end, by a fraction of a scrape: ``count <= rate * window``, a little above.
    """
    if not whole_run:  # the workload's start may have left the window: only an upper bound
        return 0 < rate * RATE_WINDOW_S <= 1.5 * count
    return count <= rate * RATE_WINDOW_S <= 1.5 * count


def _check_panel(
    target: dict[str, Any], samples: list[Sample], topics: dict[str, str], *, whole_run: bool
) -> None:
    title, ref = target["title"], target["ref"]
    where = f"{title} {ref}: {samples}"
    assert samples, where
    # Quantiles of a histogram with no observation in the window are NaN; nothing else is.
    quantile = "histogram_quantile(" in target["expr"]
    finite = [v for v in _values(samples) if not math.isnan(v)]
    assert quantile or len(finite) == len(samples), where
    assert all(v >= 0 for v in finite), where
    if quantile:
        assert finite, where
        assert all(v <= 3600 for v in finite), where
    key = (title, ref)
    if key == ("Pending operations", "A"):
        assert _by(samples, "pod") == {POD: WAITING}, where
    elif key == ("Outcomes", "A"):
        rates = _by(samples, "outcome")
        assert set(rates) == set(EXPECTED_OUTCOMES), where
        for outcome, count in EXPECTED_OUTCOMES.items():
            assert _counted(rates[outcome], count, whole_run=whole_run), where
    elif key == ("Registrations", "A"):
        rates = _by(samples, "result")
        assert _counted(rates.pop("pending"), REGISTERED, whole_run=whole_run), where
        assert set(rates.values()) == {0}, where
    elif key == ("Signals", "A"):
        signals = WARM_UP["completed"] + COMPLETED
        assert _counted(_values(samples)[0], signals, whole_run=whole_run), where
    elif key == ("Signals", "C"):
        assert _by(samples, "topic")[topics["callbacks"]] > 0, where
    elif key == ("Registration to outcome", "A"):
        # The 1 s timers are 3 of the 4 expired: the median is 1 s at most.
        medians = _by(samples, "outcome")
        assert 0 < medians["expired"] <= TIMER_MS / 1000, where
        assert medians["completed"] < 10, where
    elif key == ("Reaper lateness", "A"):
        # The overdue registration was due when it arrived, not a minute before.
        assert finite and finite[0] < 1, where
    elif key == ("Signals", "B"):
        assert _by(samples, "topic")[topics["requests"]] > 0, where  # the record that is invalid
    elif key == ("HTTP", "A"):
        statuses = _by(samples, "status")
        assert statuses["201"] > 0, where  # registrations
        assert statuses["200"] > 0, where  # signals and cancels
        assert statuses.get("503", 0) == 0, where
    elif key == ("Completion executor", "B"):
        assert _by(samples, "pod") == {POD: 0}, where
    elif key == ("Dead letters and callback errors", "A"):
        counts = {(s.labels["topic"], s.labels["reason"]): s.value for s in samples}
        assert counts[(topics["requests"], "invalid")] >= INVALID, where
        assert sum(counts.values()) == counts[(topics["requests"], "invalid")], where
    elif key == ("Dead letters and callback errors", "B"):
        assert _values(samples) == [0], where
    elif key in (("Ready replicas", "A"), ("Ready replicas", "B")):
        assert _values(samples) == [1], where


def _check_alert(
    prom: Prometheus, name: str, expr: str, topics: dict[str, str]
) -> list[dict[str, Any]]:
    """Each condition's level returns its series; the alert returns those past the threshold."""
    fired = prom.query(expr)
    holding: list[set[tuple[tuple[str, str], ...]]] = []
    levels = []
    for level, op, threshold in _conditions(expr):
        samples = prom.query(level)
        assert samples, f"{name}: {level} returns nothing"
        # A quantile is NaN once no expiration is left in its window, and then holds nowhere.
        quantile = level.startswith("histogram_quantile(")
        assert quantile or not any(math.isnan(s.value) for s in samples), f"{name}: {samples}"
        assert all(s.value >= 0 for s in samples if not math.isnan(s.value)), f"{name}: {samples}"
        holding.append(
            {tuple(sorted(s.labels.items())) for s in samples if _holds(s.value, op, threshold)}
        )
        levels.append(
            {"query": level, "threshold": f"{op} {threshold:g}", "series": _series(samples)}
        )
        for sample in samples:
            assert sample.labels["namespace"] == NAMESPACE, f"{name}: {sample}"
            if "pod" in sample.labels:
                assert sample.labels["pod"] == POD, f"{name}: {sample}"
    expected = holding[0] if len(holding) == 1 else _joined(holding)
    assert {tuple(sorted(s.labels.items())) for s in fired} == expected, f"{name}: {fired}"
    if name == "PurgatoryDeadLetters":
        (only,) = fired
        assert only.labels == {
            "namespace": NAMESPACE,
            "topic": topics["requests"],
            "reason": "invalid",
        }
        assert INVALID <= only.value < INVALID + 0.5, fired
    else:
        assert fired == [], f"{name}: {fired}"
    return levels


def _check_alerts(prom: Prometheus, topics: dict[str, str]) -> dict[str, list[dict[str, Any]]]:
    """Every alert's levels and result; the server's own evaluation agrees with them."""
    alerts = {
        rule["alert"]: _check_alert(prom, rule["alert"], rule["expr"], topics)
        for group in rules_spec()["groups"]
        for rule in group["rules"]
    }
    prom.wait_for(
        'ALERTS{alertstate="firing"}',
        lambda s: [x.labels.get("alertname") for x in s] == ["PurgatoryDeadLetters"],
        timeout_s=15,
        what="the dead-letter alert firing, and no other",
    )
    expected = {
        name: ("ok", "", "firing" if name == "PurgatoryDeadLetters" else "inactive")
        for name in alerts
    }
    end_s = time.perf_counter() + 15
    while True:  # the rules are evaluated every second, a little after each scrape
        states = {
            rule["name"]: (rule["health"], rule.get("lastError", ""), rule["state"])
            for group in prom.api("rules")["groups"]
            for rule in group["rules"]
        }
        if states == expected or time.perf_counter() >= end_s:
            break
        pause(0.2)
    assert states == expected
    return alerts


def _check_restarted(prom: Prometheus, topics: dict[str, str], *, whole_run: bool) -> None:
    """After a restart: no rate below 0, the workload still counted, the alerts unmoved."""
    prom.wait_for(  # the consumer knows its lag a little after the partitions are restored
        f"count(sum by (topic) (purgatory_consumer_lag{{{SELECTOR}}}))",
        lambda s: _values(s) == [2],
        timeout_s=30,
        what="the restarted service's consumer lag scraped",
    )
    resets = prom.value(f"sum(resets(purgatory_outcomes_total{{{SELECTOR}}}[{RATE_INTERVAL}]))")
    assert resets == len(EXPECTED_OUTCOMES) or not whole_run, resets
    for target in _targets():
        samples = prom.query(target["expr"])
        where = f"{target['title']} {target['ref']} after the restart: {samples}"
        assert samples, where
        assert all(s.value >= 0 for s in samples if not math.isnan(s.value)), where
        if (target["title"], target["ref"]) == ("Pending operations", "A"):
            assert _by(samples, "pod") == {POD: WAITING}, where  # restored
        if target["title"] == "Ready replicas":
            assert _values(samples) == [1], where
    increases = _by(
        prom.query(
            f"sum by (outcome) (increase(purgatory_outcomes_total{{{SELECTOR}}}[{RATE_INTERVAL}]))"
        ),
        "outcome",
    )
    for outcome, count in EXPECTED_OUTCOMES.items():
        rate = increases[outcome] / RATE_WINDOW_S
        assert _counted(rate, count, whole_run=whole_run), increases
    _check_alerts(prom, topics)


def _joined(holding: list[set[tuple[tuple[str, str], ...]]]) -> set[tuple[tuple[str, str], ...]]:
    """``a and on (namespace, pod) b``: the series of ``a`` whose namespace and pod ``b`` has."""
    first, second = holding

    def on(labels: tuple[tuple[str, str], ...]) -> tuple[str | None, str | None]:
        found = dict(labels)
        return found.get("namespace"), found.get("pod")

    return {labels for labels in first if on(labels) in {on(other) for other in second}}


def _series(samples: list[Sample]) -> list[dict[str, Any]]:
    return [
        {"labels": s.labels, "value": None if math.isnan(s.value) else round(s.value, 6)}
        for s in sorted(samples, key=lambda s: sorted(s.labels.items()))
    ]


def test_prometheus_scrapes_the_service_under_a_workload(
    kafka_broker: Broker, tmp_path: Path
) -> None:
    binary("prometheus")  # fail first, and clearly, if it is missing
    settings = _settings(kafka_broker)
    topics = {
        "requests": settings.topic_requests,
        "signals": settings.topic_signals,
        "callbacks": settings.topic_callbacks,
    }
    rules = write_rules(tmp_path / "rules")
    child = Child(settings, tmp_path)
    try:
        child.start()
        child.wait_ready()
        with run_prometheus(
            tmp_path,
            job=JOB,
            target=f"127.0.0.1:{settings.http_port}",
            labels={"namespace": NAMESPACE, "pod": POD},
            rules=rules,
        ) as prom:
            started_s = time.perf_counter()
            # A scrape before the workload: every counter's rate starts from its 0.
            prom.wait_for(
                f"purgatory_ready{{{SELECTOR}}}",
                lambda s: _values(s) == [1],
                timeout_s=30,
                what="a scrape of the ready service",
            )
            _warm_up(child.url, kafka_broker, settings)
            prom.wait_for(
                f"sum by (outcome) (purgatory_outcomes_total{{{SELECTOR}}})",
                lambda s: _by(s, "outcome") == WARM_UP,
                timeout_s=30,
                what="the warm-up's outcomes scraped",
            )
            prom.wait_for(
                f"count(purgatory_records_consumed_total{{{SELECTOR}}})",
                lambda s: _values(s) == [2],
                timeout_s=30,
                what="the warm-up's records consumed scraped",
            )
            _workload(child.url, kafka_broker, settings)
            outcomes = prom.wait_for(
                f"sum by (outcome) (purgatory_outcomes_total{{{SELECTOR}}})",
                lambda s: _by(s, "outcome") == EXPECTED_OUTCOMES,
                timeout_s=30,
                what="every outcome scraped",
            )
            prom.wait_for(
                f"sum(purgatory_records_dead_lettered_total{{{SELECTOR}}})",
                lambda s: _values(s) == [INVALID],
                timeout_s=30,
                what="the dead letter scraped",
            )
            prom.wait_for(
                f"max(purgatory_executor_queue_depth{{{SELECTOR}}})",
                lambda s: _values(s) == [0],
                timeout_s=30,
                what="an idle executor scraped",
            )
            registrations = _by(
                prom.query(f"sum by (result) (purgatory_registrations_total{{{SELECTOR}}})"),
                "result",
            )
            overdue = prom.value(f"sum(purgatory_registrations_overdue_total{{{SELECTOR}}})")
            signals = prom.value(f"sum(purgatory_signals_total{{{SELECTOR}}})")
            assert registrations["pending"] == REGISTERED, registrations
            assert sum(registrations.values()) == REGISTERED, registrations
            assert overdue == OVERDUE
            assert signals == WARM_UP["completed"] + COMPLETED
            counts = {
                "outcomes": _by(outcomes, "outcome"),
                "registrations": registrations,
                "overdue": overdue,
                "signals": signals,
            }

            # The dashboard's variables: label_values(purgatory_info, ...) in Grafana.
            for label, value in (("namespace", NAMESPACE), ("job", JOB), ("pod", POD)):
                assert prom.api(f"label/{label}/values", **{"match[]": "purgatory_info"}) == [value]

            panels = []
            for target in _targets():
                samples = prom.query(target["expr"])
                whole_run = time.perf_counter() - started_s < RATE_WINDOW_S - 5
                _check_panel(target, samples, topics, whole_run=whole_run)
                panels.append(
                    {
                        **target,
                        "series": [
                            {**row, "legend": _legend(target["legend"], row["labels"])}
                            for row in _series(samples)
                        ],
                    }
                )

            alerts = _check_alerts(prom, topics)
            version = prom.api("status/buildinfo")["version"]
            # Prometheus' own lint of the exposition: names, units, help texts.
            scrape = httpx.get(f"{child.url}/metrics", timeout=5).text
            lint = subprocess.run(
                [str(binary("promtool")), "check", "metrics"],
                input=scrape,
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            assert lint.returncode == 0, lint.stdout + lint.stderr

            # A restart: the counters start again at 0, the journal restores what waits.
            assert child.terminate() == 0
            child.start()
            child.wait_ready()
            prom.wait_for(
                f"sum(purgatory_outcomes_total{{{SELECTOR}}})",
                lambda s: _values(s) == [0],
                timeout_s=30,
                what="the restarted service scraped",
            )
            # The scrapes of the new process, from now on; one of them while it is ready.
            prom.wait_for(
                f"purgatory_ready{{{SELECTOR}}}",
                lambda s: _values(s) == [1],
                timeout_s=30,
                what="the restarted service scraped ready",
            )
            _check_restarted(prom, topics, whole_run=time.perf_counter() - started_s < 55)
        assert child.terminate() == 0
    finally:
        child.close()

    record = {
        "prometheus": version,
        "scrape_interval": "1s",
        "rate_interval": RATE_INTERVAL,
        "workload": {
            "warm_up": WARM_UP,
            "completed": COMPLETED,
            "waiting": WAITING,
            "cancelled": CANCELLED,
            "timers": TIMERS,
            "timer_ms": TIMER_MS,
            "overdue": OVERDUE,
            "invalid_records": INVALID,
        },
        "counts": counts,
        "panels": panels,
        "alerts": alerts,
    }
    (tmp_path / "monitoring-e2e.json").write_text(json.dumps(record, indent=2) + "\n")
    if os.environ.get("PURGATORY_RECORD_MONITORING") == "1":
        _generalize(record, topics)
        RECORD.write_text(json.dumps(record, indent=2) + "\n")
        _write_table(record)


# -- the docs' table -------------------------------------------------------------------------


def _generalize(record: dict[str, Any], topics: dict[str, str]) -> None:
    """Name the test's own topics as the chart's defaults do, in place."""
    renames = {name: f"purgatory.{role.replace('_', '-')}" for role, name in topics.items()}

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            return {walk(k): walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(item) for item in node]
        if isinstance(node, str):
            for old, new in renames.items():
                node = node.replace(old, new)
        return node

    record.update(walk(record))


def _shown(value: float | None, unit: str) -> str:
    if value is None:
        return "NaN (none in the window)"
    text = f"{value:.3g}" if value else "0"
    return {"ops": f"{text}/s", "s": f"{text} s"}.get(unit, text)


def table(record: dict[str, Any]) -> str:
    """The Markdown table of the panels' values in a record."""
    lines = ["| Panel | Query | Series: value |", "| --- | --- | --- |"]
    for panel in record["panels"]:
        shown = "; ".join(
            f"{row['legend'] or '(value)'}: {_shown(row['value'], panel['unit'])}"
            for row in panel["series"]
        )
        lines.append(f"| {panel['title']} | {panel['ref']} | {shown.replace('|', '/')} |")
    return "\n".join(lines)


def _write_table(record: dict[str, Any]) -> None:
    text = TABLE.read_text()
    start = text.index(TABLE_BEGIN) + len(TABLE_BEGIN)
    end = text.index(TABLE_END)
    TABLE.write_text(f"{text[:start]}\n{table(record)}\n{text[end:]}")


def test_the_docs_table_shows_every_panel_as_recorded() -> None:
    record = json.loads(RECORD.read_text())
    assert [(p["title"], p["ref"]) for p in record["panels"]] == [
        (t["title"], t["ref"]) for t in _targets()
    ], "re-record: PURGATORY_RECORD_MONITORING=1 pytest tests/monitoring/test_e2e.py"
    text = TABLE.read_text()
    start = text.index(TABLE_BEGIN) + len(TABLE_BEGIN)
    assert text[start : text.index(TABLE_END)].strip() == table(record)
