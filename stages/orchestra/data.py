"""Stages orchestra-tasks (the procedural suites) and orchestra-baselines (single workers and routers
fitted on the train grid, their operating point chosen on val)."""

from __future__ import annotations

import logging
from pathlib import Path

from evaluation.baselines import (
    baseline_collection_plan, baseline_run_id, baseline_table, check_one_flat_primitive, check_router_names,
    check_splits, collect_baseline_episodes, write_baseline_report,
)
from models.embeddings import default_encoder
from routerops import schema
from routerops.envs.replay import load_logged_outcomes, write_logged_outcomes
from routerops.envs.suites import read_tasks
from routerops.grid import logged_outcomes_from_trajectories
from routerops.layout import Layout
from routerops.pricing import check_pool_priced
from routerops.workers import check_pool_runnable
from stages.manifest import write_manifest
from stages.pipeline import write_suites
from stages.orchestra.config import OrchestraRun

log = logging.getLogger(__name__)


def tasks(run: OrchestraRun, layout: Layout) -> Path:
    """D_0: the procedural QA tasks the teacher, the filter and the evaluation share."""
    return write_suites(run.tasks, layout.orchestra_tasks, layout.orchestra_manifests, "orchestra-tasks")


def baselines(run: OrchestraRun, layout: Layout, tasks: Path) -> Path:
    """The baseline rows of the results table on the test and OOD tasks (evaluation/baselines.py):
    single workers and the random router rolled out through the real workers; the best single-turn
    router and MTRouter fitted on the train grid, their operating point chosen on val."""
    cfg = run.baselines
    market, task_list = run.market(layout), read_tasks(tasks)
    pool, pool_file, book_file, book = market.pool, market.pool_file, market.evaluation_file, market.evaluation.book
    check_router_names(cfg.routers)
    check_one_flat_primitive(pool, pool_file)
    check_pool_priced(pool, book, book_file)
    check_pool_runnable(pool)  # before the LLM server starts
    check_splits(task_list, tasks)
    rollout = dict(budget_usd=run.budget_usd, turn_limit=run.turn_limit, seed=cfg.rollout_seed)
    run_id = baseline_run_id([tasks, pool_file, book_file], rollout)
    episodes, turns = collect_baseline_episodes(
        baseline_collection_plan(pool, task_list, cfg.rollout_seed), pool, book,
        layout.orchestra_journals / "baselines" / run_id, run_id, concurrency=cfg.concurrency,
        server_ctx=cfg.server_ctx, server_threads=cfg.server_threads, **rollout)
    out = layout.orchestra_baselines
    schema.write_table(episodes, out.episodes, "episodes")
    schema.write_table(turns, out.turns, "turns")
    grid = write_logged_outcomes(logged_outcomes_from_trajectories(episodes, task_list), layout.orchestra_grid)
    table, selection = baseline_table(episodes, load_logged_outcomes(grid), book, pool, list(cfg.routers),
                                      list(cfg.router_seeds), default_encoder(), source=grid)
    reports = write_baseline_report(table, selection, layout.orchestra_baselines_table,
                                    layout.orchestra_baselines_markdown, layout.orchestra_baselines_selection,
                                    book.version)
    metrics = {f"{col}/{row.split}/{row.policy}": float(getattr(row, col))
               for row in table.itertuples() for col in ("accuracy", "usd_per_episode")}
    write_manifest(layout.orchestra_manifests, "orchestra-baselines", run, [tasks, pool_file, book_file],
                   [*out.paths(), grid, *reports], {**metrics, "episodes": len(episodes)}, artifacts=reports[1:2])
    return layout.orchestra_baselines_table
