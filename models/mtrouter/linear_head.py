"""A closed-form linear head beside the MLP: ŝ(h, a) = g_a(z_x) + f_θ([z_x; z_a]) ("wide & deep").

Extension, paper silent. On small logged tables the joint MLP of eq. 4 learns the shared part of
the outcome (how hard the task is) and stops early before it learns how that differs between
models — yet the difference is all a router acts on. A ridge regression of the outcome on z_x per
model, with its penalty chosen by efficient leave-one-out CV (sklearn RidgeCV), captures that
first-order, model-specific effect reliably; the MLP then models what is left (non-linear effects
and the shared structure across models), trained on cross-fitted residuals so it never learns to
undo an in-sample fit.

Under the "hardcoded model features" ablation the head may not know model identity either: it is
then one ridge on z_x ⊗ [1; attr_a] (model-conditioned only through the attributes).
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import RidgeCV
from sklearn.model_selection import GroupKFold

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.model_encoder import AttributeTable


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
        if self.by_attributes:
            self.joint = _ridge(alphas).fit(self._interactions(histories[history_idx], model_idx), y)
            self.loo = _loo(self.joint)
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
            ridge = _ridge(alphas).set_params(alpha_per_target=True)
            ridge.fit(histories[history_idx[first]], np.stack([y[rows[m]] for m in models], axis=1))
            for k, m in enumerate(models):
                self.coef[m], self.intercept[m] = ridge.coef_[k], ridge.intercept_[k]
            loo = _loo(ridge)
            for k, m in enumerate(models):
                self.loo[rows[m]] = loo[:, k]
            return self
        for m in models:
            if len(rows[m]) >= 2:
                ridge = _ridge(alphas).fit(histories[history_idx[rows[m]]], y[rows[m]])
                self.coef[m], self.intercept[m] = ridge.coef_, ridge.intercept_
                self.loo[rows[m]] = _loo(ridge)
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
