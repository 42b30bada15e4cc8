"""The house's rules (docs/architecture.md), read from the code's own imports: no import circle among the product's
modules (imports inside functions and under TYPE_CHECKING count: they only hide a circle), each layer imports
only the layers below it, and no product module is over 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SERVICES = REPO / "services"
MAX_LINES = 600
# Each package and the packages of services it may import (besides its own): the layers, from the ground up.
MAY_IMPORT = {
    "common": set(),
    "data": {"common"},
    "modeling": {"common"},
    "retriever": {"common", "modeling"},
    "eval": {"common", "data", "modeling"},
    "policy": {"common", "modeling"},
    "console": {"common"},
    "trainer": {"common", "data", "modeling", "eval"},
    "cli": {"common", "data", "modeling", "eval", "policy", "retriever", "trainer", "console"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in SERVICES.rglob("*.py")}


def imports(path: Path, known: set[str]) -> set[str]:
    """The product modules `path` imports: `from a.b import c` is a.b.c when that is a module, else a.b."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                target = f"{node.module}.{alias.name}"
                found.add(target if target in known else node.module)
    return {m for m in found if m in known}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(path, set(known)) - {name} for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def package(module: str) -> str:
    return module.split(".")[1] if module.count(".") else ""


def test_no_import_circle_among_product_modules():
    assert circles(graph()) == []


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_each_layer_imports_only_the_layers_below_it():
    upward = []
    for module, targets in graph().items():
        own = package(module)
        if own not in MAY_IMPORT:
            continue
        for target in targets:
            other = package(target)
            if other and other != own and other not in MAY_IMPORT[own]:
                upward.append(f"{module} -> {target}")
    assert sorted(upward) == []


def test_every_package_has_its_layer():
    packages = {p.name for p in SERVICES.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert packages - {"demo_data"} == set(MAY_IMPORT), "name the new package's layer in MAY_IMPORT"


def test_no_product_module_is_over_600_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}
