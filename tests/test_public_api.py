"""Every package re-exports its public names with a sorted ``__all__``; the core stays pure.

The public names are pinned here, so that a change to them is deliberate: a name a user needs
is added to its package and here; what only tests and other modules use stays private, imported
from the module that defines it.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import tomllib
import types
from pathlib import Path

import pytest

PACKAGES = [
    "purgatory",
    "purgatory._core",
    "purgatory._codec",
    "purgatory.client",
    "purgatory.service",
    "reaper",
    "spark_bridge",
]

PUBLIC: dict[str, set[str]] = {
    "purgatory": {
        # Kafka's request purgatory (the core contract of DESIGN.md)
        "Timer",
        "TimerTask",
        "DelayedOperation",
        "DelayedOperationPurgatory",
        "TimerStatistics",
        "PurgatoryStatistics",
        # Flink's keyed timers and state TTL
        "KeyedTimers",
        "TimeDomain",
        "FiredTimer",
        "KeyedTimersStatistics",
        "TtlState",
        "TtlConfig",
        "UpdateType",
        "StateVisibility",
        "CleanupStrategy",
        "TtlEntry",
        "TtlStatistics",
        # key groups
        "MAX_KEY_GROUPS",
        "key_group_for",
        "key_group_range_for_operator",
        "operator_index_for_key_group",
        # the engine
        "Engine",
        "EngineConfig",
        "EngineStatistics",
        "OperationSpec",
        "Condition",
        "Registration",
        "RegistrationStatus",
        "Outcome",
        "OutcomeKind",
        "MAX_TIME_MS",
        # durability
        "snapshot_engine",
        "restore_engine",
        "JournalRecorder",
        "replay_journal",
        # errors
        "PurgatoryError",
        "UsageError",
        "ConflictError",
        "LimitError",
        "SizeLimitError",
        "BadRecordError",
        "ConfigError",
        "TransportError",
    },
    "purgatory.client": {"ApiError", "AsyncPurgatoryClient", "PurgatoryClient", "operation"},
    "purgatory.service": {"Settings", "main", "run_service"},
    "reaper": {
        "Clock",
        "CompletionExecutor",
        "ExecutorStatistics",
        "Expirable",
        "Reaper",
        "ReaperStatistics",
    },
    "spark_bridge": {
        "CALLBACKS_SCHEMA",
        "KAFKA_CONNECTOR_PACKAGE",
        "BarrierTimeoutError",
        "Driver",
        "RowError",
        "callbacks_from_kafka",
        "dedupe",
        "local_session",
        "operations_to_kafka",
        "register_data_sources",
        "signals_to_kafka",
        "watermarks_to_kafka",
    },
}

# The names DESIGN.md promises (tests outside the repository import them from purgatory).
DESIGN_CONTRACT = {"Timer", "TimerTask", "DelayedOperation", "DelayedOperationPurgatory"}

PYPROJECT = Path(__file__).parent.parent / "pyproject.toml"


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


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_the_public_names_are_exactly_the_pinned_ones(package: str) -> None:
    module = importlib.import_module(package)
    names = set(module.__all__)
    assert names - PUBLIC[package] == set(), "new public names: pin them here on purpose"
    assert PUBLIC[package] - names == set(), "public names gone: drop them here on purpose"


def test_the_design_contract_is_importable_from_purgatory() -> None:
    assert DESIGN_CONTRACT.issubset(PUBLIC["purgatory"])
    module = importlib.import_module("purgatory")
    for name in DESIGN_CONTRACT:
        assert isinstance(getattr(module, name), type)


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_the_package_docstring_lists_every_public_name_with_a_line(package: str) -> None:
    """``help(package)`` opens with its public API: a line for each name, and its docstring."""
    module = importlib.import_module(package)
    doc = module.__doc__ or ""
    for name in module.__all__:
        assert re.search(rf"^\* :\w+:`{re.escape(name)}` -- ", doc, re.MULTILINE), (
            f"{package}'s docstring does not list {name}"
        )
        value = getattr(module, name)
        if isinstance(value, type | types.FunctionType):
            assert (value.__doc__ or "").strip(), f"{package}.{name} has no docstring"


def test_the_private_names_stay_in_the_core() -> None:
    """Names only tests and other modules use are importable from the core, not from purgatory."""
    core = importlib.import_module("purgatory._core")
    purgatory = importlib.import_module("purgatory")
    for name in ("encode_entry", "decode_entry", "SignalFact", "murmur_hash", "SNAPSHOT_VERSION"):
        assert hasattr(core, name)
        assert not hasattr(purgatory, name)


def test_the_console_scripts_resolve() -> None:
    scripts = tomllib.loads(PYPROJECT.read_text("utf-8"))["project"]["scripts"]
    assert set(scripts) == {"purgatory", "purgatory-pipeline"}
    for target in scripts.values():
        module_name, _, attr = target.partition(":")
        assert callable(getattr(importlib.import_module(module_name), attr))


def test_purgatory_demo_points_to_the_pipeline_demo(capsys: pytest.CaptureFixture[str]) -> None:
    """The whole-pipeline demo lives on the Spark side; the service's command says where."""
    from purgatory.service import main  # noqa: PLC0415

    assert main(["demo"]) == 2
    assert "purgatory-pipeline" in capsys.readouterr().err


def test_import_purgatory_does_not_import_trio_or_any_io_library() -> None:
    code = (
        "import sys, purgatory; "
        "bad = sorted(m for m in ('trio', 'kafka', 'structlog', 'prometheus_client', 'pyspark') "
        "if m in sys.modules); print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_the_service_does_not_import_spark() -> None:
    code = (
        "import sys, purgatory.service, purgatory.client; "
        "print(','.join(sorted(m for m in ('spark_bridge', 'pyspark') if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
