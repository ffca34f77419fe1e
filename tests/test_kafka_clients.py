"""Every kafka-python client the product makes connects through the one builder of its
connection arguments.

kafka-python's connection arguments (servers, client id, TLS, SASL) are built in one place,
:func:`purgatory._kafka_options.kafka_client_kwargs`. This walks the code of ``purgatory/`` and
``spark_bridge/`` and checks that every ``KafkaConsumer``, ``KafkaProducer`` and
``KafkaAdminClient`` it constructs passes that builder's output with ``**``, directly or
through a ``kafka_kwargs()`` method that returns it and nothing else, and names no connection
argument itself. Beside ``**``, Python refuses a second value for a keyword, so the client's
own arguments cannot override the connection. A client made from ``bootstrap_servers`` alone,
which would connect in plain text whatever TLS and SASL say, fails here.
"""

from __future__ import annotations

import ast
from pathlib import Path

from purgatory._kafka_options import CLIENT_ARGUMENTS

ROOT = Path(__file__).resolve().parent.parent
CLIENTS = frozenset({"KafkaConsumer", "KafkaProducer", "KafkaAdminClient"})
BUILDER = "kafka_client_kwargs"
METHOD = "kafka_kwargs"
CONNECTION = frozenset(CLIENT_ARGUMENTS.values())


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(path.relative_to(ROOT)), ast.parse(path.read_text("utf-8")))
        for root in ("purgatory", "spark_bridge")
        for path in sorted((ROOT / root).rglob("*.py"))
    ]


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _builds(node: ast.expr) -> bool:
    """Whether ``node`` is a call of the builder or of a ``kafka_kwargs()`` method."""
    return isinstance(node, ast.Call) and _name(node.func) in (BUILDER, METHOD)


def _constructions() -> list[tuple[str, ast.Call]]:
    return [
        (f"{name}:{node.lineno}", node)
        for name, module in _modules()
        for node in ast.walk(module)
        if isinstance(node, ast.Call) and _name(node.func) in CLIENTS
    ]


def test_every_client_passes_the_builders_arguments_and_names_none_itself() -> None:
    constructions = _constructions()
    assert len(constructions) >= 9  # the walk found the service's, the tools' and the bridge's
    wrong = []
    for where, call in constructions:
        built = [kw.value for kw in call.keywords if kw.arg is None and _builds(kw.value)]
        named = sorted(kw.arg for kw in call.keywords if kw.arg in CONNECTION)
        if len(built) != 1 or named or call.args:
            wrong.append((where, named))
    assert not wrong, wrong


def test_every_kafka_kwargs_method_returns_the_builders_output() -> None:
    methods = [
        (name, node)
        for name, module in _modules()
        for node in ast.walk(module)
        if isinstance(node, ast.FunctionDef) and node.name == METHOD
    ]
    assert len(methods) >= 3  # KafkaClientConfig's, and the bridge's sinks' and source's
    for name, method in methods:
        body = [
            statement
            for statement in method.body
            if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant))
        ]
        assert len(body) == 1 and isinstance(body[0], ast.Return), name
        returned = body[0].value
        assert isinstance(returned, ast.Call) and _name(returned.func) == BUILDER, name


def test_no_module_renames_a_client_class() -> None:
    """An alias (``KafkaProducer as P``) would hide a construction from the walk."""
    renamed = [
        (name, alias.name)
        for name, module in _modules()
        for node in ast.walk(module)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
        if alias.name in CLIENTS and alias.asname not in (None, alias.name)
    ]
    assert not renamed, renamed
