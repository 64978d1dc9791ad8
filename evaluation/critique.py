"""The critique-and-route controller (paper 002) and CoRL's budget modes (paper 003) on RouteLLM's GSM8K
logged outcomes, cross-fitted: the queries are cut into k folds (evaluation.replay's folds for the
seed) and each fold is scored by controllers trained on the other folds only, so no reported query was
ever trained on. Beside them, on the same folds, the single-turn routers of the replay leaderboard.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import torch
from sklearn.model_selection import KFold

from evaluation.replay import resample_counts, routing_data_from_table, run_replay_benchmark
from models.base import RoutingData
from models.critique.config import CritiqueConfig
from models.critique.corl import MODES, evaluate_modes, train_corl
from models.critique.env import by_rank, env_from_routing_data
from models.critique.evaluate import (episode_metrics, final_author_probability, greedy_episodes,
                                      state_probabilities)
from models.critique.grpo import train_critique
from models.critique.policy import ControllerPolicy
from routerops import metrics
from routerops.envs.replay import import_routellm_gsm8k
from routerops.errors import InputError
from routerops.market import resolve_book

log = logging.getLogger(__name__)
ROUTELLM_PUBLISHED = {"best_apgr": 0.622, "random_apgr": 0.497}  # RouteLLM paper, GSM8K (Table 3)
# name → (ξ as the paper's Table 9, or 0; dual ascent on ξ). The third is ours, beyond the paper.
SETTINGS = {"with_multipliers": (True, False), "without_multipliers": (False, False), "dual_multipliers": (True, True)}


def settings(cfg: CritiqueConfig) -> dict[str, tuple[bool, bool]]:
    return {name: s for name, s in SETTINGS.items() if not s[1] or cfg.grpo.multiplier_lr > 0}


def load_table(cfg: CritiqueConfig, root: Path) -> RoutingData:
    paths = [root / p for p in (cfg.table, cfg.contaminated, cfg.fewshot, cfg.price_book)]
    for path, key in zip(paths, ("table", "contaminated", "fewshot", "price_book")):
        if not path.is_file():
            raise InputError(path, f"critique.{key}", "file not found")
    table = import_routellm_gsm8k(paths[0], contaminated_path=paths[1], train_path=paths[2])
    return routing_data_from_table(table, resolve_book(paths[3]).book)


def _merge(parts: list[dict]) -> dict:
    """Greedy episodes of several folds as one."""
    out = {key: np.concatenate([p[key] for p in parts]) for key in ("final", "calls", "correct", "turns", "cost")}
    out["passes"] = sum(p["passes"] for p in parts)
    out["verdicts"] = [v for p in parts for v in p["verdicts"]]
    return out


def run_seed(cfg: CritiqueConfig, data: RoutingData, seed: int, progress: bool = True) -> dict:
    """Every controller of one seed, cross-fitted; out-of-fold results over all queries."""
    g, pol, c = cfg.grpo, cfg.policy, cfg.corl
    n = len(data)
    runs = settings(cfg)
    scores = {name: np.full(n, np.nan) for name in runs}
    episodes = {f"{name}{suffix}": [] for name in runs for suffix in ("", "_budgeted")}
    order, corl_parts, curves = [], [], {name: [] for name in (*runs, "corl")}
    env_all = None
    for fold, (fit_rows, score_rows) in enumerate(KFold(cfg.k, shuffle=True, random_state=seed).split(np.arange(n))):
        env = env_from_routing_data(data, g.horizon, fit_rows=fit_rows)
        env_all = env
        order.append(score_rows)
        xi, rho = by_rank(g.xi, env.n_agents), by_rank(g.rho, env.n_agents)
        for name, (constrained, dual) in runs.items():
            start = time.perf_counter()
            policy = ControllerPolicy(env.feature_dim, env.n_actions, pol.hidden, seed=1000 * seed + fold)
            run = train_critique(env, fit_rows, policy, iterations=g.iterations, batch=g.batch, group=g.group,
                                 xi=xi if constrained else np.zeros_like(xi), rho=rho, gamma=g.gamma,
                                 routing_weight=g.routing_weight, lr=pol.lr, weight_decay=pol.weight_decay,
                                 multiplier_lr=g.multiplier_lr if dual else 0.0, seed=1000 * seed + fold)
            probs = state_probabilities(policy, env, score_rows)
            scores[name][score_rows] = final_author_probability(probs, env)[:, 0]
            episodes[name].append(greedy_episodes(probs, env, score_rows))
            episodes[f"{name}_budgeted"].append(greedy_episodes(probs, env, score_rows, rho=rho))
            curves[name].append({**run.rows[-1], "final_xi": [float(v) for v in run.final_xi]})
            if progress:
                log.info("seed %d fold %d %s: %.1f s, last %s", seed, fold, name, time.perf_counter() - start,
                         run.rows[-1])
        start = time.perf_counter()
        corl = ControllerPolicy(env.feature_dim + len(MODES), env.n_actions, pol.hidden, value_head=True,
                                seed=1000 * seed + fold)
        corl_log = train_corl(env, fit_rows, corl, budgets=c.budgets, iterations=c.iterations, batch=c.batch,
                              epochs=c.epochs, clip=c.clip, kl=c.kl, gamma=c.gamma, lam=c.lam,
                              value_coef=c.value_coef, lr=pol.lr, value_lr=pol.value_lr,
                              weight_decay=pol.weight_decay, seed=1000 * seed + fold)
        corl_parts.append(evaluate_modes(corl, env, score_rows, c.budgets))
        curves["corl"].append(corl_log[-1])
        if progress:
            log.info("seed %d fold %d corl: %.1f s, %s", seed, fold, time.perf_counter() - start, corl_parts[-1])
    rows = np.concatenate(order)
    env = env_all
    strong, weak = env.correct[:, 0], env.correct[:, -1]
    counts = resample_counts(n, cfg.bootstrap, seed) if cfg.bootstrap else None
    out = {"controllers": {}, "corl": {}, "final_training_rows": curves}
    for name in runs:
        score = scores[name]
        row = {"apgr": float(metrics.apgr(score, strong, weak)) if np.unique(score).size > 1 else float("nan")}
        if counts is not None and np.unique(score).size > 1:
            boots = metrics.apgr_of_resamples(score, strong, weak, counts)
            row["apgr_lo"], row["apgr_hi"] = (float(v) for v in np.nanpercentile(boots, [2.5, 97.5]))
        row["greedy"] = episode_metrics(_merge(episodes[name]), env, rows)
        row["greedy_budgeted"] = episode_metrics(_merge(episodes[f"{name}_budgeted"]), env, rows)
        out["controllers"][name] = row
    for mode in MODES:
        parts = [p[mode] for p in corl_parts]
        weights = np.array([p["queries"] for p in parts], dtype=float)
        out["corl"][mode] = {key: float(np.average([p[key] for p in parts], weights=weights))
                             for key in parts[0] if key != "queries"} | {"queries": int(weights.sum())}
    return out


def run_critique_benchmark(cfg: CritiqueConfig, root: str | Path = ".", progress: bool = True) -> dict:
    """All seeds, the baselines on the same folds, and the summary the README quotes."""
    torch.set_num_threads(1)  # a shared 2-core machine: one thread each for us and whoever else runs
    start = time.perf_counter()
    data = load_table(cfg, Path(root))
    agents = env_from_routing_data(data, cfg.grpo.horizon).agents
    per_seed = {seed: run_seed(cfg, data, seed, progress) for seed in cfg.seeds}
    controllers_s = time.perf_counter() - start
    board = None
    if cfg.baselines:
        board = run_replay_benchmark(data, None, list(cfg.baselines), k=cfg.k, seeds=list(cfg.seeds),
                                     n_boot=cfg.bootstrap, progress=progress)
    summary = {}
    for name in settings(cfg):
        runs = [per_seed[s]["controllers"][name] for s in cfg.seeds]
        summary[name] = {"apgr": float(np.mean([r["apgr"] for r in runs])),
                         "apgr_seed_std": float(np.std([r["apgr"] for r in runs]))}
        for view in ("greedy", "greedy_budgeted"):
            for key in ("accuracy", "pgr", "strong_call_share", "strong_calls_per_query", "usd_per_query", "turns"):
                summary[name][f"{view}:{key}"] = float(np.mean([r[view][key] for r in runs]))
    summary["corl"] = {mode: {key: float(np.mean([per_seed[s]["corl"][mode][key] for s in cfg.seeds]))
                              for key in ("expert_call_ratio", "usd_per_query", "accuracy", "reward", "budget_usd")}
                       for mode in MODES}
    single = {w: float(data.scores[:, j].mean()) for j, w in enumerate(data.workers)}
    return {
        "protocol": f"cross-fit k={cfg.k} (evaluation.replay's folds), seeds {list(cfg.seeds)}: every query is "
                    "scored by controllers trained on the other folds only",
        "n_queries": len(data), "agents_strongest_first": agents, "single_accuracy": single,
        "routellm_published": ROUTELLM_PUBLISHED, "summary": summary,
        "per_seed": {str(s): v for s, v in per_seed.items()},
        "baselines": [] if board is None else board.drop(columns=[c for c in board.columns if c.startswith("aiq_")],
                                                          errors="ignore").to_dict("records"),
        "seconds": {"controllers": controllers_s, "total": time.perf_counter() - start},
    }
