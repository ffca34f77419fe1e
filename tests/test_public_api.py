"""Every package re-exports its public names with a sorted ``__all__``; the core stays pure."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

PACKAGES = [
    "purgatory",
    "purgatory._core",
    "purgatory._codec",
    "purgatory.client",
    "purgatory.service",
    "reaper",
]


def _isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions: the order ruff's RUF022 keeps."""
    if name.isupper():
        return (0, name)
    return (1, name) if name[0].isupper() else (2, name)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_sorted_unique_and_resolvable(package: str) -> None:
    module = importlib.import_module(package)
    names = list(module.__all__)
    assert names == sorted(names, key=_isort_key)
    assert len(set(names)) == len(names)
    for name in names:
        assert hasattr(module, name), f"{package}.{name} is listed but missing"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_public_name_is_listed(package: str) -> None:
    module = importlib.import_module(package)
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }
    assert public <= set(module.__all__)


def test_import_purgatory_does_not_import_trio_or_any_io_library() -> None:
    code = (
        "import sys, purgatory; "
        "bad = sorted(m for m in ('trio', 'kafka', 'structlog', 'prometheus_client', 'pyspark') "
        "if m in sys.modules); print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
