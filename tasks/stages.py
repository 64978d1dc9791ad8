"""Prefect tasks, one per declared stage (stages/declarations.py): the stage function itself, named
after the stage, with the retry and print policy its declaration gives — the same functions DVC runs.

Each task takes the config, the Layout and the upstream stage's real outputs, and returns its own,
so a flow that passes them along (`TASKS["grid"](params, layout, priced, tasks)`) shows the data
lineage in the Prefect UI. A new stage needs nothing here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from prefect import Task, task

from routerops.config import Params
from routerops.layout import Layout, Trajectories
from stages import STAGES, pipeline
from tasks.shards import run_shards_on_dask


def stage_task(name: str, function: Callable | None = None) -> Task:
    """The Prefect task of stage `name`: `function` (default: the stage's own) under its declared policy."""
    stage = STAGES[name]
    return task(function or stage.run(), **stage.task_options(name))


def collect_on_dask(params: Params, layout: Layout, tasks: Path) -> Trajectories:
    """Collection under Prefect: with collect.shards > 1 its shards run as their own tasks on Dask
    workers (tasks/shards.py); `routerops stage collect` runs them one after another in its process."""
    return pipeline.collect(params, layout, tasks, run_shards=run_shards_on_dask)


# The one stage whose task runs differently from its DVC command: only the shard runner differs.
TASKS: dict[str, Task] = {name: stage_task(name, collect_on_dask if name == "collect" else None) for name in STAGES}
collect_task = TASKS["collect"]
