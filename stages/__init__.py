"""Every stage of every pipeline, by name: `run_stage(NAME)` is what `routerops stage NAME` (and so
dvc.yaml) runs. A stage is `stage(config, layout, *inputs) -> outputs`; its inputs here are the
paths the upstream stages write under the Layout, which is also what the flows pass along."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from routerops.layout import Layout


def resolve(reference: str) -> Any:
    """A "module:function" reference → the function, importing its module."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Stage:
    """A stage by reference ("module:function"), imported when it runs: `routerops stage evaluate`
    (every dvc.yaml command) must not pay for importing the orchestrator's torch / transformers /
    peft stack, which the pipeline's own stages never touch."""

    run: str
    config: str  # params.yaml → the stage's config
    inputs: Callable[[Layout], tuple]  # the upstream outputs, as the Layout places them


MAIN = "routerops.config:load_params"
MT = "stages.mtrouter:load_run"
ORCH = "stages.orchestra.config:load_run"

STAGES: dict[str, Stage] = {
    "materialise": Stage("stages.pipeline:materialise", MAIN, lambda L: ()),
    "collect": Stage("stages.pipeline:collect", MAIN, lambda L: (L.tasks,)),
    "reprice": Stage("stages.pipeline:reprice", MAIN, lambda L: (L.raw,)),
    "validate": Stage("stages.pipeline:validate", MAIN, lambda L: (L.priced,)),
    "evaluate": Stage("stages.pipeline:evaluate", MAIN, lambda L: (L.priced, L.validation)),
    "grid": Stage("stages.routers:grid", MAIN, lambda L: (L.priced, L.tasks)),
    "routers": Stage("stages.routers:routers", MAIN, lambda L: (L.grid,)),
    "register": Stage("stages.routers:register", MAIN, lambda L: (L.grid, {"leaderboard": L.routers_dir / "leaderboard.csv"})),
    "replay": Stage("stages.replay:replay", MAIN, lambda L: ()),
    "critique": Stage("stages.critique:critique", "models.critique.config:load_critique_config", lambda L: ()),
    "critique-lm": Stage("stages.critique:critique_lm", "models.critique.lm_config:load_critique_lm_config",
                         lambda L: ()),
    "critique-lm-register": Stage("stages.critique:critique_lm_register", "models.critique.lm_config:load_critique_lm_config",
                                  lambda L: (L.critique_dir / "lm_results.json",)),
    "track": Stage("stages.track:track", MAIN, lambda L: (L.registry_report, L.replay_dir / "leaderboard.csv")),
    "mtrouter-collect": Stage("stages.mtrouter:collect", MT, lambda L: ()),
    "mtrouter-ablations": Stage("stages.mtrouter:ablations", MT, lambda L: (L.mtrouter_tasks, L.mtrouter_train)),
    "mtrouter-evaluate": Stage("stages.mtrouter:evaluate", MT, lambda L: (L.mtrouter_tasks, L.mtrouter_train)),
    "mtrouter-analyses": Stage("stages.mtrouter:analyses_stage", MT,
                               lambda L: (L.mtrouter_reports / "evaluation.csv",)),
    "mtrouter-register": Stage("stages.mtrouter:register", MT,
                               lambda L: (L.mtrouter_tasks, L.mtrouter_train, L.mtrouter_reports / "evaluation.csv")),
    "mtrouter-track": Stage("stages.track:mtrouter_track", MT,
                            lambda L: (L.mtrouter_reports / "registry.json",)),
    "orchestra-tasks": Stage("stages.orchestra.data:tasks", ORCH, lambda L: ()),
    "orchestra-teacher": Stage("stages.orchestra.teacher:teacher", ORCH, lambda L: (L.orchestra_tasks,)),
    "orchestra-filter": Stage("stages.orchestra.sft:verifier_filter", ORCH,
                              lambda L: (L.orchestra_tasks, L.orchestra_teacher, L.orchestra_probe)),
    "orchestra-baselines": Stage("stages.orchestra.data:baselines", ORCH, lambda L: (L.orchestra_tasks,)),
    "orchestra-probe": Stage("stages.orchestra.sft:probe", ORCH, lambda L: (L.orchestra_tasks,)),
    "orchestra-sft": Stage("stages.orchestra.sft:sft", ORCH, lambda L: (L.orchestra_sft,)),
    "orchestra-rl": Stage("stages.orchestra.rl:rl", ORCH, lambda L: (L.orchestra_rl_tasks, L.orchestra_adapter)),
    "orchestra-evaluate": Stage("stages.orchestra.evaluate:evaluate", ORCH,
                                lambda L: (L.orchestra_tasks, L.orchestra_adapter, L.orchestra_rl_adapter,
                                           L.orchestra_baselines_table)),
    "orchestra-register": Stage("stages.orchestra.register:register", ORCH,
                                lambda L: (L.orchestra_tasks, L.orchestra_rl_adapter, L.orchestra_results)),
}


def run_stage(name: str, params_file: str | Path = "params.yaml", root: str | Path = ".") -> Any:
    """Run stage `name` on the inputs the Layout under `root` holds; returns its outputs."""
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; known: {sorted(STAGES)}")
    stage, layout = STAGES[name], Layout(Path(root))
    run, config = resolve(stage.run), resolve(stage.config)
    return run(config(layout.resolve(params_file)), layout, *stage.inputs(layout))
