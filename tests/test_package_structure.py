"""The loader/feature split of ``govinda_patch``, read from the sources with ``ast`` (no import).

Every import counts, also those inside functions: a lazy import cycle is still a cycle for the
reader, and it is how the old ``int8_backend`` <-> ``int8_kv_cache_spec`` cycle was hidden.
"""

from __future__ import annotations

import ast
from pathlib import Path

from overlay_testing import REPO

PACKAGE = "govinda_patch"
FEATURE = f"{PACKAGE}.int8"
PATCHES = f"{PACKAGE}.patches"
# The CLI wires the loader's commands and the feature's (selftest, tune, counters) together.
CLI = f"{PACKAGE}.__main__"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imported(module: str, is_package: bool, tree: ast.AST, known: set[str]) -> set[str]:
    """The ``govinda_patch`` modules ``module`` names in any import statement."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import name``: name is a submodule or an attribute of pkg.
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found |= {name for name in names if name in known}
    found.discard(module)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted((REPO / PACKAGE).rglob("*.py"))
    known = {_module_name(p) for p in paths}
    return {
        _module_name(p): _imported(_module_name(p), p.name == "__init__.py", ast.parse(p.read_text(), str(p)), known)
        for p in paths
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_checks_see_real_edges_and_catch_a_cycle():
    graph = import_graph()
    # Relative, absolute, lazy and ``from pkg import submodule`` imports are all resolved.
    assert f"{PACKAGE}.config" in graph[f"{PACKAGE}.manager"]
    assert f"{PACKAGE}.settings" in graph[f"{PACKAGE}.bootstrap"]
    assert f"{FEATURE}.kv_spec" in graph[f"{PATCHES}.register_int8_backend"]
    assert f"{FEATURE}.prefill_kernel" in graph[f"{FEATURE}.backend"]
    assert f"{FEATURE}.selftest" in graph[f"{FEATURE}.guard"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_inside_the_package():
    assert cycles(import_graph()) == []


def test_no_patch_imports_another_patch():
    graph = import_graph()
    offenders = {
        module: sorted(name for name in imported if name.startswith(f"{PATCHES}."))
        for module, imported in graph.items()
        if module.startswith(f"{PATCHES}.")
    }
    assert {m: names for m, names in offenders.items() if names} == {}


def test_the_loader_imports_nothing_of_the_feature():
    graph = import_graph()
    loader = [m for m in graph if not m.startswith((FEATURE, PATCHES)) and m != CLI]
    assert f"{PACKAGE}.manager" in loader and f"{PACKAGE}.bootstrap" in loader
    leaks = {m: sorted(n for n in graph[m] if n == FEATURE or n.startswith(f"{FEATURE}.")) for m in loader}
    assert {m: names for m, names in leaks.items() if names} == {}
