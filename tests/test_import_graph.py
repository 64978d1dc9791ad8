"""The house's layering (docs/architecture.md), as the import graph sees it:

    cli → flows → tasks → stages → evaluation → models → routerops
    cli → gateway → evaluation;   flows, stages, cli → services → routerops

and no import circle between our modules. Every import counts: those at module level, those made only
for type hints (`if TYPE_CHECKING:`), which hide a circle rather than remove it, and those inside
functions, the lazy ones that keep torch out of light commands: an import made late is still a
dependency, and a circle closed by one (`gateway/app.py` ↔ `admission.py` was) is still a circle. A
"module:function" string resolved at run time is a dependency no import shows, so none is left
(uvicorn's multi-process factory, its own API, is the one)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("cli", "flows", "tasks", "stages", "evaluation", "models", "routerops", "gateway", "services")
# What each top-level package may import besides itself (the floors below it).
MAY_IMPORT = {
    "cli": {"flows", "tasks", "stages", "gateway", "services", "evaluation", "models", "routerops"},
    "flows": {"tasks", "stages", "services", "evaluation", "models", "routerops"},
    "tasks": {"stages", "services", "evaluation", "models", "routerops"},
    "stages": {"services", "evaluation", "models", "routerops"},
    "gateway": {"evaluation", "models", "routerops"},
    "evaluation": {"models", "routerops"},
    "services": {"routerops"},
    "models": {"routerops"},
    "routerops": set(),
}
STRING_REFERENCE = re.compile(r"""["']((?:%s)(?:\.\w+)*:\w+)["']""" % "|".join(PACKAGES))
KNOWN_STRING_REFERENCES = {
    "gateway.cli:app_from_env",  # uvicorn.run(..., workers=N) takes only an import string
    # names an old servable.json holds (evaluation/serving/__init__.py: FAMILY_OF_OLD_CLASS): data read
    # to find a registered champion's family, never imported
    "evaluation.serving:ServedRouter", "evaluation.mtrouter_serving:ServedMTRouter",
    "evaluation.orchestra_serving:ServedOrchestrator", "evaluation.critique_serving:ServedCritique",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_imports(tree: ast.Module, name: str, is_package: bool) -> list[str]:
    """Every import in the module, wherever it is (module level, `if` blocks, functions, classes),
    relative ones made absolute; `from a import b` counts as both `a` and `a.b` (b may be a module)."""
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([module] if module else []))
            found += [module] + [f"{module}.{alias.name}" for alias in node.names]
    return found


def import_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        targets = set()
        for imported in all_imports(tree, name, path.name == "__init__.py"):
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


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{source} → {target}" for source, targets in graph.items() for target in targets
                  if (a := source.split(".")[0]) != (b := target.split(".")[0]) and b not in MAY_IMPORT[a])


def test_no_import_circle_between_our_modules_not_even_inside_functions():
    graph = import_graph()
    assert len(graph) > 100  # the walk found the house
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " → ".join(cycle)


def test_every_import_points_down_a_floor():
    graph = import_graph()
    assert set(MAY_IMPORT) == set(PACKAGES)
    assert upward_imports(graph) == []


def test_no_module_function_string_stands_for_an_import():
    found = {(str(p.relative_to(ROOT)), ref) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")
             for ref in STRING_REFERENCE.findall(p.read_text(encoding="utf-8"))}
    assert {ref for _, ref in found} <= KNOWN_STRING_REFERENCES, sorted(found)


def test_the_checks_see_what_they_look_for():
    """A circle of two, an import inside a function, a relative one, and an upward one are all caught."""
    assert find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    tree = ast.parse("def f():\n    from gateway.app import create_app\nfrom .sibling import x\n")
    assert {"gateway.app", "stages.sibling"} <= set(all_imports(tree, "stages.module", False))
    assert upward_imports({"evaluation.ope": {"gateway.store"}}) == ["evaluation.ope → gateway.store"]
    assert STRING_REFERENCE.findall('x = "flows.pipeline:run_with_summary"') == ["flows.pipeline:run_with_summary"]
