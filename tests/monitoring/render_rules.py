"""The chart's alert rules as a Prometheus rules file, beside the promtool tests that check them.

The chart ships its alerts as a Prometheus Operator ``PrometheusRule``; its ``spec`` is exactly
a Prometheus rules file (``groups:``). This renders the chart with the real Helm SDK (see
``tests/helm/_chart.py``) and writes that file as ``purgatory-rules.yaml``, with copies of the
promtool unit tests of ``alerts/`` beside it, since promtool reads ``rule_files`` relative to a
test file::

    .venv/bin/python -m tests.monitoring.render_rules build/alerts
    promtool check rules build/alerts/purgatory-rules.yaml
    promtool test rules build/alerts/*_test.yaml

The unit tests are written for the default values, rendered as release ``rel`` in namespace
``pipelines`` (``RULES_VALUES``); ``--values`` renders other values (then only
``promtool check rules`` applies).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.helm._chart import kind, manifests

__all__ = ["ALERT_TESTS", "RULES_FILE", "RULES_VALUES", "main", "rules_spec", "write_rules"]

#: The promtool unit tests, one file per alert (and one for a quiet service).
ALERT_TESTS = Path(__file__).resolve().parent / "alerts"
#: The name the unit tests give their ``rule_files``.
RULES_FILE = "purgatory-rules.yaml"
#: The values the unit tests are written for: the chart's defaults, with the alerts on.
RULES_VALUES: dict[str, Any] = {"prometheusRule": {"enabled": True}}


def rules_spec(values: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The ``spec`` of the rendered PrometheusRule: a Prometheus rules file (``groups``).

    Args:
        values: Helm values; ``RULES_VALUES`` by default.

    Raises:
        ValueError: the values render no PrometheusRule (``prometheusRule.enabled`` false).
    """
    rules = kind(manifests(RULES_VALUES if values is None else values), "PrometheusRule")
    if len(rules) != 1:
        raise ValueError(f"expected one PrometheusRule, the chart rendered {len(rules)}")
    spec: dict[str, Any] = rules[0]["spec"]
    return spec


def write_rules(out: Path, values: Mapping[str, Any] | None = None) -> Path:
    """Write ``RULES_FILE`` into ``out`` (created if missing) with copies of the unit tests.

    Args:
        out: the directory to write into.
        values: Helm values; ``RULES_VALUES`` by default.

    Returns:
        The path of the rules file.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / RULES_FILE
    text = yaml.safe_dump(rules_spec(values), sort_keys=False, width=1_000, allow_unicode=True)
    path.write_text(text)
    for test in sorted(ALERT_TESTS.glob("*_test.yaml")):
        shutil.copyfile(test, out / test.name)
    return path


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tests.monitoring.render_rules OUT [--values FILE]``."""
    parser = argparse.ArgumentParser(prog="python -m tests.monitoring.render_rules")
    parser.add_argument("out", type=Path, help="directory to write purgatory-rules.yaml into")
    parser.add_argument("--values", type=Path, help="a Helm values file (default: the defaults)")
    args = parser.parse_args(argv)
    values = RULES_VALUES
    if args.values is not None:
        loaded = yaml.safe_load(args.values.read_text()) or {}
        values = {**loaded, "prometheusRule": {**loaded.get("prometheusRule", {}), "enabled": True}}
    print(write_rules(args.out, values))
    return 0


if __name__ == "__main__":
    sys.exit(main())
