"""The house's layering (design.md): flows → tasks → stages → evaluation → models → routerops, and no
import circle between our modules — counting the imports made only for type hints (`if
TYPE_CHECKING:`), which hide a circle rather than remove it. Imports inside functions are the lazy
ones that keep torch out of light commands; they are not module structure and are not counted."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "stages", "evaluation", "models", "routerops", "gateway", "services")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def structural_imports(tree: ast.Module) -> list[str]:
    """Imports at module level, and inside module-level `if` blocks (TYPE_CHECKING and the like)."""
    found: list[str] = []
    nodes = list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If):
            nodes.extend(node.body + node.orelse)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imported in structural_imports(ast.parse(path.read_text(encoding="utf-8"))):
            if imported in modules and imported != name and not name.startswith(imported + "."):
                targets.add(imported)  # a package's own __init__ is not an edge of its submodules
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the stack, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_no_import_circle_between_our_modules_not_even_for_type_hints():
    graph = import_graph()
    assert len(graph) > 100  # the walk found the house
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " → ".join(cycle)


def test_the_cycle_finder_finds_a_two_module_circle():
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
