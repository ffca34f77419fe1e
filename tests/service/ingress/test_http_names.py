"""The HTTP package's modules meet at public names: no module of it imports an underscored
name from another module, no module elsewhere imports one of its own, and what one module
takes from another is listed in that module's ``__all__``.

A newcomer reads a module's ``__all__`` to know what it offers; an underscored import across
modules would be a helper used as public without saying so.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SERVICE = ROOT / "purgatory" / "service"
HTTP = SERVICE / "ingress" / "http"
HTTP_PACKAGE = "purgatory.service.ingress.http"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_from(path: Path, node: ast.ImportFrom) -> str:
    """The absolute name of the module ``node`` imports from (relative imports resolved)."""
    if node.level == 0:
        return node.module or ""
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    base = package[: len(package) - node.level + 1]
    return ".".join([*base, node.module] if node.module else base)


def _imports() -> list[tuple[Path, str, str]]:
    """Every ``from X import name`` of the service: (file, X, name)."""
    found: list[tuple[Path, str, str]] = []
    for path in sorted(SERVICE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.ImportFrom):
                source = _imported_from(path, node)
                found.extend((path, source, alias.name) for alias in node.names)
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _in_http(path: Path) -> bool:
    return HTTP in path.parents


def _all_of(module: str) -> list[str] | None:
    """The ``__all__`` a module of the service declares (None: none)."""
    path = ROOT.joinpath(*module.split(".")).with_suffix(".py")
    for node in ast.parse(path.read_text("utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            value = ast.literal_eval(node.value)
            assert isinstance(value, list)
            return [str(name) for name in value]
    return None


def test_the_walk_sees_the_http_package() -> None:
    importers = {path for path, source, _ in _imports() if source.startswith(HTTP_PACKAGE)}
    assert len([p for p in importers if _in_http(p)]) >= 3  # app, routes, ... import each other
    assert SERVICE / "app.py" in importers  # the composition root builds the app


def test_no_underscored_name_crosses_a_module_of_the_http_package() -> None:
    crossing = sorted(
        f"{path.relative_to(ROOT)}: from {source} import {name}"
        for path, source, name in _imports()
        if _private(name)
        and source != _module_name(path)
        and (_in_http(path) or source.startswith(HTTP_PACKAGE))
    )
    assert not crossing, crossing


def test_what_a_module_takes_from_the_http_package_is_in_its_all() -> None:
    unlisted = []
    for path, source, name in _imports():
        if not source.startswith(HTTP_PACKAGE + ".") or source == _module_name(path):
            continue
        listed = _all_of(source)
        if listed is None or name not in listed:
            unlisted.append(f"{path.relative_to(ROOT)}: from {source} import {name}")
    assert not unlisted, sorted(unlisted)


def test_every_module_of_the_http_package_lists_its_public_names() -> None:
    # Each lists what it offers (its own names, or those it re-exports, as app's HttpConfig).
    for path in sorted(HTTP.glob("*.py")):
        if path.name == "__init__.py":
            continue
        listed = _all_of(_module_name(path))
        assert listed is not None, f"{path.name} has no __all__"
        tree = ast.parse(path.read_text("utf-8"))
        defined = {
            node.name
            for node in tree.body
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        } | {
            target.id
            for node in tree.body
            if isinstance(node, ast.Assign | ast.AnnAssign)
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name)
        }
        imported = {
            alias.asname or alias.name
            for node in tree.body
            if isinstance(node, ast.ImportFrom)
            for alias in node.names
        }
        assert set(listed) <= defined | imported, (path.name, sorted(set(listed) - defined))
