"""Prefect tasks: one-line adapters around the stage functions (stages/), the same ones DVC runs.

Each task takes the config, the Layout and the upstream stage's real outputs, and returns its own,
so a flow that passes them along shows the data lineage in the Prefect UI.
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from routerops.config import Params
from routerops.layout import Layout, Trajectories
from stages import mtrouter, pipeline, replay, retrain, routers, track
from stages.orchestra import data as orchestra_data, evaluate as orchestra_evaluate, register as orchestra_register
from stages.orchestra import rl as orchestra_rl, sft as orchestra_sft, teacher as orchestra_teacher
from tasks.shards import run_shards_on_dask

materialise_task = task(pipeline.materialise, name="materialise-suites")


# Collection talks to live endpoints; the engine retries single calls, and a rerun of the task
# resumes from its journals, so retrying the whole task is safe and never duplicates an episode.
# With collect.shards > 1 its shards run as their own tasks on Dask workers (tasks/shards.py).
@task(name="collect-trajectories", retries=2, retry_delay_seconds=5)
def collect_task(params: Params, layout: Layout, tasks: Path) -> Trajectories:
    return pipeline.collect(params, layout, tasks, run_shards=run_shards_on_dask)


reprice_task = task(pipeline.reprice, name="reprice-trajectories")
validate_task = task(pipeline.validate, name="validate-trajectories")
evaluate_task = task(pipeline.evaluate, name="evaluate-policies")
grid_task = task(routers.grid, name="build-outcome-grid")
routers_task = task(routers.routers, name="benchmark-routers")
register_task = task(routers.register, name="register-best-router")
replay_task = task(replay.replay, name="replay-real-outcomes")
track_task = task(track.track, name="track-in-mlflow")

mt_collect_task = task(mtrouter.collect, name="mtrouter-collect", retries=1, retry_delay_seconds=5)
mt_ablations_task = task(mtrouter.ablations, name="mtrouter-ablations")
mt_evaluate_task = task(mtrouter.evaluate, name="mtrouter-evaluate")
mt_analyses_task = task(mtrouter.analyses_stage, name="mtrouter-analyses")
mt_register_task = task(mtrouter.register, name="mtrouter-register")
mt_track_task = task(track.mtrouter_track, name="mtrouter-track")

# Rolls single workers and the random router out through live workers; a rerun resumes from the journal.
orchestra_baselines_task = task(orchestra_data.baselines, name="orchestra-baselines", retries=1, retry_delay_seconds=5)
orchestra_tasks_task = task(orchestra_data.tasks, name="orchestra-tasks")
# The teacher calls live workers; a rerun resumes from its journal, so a retry never duplicates an episode.
orchestra_teacher_task = task(orchestra_teacher.teacher, name="orchestra-teacher", retries=1, retry_delay_seconds=5)
orchestra_filter_task = task(orchestra_sft.verifier_filter, name="orchestra-verifier-filter")
# The LM controller's rollouts call live workers and resume from their journal: a retry never duplicates.
orchestra_probe_task = task(orchestra_sft.probe, name="orchestra-probe", retries=1, retry_delay_seconds=5)
# Resumes from its last checkpoint when rerun. Prints stay prints (log_prints=False, whatever the flow says):
# TRL maps the dataset through `datasets`, whose fingerprint finds a function's globals with dill, which
# reads `dis.dis(f)` from a captured stdout; Prefect's print-to-log patch sent the disassembly to the run's
# log instead (~180 lines of bytecode in `make orchestra`) and left dill an empty list of globals.
orchestra_sft_task = task(orchestra_sft.sft, name="orchestra-sft", log_prints=False)
# RL rolls out through live workers and resumes from its last checkpoint; not retried (a retry would
# redo the steps since that checkpoint with new samples, which is correct but costs their time twice).
orchestra_rl_task = task(orchestra_rl.rl, name="orchestra-rl")
orchestra_evaluate_task = task(orchestra_evaluate.evaluate, name="orchestra-evaluate", retries=1, retry_delay_seconds=5)
orchestra_register_task = task(orchestra_register.register, name="orchestra-register")

retrain_in_force_task = task(retrain.in_force, name="retrain-in-force")
retrain_retire_task = task(retrain.retire, name="retrain-retire-champions")
# Collects only what the per-worker journals lack; a rerun resumes, so retrying never duplicates.
retrain_collect_task = task(retrain.collect_grid, name="retrain-collect-grid", retries=2, retry_delay_seconds=5)
retrain_track_task = task(retrain.track, name="retrain-track")
