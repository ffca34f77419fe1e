"""The composition root stays a composition root: small, and wiring parts by objects.

Every callable ``app.Service`` hands from one part to another is a place where a lower stage
calls back up, out of sight of a reader who follows the flow. These tests count them, in each
delivery mode, by reading ``app.py``'s ``Service`` and evaluating every argument, mapping value
and assignment there against a service built over the in-memory broker (the version before the
stages returned their decisions handed over 35).
"""

from __future__ import annotations

import ast
import functools
import inspect
import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from purgatory.service import app
from purgatory.service.app import Service, topics_of
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport

APP = Path(app.__file__)
MAX_LINES = 450
MAX_HANDED = 15
#: The delivery mode named: its enum's members, or the setting read (``settings.delivery``,
#: ``x.delivery is ...``); not a record's delivery (``item.delivery``).
MODE_NAMED = r"\bDelivery\.(ACKNOWLEDGED|TRANSACTIONAL)\b|\bsettings\.delivery\b|\.delivery\s+is\b"

MODES = {
    "unjournaled": {"PURGATORY_JOURNAL": "false"},
    "acknowledged": {},
    "transactional": {"PURGATORY_DELIVERY": "transactional"},
}


def _wiring() -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The methods of ``Service``."""
    tree = ast.parse(APP.read_text("utf-8"))
    [service] = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Service"]
    return [n for n in service.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _handed(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.expr]:
    """The expressions handed to another part: call arguments (but the tasks a nursery
    starts: running a part is not wiring it), the values of a mapping, and assignments to
    another part's attributes."""
    handed: list[ast.expr] = []
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and func.attr in {"start", "start_soon"}:
                continue
            handed += [*sub.args, *(k.value for k in sub.keywords)]
        elif isinstance(sub, ast.Dict):
            handed += sub.values
        elif isinstance(sub, ast.Assign) and any(
            isinstance(t, ast.Attribute)
            and not (isinstance(t.value, ast.Name) and t.value.id == "self")
            for t in sub.targets
        ):
            handed.append(sub.value)  # self.part.attribute = ...: set on another part
    return handed


def _is_callable(value: Any) -> bool:
    return (
        inspect.ismethod(value)
        or inspect.isfunction(value)
        or inspect.isbuiltin(value)
        or isinstance(value, functools.partial)
    )


def _callables(service: Service) -> list[str]:
    """The callables the wiring hands between parts, as written in ``app.py``."""
    namespace = {
        "self": service,
        "settings": service.settings,
        "clock": service.clock,
        "source": service.source,
    }
    found: list[str] = []
    for method in _wiring():
        for expr in _handed(method):
            text = ast.unparse(expr)
            if isinstance(expr, ast.Lambda):
                found.append(f"{method.name}: {text}")
                continue
            if not isinstance(expr, ast.Attribute):
                continue  # a name, a constant, a call's result: an object built here
            try:
                value = eval(compile(ast.Expression(expr), str(APP), "eval"), {}, namespace)
            except (AttributeError, NameError):
                continue  # a part of another mode (None here), or a local built in place
            if _is_callable(value):
                found.append(f"{method.name}: {text}")
    return found


@pytest.mark.parametrize("mode", sorted(MODES))
async def test_the_composition_root_hands_few_callables_between_parts(
    mode: str, autojump_clock: trio.testing.MockClock
) -> None:
    settings = Settings.from_env({**MODES[mode], "PURGATORY_TOPIC_PARTITIONS": "2"})
    transport = FakeTransport(FakeBroker(dict.fromkeys(topics_of(settings), 2)))
    async with (
        transport.open_sink() as sink,
        transport.open_reader(read_committed=mode == "transactional") as reader,
        transport.open_source(
            topics=[settings.topic_requests, settings.topic_signals],
            group_id=settings.kafka_group_id,
            assignment=None,
        ) as source,
        transport.open_transactions(
            id_prefix=settings.kafka_group_id, group_id=settings.kafka_group_id
        ) as transactions,
    ):
        service = Service(
            settings,
            Clock(),
            source,
            sink,
            reader,
            transactions=transactions if mode == "transactional" else None,
        )
        handed = _callables(service)
    assert len(handed) <= MAX_HANDED, "\n".join(handed)
    assert handed, "the count found nothing: the wiring moved out of what it reads"


def test_the_composition_root_is_small() -> None:
    lines = len(APP.read_text("utf-8").splitlines())
    assert lines <= MAX_LINES, f"app.py has {lines} lines"


def test_the_delivery_mode_is_named_in_one_factory_only() -> None:
    root = APP.parents[2]
    allowed = {
        "purgatory/service/settings.py",  # where it is read from the environment
        "purgatory/service/journal/modes.py",  # the one factory
    }
    naming = []
    for path in sorted((root / "purgatory").rglob("*.py")):
        name = str(path.relative_to(root))
        text = path.read_text("utf-8")
        if name not in allowed and re.search(MODE_NAMED, text):
            naming.append(name)
    assert naming == []
