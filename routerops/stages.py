"""The pipeline's stages, one function each, called by both the Prefect tasks and the DVC stages.

materialise → collect → reprice → validate → evaluate → track. Each stage reads its inputs from
files, writes its outputs atomically, and leaves a manifest (params, metrics, input and output
hashes) under reports/stages/ that the track stage turns into one MLflow run per stage.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

from routerops import schema
from routerops.config import Params
from routerops.errors import InputError
from routerops.pricing import check_pool_priced, load_pool, load_price_book
from routerops.policies import SINGLE

TASKS = Path("data/suites/tasks.jsonl")
RAW = Path("data/raw")
PRICED = Path("data/priced")
REPORTS = Path("reports")
STAGE_MANIFESTS = REPORTS / "stages"
EVAL_DIR = REPORTS / "eval"
VALIDATION = REPORTS / "validation.json"
JOURNALS = Path(".routerops/journals")  # resumable collection state; not a DVC output


def write_json(obj: Any, path: Path) -> Path:
    """Atomic JSON write (temp file + rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as fh:
        json.dump(obj, fh, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)
    return path


def hash_files(paths: list[Path]) -> dict[str, str]:
    return {str(p): schema.file_sha256(p) for p in paths if Path(p).is_file()}


def write_manifest(stage: str, params: Any, inputs: list[Path], outputs: list[Path], metrics: dict,
                   artifacts: list[Path] = ()) -> Path:
    """What the track stage logs to MLflow for this stage."""
    manifest = {
        "stage": stage,
        "params": dataclasses.asdict(params) if dataclasses.is_dataclass(params) else params,
        "inputs": hash_files(inputs),
        "outputs": hash_files(outputs),
        "metrics": metrics,
        "artifacts": [str(a) for a in artifacts],
    }
    return write_json(manifest, STAGE_MANIFESTS / f"{stage}.json")


def materialise(params: Params) -> Path:
    """Generate the procedural QA suites (fixed seeds; one family held out as OOD)."""
    from routerops.envs.suites import materialise_suites, write_tasks

    cfg = params.materialise
    tasks = materialise_suites(
        families=list(cfg.families),
        ood_families=list(cfg.ood_families),
        sizes={"train": cfg.train, "val": cfg.val, "test": cfg.test, "ood": cfg.ood},
        seed=cfg.seed,
    )
    write_tasks(tasks, TASKS)
    counts = pd.Series([t.split for t in tasks]).value_counts().to_dict()
    write_manifest("materialise", cfg, [], [TASKS], {f"tasks_{k}": int(v) for k, v in counts.items()})
    return TASKS


def collection_run_id(params: Params) -> str:
    """Same inputs → same run id → same episode ids, so a rerun resumes instead of duplicating."""
    h = hashlib.sha256()
    for path in (TASKS, Path(params.pool.file), Path(params.collect.price_book)):
        h.update(schema.file_sha256(path).encode())
    h.update(json.dumps(dataclasses.asdict(params.collect), sort_keys=True).encode())
    return h.hexdigest()[:12]


def collect(params: Params) -> tuple[Path, Path]:
    """Run the behaviour policies: random routers on train (router training data), every behaviour
    policy on the evaluation splits. Starts the local LLM server when the pool uses it."""
    from routerops.envs.qa import QAEnvironment
    from routerops.envs.suites import read_tasks
    from routerops.policies import behaviour_policies
    from routerops.rollout import collect_sync as collect_episodes
    from routerops.workers import build_workers
    from routerops.workers.server import local_llm_server

    cfg = params.collect
    pool = load_pool(params.pool.file)
    book = load_price_book(cfg.price_book)
    check_pool_priced(pool, book, cfg.price_book)
    tasks = read_tasks(TASKS)
    run_id = collection_run_id(params)
    all_policies = behaviour_policies(pool, seed=cfg.seed, stop_prob=cfg.stop_prob)
    train_policies = [p for p in all_policies if p.name in cfg.train_policies]
    train = [t for t in tasks if t.split == "train"]
    evaluation = [t for t in tasks if t.split in params.evaluate.splits]

    uses_local = any(w.kind == "llm" and w.endpoint == "local" for w in pool.workers)
    with local_llm_server(n_ctx=cfg.server_ctx, n_threads=cfg.server_threads) if uses_local else contextlib.nullcontext() as base_url:
        workers = build_workers(pool, base_url)
        common = dict(env=QAEnvironment(), workers=workers, book=book, budget_usd=cfg.budget_usd,
                      turn_limit=cfg.turn_limit, run_id=run_id, seed=cfg.seed, concurrency=cfg.concurrency)
        ep_train, tu_train = collect_episodes(train, train_policies, out_dir=JOURNALS / run_id / "train", **common)
        ep_eval, tu_eval = collect_episodes(evaluation, all_policies, out_dir=JOURNALS / run_id / "eval", **common)

    episodes = pd.concat([ep_train, ep_eval], ignore_index=True)
    turns = pd.concat([tu_train, tu_eval], ignore_index=True)
    outputs = [schema.write_table(episodes, RAW / "episodes.parquet", "episodes"),
               schema.write_table(turns, RAW / "turns.parquet", "turns")]
    metrics = {"episodes": len(episodes), "turns": len(turns), "errors": int((episodes.ended_by == "error").sum()),
               "prompt_tokens": int(turns.prompt_tokens.sum()), "completion_tokens": int(turns.completion_tokens.sum())}
    write_manifest("collect", cfg, [TASKS, Path(params.pool.file), Path(cfg.price_book)], outputs, metrics)
    return outputs[0], outputs[1]


def reprice_tables(episodes: pd.DataFrame, turns: pd.DataFrame, book) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Recompute every turn's and episode's cost from tokens under `book`; no call is made."""
    from routerops.pricing import derive_costs

    turns = turns.copy()
    episodes = episodes.copy()
    turns["cost_usd"] = derive_costs(turns, book).to_numpy() if len(turns) else []
    per_episode = turns.groupby("episode_id")["cost_usd"].sum()
    episodes["cost_usd"] = episodes["episode_id"].map(per_episode).fillna(0.0).to_numpy()
    episodes["price_book_version"] = book.version
    return episodes, turns


def reprice(params: Params, src: Path = RAW, dst: Path = PRICED) -> tuple[Path, Path]:
    """Re-price the raw trajectories under the evaluation price book."""
    pool = load_pool(params.pool.file)
    book = load_price_book(params.reprice.price_book)
    check_pool_priced(pool, book, params.reprice.price_book)
    episodes = schema.read_table(src / "episodes.parquet", "episodes")
    turns = schema.read_table(src / "turns.parquet", "turns")
    episodes, turns = reprice_tables(episodes, turns, book)
    outputs = [schema.write_table(episodes, dst / "episodes.parquet", "episodes"),
               schema.write_table(turns, dst / "turns.parquet", "turns")]
    write_manifest("reprice", params.reprice, [src / "episodes.parquet", src / "turns.parquet",
                                               Path(params.reprice.price_book)], outputs,
                   {"usd_total": float(episodes.cost_usd.sum())})
    return outputs[0], outputs[1]


def validate(params: Params, src: Path = PRICED) -> Path:
    """Great-expectations checks on the priced tables; raises when any expectation fails."""
    from routerops.validation import validate_trajectories, write_validation_report

    pool = load_pool(params.pool.file)
    book = load_price_book(params.reprice.price_book)
    episodes = schema.read_table(src / "episodes.parquet", "episodes")
    turns = schema.read_table(src / "turns.parquet", "turns")
    report = validate_trajectories(episodes, turns, pool, book)
    write_validation_report(report, VALIDATION)
    write_manifest("validate", {}, [src / "episodes.parquet", src / "turns.parquet"], [VALIDATION],
                   {"passed": float(report.passed)})
    if not report.passed:
        first = report.failures()[0]
        raise InputError(src / f"{first.table}.parquet", first.column,
                         f"{len(report.failures())} check(s) failed, first {first.check}; see {VALIDATION}")
    return VALIDATION


def evaluate(params: Params, src: Path = PRICED) -> dict[str, Path]:
    """Leaderboard of every behaviour policy on the evaluation splits, with the accuracy–cost plot."""
    from routerops.report import breakdown_by_split, evaluate_policies, write_report

    episodes = schema.read_table(src / "episodes.parquet", "episodes")
    turns = schema.read_table(src / "turns.parquet", "turns")
    scored = episodes[episodes.split.isin(params.evaluate.splits)]
    singles = sorted(p for p in scored.policy.unique() if p.startswith(SINGLE + "/"))
    leaderboard = evaluate_policies(scored, turns, single_workers=singles, n_boot=params.evaluate.bootstrap,
                                    seed=params.evaluate.seed)
    breakdown = breakdown_by_split(scored, turns)
    paths = write_report(leaderboard, breakdown, EVAL_DIR)
    metrics = json.loads(Path(paths["metrics"]).read_text())
    write_manifest("evaluate", params.evaluate, [src / "episodes.parquet", src / "turns.parquet"],
                   list(paths.values()), metrics, artifacts=[paths["plot"], paths["leaderboard_md"]])
    return paths
