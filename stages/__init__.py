"""Every stage of every pipeline, by name: `run_stage(NAME)` is what `routerops stage NAME` (and so
dvc.yaml) runs. A stage is `stage(config, layout, *inputs) -> outputs`; its inputs here are the
paths the upstream stages write under the Layout, which is also what the flows pass along. The
stages and pipelines are declared in stages/declarations.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from routerops.layout import Layout
from stages.declarations import PIPELINES, STAGES, Pipeline, Stage

__all__ = ["PIPELINES", "STAGES", "Pipeline", "Stage", "run_stage", "standalone_stages"]


def standalone_stages() -> list[str]:
    """The stages `routerops stage NAME` runs: those whose inputs the Layout holds."""
    return sorted(name for name, stage in STAGES.items() if stage.inputs is not None)


def run_stage(name: str, params_file: str | Path = "params.yaml", root: str | Path = ".") -> Any:
    """Run stage `name` on the inputs the Layout under `root` holds; returns its outputs."""
    if name not in STAGES:
        raise KeyError(f"unknown stage {name!r}; known: {sorted(STAGES)}")
    stage, layout = STAGES[name], Layout(Path(root))
    if stage.inputs is None:
        pipeline = next(p for p, declared in PIPELINES.items() if name in declared.stages)
        raise ValueError(f"stage {name!r} runs only inside its pipeline's flow (`routerops run {pipeline}`), "
                         "which gives it its inputs")
    return stage.run()(stage.config(layout.resolve(params_file)), layout, *stage.inputs(layout))
