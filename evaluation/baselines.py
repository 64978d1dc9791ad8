"""The baseline rows of the orchestrator's results table (paper 004 §6, Tab. 1: single models,
single-turn routers, multi-round routers beside the orchestrator): each single (worker, primitive), the
uniform random router, the best single-turn router and MTRouter, on the held-out test and OOD tasks,
each as an accuracy (pass@1: the episode's `success`) and a mean USD per episode.

Single workers and the random router are rolled out through the real workers; their episodes are
the rows. The learned routers are fitted on the train split's task × worker grid of single-worker
episodes (routerops/grid.py) and replayed on the test and OOD grids: a single-turn router makes one
call, and the logged episode of the worker it picks is that call, with its real tokens and USD.

Operating point, one rule for every learned router (the knob is the cost weight λ of
models/base.py's rule argmax_w q̂(x, w) − λ·ĉ(w)):
- ĉ(w) is the worker's mean USD per episode on the train grid — MTRouter's ĉ(a), the mean logged
  cost of a call (models/mtrouter/router.py) — because a deployed router knows prices and typical
  lengths before it calls, not the tokens the answer it is about to buy will take;
- λ is the value of the router's knob grid (evaluation.replay.knob_grid on its val predictions) with
  the highest val accuracy; ties go to the lower val USD per episode, then to the larger λ;
- one fit per seed of `seeds`, each with its own λ; a row is the mean over seeds.
The best single-turn router is the configured one with the highest mean val accuracy at its λ (ties:
lower mean val USD, then the configured order). Nothing here reads a test or OOD outcome to choose.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.replay import check_disjoint, knob_grid, routing_data_from_table, split_table
from models.base import Router, RoutingData
from models.registry import ROUTER_FACTORIES, make_router
from routerops import schema
from routerops.envs.qa import QAEnvironment
from routerops.errors import InputError
from routerops.policies import SINGLE, UniformRandomRouter, policies_by_name
from routerops.pricing import Pool, PriceBook
from routerops.report import to_markdown
from routerops.rollout import collect
from routerops.types import Task
from routerops.workers import build_workers
from routerops.workers.endpoints import pool_endpoints

log = logging.getLogger(__name__)

TRAIN, CHOOSE_ON = "train", "val"
SCORED_SPLITS = ("test", "ood")  # reported apart: OOD families are in no router's training data
ALL_SPLITS = (TRAIN, CHOOSE_ON, *SCORED_SPLITS)
MTROUTER = "mtrouter"
KINDS = ("single", "random", "router", "mtrouter")
# Registry routers that are not a one-call router fitted on the train grid, and why.
NOT_SINGLE_TURN = {
    "oracle": "reads the outcomes it is scored on: an upper bound, not a baseline",
    "cascade": "calls several workers per task: not a single-turn router",
    MTROUTER: "is reported in its own row",
}
TABLE_COLUMNS = ["split", "policy", "kind", "accuracy", "usd_per_episode", "episodes", "protocol",
                 "operating_point", "accuracy_seed_std", "val_accuracy", "val_usd_per_episode"]
SELECTION_COLUMNS = ["router", "seed", "cost_weight", "val_accuracy", "val_usd_per_episode", "reported"]
OPERATING_RULE = ("λ of q̂ − λ·ĉ (ĉ: mean train USD per worker) maximising val accuracy, "
                  "ties to lower val USD then larger λ; one λ per seed")


# ---------------------------------------------------------------- checks at the edge


def check_router_names(names: Sequence[str], source: str | Path = "params.yaml",
                       where: str = "orchestra.baselines.routers") -> None:
    """The configured single-turn routers: registry names that make one call per task."""
    if not names:
        raise InputError(source, where, "name at least one single-turn router (e.g. knn)")
    for i, name in enumerate(names):
        if name in NOT_SINGLE_TURN:
            raise InputError(source, f"{where}[{i}]", f"{name!r} {NOT_SINGLE_TURN[name]}")
        if name not in ROUTER_FACTORIES:
            known = sorted(set(ROUTER_FACTORIES) - set(NOT_SINGLE_TURN))
            raise InputError(source, f"{where}[{i}]", f"unknown router {name!r}; known: {known}")


def check_one_flat_primitive(pool: Pool, source: str | Path) -> None:
    """The grid keys outcomes by worker, so each worker may offer flat routers one primitive."""
    for i, worker in enumerate(pool.workers):
        if len(worker.primitives) != 1:
            raise InputError(source, f"workers[{i}].primitives", f"worker {worker.name!r} offers "
                             f"{list(worker.primitives)}: the task × worker grid needs exactly one")


def check_splits(tasks: Sequence[Task], source: str | Path) -> None:
    """Routers need train tasks to fit, val to choose on, and test and OOD to report."""
    present = {t.split for t in tasks}
    missing = [split for split in ALL_SPLITS if split not in present]
    if missing:
        raise InputError(source, "split", f"no {missing[0]!r} task; the baselines need {list(ALL_SPLITS)}")


# ---------------------------------------------------------------- collection through the real workers


def baseline_run_id(inputs: Sequence[Path], settings: dict) -> str:
    """Same inputs and settings → same episode ids, so a rerun resumes from its journal."""
    h = hashlib.sha256()
    for path in inputs:
        h.update(schema.file_sha256(path).encode())
    h.update(json.dumps(settings, sort_keys=True).encode())
    return h.hexdigest()[:12]


def random_router(seed: int) -> UniformRandomRouter:
    """Uniform over every flat (worker, primitive) action, tools included: the action space of the
    single-worker rows and of the learned routers (the main pipeline's draws LLM answers only)."""
    return UniformRandomRouter(seed=seed, primitives=None)


def baseline_collection_plan(pool: Pool, tasks: Sequence[Task], seed: int) -> list[tuple[str, list[Task], list]]:
    """(split, tasks, policies): every single (worker, primitive) on every split — the grid the
    routers fit on (train), are chosen on (val) and are replayed on (test, OOD) — and the random
    router on test and OOD only."""
    singles = policies_by_name([SINGLE], pool, seed=seed)
    plan = []
    for split in ALL_SPLITS:
        part = [t for t in tasks if t.split == split]
        policies = singles + ([random_router(seed)] if split in SCORED_SPLITS else [])
        if part:
            plan.append((split, part, policies))
    return plan


def collect_baseline_episodes(plan: list[tuple[str, list[Task], list]], pool: Pool, book: PriceBook, out_dir: Path,
                              run_id: str, *, budget_usd: float, turn_limit: int, seed: int, concurrency: int,
                              server_ctx: int, server_threads: int) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Episodes and turns of the plan; starts the pool's LLM servers (llama.cpp, replay) while it runs.
    out_dir/<split> holds each part's resumable journal."""
    with pool_endpoints(pool, n_ctx=server_ctx, n_threads=server_threads) as endpoints:
        common = dict(env=QAEnvironment(), workers=build_workers(pool, endpoints), book=book, budget_usd=budget_usd,
                      turn_limit=turn_limit, run_id=run_id, seed=seed, concurrency=concurrency)
        parts = asyncio.run(collect_parts(plan, out_dir, common))
    return (pd.concat([ep for ep, _ in parts], ignore_index=True),
            pd.concat([tu for _, tu in parts], ignore_index=True))


async def collect_parts(plan: list[tuple[str, list[Task], list]], out_dir: Path, common: dict) -> list:
    """Every part in one event loop, whose HTTP clients are closed on it at the end (an LLM worker's
    client belongs to the loop it was made in; one loop per part would leave them to the collector)."""
    try:
        return [await collect(part, policies, out_dir=out_dir / split, **common) for split, part, policies in plan]
    finally:
        for worker in common["workers"].values():
            if hasattr(worker, "aclose"):
                await worker.aclose()


# ---------------------------------------------------------------- rows of the rolled-out baselines


def rollout_rows(episodes: pd.DataFrame, split: str) -> list[dict]:
    """One row per single worker and for the random router: their own episodes on `split`."""
    rows = []
    scored = episodes[episodes.split == split]
    for policy, group in scored.groupby("policy", sort=True):
        kind = "single" if policy.startswith(SINGLE + "/") else "random"
        what = "this (worker, primitive)" if kind == "single" else "a uniformly drawn (worker, primitive)"
        rows.append({"split": split, "policy": policy, "kind": kind,
                     "accuracy": float(group.success.astype(float).mean()),
                     "usd_per_episode": float(group.cost_usd.mean()), "episodes": int(len(group)),
                     "protocol": f"rolled out on {split}: one call to {what} per task"})
    return sorted(rows, key=lambda r: KINDS.index(r["kind"]))


# ---------------------------------------------------------------- the grid the learned routers see


@dataclass
class GridSplit:
    """One split of the task × worker grid: what a router sees (`data`: queries, workers, logged
    scores) and what its choice yields (the chosen worker's episode's success and USD)."""

    data: RoutingData
    success: np.ndarray  # (n, w) 1.0 where that worker's episode on that task succeeded
    usd: np.ndarray  # (n, w) USD that episode cost under the price book, from its tokens

    def outcome(self, choice: np.ndarray) -> tuple[float, float]:
        """(accuracy, mean USD per episode) of taking worker choice[i] on task i."""
        rows = np.arange(len(choice))
        return float(self.success[rows, choice].mean()), float(self.usd[rows, choice].mean())


def single_episodes(episodes: pd.DataFrame) -> pd.DataFrame:
    single = episodes[episodes.policy.str.startswith(SINGLE + "/")]
    return single.assign(worker=single.policy.str.split("/").str[1])


def episode_matrix(episodes: pd.DataFrame, data: RoutingData, column: str) -> np.ndarray:
    """(n, w) `column` of the single-worker episodes, aligned with `data`'s tasks and workers."""
    wide = single_episodes(episodes).pivot(index="task_id", columns="worker", values=column)
    return wide.reindex(index=data.query_ids, columns=data.workers).to_numpy(dtype=float)


def grid_splits(grid: pd.DataFrame, episodes: pd.DataFrame, book: PriceBook, pool: Pool, encoder,
                source: str | Path = "grid") -> dict[str, GridSplit]:
    """Every split of the grid; refuses a val, test or OOD task that is also a train task (by id or text)."""
    attributes = {w.name: dict(w.attributes) for w in pool.workers}  # MTRouter's attribute vector (§3)
    splits = {}
    for split in ALL_SPLITS:
        data = routing_data_from_table(split_table(grid, "split", [split], str(source)), book, encoder)
        data.worker_attributes = attributes
        splits[split] = GridSplit(data, episode_matrix(episodes, data, "success"),
                                  episode_matrix(episodes, data, "cost_usd"))
    for split in (CHOOSE_ON, *SCORED_SPLITS):
        check_disjoint(splits[TRAIN].data, splits[split].data)
    return splits


# ---------------------------------------------------------------- learned routers: fit, choose λ, score


@dataclass(frozen=True)
class OperatingPoint:
    knob: float
    accuracy: float
    usd: float


@dataclass(frozen=True)
class LearnedResult:
    """One fitted router (one seed): its λ chosen on val and the (accuracy, USD) it gets per split."""

    router: str
    seed: int
    knob: float
    by_split: dict[str, tuple[float, float]]


def expected_costs(train: GridSplit) -> np.ndarray:
    """ĉ(w): mean USD per episode of each worker on the train grid."""
    return train.usd.mean(axis=0)


def decide(router: Router, quality: np.ndarray, expected: np.ndarray, knob: float) -> np.ndarray:
    """The worker each task goes to under q̂ − λ·ĉ (router.decide, so a router's own rule is kept)."""
    choice, _ = router.decide(quality, np.broadcast_to(expected, quality.shape), knob)
    return np.asarray(choice)


def choose_operating_point(router: Router, quality: np.ndarray, val: GridSplit, expected: np.ndarray) -> OperatingPoint:
    """The module's rule: highest val accuracy, then lower val USD, then larger λ."""
    knobs = knob_grid(router, quality, np.broadcast_to(expected, quality.shape))
    points = [OperatingPoint(float(k), *val.outcome(decide(router, quality, expected, float(k)))) for k in knobs]
    return min(points, key=lambda p: (-p.accuracy, p.usd, -p.knob))


def fit_on_train(name: str, seed: int, train: RoutingData) -> Router:
    """A fresh registry router fitted on the train grid alone."""
    return make_router(name, seed).fit(train)


def evaluate_learned(name: str, seeds: Sequence[int], splits: dict[str, GridSplit]) -> list[LearnedResult]:
    """Per seed: fit on train, choose λ on val, score val, test and OOD at that λ."""
    expected = expected_costs(splits[TRAIN])
    results = []
    for seed in seeds:
        router = fit_on_train(name, seed, splits[TRAIN].data)
        quality = {s: router.predict_quality(splits[s].data) for s in (CHOOSE_ON, *SCORED_SPLITS)}
        point = choose_operating_point(router, quality[CHOOSE_ON], splits[CHOOSE_ON], expected)
        by_split = {s: splits[s].outcome(decide(router, q, expected, point.knob)) for s, q in quality.items()}
        results.append(LearnedResult(name, int(seed), point.knob, by_split))
        log.info("%s seed %d: λ=%.4g, val accuracy %.3f at $%.3g per episode", name, seed, point.knob,
                 point.accuracy, point.usd)
    return results


def mean_at(results: Sequence[LearnedResult], split: str) -> tuple[float, float]:
    return (float(np.mean([r.by_split[split][0] for r in results])),
            float(np.mean([r.by_split[split][1] for r in results])))


def choose_best_single_turn(learned: dict[str, list[LearnedResult]], order: Sequence[str]) -> str:
    """Highest mean val accuracy, then lower mean val USD, then the configured order."""
    def rank(name: str) -> tuple[float, float, int]:
        accuracy, usd = mean_at(learned[name], CHOOSE_ON)
        return -accuracy, usd, list(order).index(name)
    return min(order, key=rank)


def learned_row(results: Sequence[LearnedResult], kind: str, split: str, n_tasks: int, protocol: str) -> dict:
    accuracy, usd = mean_at(results, split)
    val_accuracy, val_usd = mean_at(results, CHOOSE_ON)
    knobs = ", ".join(f"{r.knob:.4g}" for r in results)
    return {"split": split, "policy": results[0].router, "kind": kind, "accuracy": accuracy, "usd_per_episode": usd,
            "episodes": n_tasks, "protocol": protocol,
            "operating_point": f"λ per seed {knobs}: {OPERATING_RULE}",
            "accuracy_seed_std": float(np.std([r.by_split[split][0] for r in results])),
            "val_accuracy": val_accuracy, "val_usd_per_episode": val_usd}


def router_protocol(split: str, candidates: Sequence[str] | None = None) -> str:
    chosen = f"chosen on val among {', '.join(candidates)}; " if candidates else ""
    return (f"fit on train, {chosen}λ chosen on val, scored on {split} "
            f"(replayed on {split}'s single-worker episodes)")


# ---------------------------------------------------------------- the table


def baseline_table(episodes: pd.DataFrame, grid: pd.DataFrame, book: PriceBook, pool: Pool, routers: Sequence[str],
                   seeds: Sequence[int], encoder, source: str | Path = "grid") -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the baselines table: one row per (policy, split ∈ test, OOD); every learned router's
    operating point and val numbers, the record of how the reported ones were chosen)."""
    splits = grid_splits(grid, episodes, book, pool, encoder, source)
    learned = {name: evaluate_learned(name, seeds, splits) for name in [*routers, MTROUTER]}
    best = choose_best_single_turn(learned, routers)
    log.info("best single-turn router on val: %s (of %s)", best, ", ".join(routers))
    rows = []
    for split in SCORED_SPLITS:
        n_tasks = len(splits[split].data)
        rows += rollout_rows(episodes, split)
        rows.append(learned_row(learned[best], "router", split, n_tasks, router_protocol(split, routers)))
        rows.append(learned_row(learned[MTROUTER], "mtrouter", split, n_tasks, router_protocol(split)))
    return pd.DataFrame(rows, columns=TABLE_COLUMNS), selection_table(learned, reported={best, MTROUTER})


def selection_table(learned: dict[str, list[LearnedResult]], reported: set[str]) -> pd.DataFrame:
    """Every fitted router's λ and val numbers: the whole record of the choices, on val alone."""
    rows = [{"router": r.router, "seed": r.seed, "cost_weight": r.knob, "val_accuracy": r.by_split[CHOOSE_ON][0],
             "val_usd_per_episode": r.by_split[CHOOSE_ON][1], "reported": r.router in reported}
            for results in learned.values() for r in results]
    return pd.DataFrame(rows, columns=SELECTION_COLUMNS)


def write_baseline_report(table: pd.DataFrame, selection: pd.DataFrame, csv_path: Path, markdown_path: Path,
                          selection_path: Path, price_book: str) -> list[Path]:
    """The table as CSV and Markdown (with the rule that chose the operating points), and the selection."""
    schema.write_csv_atomic(table, csv_path)
    schema.write_csv_atomic(selection, selection_path)
    shown = table.drop(columns=["operating_point"])
    text = (f"# Orchestra baselines (price book {price_book})\n\n{to_markdown(shown)}\n"
            f"Learned routers' operating point: {OPERATING_RULE}.\n\n"
            f"## How the learned rows were chosen (val only)\n\n{to_markdown(selection)}")
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(text)
    return [csv_path, markdown_path, selection_path]
