"""One stage layer: every DVC stage runs `routerops stage NAME`, every name is a registered stage,
and the paths dvc.yaml declares are the ones the Layout gives the stages."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from routerops.layout import Layout
from stages import PIPELINES, STAGES

ROOT = Path(__file__).resolve().parents[2]
DVC_FILES = [ROOT / "dvc.yaml", *(ROOT / f"pipelines/{name}/dvc.yaml" for name in ("mtrouter", "orchestra", "critique", "arena"))]


def declared(entries) -> set[str]:
    return {next(iter(e)) if isinstance(e, dict) else e for e in entries or []}


def test_every_dvc_stage_is_routerops_stage_name():
    """Every dvc.yaml stage runs a registered stage, and every stage except the retrain's (which runs in
    its own workspace under the prices in force: flows/retrain.py) is in one dvc.yaml."""
    names = []
    for path in DVC_FILES:
        for name, stage in yaml.safe_load(path.read_text())["stages"].items():
            assert stage["cmd"] == f"routerops stage {name}", (path, name)
            names.append(name)
    retrain_only = set(PIPELINES["retrain"].stages) - {s for p in PIPELINES.values() if p.dvc_file for s in p.stages}
    assert retrain_only == {"retrain-in-force", "retrain-retire", "retrain-collect-grid", "retrain-track"}
    assert sorted(names) == sorted(set(STAGES) - retrain_only)


def test_dvc_outputs_are_layout_paths():
    layout = Layout(Path("."))
    known = {str(p) for p in [layout.tasks, *layout.raw.paths(), *layout.priced.paths(), layout.grid, layout.validation,
                              layout.registry_report, layout.mlflow_runs, layout.replay_table,
                              layout.mtrouter_tasks, layout.mtrouter_train.folder, layout.mtrouter_eval.folder,
                              layout.mtrouter_routers, layout.orchestra_tasks,
                              *layout.orchestra_teacher.paths(), layout.orchestra_sft, layout.orchestra_rl_tasks,
                              layout.orchestra_decisions, layout.arena_results]}
    dirs = [str(p) for p in (layout.eval_dir, layout.routers_dir, layout.replay_dir, layout.critique_dir, layout.mtrouter_reports,
                                        layout.orchestra_data, layout.orchestra_reports, layout.arena_data,
                                        layout.arena_reports)]
    for path in DVC_FILES:
        for stage in yaml.safe_load(path.read_text())["stages"].values():
            for out in declared(stage.get("outs")) | declared(stage.get("metrics")):
                assert out in known or any(out.startswith(d + "/") for d in dirs), out


def test_every_stage_reference_resolves_to_a_function():
    """A stage's module is imported when it runs (stages/loaders.py): a wrong name would only show when
    that stage runs, so load them all here."""
    for name, stage in STAGES.items():
        assert callable(stage.run()) and callable(stage.config), name


@pytest.mark.slow
def test_the_command_line_imports_no_stack_it_does_not_run():
    """`routerops stage NAME` (every dvc.yaml command) and `routerops reprice` start without torch,
    transformers, MLflow or Prefect when they do not need them."""
    import subprocess
    import sys

    heavy = ["torch", "transformers", "mlflow", "prefect", "peft", "sklearn"]
    code = ("import sys; import cli.main; import cli.data; from stages import STAGES; STAGES['reprice'].run(); "
            "print(sorted(m for m in %r if m in sys.modules))" % heavy)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
