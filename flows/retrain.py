"""The retrain flow: what the schedule, a published price book or a published pool starts
(stages/retrain.py; deployed by flows/deployments.py, triggered by `routerops prices|pool publish`).

in force → retire → materialise → collect the grid (only what the journals lack) → reprice →
validate → grid → routers → register (gate on val) → track. A price-only change makes no LLM call; a
pool change collects only the new or changed workers' episodes.

Run it by hand with `make retrain` (`routerops run retrain`) from the repository root.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow

from routerops.config import load_params
from routerops.layout import Layout
from stages.retrain import retrain_setup
from tasks.stages import TASKS

TRIGGERS = ("manual", "schedule", "prices", "pool")


@flow(name="routerops-retrain", log_prints=True)
def retrain(params_file: str = "params.yaml", root: str = ".", trigger: str = "manual") -> Path:
    if trigger not in TRIGGERS:
        raise ValueError(f"trigger must be one of {TRIGGERS}, got {trigger!r}")
    repo = Layout(Path(root).resolve())
    params = load_params(repo.resolve(params_file))
    now = TASKS["retrain-in-force"](params, repo, trigger)
    params, layout = retrain_setup(params, repo, now)
    retired = TASKS["retrain-retire"](params, layout, now)
    # The main pipeline's logged-outcome table (its `outcomes` stage): read only with materialise.source "table".
    tasks = TASKS["materialise"](params, layout, repo.replay_table, wait_for=[retired])
    raw = TASKS["retrain-collect-grid"](params, layout, tasks, now)
    priced = TASKS["reprice"](params, layout, raw)
    TASKS["validate"](params, layout, priced)
    grid = TASKS["grid"](params, layout, priced, tasks)
    router_report = TASKS["routers"](params, layout, grid)
    registry = TASKS["register"](params, layout, grid, router_report)
    return TASKS["retrain-track"](params, layout, now, registry)

