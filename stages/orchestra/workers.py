"""The pool's workers and the LM controller's rollouts through the real executor, shared by the
teacher, probe, evaluation and RL stages."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from pathlib import Path

from evaluation.baselines import (
    baseline_run_id,
)
from models.orchestrator.engines import load_controller_engine
from routerops.errors import InputError
from routerops.layout import Layout
from routerops.orchestra.curriculum import (
    collect_episodes,
)
from routerops.orchestra.executor import Executor, ExecutorConfig
from routerops.workers import build_workers, check_pool_runnable
from routerops.workers.cache import WorkerCache
from routerops.workers.endpoints import pool_endpoints
from stages.orchestra.config import CONTROLLER_NAME, OrchestraRun

log = logging.getLogger(__name__)


@contextlib.contextmanager
def workers_with_servers(pool, server_ctx: int, server_threads: int):
    """The pool's workers, with its LLM servers (llama.cpp, replay endpoints) up while they are used."""
    with pool_endpoints(pool, n_ctx=server_ctx, n_threads=server_threads) as endpoints:
        yield build_workers(pool, endpoints)


async def close_workers(workers) -> None:
    for worker in workers.values():
        if hasattr(worker, "aclose"):
            await worker.aclose()


def load_controller(run: OrchestraRun, layout: Layout, adapter: Path | None = None,
                    version: str | None = None):
    """The LM controller, priced as `orchestrator` (configs/prices): π(0) without an adapter, the SFT'd
    or RL'd controller with one; `version` (base / sft / rl) tells their episodes apart."""
    return load_controller_engine(run.model, run.controller, adapter, layout.model_cache, name=CONTROLLER_NAME,
                                  version=version or ("base" if adapter is None else "sft"))


def rollout_run_id(run: OrchestraRun, layout: Layout, stage: str, inputs: list[Path]) -> str:
    """A run id that changes with what the episodes depend on (tasks, pool, prices, weights, limits), so
    a rerun after any of them changed never reuses an old journal line."""
    settings = {"budget_usd": run.budget_usd, "turn_limit": run.turn_limit, "prompt": run.prompt, "evaluation": dataclasses.asdict(run.evaluation),
                "model": dataclasses.asdict(run.model), "controller": dataclasses.asdict(run.controller)}
    if run.anonymize_workers:  # other labels, other episodes (absent when off: earlier run ids stay valid)
        settings["anonymize_workers"] = True
    return f"{stage}-{baseline_run_id(inputs, settings)}"


def controller_rollouts(run: OrchestraRun, layout: Layout, batches: list, out_dir: Path):
    """Episodes of each (controller, tasks, run id) batch through the real executor and workers, one
    lockstep batch per controller (one generate call per round), resumable from out_dir's journal."""
    market = run.market(layout)
    pool, book = market.pool, market.priced().book
    check_pool_runnable(pool)
    cfg = run.evaluation
    max_tokens = run.controller.max_new_tokens
    config = ExecutorConfig(budget_usd=run.budget_usd, turn_limit=run.turn_limit, controller_max_tokens=max_tokens,
                            end_on_malformed=cfg.end_on_malformed, prompt=run.prompt,
                            anonymize_models=run.anonymize_workers)
    cache = worker_cache(run, layout)
    with workers_with_servers(pool, cfg.server_ctx, cfg.server_threads) as workers:
        async def collect():
            try:
                return await collect_episodes(Executor(pool, workers, book, config, cache=cache), batches, out_dir,
                                              seed=cfg.seed)
            finally:
                await close_workers(workers)

        collected = asyncio.run(collect())
    if cache is not None:
        log.info("worker cache %s: %s", cache.path, cache.stats.snapshot())
    return collected


def worker_cache(run: OrchestraRun, layout: Layout) -> WorkerCache | None:
    """The deterministic workers' cache of this layout, if orchestra.worker_cache is on."""
    return WorkerCache(layout.worker_cache) if run.worker_cache else None


def tasks_of(task_list: list, splits: list[str], source: Path) -> list:
    chosen = [t for t in task_list if t.split in splits]
    if not chosen:
        raise InputError(source, "split", f"no task in the splits {splits}")
    return chosen


def run_inputs(run: OrchestraRun, layout: Layout, *paths: Path) -> list[Path]:
    return [*paths, layout.resolve(run.pool), layout.resolve(run.price_book)]
