"""Evaluation metrics for routers: per-policy summaries, Pareto frontier, AIQ, APGR/CPT, LLMRouterBench
gains, bootstrap intervals. Pure functions over numpy arrays and pandas frames; no I/O.

Sources (each function names the one it follows):
- RouterBench, Hu et al. 2024 (arXiv 2403.12031), §3: AIQ over the non-decreasing convex hull.
- RouteLLM, Ong et al. 2024 (arXiv 2406.18665) and its code, routellm/evals/evaluate.py and
  routellm/evals/benchmarks.py: threshold sweep, AUC, APGR, CPT.
- LLMRouterBench, Li et al. 2026 (arXiv 2601.07206), "cost-aware routing" metrics: PerfGain,
  CostSave, ParetoDist relative to the best single model.
- Efron & Tibshirani 1993, percentile bootstrap (computed with scipy.stats.bootstrap).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pandas as pd
from scipy import stats

ArrayLike = Sequence[float] | np.ndarray | pd.Series

# ---------------------------------------------------------------- per-policy summaries


def count_switches(turns: pd.DataFrame) -> pd.Series:
    """Per episode, how many times consecutive turns change worker (MTRouter's switch analysis):
    workers [a, a, b, a] -> 2. Index: episode_id."""
    if turns.empty:
        return pd.Series(dtype="int64", name="switches")
    ordered = turns.sort_values(["episode_id", "turn_index"], kind="mergesort")
    same_episode = ordered["episode_id"].eq(ordered["episode_id"].shift())
    changed = ordered["worker"].ne(ordered["worker"].shift()) & same_episode
    return changed.groupby(ordered["episode_id"]).sum().astype("int64").rename("switches")


def episode_table(episodes: pd.DataFrame, turns: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per episode with the per-query quantities the summaries average: accuracy (success
    as 0/1), score, cost, tokens, turns, and (given turns) switches and latency."""
    out = pd.DataFrame({
        "episode_id": episodes["episode_id"].to_numpy(),
        "policy": episodes["policy"].to_numpy(),
        "split": episodes["split"].to_numpy(),
        "correct": episodes["success"].astype(float).to_numpy(),
        "score": episodes["score"].astype(float).to_numpy(),
        "cost_usd": episodes["cost_usd"].astype(float).to_numpy(),
        "tokens": (episodes["prompt_tokens"] + episodes["completion_tokens"]).astype(float).to_numpy(),
        "turns": episodes["turns"].astype(float).to_numpy(),
    })
    if turns is not None:
        switches = count_switches(turns)
        latency = turns.groupby("episode_id")["latency_s"].sum()
        out["switches"] = out["episode_id"].map(switches).fillna(0).astype(float)
        out["latency_s"] = out["episode_id"].map(latency).fillna(0.0).astype(float)
    else:
        out["switches"] = np.nan
        out["latency_s"] = np.nan
    return out


def summarise_group(rows: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """Summary of one group of per-episode rows (see `episode_table`): accuracy with its 95%
    percentile-bootstrap interval, mean score, USD per query and in total, tokens, turns,
    switches and latency per query."""
    acc, lo, hi = bootstrap_ci(rows["correct"].to_numpy(), np.mean, n_boot=n_boot, seed=seed)
    return {
        "n": int(len(rows)),
        "accuracy": acc, "accuracy_lo": lo, "accuracy_hi": hi,
        "score_mean": float(rows["score"].mean()),
        "usd_per_query": float(rows["cost_usd"].mean()),
        "usd_total": float(rows["cost_usd"].sum()),
        "tokens_per_query": float(rows["tokens"].mean()),
        "turns_per_query": float(rows["turns"].mean()),
        "switches_per_query": float(rows["switches"].mean()),
        "latency_s_per_query": float(rows["latency_s"].mean()),
    }


def summarise_policies(table: pd.DataFrame, by: Sequence[str] = ("policy",), n_boot: int = 1000,
                       seed: int = 0) -> pd.DataFrame:
    """`summarise_group` for every group of an `episode_table`, one row per group."""
    keys = list(by)
    rows = []
    for key, group in table.groupby(keys, sort=True):
        key = key if isinstance(key, tuple) else (key,)
        rows.append({**dict(zip(keys, key)), **summarise_group(group, n_boot=n_boot, seed=seed)})
    return pd.DataFrame(rows)


def split_breakdown(df: pd.DataFrame, by: str = "split", n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per policy and per value of `by` (ID splits vs the OOD split): the same summary as the
    leaderboard. `df` is an `episode_table`."""
    return summarise_policies(df, by=("policy", by), n_boot=n_boot, seed=seed)


# ---------------------------------------------------------------- Pareto frontier


def pareto_frontier(costs: ArrayLike, scores: ArrayLike) -> np.ndarray:
    """Indices of the non-dominated points, cheapest first. A point is dominated when another costs
    no more and scores no less, and is strictly better in one of the two; identical points are
    therefore all kept."""
    c, s = np.asarray(costs, dtype=float), np.asarray(scores, dtype=float)
    if c.shape != s.shape or c.ndim != 1:
        raise ValueError("costs and scores must be 1-D arrays of the same length")
    no_worse = (c[None, :] <= c[:, None]) & (s[None, :] >= s[:, None])  # [i, j]: j no worse than i
    better = (c[None, :] < c[:, None]) | (s[None, :] > s[:, None])
    dominated = (no_worse & better).any(axis=1)
    keep = np.flatnonzero(~dominated)
    return keep[np.lexsort((-s[keep], c[keep]))]


# ---------------------------------------------------------------- RouterBench AIQ


def non_decreasing_hull(costs: ArrayLike, scores: ArrayLike) -> np.ndarray:
    """RouterBench §3 (Hu et al. 2024): the non-decreasing convex hull of a router's (cost, quality)
    points, as an (m, 2) array sorted by cost.

    Mixing two operating points at random reaches every point on the segment between them
    (RouterBench's linear interpolation), so the reachable quality at cost c is the upper concave
    hull; spending more never has to lower quality, so the hull is cut at its highest point (the
    part after it decreases). Computed with Andrew's monotone chain on the upper side."""
    pts = np.column_stack([np.asarray(costs, dtype=float), np.asarray(scores, dtype=float)])
    if len(pts) == 0:
        raise ValueError("need at least one (cost, quality) point")
    pts = pts[np.lexsort((pts[:, 1], pts[:, 0]))]
    # at equal cost only the best quality matters
    last_of_cost = np.append(pts[1:, 0] != pts[:-1, 0], True)
    pts = pts[last_of_cost]
    hull: list[np.ndarray] = []
    for p in pts:
        # pop while the last two hull points and p do not make a right (clockwise) turn
        while len(hull) >= 2 and _cross(hull[-2], hull[-1], p) >= 0:
            hull.pop()
        hull.append(p)
    upper = np.array(hull)
    return upper[: int(np.argmax(upper[:, 1])) + 1]


def _cross(o: np.ndarray, a: np.ndarray, b: np.ndarray) -> float:
    return float((a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0]))


def aiq(costs: ArrayLike, scores: ArrayLike, cost_min: float, cost_max: float) -> float:
    """Average Improvement in Quality, RouterBench Eq. (AIQ): (1 / (c_max - c_min)) times the
    integral over [c_min, c_max] of the router's non-decreasing convex hull R~(c).

    What this computes, precisely: costs are mapped to x = (c - c_min) / (c_max - c_min) in [0, 1];
    R~ is `non_decreasing_hull`, linearly interpolated between its vertices; right of the router's
    most expensive useful point it stays flat at its best quality (extra budget buys nothing);
    left of its cheapest point it is 0 (the router cannot operate there). The area is the
    trapezoid rule over the hull vertices, which is exact for a piecewise-linear curve. This
    matches RouterBench's reference code (evaluation/AIQ.py), which appends the flat extension
    and divides the trapezoid area by the cost range."""
    if not cost_max > cost_min:
        raise ValueError(f"cost range must be non-empty, got [{cost_min}, {cost_max}]")
    c = np.asarray(costs, dtype=float)
    if (c < cost_min).any() or (c > cost_max).any():
        raise ValueError(f"every cost must lie in [{cost_min}, {cost_max}]")
    hull = non_decreasing_hull(c, scores)
    x = (hull[:, 0] - cost_min) / (cost_max - cost_min)
    y = hull[:, 1]
    x, y = np.append(x, 1.0), np.append(y, y[-1])
    return float(np.trapezoid(y, x))



def curve_aiq(usd: ArrayLike, accuracy: ArrayLike, window: tuple[float, float]) -> float:
    """RouterBench AIQ of one accuracy–cost curve inside a fixed cost `window` (so AIQs of different
    routers on one table compare); points cheaper than the window count at its left edge, and the
    hull is cut at the right edge."""
    lo, hi = window
    hull = non_decreasing_hull(np.clip(np.asarray(usd, dtype=float), lo, None), accuracy)
    inside = hull[hull[:, 0] <= hi]
    if len(inside) < len(hull):  # the hull crosses the right edge: keep the point where it does
        edge = np.interp(hi, hull[:, 0], hull[:, 1])
        inside = np.vstack([inside, [hi, edge]]) if len(inside) else np.array([[hi, edge]])
    return aiq(inside[:, 0], inside[:, 1], lo, hi)


# ---------------------------------------------------------------- RouteLLM APGR / CPT


def routellm_curve(router_scores: ArrayLike, strong_correct: ArrayLike, weak_correct: ArrayLike,
                   num_results: int = 10) -> pd.DataFrame:
    """The call-share / accuracy curve RouteLLM's evaluator builds (routellm/evals/benchmarks.py,
    `evaluate`): thresholds are the edges of `pd.qcut(router_scores, num_results)` (deciles of the
    router's strong-win-rate); for each edge a query goes to the strong model when its score is
    >= the edge (> for the last edge, so the sweep ends at 0% strong). Returns one row per
    threshold, sorted by strong_percentage as evaluate.py sorts before integrating: threshold,
    strong_percentage (0-100, as RouteLLM), accuracy (mean of the routed model's correctness, as a
    fraction where RouteLLM prints percent).

    One deviation: where the decile edges repeat (many tied scores) RouteLLM's qcut raises; here
    the repeated edges are dropped (`duplicates="drop"`). Inputs without repeated edges give
    RouteLLM's exact curve."""
    s = np.asarray(router_scores, dtype=float)
    strong, weak = np.asarray(strong_correct, dtype=float), np.asarray(weak_correct, dtype=float)
    if not (s.shape == strong.shape == weak.shape) or s.ndim != 1 or len(s) == 0:
        raise ValueError("router_scores, strong_correct and weak_correct must be 1-D, equal length, non-empty")
    _, edges = pd.qcut(s, num_results, retbins=True, duplicates="drop")
    rows = []
    for i, threshold in enumerate(edges):
        to_strong = s >= threshold if i != len(edges) - 1 else s > threshold
        rows.append({
            "threshold": float(threshold),
            "strong_percentage": to_strong.sum() / len(s) * 100,
            "accuracy": float(np.where(to_strong, strong, weak).mean()),
        })
    curve = pd.DataFrame(rows)
    return curve.sort_values("strong_percentage", kind="mergesort").reset_index(drop=True)


def routellm_auc(curve: pd.DataFrame) -> float:
    """evaluate.py `auc_metric`: trapezoid rule (np.trapz there) of accuracy over the strong-call
    fraction strong_percentage / 100, on the curve sorted by strong_percentage."""
    return float(np.trapezoid(curve["accuracy"], curve["strong_percentage"] / 100))


def apgr(router_scores: ArrayLike, strong_correct: ArrayLike, weak_correct: ArrayLike,
         num_results: int = 10) -> float:
    """Average Performance Gap Recovered, evaluate.py `apgr_metric`:
    (AUC - weak_AUC) / (strong_AUC - weak_AUC), where weak_AUC and strong_AUC integrate each
    model's overall accuracy (a constant) over the same strong-call fractions. A random router
    scores about 0.5, a perfect one close to 1."""
    curve = routellm_curve(router_scores, strong_correct, weak_correct, num_results)
    x = curve["strong_percentage"] / 100
    weak_acc = float(np.mean(np.asarray(weak_correct, dtype=float)))
    strong_acc = float(np.mean(np.asarray(strong_correct, dtype=float)))
    weak_auc = float(np.trapezoid(np.full(len(x), weak_acc), x))
    strong_auc = float(np.trapezoid(np.full(len(x), strong_acc), x))
    if strong_auc == weak_auc:
        raise ValueError("strong and weak models have the same accuracy: APGR is undefined")
    return (routellm_auc(curve) - weak_auc) / (strong_auc - weak_auc)


def apgr_of_resamples(router_scores: ArrayLike, strong_correct: ArrayLike, weak_correct: ArrayLike,
                      counts: np.ndarray, num_results: int = 10) -> np.ndarray:
    """`apgr` of B bootstrap resamples at once: resample b takes query i counts[b, i] times. Equal to
    `apgr(router_scores[idx], ...)` for idx the resample's query list (tests/routerops/test_metrics.py),
    with the deciles of `routellm_curve` read off the resample's cumulative counts instead of a sort
    per resample. NaN where APGR is undefined (strong and weak equally accurate on the resample, or
    one score value only).

    The n-long running sums of RESAMPLE_BLOCK resamples are taken together, row by row along the
    queries: a cumulative sum is sequential either way, so every resample's sums, and its APGR, are
    bit for bit those of one resample at a time (`_apgr_of_counts`, which the tests compare with);
    only the ~11 decile edges are then handled per resample. On 14,000 queries this took a router's
    bootstrap from ~16 s to a few."""
    s = np.asarray(router_scores, dtype=float)
    order = np.argsort(s, kind="stable")
    s_sorted = s[order]
    strong = np.asarray(strong_correct, dtype=float)[order]
    weak = np.asarray(weak_correct, dtype=float)[order]
    counts = np.atleast_2d(np.asarray(counts))
    out = np.full(len(counts), np.nan)
    quantiles = _qcut_fractions(num_results)
    for start in range(0, len(counts), RESAMPLE_BLOCK):
        block = counts[start : start + RESAMPLE_BLOCK][:, order].astype(float)
        out[start : start + len(block)] = _apgr_of_count_block(s_sorted, strong, weak, block, quantiles)
    return out


def _qcut_fractions(q: int) -> np.ndarray:
    """The quantile fractions pandas.qcut(x, q) asks for, rounding included: linspace(0, 1, q + 1),
    rounded up where not representable, passed through np.percentile as q · 100 and back."""
    fractions = np.linspace(0, 1, q + 1)
    np.putmask(fractions, q * fractions != np.arange(q + 1), np.nextafter(fractions, 1))
    return fractions * 100 / 100


# Resamples whose running sums are held at once by apgr_of_resamples: 4 arrays of 64 × n floats
# (~29 MB at n = 14,000).
RESAMPLE_BLOCK = 64


def _apgr_of_count_block(s_sorted: np.ndarray, strong: np.ndarray, weak: np.ndarray, block: np.ndarray,
                         quantiles: np.ndarray) -> np.ndarray:
    """APGR of each row of `block` (counts over the queries sorted by score), as _apgr_of_counts."""
    m = block.sum(axis=1)
    cum = np.cumsum(block, axis=1)
    strong_drawn, weak_drawn = block * strong, block * weak
    strong_tail = _tail_sums(strong_drawn)
    weak_head = np.concatenate([np.zeros((len(block), 1)), np.cumsum(weak_drawn, axis=1)], axis=1)
    count_tail = _tail_sums(block)
    # numpy's own (pairwise) sums, not a BLAS dot: OpenBLAS splits a long dot across its threads,
    # so the last bits of the accuracies depended on the thread count, and on a busy 2-core machine a
    # threaded dot per resample waited milliseconds for the second thread.
    strong_acc, weak_acc = strong_drawn.sum(axis=1) / m, weak_drawn.sum(axis=1) / m
    varied = _two_scores_present(s_sorted, block > 0)
    out = np.full(len(block), np.nan)
    for r in np.flatnonzero(varied):
        out[r] = _apgr_of_sums(s_sorted, cum[r], strong_tail[r], weak_head[r], count_tail[r], m[r], quantiles,
                               float(strong_acc[r]), float(weak_acc[r]))
    return out


def _tail_sums(values: np.ndarray) -> np.ndarray:
    """Per row, the sum of each element and all after it, then a trailing 0 (the empty tail)."""
    tails = np.cumsum(values[:, ::-1], axis=1)[:, ::-1]
    return np.concatenate([tails, np.zeros((len(values), 1))], axis=1)


def _two_scores_present(s_sorted: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Per row of `present`, whether the drawn queries carry at least two distinct scores: the scores
    are sorted, so the first and last drawn ones differ (NaNs, sorted last, count as one value, as
    np.unique has them)."""
    n = present.shape[1]
    first = s_sorted[np.argmax(present, axis=1)]
    last = s_sorted[n - 1 - np.argmax(present[:, ::-1], axis=1)]
    return present.any(axis=1) & (first != last) & ~(np.isnan(first) & np.isnan(last))


def _apgr_of_counts(s_sorted: np.ndarray, strong: np.ndarray, weak: np.ndarray, c: np.ndarray, m: float,
                    quantiles: np.ndarray) -> float:
    """APGR of one resample (counts c over the queries sorted by score): the reference that
    _apgr_of_count_block computes many of at once."""
    cum = np.cumsum(c)
    present = c > 0
    if np.unique(s_sorted[present]).size < 2:
        return float("nan")
    strong_tail = np.concatenate([np.cumsum((c * strong)[::-1])[::-1], [0.0]])
    weak_head = np.concatenate([[0.0], np.cumsum(c * weak)])
    count_tail = np.concatenate([np.cumsum(c[::-1])[::-1], [0.0]])
    return _apgr_of_sums(s_sorted, cum, strong_tail, weak_head, count_tail, m, quantiles,
                         float((c * strong).sum()) / m, float((c * weak).sum()) / m)


def _apgr_of_sums(s_sorted: np.ndarray, cum: np.ndarray, strong_tail: np.ndarray, weak_head: np.ndarray,
                  count_tail: np.ndarray, m: float, quantiles: np.ndarray, strong_acc: float,
                  weak_acc: float) -> float:
    """APGR of one resample from its running sums over the score-sorted queries: cum (drawn so far),
    strong_tail / weak_head / count_tail (strong-correct, weak-correct and drawn counts at or after,
    before, at or after each position) and m draws in all."""
    # Linear-interpolated quantiles of the expanded (repeated) sorted sample, as np.quantile computes
    # them: position h = (m − 1)·q, value lerp(a[⌊h⌋], a[⌊h⌋ + 1], h − ⌊h⌋) with numpy's own lerp.
    h = (m - 1) * quantiles
    lo = np.floor(h)
    a = s_sorted[np.searchsorted(cum, lo, side="right")]
    b = s_sorted[np.searchsorted(cum, np.minimum(lo + 1, m - 1), side="right")]
    t = h - lo
    diff = b - a
    edges = np.where(t >= 0.5, b - diff * (1 - t), a + diff * t)
    edges = np.unique(edges)  # qcut(duplicates="drop")
    # Queries sent to the strong model at each edge: score ≥ edge (> for the last edge).
    first = np.searchsorted(s_sorted, edges, side="left")
    first[-1] = np.searchsorted(s_sorted, edges[-1], side="right")
    share = count_tail[first] / m
    accuracy = (strong_tail[first] + weak_head[first]) / m
    by_share = np.argsort(share, kind="mergesort")
    share, accuracy = share[by_share], accuracy[by_share]
    span = share[-1] - share[0]
    if strong_acc == weak_acc or span == 0:
        return float("nan")
    area = float(np.trapezoid(accuracy, share))
    return (area - weak_acc * span) / ((strong_acc - weak_acc) * span)


def cpt(router_scores: ArrayLike, strong_correct: ArrayLike, weak_correct: ArrayLike, pgr: float = 0.5,
        num_results: int = 10) -> float:
    """Call-Performance Threshold CPT(pgr), evaluate.py `pct_call_metric`: the percentage of calls
    to the strong model needed to reach weak_acc + pgr * (strong_acc - weak_acc), read off the
    curve with np.interp(target, accuracy, strong_percentage). As in RouteLLM, np.interp assumes
    accuracy rises with the strong share; a curve that dips gives np.interp's (unchecked) answer."""
    curve = routellm_curve(router_scores, strong_correct, weak_correct, num_results)
    weak_acc = float(np.mean(np.asarray(weak_correct, dtype=float)))
    strong_acc = float(np.mean(np.asarray(strong_correct, dtype=float)))
    target = pgr * (strong_acc - weak_acc) + weak_acc
    return float(np.interp(target, curve["accuracy"], curve["strong_percentage"]))


# ---------------------------------------------------------------- LLMRouterBench


def best_single(costs: ArrayLike, scores: ArrayLike) -> int:
    """Index of LLMRouterBench's "Best Single": the single worker with the highest accuracy; ties go
    to the cheaper one."""
    c, s = np.asarray(costs, dtype=float), np.asarray(scores, dtype=float)
    return int(np.lexsort((c, -s))[0])


def gain_over_best_single(router_costs: ArrayLike, router_scores: ArrayLike, best_cost: float,
                          best_score: float) -> dict[str, float]:
    """LLMRouterBench PerfGain, "maximum performance improvement over the best single model":
    `any_cost` = best router accuracy minus the best single worker's; `matched_cost` = the same over
    the router points that cost no more than that worker (NaN when there are none)."""
    c, s = np.asarray(router_costs, dtype=float), np.asarray(router_scores, dtype=float)
    affordable = s[c <= best_cost]
    return {
        "any_cost": float(s.max() - best_score),
        "matched_cost": float(affordable.max() - best_score) if len(affordable) else float("nan"),
    }


def cost_saved_at_matched_accuracy(router_costs: ArrayLike, router_scores: ArrayLike, best_cost: float,
                                   best_score: float) -> float:
    """LLMRouterBench CostSave, "cost reduction while maintaining comparable accuracy to the best
    single model": 1 - c*/best_cost, where c* is the cost of the cheapest router point whose
    accuracy reaches the best single worker's. NaN when no point reaches it (or best_cost is 0)."""
    c, s = np.asarray(router_costs, dtype=float), np.asarray(router_scores, dtype=float)
    reaching = c[s >= best_score]
    if len(reaching) == 0 or best_cost <= 0:
        return float("nan")
    return float(1.0 - reaching.min() / best_cost)


def pareto_distance(costs: ArrayLike, scores: ArrayLike, all_costs: ArrayLike, all_scores: ArrayLike) -> np.ndarray:
    """LLMRouterBench ParetoDist, "average distance to the Pareto frontier" (average the returned
    array): for each (cost, score) point, the Euclidean distance to the nearest point of the Pareto
    frontier of `all_*` (every router and worker). Cost is min-max scaled over `all_costs` so both
    axes run over [0, 1]; score (accuracy) is used as is. Points on the frontier get 0."""
    ac, as_ = np.asarray(all_costs, dtype=float), np.asarray(all_scores, dtype=float)
    span = float(ac.max() - ac.min()) or 1.0
    front = pareto_frontier(ac, as_)
    fx, fy = (ac[front] - ac.min()) / span, as_[front]
    px = (np.asarray(costs, dtype=float) - ac.min()) / span
    py = np.asarray(scores, dtype=float)
    d = np.hypot(px[:, None] - fx[None, :], py[:, None] - fy[None, :])
    return d.min(axis=1)


# ---------------------------------------------------------------- bootstrap


def bootstrap_ci(values: ArrayLike | tuple[ArrayLike, ...], stat_fn: Callable = np.mean, n_boot: int = 1000,
                 seed: int = 0, confidence: float = 0.95) -> tuple[float, float, float]:
    """(statistic, low, high): percentile-bootstrap interval (Efron & Tibshirani 1993, ch. 13) by
    scipy.stats.bootstrap. `values` is one per-query array, or a tuple of per-query arrays
    resampled together (paired over queries), e.g. (correct, cost) with
    stat_fn=lambda c, u, axis=-1: c.mean(axis) / u.mean(axis). stat_fn must accept `axis`."""
    data = tuple(np.asarray(v, dtype=float) for v in values) if isinstance(values, tuple) else (
        np.asarray(values, dtype=float),)
    estimate = float(stat_fn(*data, axis=-1))
    if len(data[0]) < 2:
        return estimate, float("nan"), float("nan")
    res = stats.bootstrap(data, stat_fn, n_resamples=n_boot, confidence_level=confidence, method="percentile",
                          paired=True, vectorized=True, rng=np.random.default_rng(seed))
    return estimate, float(res.confidence_interval.low), float(res.confidence_interval.high)


def paired_bootstrap_diff(a: ArrayLike, b: ArrayLike, stat_fn: Callable = np.mean, n_boot: int = 1000,
                          seed: int = 0, confidence: float = 0.95) -> tuple[float, float, float]:
    """(stat(a) - stat(b), low, high) with the queries resampled jointly: a[i] and b[i] are two
    routers on the same query i, so query difficulty cancels (the promotion gate's test: the
    challenger beats the champion when low > 0)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError("paired bootstrap needs the two routers on the same queries (equal lengths)")

    def diff(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        return stat_fn(x, axis=axis) - stat_fn(y, axis=axis)

    return bootstrap_ci((a, b), diff, n_boot=n_boot, seed=seed, confidence=confidence)
