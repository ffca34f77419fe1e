"""No import circle in the product: its module graph has no cycle, typing-only imports included.

A module that imports one that imports it back (even under ``TYPE_CHECKING``) cannot be read,
tested or moved alone, and its import order decides whether it loads at all. The graph of
``purgatory``, ``reaper`` and ``spark_bridge`` is built by grimp (import-linter's graph) with
the imports under ``if TYPE_CHECKING:`` kept, and its strongly connected components are
computed (Tarjan's algorithm): each must be a single module. A failure prints each circle found,
with the line of each import along it.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from itertools import pairwise

import grimp

PACKAGES = ("purgatory", "reaper", "spark_bridge")

Graph = Mapping[str, Set[str]]


def _module_graph() -> tuple[grimp.ImportGraph, dict[str, set[str]]]:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)
    edges = {
        module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules
    }
    return graph, edges


def strongly_connected(edges: Graph) -> list[list[str]]:
    """The strongly connected components of ``edges`` (module -> modules it imports), each
    sorted, in a stable order; iterative Tarjan, so no recursion limit applies."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(sorted(edges.get(root, ()))))]
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(edges.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def _circle(graph: grimp.ImportGraph, component: list[str]) -> str:
    """One circle through the component's first module, each import with its line."""
    members = set(component)
    start = component[0]
    # The shortest way back to ``start`` from a module it imports, inside the component.
    back = min(
        (chain for nxt in sorted(graph.find_modules_directly_imported_by(start) & members)
         if (chain := graph.find_shortest_chain(importer=nxt, imported=start)) is not None),
        key=len,
    )  # fmt: skip
    path = [start, *back]
    steps = []
    for importer, imported in pairwise(path):
        details = graph.get_import_details(importer=importer, imported=imported)
        where = ", ".join(f"line {d['line_number']}: {d['line_contents']}" for d in details)
        steps.append(f"  {importer} -> {imported}  ({where})")
    return f"a circle of {len(component)} modules {component}:\n" + "\n".join(steps)


def test_the_product_has_no_import_circle() -> None:
    graph, edges = _module_graph()
    assert len(edges) > 100  # the walk found the code
    circles = [c for c in strongly_connected(edges) if len(c) > 1]
    assert not circles, "\n\n".join(_circle(graph, c) for c in circles)


def test_the_check_finds_a_circle_and_only_circles() -> None:
    edges = {
        "p.engine": {"p.budget", "p.types"},
        "p.budget": {"p.types"},
        "p.types": {"p.engine", "p.model"},  # back to the engine: a circle of three
        "p.model": set(),
        "p.leaf": {"p.model", "p.leaf"},  # a module importing itself is no circle of modules
    }
    components = strongly_connected(edges)
    assert [c for c in components if len(c) > 1] == [["p.budget", "p.engine", "p.types"]]
    assert sorted(m for c in components for m in c) == sorted(edges)
