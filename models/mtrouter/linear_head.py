"""A closed-form linear head beside the MLP: ŝ(h, a) = g_a(z_x) + f_θ([z_x; z_a]) ("wide & deep").

Extension, paper silent. On small logged tables the joint MLP of eq. 4 learns the shared part of
the outcome (how hard the task is) and stops early before it learns how that differs between
models — yet the difference is all a router acts on. A ridge regression of the outcome on z_x per
model, with its penalty chosen by efficient leave-one-out CV (sklearn RidgeCV), captures that
first-order, model-specific effect reliably; the MLP then models what is left (non-linear effects
and the shared structure across models), trained on cross-fitted residuals so it never learns to
undo an in-sample fit.

At scale (more rows than EXACT_LOO_MAX_ROWS) RidgeCV's exact search is replaced by `large_ridge`:
its leave-one-out needs an SVD of the n × d design (d ≈ 4.5k with the hashed n-grams), which took
~3 minutes per fit on 11k queries on 2 cores. The penalty is chosen by the same exact leave-one-out on
a random subsample (sklearn's Ridge penalises the summed squared error, so the Bayes-optimal penalty
σ²/τ² does not depend on n), then one Cholesky factor of XᵀX + αI gives the coefficients on every row
and, from the hat diagonal, every row's exact leave-one-out prediction at that penalty.

Under the "hardcoded model features" ablation the head may not know model identity either: it is
then one ridge on z_x ⊗ [1; attr_a] (model-conditioned only through the attributes).
"""

from __future__ import annotations

import logging

import numpy as np
from scipy import linalg
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import GroupKFold

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.model_encoder import AttributeTable


log = logging.getLogger(__name__)

# Up to this many rows a fit uses RidgeCV's exact leave-one-out search over every penalty (fast while
# n ≲ d, where it decomposes the n × n kernel; RouteLLM's GSM8K has ~1k queries). Above, large_ridge.
EXACT_LOO_MAX_ROWS = 3000
# Rows of the subsample whose exact leave-one-out picks the penalty in large_ridge.
ALPHA_PROBE_ROWS = 2000
ROW_CHUNK = 2048  # rows per triangular solve of the hat diagonal (bounds memory to chunk × d floats)


def _ridge(alphas: list[float]) -> RidgeCV:
    # A scoring makes RidgeCV keep each row's leave-one-out prediction (cv_results_), free with its
    # closed-form LOO: the MLP's cross-fitted residual targets then cost no extra fit.
    return RidgeCV(alphas=alphas, scoring="neg_mean_squared_error", store_cv_results=True)


def _loo(ridge: RidgeCV) -> np.ndarray:
    """(n,) or (n, t) leave-one-out predictions at each target's chosen penalty."""
    results, alphas = ridge.cv_results_, list(ridge.alphas)
    chosen = np.atleast_1d(ridge.alpha_)
    if results.ndim == 2:
        return results[:, alphas.index(float(chosen[0]))]
    return np.stack([results[:, t, alphas.index(float(a))] for t, a in enumerate(chosen)], axis=1)


class LargeRidge:
    """What LinearHead reads of a fitted RidgeCV: coef_ (t, d), intercept_ (t,), alpha_ (t,), and
    loo: (n, t) leave-one-out predictions at each target's chosen penalty."""

    def __init__(self, coef: np.ndarray, intercept: np.ndarray, alpha: np.ndarray, loo: np.ndarray):
        self.coef_, self.intercept_, self.alpha_, self.loo = coef, intercept, alpha, loo

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, dtype=np.float64) @ self.coef_.T + self.intercept_


def large_ridge(x: np.ndarray, y: np.ndarray, alphas: list[float], seed: int = 0) -> LargeRidge:
    """Ridge with an unpenalised intercept for n ≫ rows RidgeCV handles quickly; y is (n,) or (n, t).

    1. Penalty per target: RidgeCV's exact leave-one-out on ALPHA_PROBE_ROWS random rows.
    2. Coefficients: Cholesky of X̃ᵀX̃ + αI (X̃ centred), one factor per distinct penalty.
    3. Leave-one-out predictions, exact for that penalty: e_i / (1 − h_ii) with
       h_ii = 1/n + ‖L⁻¹x̃_i‖² (the centring makes the intercept's leverage 1/n; hat_diagonal, whose
       triangular solves run in float32).
    """
    x = np.asarray(x, dtype=np.float32)
    y2 = np.asarray(y, dtype=np.float64).reshape(len(y), -1)
    n, t = y2.shape
    rng = np.random.default_rng(seed)
    probe_rows = np.sort(rng.choice(n, size=min(n, ALPHA_PROBE_ROWS), replace=False))
    probe = _ridge(alphas).set_params(alpha_per_target=t > 1, store_cv_results=False, scoring=None)
    probe.fit(x[probe_rows], y2[probe_rows] if t > 1 else y2[probe_rows, 0])
    chosen = np.broadcast_to(np.atleast_1d(probe.alpha_), (t,)).astype(float)
    mean_x, mean_y = x.mean(axis=0), y2.mean(axis=0)
    xc = x - mean_x
    gram = (xc.T @ xc).astype(np.float64)  # float32 GEMM (the n·d² step), factored in float64
    xty = sum(part.T @ (y2[rows] - mean_y) for rows, part in _float64_rows(xc))
    coef, loo = np.zeros((t, x.shape[1])), np.zeros((n, t))
    for alpha in np.unique(chosen):
        targets = np.flatnonzero(chosen == alpha)
        factor = linalg.cho_factor(gram + alpha * np.eye(len(gram)), lower=True, overwrite_a=True, check_finite=False)
        coef[targets] = linalg.cho_solve(factor, xty[:, targets], check_finite=False).T
        leverage = 1.0 / n + hat_diagonal(factor[0], xc)
        fitted = np.concatenate([part @ coef[targets].T for _, part in _float64_rows(xc)]) + mean_y[targets]
        loo[:, targets] = y2[:, targets] - (y2[:, targets] - fitted) / (1.0 - leverage)[:, None]
    log.debug("large_ridge: n=%d d=%d penalties %s", n, x.shape[1], chosen.tolist())
    intercept = mean_y - coef @ mean_x.astype(np.float64)
    if np.ndim(y) == 1:  # shaped like a single-target sklearn fit: coef_ (d,), intercept_ scalar
        return LargeRidge(coef[0], float(intercept[0]), chosen, loo[:, 0])
    return LargeRidge(coef, intercept, chosen, loo)


def _float64_rows(x: np.ndarray):
    """(row slice, those rows in float64), ROW_CHUNK rows at a time: products that need float64
    accuracy without a float64 copy of the whole n × d design (400 MB for an 11,200-row fit, held by
    each replay worker at once)."""
    for start in range(0, len(x), ROW_CHUNK):
        rows = slice(start, start + ROW_CHUNK)
        yield rows, np.asarray(x[rows], dtype=np.float64)


def hat_diagonal(lower: np.ndarray, xc: np.ndarray) -> np.ndarray:
    """(n,) x̃_iᵀ(LLᵀ)⁻¹x̃_i = ‖L⁻¹x̃_i‖² for every row of xc, given the lower Cholesky factor L of
    X̃ᵀX̃ + αI (float64, as factored).

    The triangular solves run in float32 (strsm, ROW_CHUNK rows at a time): on this 2-core EPYC, one
    thread, a 4,486-wide factor against 2,048 rows takes 0.50 s in float32 vs 2.0 s in float64 (the
    n·d² step of a large_ridge fit: 11 s of a 11,200-row fit, now ~3 s), and the leverages agree to a
    relative 1e-6 (tests/models/mtrouter/test_linear_head_large.py checks it against float64): a leave-
    one-out prediction e_i / (1 − h_ii) moves by ~1e-7, far below anything a penalty or a router reads.
    """
    factor32 = np.tril(lower).astype(np.float32)
    out = np.empty(len(xc))
    for start in range(0, len(xc), ROW_CHUNK):
        z = linalg.solve_triangular(factor32, np.asarray(xc[start:start + ROW_CHUNK], dtype=np.float32).T,
                                    lower=True, check_finite=False)
        out[start:start + ROW_CHUNK] = np.einsum("dn,dn->n", z, z, dtype=np.float64)
    return out


def _fit_ridge(x: np.ndarray, y: np.ndarray, alphas: list[float], seed: int, multi: bool = False):
    """(fitted ridge with coef_ / intercept_ / predict, its leave-one-out predictions)."""
    if len(x) > EXACT_LOO_MAX_ROWS:
        ridge = large_ridge(x, y, alphas, seed)
        return ridge, ridge.loo
    ridge = _ridge(alphas).set_params(alpha_per_target=multi).fit(x, y)
    return ridge, _loo(ridge)


class LinearHead:
    """g_a(z_x): per-model RidgeCV (learned mode) or one RidgeCV on z_x ⊗ [1; attr_a] (hardcoded).

    After fit, `loo` holds every training row's leave-one-out prediction (leaving out that row
    from its model's fit).
    """

    def __init__(self, table: AttributeTable, cfg: MTRouterConfig):
        self.table = table
        self.cfg = cfg
        self.by_attributes = cfg.model_features == "hardcoded"
        self.coef = np.zeros((len(table.models), 0), np.float32)  # (m, d) per-model weights
        self.intercept = np.zeros(len(table.models))
        self.joint: RidgeCV | None = None
        self.loo: np.ndarray | None = None

    def _interactions(self, x: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        phi = np.concatenate([np.ones((len(model_idx), 1), np.float32), self.table.standardised()[model_idx]], axis=1)
        return (phi[:, :, None] * x[:, None, :]).reshape(len(x), -1)

    def fit(self, histories: np.ndarray, history_idx: np.ndarray, model_idx: np.ndarray,
            y: np.ndarray) -> "LinearHead":
        """Fit on rows (history_idx[i], model_idx[i]) → y[i]; `histories` holds each distinct z_x once,
        so a single-turn grid of n queries × K models never materialises K copies of its features."""
        histories = np.asarray(histories, dtype=np.float32)
        history_idx, model_idx, y = np.asarray(history_idx), np.asarray(model_idx), np.asarray(y, dtype=float)
        alphas = list(self.cfg.ridge_alphas)
        seed = int(self.cfg.seed)
        if self.by_attributes:
            self.joint, self.loo = _fit_ridge(self._interactions(histories[history_idx], model_idx), y, alphas, seed)
            return self
        self.coef = np.zeros((len(self.table.models), histories.shape[1]), np.float32)
        self.intercept = np.full(len(self.table.models), float(np.mean(y)))  # a model never logged: the mean
        self.loo = np.array(y, dtype=float)
        models = [int(m) for m in np.unique(model_idx)]
        rows = {m: np.flatnonzero(model_idx == m) for m in models}
        first = rows[models[0]]
        if len(models) > 1 and all(np.array_equal(history_idx[rows[m]], history_idx[first]) for m in models):
            # Single-turn grids: every model was logged on the same histories, so one multi-target
            # fit shares the Gram matrix and its eigendecomposition across models.
            ridge, loo = _fit_ridge(histories[history_idx[first]], np.stack([y[rows[m]] for m in models], axis=1),
                                    alphas, seed, multi=True)
            for k, m in enumerate(models):
                self.coef[m], self.intercept[m] = ridge.coef_[k], ridge.intercept_[k]
            for k, m in enumerate(models):
                self.loo[rows[m]] = loo[:, k]
            return self
        for m in models:
            if len(rows[m]) >= 2:
                ridge, self.loo[rows[m]] = _fit_ridge(histories[history_idx[rows[m]]], y[rows[m]], alphas, seed)
                self.coef[m], self.intercept[m] = np.ravel(ridge.coef_), float(np.ravel(ridge.intercept_)[0])
        return self

    def predict(self, x: np.ndarray, model_idx: np.ndarray) -> np.ndarray:
        x, model_idx = np.asarray(x, dtype=np.float32), np.asarray(model_idx)
        if self.by_attributes:
            return self.joint.predict(self._interactions(x, model_idx))
        return np.einsum("nd,nd->n", x, self.coef[model_idx]) + self.intercept[model_idx]


def unique_per_group(model_idx: np.ndarray, groups: np.ndarray | None) -> bool:
    """True when no (task, model) pair has two rows: leave-one-out is then leave-one-task-out."""
    if groups is None:
        return True
    pairs = list(zip(np.asarray(groups).tolist(), np.asarray(model_idx).tolist()))
    return len(set(pairs)) == len(pairs)


def cross_fitted_predictions(head: LinearHead, histories: np.ndarray, history_idx: np.ndarray,
                             model_idx: np.ndarray, y: np.ndarray, groups: np.ndarray | None,
                             folds: int = 5) -> np.ndarray:
    """Out-of-sample g_a(z_x) for every training row of the fitted `head`: its free leave-one-out
    predictions when each task has one row per model, else task-grouped K-fold refits (a task's
    turns share histories, so leaving out one row would leak its siblings)."""
    if unique_per_group(model_idx, groups):
        return head.loo
    k = min(folds, len(np.unique(groups)))
    if k < 2:
        return head.predict(histories[history_idx], model_idx)
    out = np.empty(len(y), dtype=float)
    for fit_rows, held in GroupKFold(n_splits=k).split(history_idx, y, groups):
        part = LinearHead(head.table, head.cfg).fit(histories, history_idx[fit_rows], model_idx[fit_rows], y[fit_rows])
        out[held] = part.predict(histories[history_idx[held]], model_idx[held])
    return out
