"""Every stage of every pipeline, by name: `run_stage(NAME)` is what `routerops stage NAME` (and so
dvc.yaml) runs. A stage is `stage(config, layout, *inputs) -> outputs`; its inputs here are the
paths the upstream stages write under the Layout, which is also what the flows pass along."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from routerops.config import load_params
from routerops.layout import Layout
from models.critique.config import load_critique_config
from stages import critique, mtrouter, orchestra, pipeline, replay, routers, track


@dataclass(frozen=True)
class Stage:
    run: Callable[..., Any]
    config: Callable[[Path], Any]  # params.yaml → the stage's config
    inputs: Callable[[Layout], tuple]  # the upstream outputs, as the Layout places them


def _main(path: Path):
    return load_params(path)


STAGES: dict[str, Stage] = {
    "materialise": Stage(pipeline.materialise, _main, lambda L: ()),
    "collect": Stage(pipeline.collect, _main, lambda L: (L.tasks,)),
    "reprice": Stage(pipeline.reprice, _main, lambda L: (L.raw,)),
    "validate": Stage(pipeline.validate, _main, lambda L: (L.priced,)),
    "evaluate": Stage(pipeline.evaluate, _main, lambda L: (L.priced, L.validation)),
    "grid": Stage(routers.grid, _main, lambda L: (L.priced, L.tasks)),
    "routers": Stage(routers.routers, _main, lambda L: (L.grid,)),
    "register": Stage(routers.register, _main, lambda L: (L.grid, {"leaderboard": L.routers_dir / "leaderboard.csv"})),
    "replay": Stage(replay.replay, _main, lambda L: ()),
    "critique": Stage(critique.critique, load_critique_config, lambda L: ()),
    "track": Stage(track.track, _main, lambda L: (L.registry_report, L.replay_dir / "leaderboard.csv")),
    "mtrouter-collect": Stage(mtrouter.collect, mtrouter.load_run, lambda L: ()),
    "mtrouter-ablations": Stage(mtrouter.ablations, mtrouter.load_run, lambda L: (L.mtrouter_tasks, L.mtrouter_train)),
    "mtrouter-evaluate": Stage(mtrouter.evaluate, mtrouter.load_run, lambda L: (L.mtrouter_tasks, L.mtrouter_train)),
    "mtrouter-analyses": Stage(mtrouter.analyses_stage, mtrouter.load_run,
                               lambda L: (L.mtrouter_reports / "evaluation.csv",)),
    "mtrouter-register": Stage(mtrouter.register, mtrouter.load_run,
                               lambda L: (L.mtrouter_tasks, L.mtrouter_train, L.mtrouter_reports / "evaluation.csv")),
    "mtrouter-track": Stage(track.mtrouter_track, mtrouter.load_run,
                            lambda L: (L.mtrouter_reports / "registry.json",)),
    "orchestra-tasks": Stage(orchestra.tasks, orchestra.load_run, lambda L: ()),
    "orchestra-teacher": Stage(orchestra.teacher, orchestra.load_run, lambda L: (L.orchestra_tasks,)),
    "orchestra-filter": Stage(orchestra.verifier_filter, orchestra.load_run,
                              lambda L: (L.orchestra_tasks, L.orchestra_teacher, L.orchestra_probe)),
    "orchestra-baselines": Stage(orchestra.baselines, orchestra.load_run, lambda L: (L.orchestra_tasks,)),
    "orchestra-probe": Stage(orchestra.probe, orchestra.load_run, lambda L: (L.orchestra_tasks,)),
    "orchestra-sft": Stage(orchestra.sft, orchestra.load_run, lambda L: (L.orchestra_sft,)),
    "orchestra-rl": Stage(orchestra.rl, orchestra.load_run, lambda L: (L.orchestra_rl_tasks, L.orchestra_adapter)),
    "orchestra-evaluate": Stage(orchestra.evaluate, orchestra.load_run,
                                lambda L: (L.orchestra_tasks, L.orchestra_adapter, L.orchestra_rl_adapter,
                                           L.orchestra_baselines_table)),
    "orchestra-register": Stage(orchestra.register, orchestra.load_run,
                                lambda L: (L.orchestra_tasks, L.orchestra_rl_adapter, L.orchestra_results)),
}


def run_stage(name: str, params_file: str | Path = "params.yaml", root: str | Path = ".") -> Any:
    """Run stage `name` on the inputs the Layout under `root` holds; returns its outputs."""
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; known: {sorted(STAGES)}")
    stage, layout = STAGES[name], Layout(Path(root))
    return stage.run(stage.config(layout.resolve(params_file)), layout, *stage.inputs(layout))
