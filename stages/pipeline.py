"""The main pipeline's trajectory stages: materialise → collect → reprice → validate → evaluate.

Each stage is `stage(params, layout, *inputs) -> outputs`: it reads only the paths it is given,
writes its outputs atomically under the Layout, and leaves a manifest (params, metrics, input and
output hashes) that the track stage turns into one MLflow run per stage. `routerops stage NAME`
(what dvc.yaml runs) and the Prefect tasks call these same functions.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from routerops import schema, shards
from routerops.config import Params
from routerops.envs.qa import QAEnvironment
from routerops.envs.replay import load_logged_outcomes
from routerops.envs.suites import materialise_suites, read_tasks, write_tasks
from routerops.envs.table_tasks import table_tasks
from routerops.errors import InputError
from routerops.layout import Layout, Trajectories
from routerops.policies import SINGLE, behaviour_policies, policies_by_name
from routerops.pricing import derive_costs
from routerops.report import breakdown_by_split, evaluate_policies, write_report
from routerops.rollout import plan_episodes
from routerops.validation import validate_trajectories, write_validation_report
from routerops.workers import ServedEndpoints, build_workers, check_pool_runnable, pool_endpoints, run_closing
from routerops.workers.endpoints import replay_tables
from stages.manifest import write_manifest


def materialise(params: Params, layout: Layout, outcomes: Path) -> Path:
    """The tasks: the procedural QA suites (fixed seeds; one family held out as OOD), or with
    `source: table` the questions of the logged-outcome table `outcomes` in one seeded split by query."""
    cfg = params.materialise
    if cfg.source == "suites":
        return write_suites(cfg, layout.tasks, layout.manifests, "materialise")
    if cfg.source != "table":
        raise InputError("params.yaml", "materialise.source", f"expected 'suites' or 'table', got {cfg.source!r}")
    answers = layout.resolve(cfg.answers)
    tasks = table_tasks(load_logged_outcomes(outcomes), answers, {"train": cfg.train, "val": cfg.val,
                                                                  "test": cfg.test}, cfg.seed)
    write_tasks(tasks, layout.tasks)
    counts = pd.Series([t.split for t in tasks]).value_counts().to_dict()
    write_manifest(layout.manifests, "materialise", cfg, [outcomes, answers], [layout.tasks],
                   {f"tasks_{k}": int(v) for k, v in counts.items()})
    return layout.tasks


def write_suites(cfg, path: Path, manifests: Path, stage: str) -> Path:
    """The tasks of `cfg` (families, ood_families, per-split sizes, seed) written to `path`, with the
    stage's manifest (task counts per split)."""
    tasks = materialise_suites(families=list(cfg.families), ood_families=list(cfg.ood_families),
                               sizes={"train": cfg.train, "val": cfg.val, "test": cfg.test, "ood": cfg.ood},
                               seed=cfg.seed)
    write_tasks(tasks, path)
    counts = pd.Series([t.split for t in tasks]).value_counts().to_dict()
    write_manifest(manifests, stage, cfg, [], [path], {f"tasks_{k}": int(v) for k, v in counts.items()})
    return path


# Where episodes run changes nothing about them: these settings stay out of the run id, so a
# collection keeps its episode ids (and resumes) when it is spread over more or fewer workers.
PLACEMENT_KEYS = ("shards", "dask_address", "dask_workers")


def collection_run_id(params: Params, layout: Layout, tasks: Path) -> str:
    """Same inputs → same run id → same episode ids, so a rerun resumes instead of duplicating."""
    h = hashlib.sha256()
    market = params.market(layout)
    replayed = replay_tables(market.pool, layout.root).values()  # the answers replay endpoints give
    for path in (tasks, market.pool_file, market.collection.file, *replayed):
        h.update(schema.file_sha256(path).encode())
    settings = {k: v for k, v in dataclasses.asdict(params.collect).items() if k not in PLACEMENT_KEYS}
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()[:12]


def collection_plan(params: Params, pool, tasks: list) -> list[tuple[str, list, list]]:
    """(label, tasks, policies) per part of the collection.

    train: the random behaviour routers (with their propensities) and every single (worker,
    primitive), whose episodes are the logged-outcome grid routers are fit on; val: the single
    workers only, the grid the promotion gate judges on; the evaluation splits (test, OOD): every
    behaviour policy, for the leaderboard. No router ever trains on val, test or OOD tasks.
    """
    cfg = params.collect
    every = behaviour_policies(pool, seed=cfg.seed, stop_prob=cfg.stop_prob)
    singles = policies_by_name([SINGLE], pool, seed=cfg.seed, stop_prob=cfg.stop_prob)
    behaviour = [p for p in every if p.name in cfg.train_policies]
    by_split = {split: [t for t in tasks if t.split == split] for split in ("train", "val")}
    evaluation = [t for t in tasks if t.split in params.evaluate.splits]
    return [("train", by_split["train"], behaviour + singles), ("val", by_split["val"], singles),
            ("eval", evaluation, every)]


@dataclasses.dataclass(frozen=True)
class ShardJob:
    """One unit of a collection's work: shard `shard` of `n_shards` of one part (train / val / eval)
    of the plan. Small and picklable, so a Dask worker on another process or machine can run it."""

    label: str
    shard: int
    n_shards: int
    run_id: str
    endpoints: ServedEndpoints  # the servers the stage started (llama.cpp, replay); plain strings


def planned_parts(params: Params, pool, tasks: Path, run_id: str) -> dict[str, list]:
    """Every non-empty part of the collection plan as (episode id, task, policy) rows, by label."""
    parts = collection_plan(params, pool, read_tasks(tasks))
    return {label: plan_episodes(part, policies, run_id, params.collect.seed) for label, part, policies in parts
            if part}


def collect_shard(params: Params, layout: Layout, tasks: Path, job: ShardJob) -> int:
    """Collect one shard into its journal (routerops.shards); runs in whichever process is handed
    the job, rebuilding pool, workers and plan from the same files, and returns its episode count."""
    cfg, market = params.collect, params.market(layout)
    pool, book = market.pool, market.collection.book
    plan = planned_parts(params, pool, tasks, job.run_id)[job.label]
    workers = build_workers(pool, job.endpoints)
    return run_closing(shards.collect_shard(
        plan, job.shard, job.n_shards, QAEnvironment(), workers, book, cfg.budget_usd,
        cfg.turn_limit, layout.journals / job.run_id / job.label, job.run_id, cfg.seed, cfg.concurrency,
        progress=job.n_shards == 1), workers.values())


def run_shards_here(params: Params, layout: Layout, tasks: Path, jobs: list[ShardJob]) -> None:
    """The shards one after another in this process: what `routerops stage collect` (DVC) does. A
    Prefect flow passes a runner that spreads them over Dask workers (tasks/shards.py)."""
    for job in jobs:
        collect_shard(params, layout, tasks, job)


def collect(params: Params, layout: Layout, tasks: Path,
            run_shards: Callable[..., None] = run_shards_here) -> Trajectories:
    """Run the collection plan against the pool, in `collect.shards` shards per part handed to
    `run_shards`; starts the pool's LLM servers (llama.cpp, replay endpoints) for as long as they run."""
    cfg, market = params.collect, params.market(layout)
    collection = market.priced("collection")
    pool, pool_file, book_file, book = market.pool, market.pool_file, collection.file, collection.book
    check_pool_runnable(pool)  # before the LLM server starts: a pool whose tools cannot run fails now
    shards.check_shard_count(cfg.shards)
    run_id = collection_run_id(params, layout, tasks)
    plan = planned_parts(params, pool, tasks, run_id)
    with pool_endpoints(pool, layout.root, n_ctx=cfg.server_ctx, n_threads=cfg.server_threads) as endpoints:
        run_shards(params, layout, tasks, [ShardJob(label, k, cfg.shards, run_id, endpoints)
                                           for label in plan for k in range(cfg.shards)])
    parts = [shards.merge_shards(part, cfg.shards, layout.journals / run_id / label, book, cfg.budget_usd,
                                 cfg.turn_limit) for label, part in plan.items()]
    episodes = pd.concat([ep for ep, _ in parts], ignore_index=True)
    turns = pd.concat([tu for _, tu in parts], ignore_index=True)
    raw = layout.raw
    schema.write_table(episodes, raw.episodes, "episodes")
    schema.write_table(turns, raw.turns, "turns")
    metrics = {"episodes": len(episodes), "turns": len(turns), "errors": int((episodes.ended_by == "error").sum()),
               "prompt_tokens": int(turns.prompt_tokens.sum()), "completion_tokens": int(turns.completion_tokens.sum())}
    write_manifest(layout.manifests, "collect", cfg, [tasks, pool_file, book_file], raw.paths(), metrics)
    return raw


def reprice_tables(episodes: pd.DataFrame, turns: pd.DataFrame, book) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Recompute every turn's and episode's cost from tokens under `book`; no call is made."""
    turns = turns.copy()
    episodes = episodes.copy()
    turns["cost_usd"] = derive_costs(turns, book).to_numpy() if len(turns) else []
    per_episode = turns.groupby("episode_id")["cost_usd"].sum()
    episodes["cost_usd"] = episodes["episode_id"].map(per_episode).fillna(0.0).to_numpy()
    episodes["price_book_version"] = book.version
    return episodes, turns


def reprice(params: Params, layout: Layout, raw: Trajectories) -> Trajectories:
    """Re-price the raw trajectories under the evaluation price book."""
    evaluation = params.market(layout).priced("evaluation")
    book_file, book = evaluation.file, evaluation.book
    episodes, turns = reprice_tables(schema.read_table(raw.episodes, "episodes"),
                                     schema.read_table(raw.turns, "turns"), book)
    priced = layout.priced
    schema.write_table(episodes, priced.episodes, "episodes")
    schema.write_table(turns, priced.turns, "turns")
    write_manifest(layout.manifests, "reprice", {"price_book": str(params.prices.evaluation)}, raw.paths() + [book_file], priced.paths(),
                   {"usd_total": float(episodes.cost_usd.sum())})
    return priced


def validate(params: Params, layout: Layout, priced: Trajectories) -> Path:
    """Great-expectations checks on the priced tables; raises when any expectation fails."""
    market = params.market(layout)
    pool, book = market.pool, market.evaluation.book
    episodes = schema.read_table(priced.episodes, "episodes")
    turns = schema.read_table(priced.turns, "turns")
    report = validate_trajectories(episodes, turns, pool, book)
    write_validation_report(report, layout.validation)
    write_manifest(layout.manifests, "validate", {}, priced.paths(), [layout.validation],
                   {"passed": float(report.passed)})
    if not report.passed:
        first = report.failures()[0]
        raise InputError(priced.folder / f"{first.table}.parquet", first.column,
                         f"{len(report.failures())} check(s) failed, first {first.check}; see {layout.validation}")
    return layout.validation


def evaluate(params: Params, layout: Layout, priced: Trajectories, validation: Path) -> dict[str, Path]:
    """Leaderboard of every behaviour policy on the evaluation splits, with the accuracy–cost plot.
    `validation` is the passed report: evaluation never reads data that failed its checks."""
    if not json.loads(Path(validation).read_text()).get("passed", False):
        raise InputError(validation, "passed", "the trajectories failed validation; not evaluating them")
    episodes = schema.read_table(priced.episodes, "episodes")
    turns = schema.read_table(priced.turns, "turns")
    scored = episodes[episodes.split.isin(params.evaluate.splits)]
    singles = sorted(p for p in scored.policy.unique() if p.startswith(SINGLE + "/"))
    leaderboard = evaluate_policies(scored, turns, single_workers=singles, n_boot=params.evaluate.bootstrap,
                                    seed=params.evaluate.seed)
    paths = write_report(leaderboard, breakdown_by_split(scored, turns), layout.eval_dir)
    metrics = json.loads(Path(paths["metrics"]).read_text())
    write_manifest(layout.manifests, "evaluate", params.evaluate, priced.paths(), list(paths.values()), metrics,
                   artifacts=[paths["plot"], paths["leaderboard_md"]])
    return paths
