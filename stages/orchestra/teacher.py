"""Stage orchestra-teacher: the teacher's trajectories on the train tasks (004 §4.1)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from evaluation.baselines import (
    baseline_run_id,
)
from routerops.envs.suites import read_tasks
from routerops.envs.qa import extract_answer
from routerops.errors import InputError
from routerops.layout import Layout, Trajectories
from routerops.orchestra.curriculum import (
    STRATEGY_SEPARATOR, collect_episodes,
)
from routerops.orchestra.endpoint import EndpointController
from routerops.orchestra.executor import Executor, ExecutorConfig
from routerops.orchestra.teacher import teacher_controllers
from routerops.pricing import check_pool_priced
from routerops.workers import check_pool_runnable
from routerops.workers.cache import WorkerCache
from stages.manifest import write_manifest
from stages.orchestra.config import OrchestraTeacher, OrchestraRun, check_teacher
from stages.orchestra.workers import close_workers, workers_with_servers, worker_cache

log = logging.getLogger(__name__)


def teacher(run: OrchestraRun, layout: Layout, tasks: Path) -> Trajectories:
    """Teacher trajectories on the train tasks, every candidate run through the real executor and
    workers (004 App. A.4: observations are runtime outputs); resumable from its journal."""
    cfg = run.teacher
    market = run.market(layout)
    pool, pool_file, book_file, book = market.pool, market.pool_file, market.evaluation_file, market.evaluation.book
    chosen = [t for t in read_tasks(tasks) if t.split in cfg.splits]
    if not chosen:
        raise InputError(tasks, "split", f"no task in the teacher's splits {cfg.splits}")
    check_pool_priced(pool, book, book_file)
    check_pool_runnable(pool)
    check_teacher(cfg, pool, pool_file, layout.resolve("params.yaml"))
    out = layout.orchestra_teacher
    run_id = baseline_run_id([tasks, pool_file, book_file], {"budget_usd": run.budget_usd,
                                                             "turn_limit": run.turn_limit, "teacher": cfg.seed,
                                                             "kind": cfg.kind, "llm_worker": cfg.llm_worker,
                                                             "prompt": run.prompt})
    with workers_with_servers(pool, cfg.server_ctx, cfg.server_threads) as workers:
        episodes, _ = asyncio.run(_teach(run, pool, book, workers, chosen, out.folder, run_id,
                                         worker_cache(run, layout)))  # writes out
    passed = episodes.groupby("task_id").success.any()
    write_manifest(layout.orchestra_manifests, "orchestra-teacher", run, [tasks, pool_file, book_file], out.paths(),
                   {"trajectories": len(episodes), "tasks": len(chosen), "tasks_with_a_passing_trajectory": int(passed.sum()),
                    "usd": float(episodes.cost_usd.sum())})
    return out


async def teacher_batches(cfg: OrchestraTeacher, pool, workers, chosen: list, run_id: str) -> list:
    """(controller, tasks, run id) per teacher strategy: the search teacher's candidates, or `samples`
    rollouts of the LLM teacher. The strategy rides in the run id (curriculum.strategy_of)."""
    if cfg.kind == "llm":
        teacher = workers[cfg.llm_worker]
        controller = EndpointController(teacher.spec, teacher.base_url, version="llm-teacher")
        return [(controller, chosen, f"{run_id}{STRATEGY_SEPARATOR}llm:{cfg.llm_worker}:{i}") for i in range(cfg.samples)]
    lazy = await lazy_answers(chosen, workers[cfg.lazy_worker])
    return [(controller, batch, f"{run_id}{STRATEGY_SEPARATOR}{name}")
            for name, (controller, batch) in teacher_controllers(chosen, pool, lazy).items()]


async def _teach(run: OrchestraRun, pool, book, workers, chosen: list, out_dir: Path, run_id: str,
                 cache: WorkerCache | None = None):
    executor = Executor(pool, workers, book, ExecutorConfig(budget_usd=run.budget_usd, turn_limit=run.turn_limit,
                                                            prompt=run.prompt), cache=cache)
    try:
        batches = await teacher_batches(run.teacher, pool, workers, chosen, run_id)
        return await collect_episodes(executor, batches, out_dir, seed=run.teacher.seed)
    finally:
        await close_workers(workers)


async def lazy_answers(chosen: list, worker) -> dict[str, str]:
    """The controller model's own direct answer per task (the lazy candidate: no worker call)."""
    replies = await asyncio.gather(*(worker.call(task.prompt) for task in chosen))
    return {t.task_id: answer for t, r in zip(chosen, replies) if not r.error and (answer := extract_answer(r.text))}
