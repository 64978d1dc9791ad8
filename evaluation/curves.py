"""A router's accuracy–cost curve and the leaderboard's numbers on it, given its quality estimates.

The router's knob (cost weight λ, or a cascade's threshold) is swept over a grid (`knob_grid`) into
operating points (`operating_points`: per knob value, each query's logged score and USD of the chosen
worker); their summary (`curve_summary`) is RouterBench's AIQ in the single workers' cost window,
LLMRouterBench's gain over the best single worker and cost saved, the cost at 95% of the strong
worker's accuracy and, for two-worker tables, RouteLLM's APGR and CPT(50%/80%) with router score
q̂(strong) − q̂(weak); `bootstrap_intervals` gives their percentile intervals over query resamples.
What is swept (out-of-fold or fixed-split predictions) is evaluation/replay.py's business.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from models.base import Router, RoutingData
from routerops import metrics
from routerops.metrics import curve_aiq

STRONG_FRACTION = 0.95  # "cost at 95% of the strong model's accuracy"


def knob_grid(router: Router, quality: np.ndarray, costs: np.ndarray, n_points: int = 201) -> np.ndarray:
    """Knob values that trace the whole curve.

    Cost weight: every λ at which some query switches worker is a break-even (q̂_i − q̂_j)/(c_i − c_j)
    between a dearer, better worker i and a cheaper one j; quantiles of those, plus 0 and a λ past the
    largest (everyone on their cheapest worker). Threshold: quantiles of the predicted qualities.
    """
    if router.knob_name == "threshold":
        cuts = np.quantile(quality, np.linspace(0, 1, n_points - 1))
        return np.unique(np.concatenate([[0.0], cuts, [np.nextafter(quality.max(), np.inf)]]))
    dq = quality[:, :, None] - quality[:, None, :]
    dc = costs[:, :, None] - costs[:, None, :]
    switch = (dq > 0) & (dc > 0)
    breaks = dq[switch] / dc[switch]
    if breaks.size == 0:
        return np.array([0.0])
    inner = np.quantile(breaks, np.linspace(0, 1, n_points - 2))
    return np.unique(np.concatenate([[0.0], inner, [breaks.max() * 1.01 + 1e-12]]))


@dataclass
class OperatingPoints:
    """Per knob value and query: the score obtained and the USD paid (K × n each)."""

    knobs: np.ndarray
    correct: np.ndarray
    paid: np.ndarray
    choice: np.ndarray


def operating_points(router: Router, quality: np.ndarray, data: RoutingData,
                     grid: np.ndarray | None = None) -> OperatingPoints:
    grid = knob_grid(router, quality, data.costs) if grid is None else np.asarray(grid, dtype=float)
    rows = np.arange(len(data))
    choices, paid = zip(*(router.decide(quality, data.costs, float(knob)) for knob in grid))
    choice = np.stack(choices)
    return OperatingPoints(grid, data.scores[rows[None, :], choice], np.stack(paid), choice)


def sweep(router: Router, quality: np.ndarray, data: RoutingData, grid: np.ndarray | None = None) -> pd.DataFrame:
    """Accuracy–cost points of `router` over its knob: knob, accuracy, usd_per_query, share:<worker>."""
    ops = operating_points(router, quality, data, grid)
    table = pd.DataFrame(
        {"knob": ops.knobs, "accuracy": ops.correct.mean(axis=1), "usd_per_query": ops.paid.mean(axis=1)}
    )
    for j, w in enumerate(data.workers):
        table[f"share:{w}"] = (ops.choice == j).mean(axis=1)
    return table


def strong_weak(data: RoutingData) -> tuple[int, int]:
    """(strong, weak) worker indices of a two-worker table: the more accurate is strong (ties: dearer)."""
    if len(data.workers) != 2:
        raise ValueError("APGR/CPT are defined for two-worker tables")
    acc, cost = np.nanmean(data.scores, axis=0), data.costs.mean(axis=0)
    strong = int(np.lexsort((-cost, -acc))[0])
    return strong, 1 - strong


def strong_call_score(quality: np.ndarray, data: RoutingData, router: Router | None = None) -> np.ndarray:
    """RouteLLM's per-query router score (higher = send to the strong model): q̂(strong) − q̂(weak).

    A cascade decides to escalate from the cheap worker's answer alone, so its score is 1 − P̂(cheap
    worker right); using the dear worker's P̂ too would read an answer it has not paid for yet.
    """
    strong, weak = strong_weak(data)
    if router is not None and router.knob_name == "threshold":
        cheap = int(np.argmin(data.costs.mean(axis=0)))
        return 1.0 - quality[:, cheap]
    return quality[:, strong] - quality[:, weak]


def two_worker_metrics(quality: np.ndarray, data: RoutingData, idx: np.ndarray | None = None,
                       router: Router | None = None) -> dict[str, float]:
    """RouteLLM's APGR, CPT(50%), CPT(80%) of `strong_call_score` (idx: the queries of a resample)."""
    strong, weak = strong_weak(data)
    idx = np.arange(len(data)) if idx is None else idx
    score = strong_call_score(quality, data, router)[idx]
    s, w = data.scores[idx, strong], data.scores[idx, weak]
    # Undefined, so NaN (reported as such, never a crash): a constant score (a single worker) has no
    # curve to integrate, and equally accurate workers leave no gap to recover.
    if np.unique(score).size < 2 or s.mean() == w.mean():
        return {"apgr": np.nan, "cpt50": np.nan, "cpt80": np.nan}
    return {
        "apgr": metrics.apgr(score, s, w),
        "cpt50": metrics.cpt(score, s, w, pgr=0.5),
        "cpt80": metrics.cpt(score, s, w, pgr=0.8),
    }


def cost_window(data: RoutingData) -> tuple[float, float]:
    """AIQ's cost range for a table: from always taking each query's cheapest worker to always taking
    the dearest single worker. Fixed per table, so AIQs of different routers are comparable."""
    return float(data.costs.min(axis=1).mean()), float(data.costs.mean(axis=0).max())


def aiq_in_window(usd: np.ndarray, accuracy: np.ndarray, window: tuple[float, float]) -> float:
    """curve_aiq, or NaN where the table leaves no cost range to integrate over (one worker, or
    workers that all cost the same): undefined, so reported as such."""
    return curve_aiq(usd, accuracy, window) if window[1] > window[0] else float("nan")


def cost_at_accuracy(usd: np.ndarray, accuracy: np.ndarray, target: float) -> float:
    """USD per query at which the curve's non-decreasing hull first reaches `target` (mixing two
    operating points reaches any cost between them); NaN when it never does."""
    hull = metrics.non_decreasing_hull(usd, accuracy)
    if hull[-1, 1] < target:
        return float("nan")
    if hull[0, 1] >= target:
        return float(hull[0, 0])
    return float(np.interp(target, hull[:, 1], hull[:, 0]))


def curve_summary(router: Router, ops: OperatingPoints, data: RoutingData, quality: np.ndarray,
                  best: tuple[float, float], target: float, idx: np.ndarray | None = None) -> dict[str, float]:
    """Every leaderboard number of one cross-fitted run (on the queries `idx`, default all)."""
    idx = np.arange(len(data)) if idx is None else idx
    acc, usd = ops.correct[:, idx].mean(axis=1), ops.paid[:, idx].mean(axis=1)
    best_cost, best_acc = best
    gain = metrics.gain_over_best_single(usd, acc, best_cost, best_acc)
    at_best = int(np.lexsort((usd, -acc))[0])
    row = {
        "aiq": aiq_in_window(usd, acc, cost_window(data)),
        "best_accuracy": float(acc[at_best]),
        "usd_per_query_at_best": float(usd[at_best]),
        "cost95_usd_per_query": cost_at_accuracy(usd, acc, target),
        "gain_any_cost": gain["any_cost"],
        "gain_matched_cost": gain["matched_cost"],
        "cost_saved_vs_best_single": metrics.cost_saved_at_matched_accuracy(usd, acc, best_cost, best_acc),
    }
    if len(data.workers) == 2:
        row.update(two_worker_metrics(quality, data, idx, router))
    return row


def bootstrap_intervals(router: Router, ops: OperatingPoints, data: RoutingData, quality: np.ndarray,
                        n_boot: int, seed: int, confidence: float = 0.95) -> dict[str, float]:
    """Percentile intervals (Efron & Tibshirani 1993, ch. 13) of AIQ, and APGR on two-worker tables,
    over `n_boot` resamples of the queries with replacement.

    All resamples at once: resample b is a row of counts (how often each query is drawn), so every
    operating point's accuracy and cost on it is one matrix product, and APGR's deciles come from
    cumulative counts (metrics.apgr_of_resamples). A resample on which APGR is undefined (strong and
    weak equally right on it) is left out of the APGR interval and counted in `apgr_boot_undefined`.
    """
    counts = resample_counts(len(data), n_boot, seed)
    window = cost_window(data)
    accuracy = ops.correct @ counts.T / len(data)  # (knob values, resamples)
    usd = ops.paid @ counts.T / len(data)
    out = _percentile_interval("aiq", [aiq_in_window(usd[:, b], accuracy[:, b], window) for b in range(n_boot)],
                               confidence)
    if len(data.workers) == 2:
        strong, weak = strong_weak(data)
        score = strong_call_score(quality, data, router)
        values = metrics.apgr_of_resamples(score, data.scores[:, strong], data.scores[:, weak], counts)
        out.update(_percentile_interval("apgr", values, confidence))
        out["apgr_boot_undefined"] = int(np.isnan(values).sum())
    return out


def resample_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) int32: how many times each of n queries is drawn in each bootstrap resample."""
    draws = np.random.default_rng(seed).integers(0, n, size=(n_boot, n))
    offsets = (np.arange(n_boot) * n)[:, None]
    return np.bincount((draws + offsets).ravel(), minlength=n_boot * n).reshape(n_boot, n).astype(np.int32)


def _percentile_interval(key: str, values, confidence: float) -> dict[str, float]:
    values = np.asarray(values, dtype=float)
    values = values[~np.isnan(values)]
    if values.size == 0:
        return {f"{key}_lo": float("nan"), f"{key}_hi": float("nan")}
    tail = 100 * (1 - confidence) / 2
    lo, hi = np.percentile(values, [tail, 100 - tail])
    return {f"{key}_lo": float(lo), f"{key}_hi": float(hi)}


def single_worker_reference(data: RoutingData) -> tuple[tuple[float, float], float]:
    """((cost, accuracy) of LLMRouterBench's best single worker, 95% of the strong worker's accuracy)."""
    acc, cost = np.nanmean(data.scores, axis=0), data.costs.mean(axis=0)
    best = metrics.best_single(cost, acc)
    return (float(cost[best]), float(acc[best])), STRONG_FRACTION * float(acc.max())
