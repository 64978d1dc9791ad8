"""Each flow calls exactly the stages its pipeline declares (stages/declarations.py), in that order:
read from the flow's source (the `TASKS["name"](...)` calls of its @flow function), not by running it."""

from __future__ import annotations

import ast
import importlib
import inspect

import pytest

from cli.run import FLOWS
from stages import PIPELINES


def called_stages(module_name: str) -> list[str]:
    """The stage names the module's @flow function calls through TASKS, in source order."""
    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    flows = [f for f in tree.body if isinstance(f, ast.FunctionDef)
             and any("flow" in ast.unparse(d) for d in f.decorator_list)]
    assert len(flows) == 1, f"{module_name}: expected one @flow function, found {[f.name for f in flows]}"
    calls = [n for n in ast.walk(flows[0]) if isinstance(n, ast.Call) and isinstance(n.func, ast.Subscript)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "TASKS"]
    return [ast.literal_eval(c.func.slice) for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def test_every_pipeline_but_the_critique_ones_has_a_flow():
    assert set(FLOWS) == {"main", "mtrouter", "orchestra", "retrain", "arena"}


@pytest.mark.parametrize("name", sorted(FLOWS))
def test_the_flow_calls_the_declared_stages_in_order(name):
    flow = FLOWS[name]()  # the CLI's reference: the function `routerops run NAME` calls
    module = getattr(flow, "fn", flow).__module__
    assert called_stages(module) == list(PIPELINES[name].stages), f"{module} and PIPELINES[{name!r}] disagree"


def test_a_flow_calling_another_order_is_caught(tmp_path, monkeypatch):
    """The check reads calls, not names: swap two lines of a flow and it differs."""
    source = inspect.getsource(importlib.import_module("flows.mtrouter"))
    a = '    ablations = TASKS["mtrouter-ablations"](run, layout, tasks, train)\n'
    b = '    evaluation = TASKS["mtrouter-evaluate"](run, layout, tasks, train)\n'
    assert a + b in source
    (tmp_path / "swapped_flow.py").write_text(source.replace(a + b, b + a))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert called_stages("swapped_flow")[1:3] == ["mtrouter-evaluate", "mtrouter-ablations"]
