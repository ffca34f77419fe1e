"""Structured logs: JSON lines with a UTC timestamp, the level, the event and the bound keys."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog

from purgatory._core import ConfigError
from purgatory.service.telemetry.logging import configure_logging, get_logger

_module_logger = get_logger(component="test")  # created before any configuration


@pytest.fixture(autouse=True)
def _restore_structlog() -> Iterator[None]:
    yield
    structlog.contextvars.clear_contextvars()
    structlog.reset_defaults()


def lines_of(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_json_lines_carry_timestamp_level_event_and_bound_keys() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    before = datetime.now(UTC)
    get_logger(scope="nightly").info("operation_expired", op_id="op-1", key="ingest/orders")
    (line,) = lines_of(out)
    assert line["event"] == "operation_expired"
    assert line["level"] == "info"
    assert (line["op_id"], line["scope"], line["key"]) == ("op-1", "nightly", "ingest/orders")
    assert line["timestamp"].endswith("Z")
    stamp = datetime.fromisoformat(line["timestamp"])
    assert stamp.utcoffset() == timedelta(0)
    assert before - timedelta(seconds=5) <= stamp <= datetime.now(UTC) + timedelta(seconds=5)


def test_events_below_the_level_are_dropped() -> None:
    out = io.StringIO()
    configure_logging("WARNING", "json", out)
    log = get_logger()
    log.debug("not_written")
    log.info("not_written_either")
    log.warning("written")
    log.error("written_too")
    assert [(line["event"], line["level"]) for line in lines_of(out)] == [
        ("written", "warning"),
        ("written_too", "error"),
    ]


def test_configuring_twice_replaces_without_duplicating() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", first)
    configure_logging("info", "json", second)
    configure_logging("info", "json", second)
    _module_logger.info("started")
    assert first.getvalue() == ""
    assert [line["event"] for line in lines_of(second)] == ["started"]
    assert lines_of(second)[0]["component"] == "test"


def test_a_logger_follows_a_later_configuration() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("info", "json", first)
    _module_logger.info("one")
    configure_logging("debug", "json", second)
    _module_logger.debug("two")
    assert [line["event"] for line in lines_of(first)] == ["one"]
    assert [line["event"] for line in lines_of(second)] == ["two"]


def test_context_variables_are_merged() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    structlog.contextvars.bind_contextvars(op_id="op-9")
    get_logger().info("signal_applied", key="k")
    (line,) = lines_of(out)
    assert (line["op_id"], line["key"]) == ("op-9", "k")


def test_exceptions_are_rendered_into_the_line() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    try:
        raise RuntimeError("broker went away")
    except RuntimeError:
        get_logger().exception("callback_failed")
    (line,) = lines_of(out)
    assert line["level"] == "error"
    assert "RuntimeError: broker went away" in line["exception"]


def test_values_json_cannot_encode_are_written_as_text() -> None:
    out = io.StringIO()
    configure_logging("info", "json", out)
    get_logger().info("odd_value", value={1, 2}.__class__, when=datetime(2026, 1, 1, tzinfo=UTC))
    (line,) = lines_of(out)
    assert isinstance(line["value"], str) and isinstance(line["when"], str)


def test_console_format_is_text() -> None:
    out = io.StringIO()
    configure_logging("info", "console", out)
    get_logger().info("service_ready", http="127.0.0.1:8080")
    text = out.getvalue()
    assert "service_ready" in text and "http=127.0.0.1:8080" in text
    with pytest.raises(json.JSONDecodeError):
        json.loads(text)


def test_defaults_to_standard_error(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", "json")
    get_logger().info("to_stderr")
    captured = capsys.readouterr()
    assert captured.out == ""
    assert json.loads(captured.err)["event"] == "to_stderr"


def test_bad_arguments_name_themselves() -> None:
    with pytest.raises(ConfigError, match=r"^level: must be one of debug, info"):
        configure_logging("verbose", "json")
    with pytest.raises(ConfigError, match=r"^fmt: must be one of json, console"):
        configure_logging("info", "xml")
