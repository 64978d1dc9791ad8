"""The retrain stages: what a schedule, a published price book or a published pool sets off
(flows/retrain.py; README "Retraining on price and pool changes").

in-force → retire → collect-grid → reprice → validate → grid → routers → register → track, in the
retrain workspace (`ops.workspace`), under the price book and pool in force (`routerops.publishing`).

- retire: a champion that can route to a worker the pool no longer has loses its alias first.
- collect-grid: the single-worker episodes of every split, one journal per worker *signature*
  (its spec and primitives, `worker_signature`): a worker keeps its episodes across retrains for as
  long as its signature holds. So a price-only change collects nothing and makes no call (the LLM
  server is not even started), a pool change collects exactly the episodes of the new or changed
  workers, and a removed worker's episodes are simply not read. The first retrain after the main
  pipeline (`make demo`) starts from that run's logged trajectories (data/raw): a worker whose
  signature is the one it had in params.yaml's pool gets the main run's single-worker episodes of
  the same tasks copied into its journal (`seed_grid`), so that retrain too re-prices and calls no one.
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

import numpy as np
import pandas as pd

from evaluation.registry import retire_champions_routing_to
from evaluation.tracking import log_pipeline_runs, use_tracking
from routerops import schema
from routerops.config import Params
from routerops.envs.qa import QAEnvironment
from routerops.envs.suites import read_tasks
from routerops.layout import Layout, Trajectories
from routerops.policies import SINGLE, policies_by_name
from routerops.market import resolve_book
from routerops.pricing import check_pool_priced, load_pool
from routerops.publishing import POOL, PRICES, copy_atomic, pool_changes, versions, worker_signature
from routerops.publishing import in_force as file_in_force
from routerops.rollout import JOURNAL_NAME, append_journal, collect_sync, plan_episodes, read_journal
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
    repo: Path | None = None  # the repository root: the main pipeline's logged trajectories seed the grid

    def tags(self) -> dict[str, str]:
        return {"routerops.trigger": self.trigger, "routerops.price_book_version": self.price_book_version,
                "routerops.pool_version": self.pool_version}  # the same keys as the main pipeline's run


def in_force(params: Params, repo: Layout, trigger: str = "manual") -> InForce:
    """The published price book and pool in force (params.yaml's files when nothing was published)."""
    store = repo.resolve(params.ops.publish_dir)
    book_file = file_in_force(store, PRICES, repo.resolve(params.prices.evaluation)).resolve()
    pool_file = file_in_force(store, POOL, repo.resolve(params.pool.file)).resolve()
    found = versions(book_file, pool_file)
    return InForce(book_file, found["price_book_version"], pool_file, found["pool_version"], trigger,
                   repo.resolve(params.pool.file).resolve(), repo.root.resolve())


def retrain_setup(params: Params, repo: Layout, now: InForce) -> tuple[Params, Layout]:
    """params.yaml with the pool and price book in force, and the retrain workspace's Layout."""
    params = dataclasses.replace(
        params, pool=dataclasses.replace(params.pool, file=str(now.pool)),
        prices=dataclasses.replace(params.prices, evaluation=str(now.price_book)),
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


def native(record: dict) -> dict:
    """A table row as a journal line holds it: plain Python values."""
    return {k: (v.item() if isinstance(v, np.generic) else v) for k, v in record.items()}


def logged_entries(params: Params, now: InForce, tasks: list) -> tuple[dict, Path | None]:
    """The main pipeline's logged single-worker episodes as journal entries by (task id, policy), and
    the price book they were collected under; empty when there is no main run to seed from (`now.repo`
    unset, its raw tables absent, or collected under another book than params.yaml's collect book)."""
    repo = Layout(now.repo) if now.repo else None
    if repo is None or not all(p.is_file() for p in (repo.raw.episodes, repo.raw.turns, repo.tasks)):
        return {}, None
    book_file = repo.resolve(params.prices.collection)
    episodes = schema.read_table(repo.raw.episodes, "episodes")
    episodes = episodes[episodes.policy.str.startswith(f"{SINGLE}/")]
    if episodes.empty or not book_file.is_file() \
            or set(episodes.price_book_version) != {resolve_book(book_file).version}:
        return {}, None
    logged_tasks = {t.task_id: t for t in read_tasks(repo.tasks)}
    same = {t.task_id for t in tasks if logged_tasks.get(t.task_id) == t}  # the same task, not only its id
    episodes = episodes[episodes.task_id.isin(same)]
    turns = schema.read_table(repo.raw.turns, "turns")
    turns = turns[turns.episode_id.isin(set(episodes.episode_id))].sort_values(["episode_id", "turn_index"])
    by_episode = {eid: [native(t) for t in group.to_dict("records")]
                  for eid, group in turns.groupby("episode_id", sort=False)}
    entries = {(ep["task_id"], ep["policy"]): {"episode": native(ep), "turns": by_episode.get(ep["episode_id"], [])}
               for ep in episodes.to_dict("records")}
    return entries, book_file


def same_worker_as_main(part: WorkerPart, now: InForce) -> bool:
    """The worker has the signature it had in params.yaml's pool, the pool the main pipeline collected with."""
    main_pool = load_pool(now.params_pool)
    return part.name in main_pool.names and worker_signature(main_pool, part.name) == part.signature


def seed_from_main(part: WorkerPart, params: Params, tasks: list, logged: dict) -> int:
    """Append to a worker's grid journal the main pipeline's episodes of that worker (same signature,
    same task, same budget, turn limit and policy version): the retrain after `make demo` re-prices
    those instead of calling the worker again. Each keeps its outcome and tokens under the retrain's
    episode id. Returns how many were added."""
    done = read_journal(part.folder / JOURNAL_NAME)
    settings = {"budget_usd": float(params.collect.budget_usd), "turn_limit": int(params.collect.turn_limit)}
    found = []
    for eid, task, policy in plan_episodes(tasks, part.policies, part.signature, params.collect.seed):
        entry = logged.get((task.task_id, policy.name))
        if eid in done or entry is None or entry["episode"]["policy_version"] != str(policy.version) \
                or any(entry["episode"][k] != v for k, v in settings.items()):
            continue
        episode = {**entry["episode"], "episode_id": eid, "run_id": part.signature}
        found.append((episode, [{**t, "episode_id": eid} for t in entry["turns"]]))
    if found:
        part.folder.mkdir(parents=True, exist_ok=True)
        with open(part.folder / JOURNAL_NAME, "ab") as journal:
            for episode, turns in found:
                append_journal(journal, episode, turns)
    return len(found)


def seed_grid(params: Params, parts: list[WorkerPart], tasks: list,
              now: InForce) -> tuple[list[WorkerPart], dict[str, int]]:
    """The parts with what the main pipeline already logged added to their journals (seed_from_main),
    and how many episodes each got. A worker whose journal was begun under another price book than
    the main run's keeps its own episodes: one journal, one collection book."""
    wanting = [p for p in parts if p.missing and same_worker_as_main(p, now)]
    logged, main_book = logged_entries(params, now, tasks) if wanting else ({}, None)
    seeded: dict[str, int] = {}
    for part in wanting if logged else []:
        kept = part.folder / COLLECTION_BOOK
        if kept.is_file() and resolve_book(kept).version != resolve_book(main_book).version:
            continue
        if not kept.is_file():
            copy_atomic(main_book, kept)  # the book the main run's budgets were enforced under
        seeded[part.name] = seed_from_main(part, params, tasks, logged)
    if seeded:
        print("collect-grid: " + ", ".join(f"{n} episodes of {w}" for w, n in seeded.items())
              + " taken from the main pipeline's logged trajectories (re-priced, not re-collected)")
    return [dataclasses.replace(p, missing=p.missing - seeded.get(p.name, 0)) for p in parts], seeded


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
    parts, seeded = seed_grid(params, worker_parts(params, layout, pool, chosen), chosen, now)
    # Only the servers of workers with episodes still to collect (a journal that is complete needs none).
    needed = dataclasses.replace(pool, workers=tuple(pool.worker(p.name) for p in parts if p.missing))
    frames, collected = [], {}
    # Replay tables are the repository's (the folder the retrain runs from), not the workspace's.
    with pool_endpoints(needed, n_ctx=cfg.server_ctx, n_threads=cfg.server_threads) as endpoints:
        for part in parts:
            book_file = collection_book(part, now)
            book = resolve_book(book_file).book
            one = dataclasses.replace(pool, workers=(pool.worker(part.name),))
            check_pool_priced(one, book, book_file)
            workers = build_workers(one, endpoints) if part.missing else {}  # nothing to run: no client at all
            if part.missing:
                print(f"collect-grid: {part.missing} episodes of {part.name} to collect")
            frames.append(collect_sync(chosen, part.policies, env=QAEnvironment(), workers=workers, book=book,
                                       budget_usd=cfg.budget_usd, turn_limit=cfg.turn_limit, out_dir=part.folder,
                                       run_id=part.signature, seed=cfg.seed, concurrency=cfg.concurrency,
                                       progress=bool(part.missing)))
            collected[part.name] = part.missing
    episodes = pd.concat([ep for ep, _ in frames], ignore_index=True)
    turns = pd.concat([tu for _, tu in frames], ignore_index=True)
    raw = layout.raw
    schema.write_table(episodes, raw.episodes, "episodes")
    schema.write_table(turns, raw.turns, "turns")
    metrics: dict[str, Any] = {"episodes": len(episodes), "episodes_collected": sum(collected.values()),
                               **{f"episodes_collected/{w}": n for w, n in collected.items()},
                               "episodes_from_main_run": sum(seeded.values()),
                               "llm_server_started": float(uses_local(needed))}
    write_manifest(layout.manifests, "collect-grid", cfg, [tasks, now.pool], raw.paths(), metrics)
    return raw


# ---------------------------------------------------------------- track


def track(params: Params, layout: Layout, now: InForce, registry: Path) -> Path:
    """One MLflow parent run `retrain` (a nested run per stage), tagged with the trigger and the
    price book and pool versions in force; `registry` is the register report (ordering only)."""
    run_ids = log_pipeline_runs(params.track, layout.manifests, RETRAIN_STAGES, run_name="retrain", tags=now.tags())
    return schema.write_json_atomic(run_ids, layout.mlflow_runs)
