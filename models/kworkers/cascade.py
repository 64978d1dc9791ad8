"""A K-step cascade ordered by price, with per-step acceptance thresholds fitted on validation.

Source: FrugalGPT (Chen, Zaharia & Zou 2023, arXiv 2305.05176, §3 "LLM cascade"): call workers
in a fixed order and stop at the first answer a scorer accepts; its thresholds are one per step,
chosen by optimisation (its eq. 2: maximise the expected score under a budget) on held-out data.
models/baselines/cascade.py, by contrast, walks every worker cheapest-first with one threshold for
all of them: on nine workers with six at one price it pays for up to eight wasted calls.

The chain: one worker per price tier (the most accurate on the fit fold), cheapest first, so K =
the number of tiers. Per-step thresholds: for each λ of a grid, coordinate ascent on the validation
fold over each step's threshold (quantiles of its P̂ there, or "never accept") to maximise
mean(score) − λ · mean(USD paid, every call on the way). A larger λ never raises a threshold
(enforced), so the fitted levels nest and one knob u ∈ (0, 1) names them all: step s accepts when
g_s(P̂_s) ≥ u with g_s(p) = the largest level u_l whose threshold t_{s,l} ≤ p. The quality matrix
holds g_s(P̂_s) for chain workers (1 for the last, which always answers) and −1 for workers off the
chain, so `decide` reads everything it needs from it (the replay harness gives `decide` an unfitted
router). Scorers read the query alone unless the table logs responses (this one does not), so a
cascade here pays for answers it learns nothing from: it is the protocol's lower reference.
"""

from __future__ import annotations

import numpy as np

from models.base import Router, RoutingData
from models.baselines.linear import LogisticRouter
from models.kworkers.validation import split_data

OFF_CHAIN = -1.0
RELATIVE_LAMBDAS = np.concatenate([[0.0], np.geomspace(0.01, 20.0, 30)])  # × 1 / (mean cost of the last step)
PASSES = 3
N_CANDIDATES = 41


def price_tiers(costs: np.ndarray, rtol: float = 0.01) -> list[list[int]]:
    """Workers grouped by mean cost (equal within rtol), cheapest tier first."""
    mean = np.asarray(costs, dtype=float).mean(axis=0)
    tiers: list[list[int]] = []
    for j in np.argsort(mean, kind="stable"):
        if tiers and np.isclose(mean[j], mean[tiers[-1][0]], rtol=rtol, atol=0.0):
            tiers[-1].append(int(j))
        else:
            tiers.append([int(j)])
    return tiers


def walk(accept: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """accept (n, K) along a chain (last column forced True), costs (n, K) along the chain →
    (stopping step, USD paid for every call up to it)."""
    accept = accept.copy()
    accept[:, -1] = True
    stop = np.argmax(accept, axis=1)
    paid = np.cumsum(costs, axis=1)[np.arange(len(stop)), stop]
    return stop, paid


class KStepCascade(Router):
    name = "kcascade"
    knob_name = "threshold"

    def __init__(self, val_fraction: float = 0.25, seed: int = 0, encoder=None,
                 relative_lambdas: np.ndarray = RELATIVE_LAMBDAS):
        self.val_fraction, self.seed, self.encoder = val_fraction, seed, encoder
        self.relative_lambdas = np.asarray(relative_lambdas, dtype=float)
        self.scorer_: LogisticRouter | None = None

    def fit(self, data: RoutingData) -> "KStepCascade":
        fit_on, val = split_data(data, self.val_fraction, self.seed)
        self.scorer_ = LogisticRouter(seed=self.seed, encoder=self.encoder).fit(fit_on)
        accuracy = np.nanmean(fit_on.scores, axis=0)
        self.chain_ = [max(tier, key=lambda j: (accuracy[j], -j)) for tier in price_tiers(fit_on.costs)]
        self.n_workers_ = len(data.workers)
        p = self.scorer_.predict_quality(val)[:, self.chain_]
        y = np.nan_to_num(val.scores[:, self.chain_])
        c = val.costs[:, self.chain_]
        lambdas = self.relative_lambdas / max(float(c[:, -1].mean()), 1e-12)
        thresholds = np.stack([self._fit_thresholds(p, y, c, lam) for lam in lambdas])  # (L, K-1)
        # Nesting: a dearer λ never demands more before accepting (running minimum along λ).
        self.thresholds_ = np.minimum.accumulate(thresholds, axis=0)
        self.lambdas_ = lambdas
        self.levels_ = 1.0 - np.arange(1, len(lambdas) + 1) / (len(lambdas) + 1)  # u_l, decreasing in λ
        return self

    def _fit_thresholds(self, p: np.ndarray, y: np.ndarray, c: np.ndarray, lam: float) -> np.ndarray:
        """Coordinate ascent over the K−1 thresholds (the last step always answers)."""
        k = p.shape[1]
        if k == 1:
            return np.zeros(0)
        grids = [np.unique(np.concatenate([np.quantile(p[:, s], np.linspace(0, 1, N_CANDIDATES)), [np.inf]]))
                 for s in range(k - 1)]
        t = np.full(k - 1, np.inf)  # start: always escalate to the last step
        rows = np.arange(len(p))

        def utility(th: np.ndarray) -> float:
            stop, paid = walk(np.concatenate([p[:, :-1] >= th[None, :], np.ones((len(p), 1), bool)], axis=1), c)
            return float(y[rows, stop].mean() - lam * paid.mean())

        best = utility(t)
        for _ in range(PASSES):
            changed = False
            for s in range(k - 1):
                for value in grids[s]:
                    trial = t.copy()
                    trial[s] = value
                    u = utility(trial)
                    if u > best + 1e-12:
                        best, t, changed = u, trial, True
            if not changed:
                break
        return t

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.scorer_ is None:
            raise RuntimeError("KStepCascade.predict_quality before fit")
        p = self.scorer_.predict_quality(data)
        out = np.full((len(data), self.n_workers_), OFF_CHAIN)
        for s, j in enumerate(self.chain_[:-1]):
            passed = p[:, j][:, None] >= self.thresholds_[None, :, s]  # (n, L): level l accepts here
            # g_s(p): the largest level whose threshold p clears (levels decrease with l), else 0.
            out[:, j] = np.where(passed.any(axis=1), self.levels_[np.argmax(passed, axis=1)], 0.0)
        out[:, self.chain_[-1]] = 1.0
        return out

    def decide(self, quality: np.ndarray, costs: np.ndarray, knob: float) -> tuple[np.ndarray, np.ndarray]:
        """Walk the chain (workers with quality ≥ 0, cheapest first); step s answers when its g_s ≥
        knob, the last always; every call on the way is paid."""
        quality = np.asarray(quality, dtype=float)
        n = len(quality)
        if n == 0:
            return np.zeros(0, dtype=int), np.zeros(0)
        on_chain = quality[0] >= 0
        chain = np.flatnonzero(on_chain)
        chain = chain[np.argsort(costs[:, chain].mean(axis=0), kind="stable")]
        stop, paid = walk(quality[:, chain] >= knob, costs[:, chain])
        return chain[stop], paid

    def route(self, data: RoutingData, threshold: float = 0.5) -> np.ndarray:  # type: ignore[override]
        """For this cascade the knob is the level u ∈ (0, 1] (higher: more escalation)."""
        return self.route_with_cost(data, threshold)[0]
