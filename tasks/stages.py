"""Prefect tasks: thin adapters around routerops.stages (the same functions DVC's stages call)."""

from __future__ import annotations

from pathlib import Path

from prefect import task

from routerops import stages
from routerops.config import Params


@task(name="materialise-suites")
def materialise_task(params: Params) -> Path:
    return stages.materialise(params)


# Collection talks to live endpoints; the engine retries single calls, and a rerun of the task
# resumes from its journal, so retrying the whole task is safe and never duplicates an episode.
@task(name="collect-trajectories", retries=2, retry_delay_seconds=5)
def collect_task(params: Params, tasks_file: Path) -> tuple[Path, Path]:
    return stages.collect(params)


@task(name="reprice-trajectories")
def reprice_task(params: Params, raw: tuple[Path, Path]) -> tuple[Path, Path]:
    return stages.reprice(params)


@task(name="validate-trajectories")
def validate_task(params: Params, priced: tuple[Path, Path]) -> Path:
    return stages.validate(params)


@task(name="evaluate-policies")
def evaluate_task(params: Params, validation: Path) -> dict[str, Path]:
    return stages.evaluate(params)


@task(name="benchmark-routers")
def routers_task(params: Params, report: dict[str, Path]) -> dict[str, Path]:
    from models.stages import benchmark_routers

    return benchmark_routers(params)


@task(name="register-best-router")
def register_task(params: Params, router_report: dict[str, Path]) -> dict:
    from tasks.register_stage import register_best_router

    return register_best_router(params)


@task(name="track-in-mlflow")
def track_task(params: Params, registered: dict) -> dict[str, str]:
    from tasks.tracking import log_pipeline_runs

    run_ids = log_pipeline_runs(params.track)
    stages.write_json(run_ids, stages.REPORTS / "mlflow_runs.json")
    return run_ids
