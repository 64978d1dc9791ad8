"""The scripts under experiments/ and benchmarks/ share helpers through the library only: no script
imports another script (or puts a scripts folder on sys.path to do so), and none imports a private
name (`_x`) of the library's packages."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*REPO.glob("experiments/*.py"), *REPO.glob("benchmarks/*.py")])
FOLDERS = {"experiments", "benchmarks"}
SCRIPT_NAMES = {p.stem for p in SCRIPTS}


def violations(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            top = node.module.split(".")[0]
            if top in FOLDERS or top in SCRIPT_NAMES:
                found.append(f"imports the script {node.module}")
            found += [f"imports the private {node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
        elif isinstance(node, ast.Import):
            found += [f"imports the script {a.name}" for a in node.names
                      if a.name.split(".")[0] in FOLDERS | SCRIPT_NAMES]
    return found


@pytest.mark.parametrize("script", SCRIPTS, ids=[f"{p.parent.name}/{p.name}" for p in SCRIPTS])
def test_a_script_imports_only_the_library_and_its_public_names(script):
    assert violations(script.read_text()) == []


def test_the_rule_catches_both_kinds():
    source = ("from benchmarks.rl_step import fit_prompt\nimport k_worker_routing as kw\n"
              "from evaluation.critique_lm import _critique_paths, fixed_split\n")
    assert violations(source) == ["imports the script benchmarks.rl_step", "imports the script k_worker_routing",
                                  "imports the private evaluation.critique_lm._critique_paths"]
