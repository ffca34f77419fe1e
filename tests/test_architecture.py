"""docs/architecture.md against the code: its module lists, its two paths, its up-calls."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import trio
import trio.testing

from purgatory.service.app import Service, topics_of
from purgatory.service.settings import Settings
from reaper import Clock
from tests.service.fake_kafka import FakeBroker, FakeTransport
from tests.service.test_app import MAX_HANDED, _callables

ROOT = Path(__file__).resolve().parent.parent
SERVICE = ROOT / "purgatory" / "service"
PAGE = (ROOT / "docs" / "architecture.md").read_text("utf-8")
NUMBERS = {"four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10}
STEP = re.compile(r"^\d+\. \*\*([\w/]+\.py)\*\* \(`([\w.]+)`\)", re.M)


def _section(title: str) -> str:
    start = PAGE.index(f"## {title}")
    end = PAGE.find("\n## ", start + 1)
    return PAGE[start : end if end != -1 else None]


def _modules(package: Path) -> set[str]:
    return {str(p.relative_to(package)) for p in package.rglob("*.py") if p.name != "__init__.py"}


def test_the_table_lists_every_module_of_every_sub_package() -> None:
    rows = {
        m.group(1): set(re.findall(r"`([\w/]+\.py)`", m.group(2)))
        for m in re.finditer(r"^\| `(\w+)/` \|(.*)$", PAGE, re.M)
    }
    packages = {p.parent.name for p in SERVICE.glob("*/__init__.py")}
    assert set(rows) == packages
    for package, named in rows.items():
        assert named == _modules(SERVICE / package), package


def test_the_top_of_the_service_is_listed() -> None:
    paragraph = PAGE[PAGE.index("At the top,") : PAGE.index("Development tooling")]
    named = set(re.findall(r"`(\w+\.py)`", paragraph))
    assert named == {p.name for p in SERVICE.glob("*.py") if p.name != "__init__.py"}


def _path(title: str) -> tuple[list[tuple[str, str]], int]:
    """A path's steps (module, qualified name) and the module count its page states."""
    section = _section(title)
    steps = STEP.findall(section)
    [count] = re.findall(r"^(\w+) modules of the service", section, re.M)
    return steps, NUMBERS[count.lower()]


def _resolves(module: str, qualified: str) -> bool:
    found: object = importlib.import_module(
        "purgatory.service." + module.removesuffix(".py").replace("/", ".")
    )
    for part in qualified.split("."):
        if not hasattr(found, part):
            return False
        found = getattr(found, part)
    return callable(found)


def test_each_path_names_modules_and_methods_that_exist_and_counts_them() -> None:
    for title in ("A Kafka signal, to its callback", "An HTTP registration, to its 201"):
        steps, stated = _path(title)
        assert steps, title
        for module, qualified in steps:
            assert (SERVICE / module).is_file(), module
            assert _resolves(module, qualified), f"{module}: {qualified}"
        service_modules = {m for m, _ in steps if not m.startswith("kafka/")}
        assert len(service_modules) == stated, (title, sorted(service_modules))


async def test_the_up_calls_are_exactly_what_the_composition_root_hands_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    table = _section("Where a lower stage calls back up")
    documented = {
        name
        for row in re.findall(r"^\| [^|]+ \| ([^|]+) \|", table, re.M)
        for name in re.findall(r"`([\w.]+)`", row)
    }
    settings = Settings.from_env({"PURGATORY_TOPIC_PARTITIONS": "2"})
    transport = FakeTransport(FakeBroker(dict.fromkeys(topics_of(settings), 2)))
    async with (
        transport.open_sink() as sink,
        transport.open_reader() as reader,
        transport.open_source(
            topics=[settings.topic_requests, settings.topic_signals],
            group_id=settings.kafka_group_id,
            assignment=None,
        ) as source,
    ):
        handed = _callables(Service(settings, Clock(), source, sink, reader))
    in_code = {entry.split(": ", 1)[1].removeprefix("self.") for entry in handed}
    assert documented == in_code
    assert f"holds them to {MAX_HANDED}" in table
