"""The service's page (docs/service.md) documents every setting and every metric it has."""

from __future__ import annotations

from pathlib import Path

from purgatory.service.settings import Settings
from purgatory.service.telemetry.metrics import Metrics

README = (Path(__file__).parent.parent / "docs" / "service.md").read_text("utf-8")


def test_every_setting_is_documented() -> None:
    missing = [name for name, _, _ in Settings.describe() if f"`{name}`" not in README]
    assert not missing, f"docs/service.md lacks {missing}"


def test_every_metric_is_documented() -> None:
    missing = [name for name in sorted(Metrics().names()) if f"`{name}" not in README]
    assert not missing, f"docs/service.md lacks {missing}"
