"""MTRouter's stages (paper 000, §3–4): collect → train estimator and ablations → evaluate → register.

Each is one function called by the Prefect tasks of flows/mtrouter.py. Defaults live in
params.yaml, section `mtrouter` (small scale for this CPU; the README gives the paper-scale run).
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from models.mtrouter.ablations import ABLATIONS, ablation_config
from models.mtrouter.config import MTRouterConfig
from routerops import schema
from routerops.errors import InputError
from routerops.pricing import Pool, load_pool, load_price_book

OUT = Path("data/mtrouter")
REPORT = Path("reports/mtrouter")
ROUTERS = OUT / "routers"  # every evaluated estimator seed's router (MTRouter.save); seeds[0] is registered


@dataclass(frozen=True)
class MTRouterRun:
    """params.yaml → mtrouter: the environment, data collection and evaluation of the small run."""

    pool: str = "configs/pool.yaml"
    price_book: str = "configs/prices/current.yaml"
    id_types: list[str] = field(default_factory=lambda: ["find-plant", "boil"])
    ood_types: list[str] = field(default_factory=lambda: ["find-non-living-thing"])
    max_variations: int = 5  # per task type (paper: at most N variations per type)
    split_seed: int = 42  # ID variations → train / val / test 60/20/20 (App. A: seed 42)
    budget_usd: float = 0.05  # B, per episode
    turn_limit: int = 6  # Tmax
    concurrency: int = 2
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])  # estimator seeds for mean ± std
    ablations: list[str] = field(default_factory=lambda: list(ABLATIONS))
    # Also roll every ablation out on ID test and OOD (seeds[0]) and add it to the evaluation table,
    # as Table 4 reports ablations by score; off by default at small scale, where scores are flat.
    ablation_rollouts: bool = False
    cost_weight: float = 0.0  # λ of the cost-aware variant: score − λ·predicted cost
    # Episode-level baselines (§4.1 "single-turn routers"): routers of models.baselines trained on the
    # single-model episodes' task × model grid; one decision at turn 0, kept for the episode.
    episode_routers: list[str] = field(default_factory=lambda: ["knn", "logistic", "mf", "mlp"])
    score_bounds: list[float] = field(default_factory=lambda: [-100.0, 100.0])  # ScienceWorld's score range
    estimator: dict = field(default_factory=dict)  # overrides of MTRouterConfig (paper defaults)
    # Promotion gate of the register step (routerops/promotion.py): the seeds[0] router replaces the
    # champion only if its mean ID-test episode score beats the champion's on the same tasks by more
    # than `gate_min_improvement` (score units) at the lower end of a paired bootstrap interval.
    gate_confidence: float = 0.95
    gate_n_boot: int = 2000
    gate_min_improvement: float = 0.0


def load_run(path: str | Path = "params.yaml") -> MTRouterRun:
    raw = (yaml.safe_load(Path(path).read_text()) or {}).get("mtrouter", {}) or {}
    unknown = sorted(set(raw) - {f.name for f in dataclasses.fields(MTRouterRun)})
    if unknown:
        raise InputError(path, f"mtrouter.{unknown[0]}", "unknown key")
    return MTRouterRun(**raw)


def check_run(run: MTRouterRun) -> None:
    """Fail before any work on what would fail later: the estimator overrides, an LLM-less pool, or a
    pool worker without a price (an unpriced worker would make the budget B meaningless)."""
    from routerops.pricing import check_pool_priced

    estimator_config(run)
    pool = llm_pool(run)
    if not pool.workers:
        raise InputError(run.pool, "workers", "no LLM worker: ScienceWorld needs models that emit text actions")
    check_pool_priced(pool, load_price_book(run.price_book), run.price_book)


def llm_pool(run: MTRouterRun) -> Pool:
    """ScienceWorld takes one text action per turn: only LLM workers can act."""
    pool = load_pool(run.pool)
    return Pool(name=pool.name, workers=tuple(w for w in pool.workers if w.kind == "llm"))


def estimator_config(run: MTRouterRun, seed: int = 0) -> MTRouterConfig:
    return MTRouterConfig.from_dict({**run.estimator, "seed": seed}, source="params.yaml mtrouter.estimator")


def materialise(run: MTRouterRun) -> list:
    from routerops.envs.scienceworld_env import scienceworld_tasks
    from routerops.envs.suites import write_tasks

    tasks = scienceworld_tasks(run.id_types, run.ood_types, max_variations=run.max_variations,
                                seed=run.split_seed)
    write_tasks(tasks, OUT / "tasks.jsonl")
    return tasks


def rollouts(run: MTRouterRun, tasks: list, policies: list, out_dir: Path, seed: int = 0):
    """Episodes of `policies` on `tasks` against the pool (the local server when the pool uses it)."""
    from routerops.envs.scienceworld_env import ScienceWorldEnvironment
    from routerops.rollout import collect_sync
    from routerops.workers import build_workers
    from routerops.workers.server import local_llm_server

    pool, book = llm_pool(run), load_price_book(run.price_book)
    uses_local = any(w.endpoint == "local" for w in pool.workers)
    with local_llm_server() if uses_local else contextlib.nullcontext() as base_url:
        workers = build_workers(pool, base_url)
        return collect_sync(tasks, policies, env=ScienceWorldEnvironment(), workers=workers, book=book,
                            budget_usd=run.budget_usd, turn_limit=run.turn_limit, out_dir=out_dir,
                            run_id="mtrouter", seed=seed, concurrency=run.concurrency)


def behaviour_policies(pool: Pool, seed: int = 0) -> list:
    """The paper's data (§3.4): a random router (a uniformly random model at every turn, until the
    environment ends the episode or Tmax) and every single model over the pool."""
    from routerops.policies import RandomMultiTurnPolicy, SinglePolicy

    return ([RandomMultiTurnPolicy(stop_prob=0.0, seed=seed)]
            + [SinglePolicy(w.name, "answer", turns=None) for w in pool.workers])


def collect(run: MTRouterRun) -> tuple[pd.DataFrame, pd.DataFrame]:
    tasks = materialise(run)
    train = [t for t in tasks if t.split in ("train", "val")]
    return rollouts(run, train, behaviour_policies(llm_pool(run)), OUT / "train")


def fit_router(run: MTRouterRun, cfg: MTRouterConfig, episodes: pd.DataFrame, turns: pd.DataFrame, prompts):
    from models.mtrouter.router import MTRouter

    return MTRouter(llm_pool(run), load_price_book(run.price_book), cfg).fit(episodes, turns, prompts)


def first_turn_prediction(router, task, worker: str) -> float:
    """ŝ(h_0, a): the estimator's outcome for starting the task with `worker`."""
    from routerops.types import EpisodeState

    return float(router.score(router.history_features(EpisodeState(task=task)), [worker])[0])


def ablation_metrics(run: MTRouterRun, name: str, episodes: pd.DataFrame, turns: pd.DataFrame,
                     tasks_by_id: dict) -> dict:
    """Train one ablation on the train episodes and measure it offline on the validation episodes.

    val_mae: error of its first-turn prediction ŝ(h_0, a_0) against the target it was trained for,
    S̃_0 under its own settings (with or without the error penalty), so ablations that learn different
    targets are each judged on their own. val_spearman: how well those predictions rank the episodes'
    final scores — the quantity routing acts on, comparable across ablations.
    """
    prompts = {k: t.prompt for k, t in tasks_by_id.items()}
    router = fit_router(run, ablation_config(name, estimator_config(run)), episodes[episodes.split == "train"],
                        turns, prompts)
    return offline_metrics(router, episodes[episodes.split == "val"], turns, tasks_by_id)


def offline_metrics(router, val: pd.DataFrame, turns: pd.DataFrame, tasks_by_id: dict) -> dict:
    """val_mae against each row's own S̃_0 and val_spearman against S_final (see ablation_metrics)."""
    from scipy.stats import spearmanr

    from models.mtrouter.targets import turn_targets

    val_turns = turns[turns.episode_id.isin(set(val.episode_id))]
    own_target = turn_targets(val, val_turns, router.cfg, router.lengths)
    first = val_turns[val_turns.turn_index == 0]
    by_id = val.set_index("episode_id")
    rows = [(first_turn_prediction(router, tasks_by_id[by_id.loc[t.episode_id, "task_id"]], t.worker),
             own_target.loc[i], by_id.loc[t.episode_id, "score"]) for i, t in zip(first.index, first.itertuples())]
    metrics = {"val_episodes": float(len(rows))}
    reports = getattr(router.estimator, "reports", [])
    if reports and reports[0].val_loss:
        metrics["best_val_loss"] = float(min(reports[0].val_loss))
    if len(rows) >= 2:
        pred, target, final = np.array(rows, dtype=float).T
        metrics["val_mae"] = float(np.mean(np.abs(pred - target)))
        metrics["val_spearman"] = float(np.nan_to_num(spearmanr(pred, final).statistic))
    return metrics


def episode_level_baselines(run: MTRouterRun, episodes: pd.DataFrame, prompts: dict) -> list:
    """The evaluation issue's routers as episode-level policies, trained on the train and validation
    tasks MTRouter learns from (never on test or OOD)."""
    from models.episode_router import episode_level_policies

    if not run.episode_routers:
        return []
    train = episodes[episodes.split.isin(["train", "val"])]
    return episode_level_policies(run.episode_routers, train, prompts, tuple(run.score_bounds), seed=run.seeds[0],
                                  cost_weight=run.cost_weight)


def ablated_policies(run: MTRouterRun, episodes: pd.DataFrame, turns: pd.DataFrame, prompts: dict) -> list:
    """`mtrouter:<ablation>` policies (seeds[0]), trained on the same train / val episodes as MTRouter."""
    base = estimator_config(run, run.seeds[0]).replace(cost_weight=run.cost_weight)
    return [fit_router(run, ablation_config(name, base), episodes, turns, prompts)
            .policy(name=f"mtrouter:{name}", version=f"seed{run.seeds[0]}")
            for name in run.ablations if name != "full"]


def evaluate(run: MTRouterRun, episodes: pd.DataFrame, turns: pd.DataFrame, tasks: list) -> pd.DataFrame:
    """MTRouter (one per estimator seed) against the single-model, random and episode-level router
    baselines on ID test and OOD (§4.1): mean ± std over seeds of score, success, USD per episode,
    turns and switches; with `ablation_rollouts`, each ablation too (Table 4)."""
    from routerops.metrics import count_switches

    prompts = {t.task_id: t.prompt for t in tasks}
    held_out = [t for t in tasks if t.split in ("test", "ood")]
    # The baselines do not depend on the estimator's seed: roll them out once.
    baselines = behaviour_policies(llm_pool(run), seed=run.seeds[0]) + episode_level_baselines(run, episodes, prompts)
    frames = [rollouts(run, held_out, baselines, OUT / "eval-baselines", seed=run.seeds[0])]
    if run.ablation_rollouts:
        frames.append(rollouts(run, held_out, ablated_policies(run, episodes, turns, prompts), OUT / "eval-ablations",
                               seed=run.seeds[0]))
    for seed in run.seeds:
        router = fit_router(run, estimator_config(run, seed).replace(cost_weight=run.cost_weight), episodes, turns, prompts)
        router.save(ROUTERS / f"seed{seed}")  # the register step logs exactly the router evaluated here
        frames.append(rollouts(run, held_out, [router.policy(version=f"seed{seed}")], OUT / f"eval-seed{seed}", seed=seed))
    frames = [(ep.assign(switches=ep.episode_id.map(count_switches(tu)).fillna(0)), tu) for ep, tu in frames]
    episodes_all = pd.concat([f[0] for f in frames], ignore_index=True)
    turns_all = pd.concat([f[1] for f in frames], ignore_index=True)
    schema.write_table(episodes_all.drop(columns=["switches"]), OUT / "eval/episodes.parquet", "episodes")
    schema.write_table(turns_all, OUT / "eval/turns.parquet", "turns")
    per_seed = (episodes_all.groupby(["policy", "split", "seed"])
                .agg(score=("score", "mean"), success=("success", "mean"), usd=("cost_usd", "mean"),
                     turns=("turns", "mean"), switches=("switches", "mean")).reset_index())
    table = per_seed.groupby(["policy", "split"]).agg(["mean", "std"])
    table.columns = [f"{a}_{b}" for a, b in table.columns]
    return table.drop(columns=[c for c in table.columns if c.startswith("seed_")]).reset_index()


# ---------------------------------------------------------------- register (the gate's evidence)


def suite_name(tasks: list) -> str:
    """The environment the router serves: `scienceworld` for tasks of suites `scienceworld/<type>`."""
    names = sorted({t.suite.split("/")[0] for t in tasks})
    if len(names) != 1:
        raise InputError("tasks", "suite", f"one environment per MTRouter run, got {names}")
    return names[0]


def gate_config(run: MTRouterRun):
    """The paired gate on per-episode scores: "accuracy_at_budget" with no per-query budget is the mean
    score (the rollouts already enforced the per-episode budget B)."""
    from routerops.promotion import GateConfig

    return GateConfig(objective="accuracy_at_budget", budget_usd=None, n_boot=run.gate_n_boot,
                      confidence=run.gate_confidence, min_improvement=run.gate_min_improvement, seed=run.seeds[0])


def held_out_outcomes(episodes: pd.DataFrame) -> pd.DataFrame:
    """score and cost_usd of each ID-test episode, indexed by task id (one episode per task)."""
    test = episodes[episodes.split == "test"]
    return test.set_index("task_id")[["score", "cost_usd"]].sort_index()


def registration_candidate(run: MTRouterRun):
    """The seeds[0] router as evaluate() fit and rolled it out, and its ID-test outcomes."""
    from models.mtrouter.router import MTRouter

    episodes = schema.read_table(OUT / "eval/episodes.parquet", "episodes")
    mine = episodes[(episodes.policy == "mtrouter") & (episodes.policy_version == f"seed{run.seeds[0]}")]
    return MTRouter.load(ROUTERS / f"seed{run.seeds[0]}"), held_out_outcomes(mine)


def champion_outcomes(run: MTRouterRun, tasks: list, champion, label: str) -> pd.DataFrame:
    """Roll `champion` out on the ID-test tasks with the candidate's seed, budget and turn limit."""
    out_dir = OUT / "gate" / label
    shutil.rmtree(out_dir, ignore_errors=True)  # this champion's episodes, never an older journal's
    test = [t for t in tasks if t.split == "test"]
    episodes, _ = rollouts(run, test, [champion.policy(name="mtrouter-champion", version=label)], out_dir,
                           seed=run.seeds[0])
    return held_out_outcomes(episodes)


def training_hashes() -> dict[str, str]:
    """sha256 of the tables the registered router learned from."""
    files = {"train_episodes_sha256": "train/episodes.parquet", "train_turns_sha256": "train/turns.parquet",
             "tasks_sha256": "tasks.jsonl"}
    return {key: schema.file_sha256(OUT / rel) for key, rel in files.items()}
