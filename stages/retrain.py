"""The retrain stages: what a schedule, a published price book or a published pool sets off
(flows/retrain.py; README "Retraining on price and pool changes").

in-force → retire → collect-grid → reprice → validate → grid → routers → register → track, in the
retrain workspace (`ops.workspace`), under the price book and pool in force (`routerops.publishing`).

- retire: a champion that can route to a worker the pool no longer has loses its alias first.
- collect-grid: the single-worker episodes of every split, one journal per worker *signature*
  (its spec and primitives, `worker_signature`): a worker keeps its episodes across retrains for as
  long as its signature holds. So a price-only change collects nothing and makes no call (the LLM
  server is not even started), a pool change collects exactly the episodes of the new or changed
  workers, and a removed worker's episodes are simply not read.
- the rest are the main pipeline's own stage functions on the retrain Layout; the register step
  records the price book and pool versions on the registered version and in its promotion decision.

Each worker's budgets are enforced under the price book in force when its episodes were first
collected (kept beside its journal, so a resumed collection runs under the same book); the reprice
stage then prices every episode under the book in force now — costs always derive from tokens.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from evaluation.registry import retire_champions_routing_to
from evaluation.tracking import log_pipeline_runs, use_tracking
from routerops import schema
from routerops.config import Params
from routerops.envs.qa import QAEnvironment
from routerops.envs.suites import read_tasks
from routerops.layout import Layout, Trajectories
from routerops.policies import SINGLE, policies_by_name
from routerops.pricing import check_pool_priced, load_pool, load_price_book
from routerops.publishing import POOL, PRICES, copy_atomic, pool_changes, versions, worker_signature
from routerops.publishing import in_force as file_in_force
from routerops.rollout import JOURNAL_NAME, collect_sync, plan_episodes, read_journal
from routerops.workers import build_workers
from routerops.workers.endpoints import pool_endpoints, uses_local
from stages.manifest import write_manifest

RETRAIN_STAGES = ["retire", "collect-grid", "reprice", "validate", "grid", "routers", "register"]
COLLECTION_BOOK = "collection_book.yaml"


@dataclass(frozen=True)
class InForce:
    """The price book and pool a retrain runs under, and why it runs."""

    price_book: Path
    price_book_version: str
    pool: Path
    pool_version: str
    trigger: str  # "schedule", "prices", "pool" or "manual"
    params_pool: Path  # params.yaml's pool: what was in use before the first retrain

    def tags(self) -> dict[str, str]:
        return {"routerops.trigger": self.trigger, "routerops.price_book_version": self.price_book_version,
                "routerops.pool_version": self.pool_version}  # the same keys as the main pipeline's run


def in_force(params: Params, repo: Layout, trigger: str = "manual") -> InForce:
    """The published price book and pool in force (params.yaml's files when nothing was published)."""
    store = repo.resolve(params.ops.publish_dir)
    book_file = file_in_force(store, PRICES, repo.resolve(params.reprice.price_book)).resolve()
    pool_file = file_in_force(store, POOL, repo.resolve(params.pool.file)).resolve()
    found = versions(book_file, pool_file)
    return InForce(book_file, found["price_book_version"], pool_file, found["pool_version"], trigger,
                   repo.resolve(params.pool.file).resolve())


def retrain_setup(params: Params, repo: Layout, now: InForce) -> tuple[Params, Layout]:
    """params.yaml with the pool and price book in force, and the retrain workspace's Layout."""
    params = dataclasses.replace(
        params, pool=dataclasses.replace(params.pool, file=str(now.pool)),
        reprice=dataclasses.replace(params.reprice, price_book=str(now.price_book)),
        # The reference answers materialise reads stay the repository's file.
        materialise=dataclasses.replace(params.materialise, answers=str(repo.resolve(params.materialise.answers))))
    return params, Layout(repo.resolve(params.ops.workspace))


# ---------------------------------------------------------------- retire


def retire(params: Params, layout: Layout, now: InForce) -> Path:
    """Retire every champion that can route to a worker missing from the pool in force. The pool the
    last retrain used is the workspace's `pool_in_use.yaml`; before the first, params.yaml's pool
    (what the main pipeline registered its champions over)."""
    last = layout.root / "pool_in_use.yaml"
    pool = load_pool(now.pool)
    changes = pool_changes(load_pool(last if last.is_file() else now.params_pool), pool)
    use_tracking(params.track)
    retired = retire_champions_routing_to(set(changes["removed"]), f"pool {now.pool_version}")
    copy_atomic(now.pool, last)
    report = layout.reports / "retire.json"
    schema.write_json_atomic({"pool_version": now.pool_version, "changes": changes, "retired": retired}, report)
    write_manifest(layout.manifests, "retire", {}, [now.pool], [report],
                   {"workers_added": len(changes["added"]), "workers_removed": len(changes["removed"]),
                    "workers_changed": len(changes["changed"]), "champions_retired": len(retired)})
    return report


# ---------------------------------------------------------------- collect the grid, per worker


@dataclass(frozen=True)
class WorkerPart:
    """One worker's share of the grid: its single-worker policies over every collected split."""

    name: str
    signature: str
    folder: Path
    policies: list
    missing: int  # planned episodes its journal does not hold yet


def grid_splits(params: Params) -> list[str]:
    return ["train", "val", *params.evaluate.splits]


def worker_parts(params: Params, layout: Layout, pool, tasks: list) -> list[WorkerPart]:
    parts = []
    for spec in pool.workers:
        signature = worker_signature(pool, spec.name)
        folder = layout.journals / "grid" / f"{spec.name}-{signature}"
        names = [f"{SINGLE}/{w}/{p}" for w, p in pool.actions() if w == spec.name]
        policies = policies_by_name(names, pool, seed=params.collect.seed)
        done = read_journal(folder / JOURNAL_NAME)
        planned = plan_episodes(tasks, policies, signature, params.collect.seed)
        parts.append(WorkerPart(spec.name, signature, folder, policies, sum(eid not in done for eid, _, _ in planned)))
    return parts


def collection_book(part: WorkerPart, now: InForce) -> Path:
    """The book this worker's budgets are enforced under: the one in force at its first collection."""
    kept = part.folder / COLLECTION_BOOK
    if not kept.is_file():
        copy_atomic(now.price_book, kept)
    return kept


def collect_grid(params: Params, layout: Layout, tasks: Path, now: InForce) -> Trajectories:
    """Every worker's single-worker episodes on train, val and the evaluation splits; only what the
    journals lack is collected (see the module docstring)."""
    cfg, pool = params.collect, load_pool(now.pool)
    chosen = [t for t in read_tasks(tasks) if t.split in grid_splits(params)]
    parts = worker_parts(params, layout, pool, chosen)
    # Only the servers of workers with episodes still to collect (a journal that is complete needs none).
    needed = dataclasses.replace(pool, workers=tuple(pool.worker(p.name) for p in parts if p.missing))
    frames, collected = [], {}
    # Replay tables are the repository's (the folder the retrain runs from), not the workspace's.
    with pool_endpoints(needed, n_ctx=cfg.server_ctx, n_threads=cfg.server_threads) as endpoints:
        for part in parts:
            book_file = collection_book(part, now)
            book = load_price_book(book_file)
            one = dataclasses.replace(pool, workers=(pool.worker(part.name),))
            check_pool_priced(one, book, book_file)
            workers = build_workers(one, endpoints) if part.missing else {}  # nothing to run: no client at all
            frames.append(collect_sync(chosen, part.policies, env=QAEnvironment(), workers=workers, book=book,
                                       budget_usd=cfg.budget_usd, turn_limit=cfg.turn_limit, out_dir=part.folder,
                                       run_id=part.signature, seed=cfg.seed, concurrency=cfg.concurrency,
                                       progress=False))
            collected[part.name] = part.missing
    episodes = pd.concat([ep for ep, _ in frames], ignore_index=True)
    turns = pd.concat([tu for _, tu in frames], ignore_index=True)
    raw = layout.raw
    schema.write_table(episodes, raw.episodes, "episodes")
    schema.write_table(turns, raw.turns, "turns")
    metrics: dict[str, Any] = {"episodes": len(episodes), "episodes_collected": sum(collected.values()),
                               **{f"episodes_collected/{w}": n for w, n in collected.items()},
                               "llm_server_started": float(uses_local(needed))}
    write_manifest(layout.manifests, "collect-grid", cfg, [tasks, now.pool], raw.paths(), metrics)
    return raw


# ---------------------------------------------------------------- track


def track(params: Params, layout: Layout, now: InForce, registry: Path) -> Path:
    """One MLflow parent run `retrain` (a nested run per stage), tagged with the trigger and the
    price book and pool versions in force; `registry` is the register report (ordering only)."""
    run_ids = log_pipeline_runs(params.track, layout.manifests, RETRAIN_STAGES, run_name="retrain", tags=now.tags())
    return schema.write_json_atomic(run_ids, layout.mlflow_runs)
