"""Structured logs (service layer concept: logging; the core never logs).

One event per line: with ``fmt="json"`` each line is a JSON object with ``timestamp`` (ISO 8601,
UTC, ``Z``), ``level``, ``event`` (a snake_case fact such as ``operation_expired``) and every
bound key (``op_id``, ``scope``, ``key``...). ``fmt="console"`` writes the same events as aligned
text for a terminal. The pipeline is structlog's own (no stdlib ``logging``): events below the
level are dropped by the bound logger before any processor runs, and the rest are written to one
stream with a single ``write`` per line.

Keys bound with :func:`structlog.contextvars.bind_contextvars` are merged into every event of the
current trio task (trio gives each task its own context), so a request handler can bind
``op_id`` once.
"""

from __future__ import annotations

import sys
from typing import TextIO, cast

import structlog
from structlog.typing import FilteringBoundLogger, Processor

from purgatory._core import ConfigError

__all__ = ["LEVELS", "configure_logging", "get_logger", "logs_enabled"]

#: Level names accepted by :func:`configure_logging`, with their numeric values.
LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}

_FORMATS = ("json", "console")

# The configured level, so that a hot path can skip building a per-record event entirely (a
# filtered structlog call still costs a lazy proxy lookup and the keyword arguments).
_level = {"number": LEVELS["info"]}


def logs_enabled(level: str) -> bool:
    """Whether events of ``level`` are written under the current configuration (cheap)."""
    return LEVELS[level] >= _level["number"]


def configure_logging(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Configure structlog for the whole process; calling it again replaces the configuration.

    Loggers are not cached on first use, so a module-level logger (``get_logger()`` at import
    time) follows a later call too: tests capture output by calling this with their own stream.

    Args:
        level: ``debug``, ``info``, ``warning``, ``error`` or ``critical`` (any case).
        fmt: ``json`` (one JSON object per line) or ``console`` (text for a terminal).
        stream: where lines are written; ``sys.stderr`` (as it is at the time of the call) by
            default.

    Raises:
        ConfigError: naming the argument if ``level`` or ``fmt`` is not one of the above.
    """
    number = LEVELS.get(str(level).lower())
    if number is None:
        raise ConfigError(f"level: must be one of {', '.join(LEVELS)}, got {level!r}")
    fmt = str(fmt).lower()
    if fmt not in _FORMATS:
        raise ConfigError(f"fmt: must be one of {', '.join(_FORMATS)}, got {fmt!r}")
    out = sys.stderr if stream is None else stream
    _level["number"] = number
    processors: list[Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
        structlog.processors.StackInfoRenderer(),
    ]
    if fmt == "json":
        processors += [
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ]
    else:
        colors = bool(getattr(out, "isatty", lambda: False)())
        processors.append(structlog.dev.ConsoleRenderer(colors=colors))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(number),
        logger_factory=structlog.WriteLoggerFactory(file=out),
        context_class=dict,
        cache_logger_on_first_use=False,
    )


def get_logger(**bound: object) -> FilteringBoundLogger:
    """A logger whose events carry ``bound`` keys (for example ``scope=...``).

    Args:
        bound: keys and values added to every event of this logger.

    Returns:
        A lazy logger: it uses the configuration current when an event is logged.
    """
    return cast(FilteringBoundLogger, structlog.get_logger(**bound))
