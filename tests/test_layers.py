"""The package is layered: each layer imports only those below it, and no module circles.

Every import statement counts, also those inside functions and under ``TYPE_CHECKING``:
a type-only import against the order is still a layer that knows too much.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

PACKAGE: Final = Path(__file__).resolve().parent.parent / "agentq"

LAYERS: Final = (
    (
        "agentq.errors",
        "agentq.records",
        "agentq.ids",
        "agentq.outcomes",
        "agentq.limits",
        "agentq.settings",
    ),
    ("agentq.codec",),
    ("agentq.store",),
    ("agentq.engine",),
    ("agentq.celery",),
    ("agentq.langgraph",),
    ("agentq.ops",),
    ("agentq.demo",),
    ("agentq.ui",),
    ("agentq.cli",),
)
"""Lowest first; the package's face (``agentq``, ``agentq._moved``) stands above them all."""

TOP: Final = len(LAYERS)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> int:
    for level, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return level
    return TOP


def imports_of(path: Path) -> Iterator[str]:
    """Every agentq module ``path`` imports, relative imports resolved."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in targets:
            if target == "agentq" or target.startswith("agentq."):
                yield target


def graph() -> dict[str, set[str]]:
    """Module -> the agentq modules it imports (only names that are modules)."""
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    edges: dict[str, set[str]] = {}
    for name, path in paths.items():
        edges[name] = {t for t in imports_of(path) if t in paths and t != name}
    return edges


def test_no_layer_imports_a_higher_one() -> None:
    against = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in sorted(graph().items())
        for target in sorted(targets)
        if layer_of(target) > layer_of(module)
    ]
    assert not against, "imports against the layer order:\n" + "\n".join(against)


def test_no_module_imports_itself_through_others() -> None:
    edges = graph()
    # The package's face imports everything to re-export it; submodules import the package
    # only to reach their own siblings, which are the edges that count.
    for targets in edges.values():
        targets.discard("agentq")
    cycles: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, trail: list[str]) -> None:
        if module in trail:
            cycles.append([*trail[trail.index(module) :], module])
            return
        if module in done:
            return
        for target in sorted(edges.get(module, ())):
            visit(target, [*trail, module])
        done.add(module)

    for module in sorted(edges):
        visit(module, [])
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


@pytest.mark.parametrize("forbidden", ["celery", "kombu"])
def test_the_engine_knows_nothing_of_celery(forbidden: str) -> None:
    for path in (PACKAGE / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            assert not any(n == forbidden or n.startswith(forbidden + ".") for n in names), (
                f"{path.relative_to(PACKAGE.parent)} imports {forbidden}"
            )


def test_the_order_is_checked_at_all() -> None:
    # A walk that found no edges would pass the tests above by finding nothing.
    edges = graph()
    assert "agentq.store.contract" in edges["agentq.engine.driver"]
    assert layer_of("agentq.engine.driver") > layer_of("agentq.store.contract")
