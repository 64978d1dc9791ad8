"""The orchestrator's stages (paper 004, Uno-Orchestra §4): tasks → teacher → verifier filter → SFT →
evaluate → register.

Each is `stage(run, layout, *inputs) -> outputs` like every other stage (stages/pipeline.py): the
Prefect tasks of flows/orchestra.py and `routerops stage orchestra-…` (dvc.yaml) call them. Defaults
live in params.yaml, section `orchestra` (small scale for this CPU); configs/paper/orchestra.yaml is
the paper-scale run. The controller trains on train tasks only; the promotion gate judges on val;
test and OOD are only rolled out on.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from evaluation.baselines import (
    baseline_collection_plan, baseline_run_id, baseline_table, check_one_flat_primitive, check_router_names,
    check_splits, collect_baseline_episodes, write_baseline_report,
)
from models.embeddings import default_encoder
from routerops import schema
from routerops.envs.replay import load_logged_outcomes, write_logged_outcomes
from routerops.envs.suites import materialise_suites, read_tasks, write_tasks
from routerops.errors import InputError
from routerops.grid import logged_outcomes_from_trajectories
from routerops.layout import Layout
from routerops.pricing import check_pool_priced, load_pool, load_price_book
from routerops.workers import check_pool_runnable
from stages.manifest import write_manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OrchestraTasks:
    """The task pool D_0 (004 §4): verifiable reasoning-gym families, one held out as OOD. The split
    seeds are per (family, split), so with the main pipeline's families and seed the test and OOD
    tasks are the main pipeline's, whatever the train size."""

    families: list[str] = field(default_factory=lambda: ["basic_arithmetic", "chain_sum", "gcd", "lcm"])
    ood_families: list[str] = field(default_factory=lambda: ["decimal_chain_sum"])
    train: int = 12  # tasks per family: the teacher's pool, split by the filter into D_SFT and D_RL
    val: int = 2  # the promotion gate's tasks
    test: int = 4
    ood: int = 6
    seed: int = 7


@dataclass(frozen=True)
class OrchestraBaselines:
    """The baseline rows of the results table (004 §6 Tab. 1: single models, single-turn routers and
    multi-round routers beside the orchestrator), on the same tasks, pool, prices and budget."""

    # Single-turn routers of models/registry.py, fitted on the train grid; the one best on val is
    # reported as "the best single-turn router" (MTRouter is always fitted and reported too).
    routers: list[str] = field(default_factory=lambda: ["knn", "logistic", "mf", "mlp"])
    # One fit per seed of every learned router; a row is the mean over them (design.md: three seeds
    # where training is stochastic).
    router_seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    rollout_seed: int = 11  # episode ids and the random router's draws
    concurrency: int = 4  # episodes in flight
    server_ctx: int = 2048  # llama.cpp context of the embedded server
    server_threads: int = 2  # llama.cpp generation threads (1 on a busy machine)


@dataclass(frozen=True)
class OrchestraRun:
    """params.yaml → orchestra."""

    pool: str = "configs/pool.yaml"
    price_book: str = "configs/prices/current.yaml"
    tasks: OrchestraTasks = field(default_factory=OrchestraTasks)
    budget_usd: float = 0.01  # per episode, checked before every worker call
    turn_limit: int = 8  # Tmax, controller turns per episode (004 App. B: Tmax = 8)
    baselines: OrchestraBaselines = field(default_factory=OrchestraBaselines)


def load_run(path: str | Path = "params.yaml") -> OrchestraRun:
    raw = (yaml.safe_load(Path(path).read_text()) or {}).get("orchestra", {}) or {}
    return _build(OrchestraRun, raw, path, "orchestra")


def _build(cls, raw, path, where: str):
    if not isinstance(raw, dict):
        raise InputError(path, where, f"expected a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise InputError(path, f"{where}.{unknown[0]}", "unknown key")
    values = {}
    for name, value in raw.items():
        default = fields[name].default_factory() if fields[name].default_factory is not dataclasses.MISSING else None
        values[name] = _build(type(default), value, path, f"{where}.{name}") if dataclasses.is_dataclass(default) else value
    return cls(**values)


# ---------------------------------------------------------------- stage: tasks


def tasks(run: OrchestraRun, layout: Layout) -> Path:
    """D_0: the procedural QA tasks the teacher, the filter and the evaluation share."""
    cfg = run.tasks
    pool = materialise_suites(families=list(cfg.families), ood_families=list(cfg.ood_families),
                              sizes={"train": cfg.train, "val": cfg.val, "test": cfg.test, "ood": cfg.ood},
                              seed=cfg.seed)
    write_tasks(pool, layout.orchestra_tasks)
    counts = pd.Series([t.split for t in pool]).value_counts().to_dict()
    write_manifest(layout.orchestra_manifests, "orchestra-tasks", run, [], [layout.orchestra_tasks],
                   {f"tasks_{k}": int(v) for k, v in counts.items()})
    return layout.orchestra_tasks


# ---------------------------------------------------------------- stage: baselines


def baselines(run: OrchestraRun, layout: Layout, tasks: Path) -> Path:
    """The baseline rows of the results table on the test and OOD tasks (evaluation/baselines.py):
    single workers and the random router rolled out through the real workers; the best single-turn
    router and MTRouter fitted on the train grid, their operating point chosen on val."""
    cfg = run.baselines
    pool_file, book_file = layout.resolve(run.pool), layout.resolve(run.price_book)
    pool, book, task_list = load_pool(pool_file), load_price_book(book_file), read_tasks(tasks)
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
