"""A stacked ensemble of outcome estimators: member P̂ combined per worker by weights learned on
out-of-fold predictions of the training queries.

Source: stacked generalisation (Wolpert 1992, "Stacked generalization", Neural Networks 5(2)); the
level-1 learner is a per-worker logistic regression on the members' logits (Breiman 1996, "Stacked
regressions", recommends constrained linear level-1 learners; a logistic link keeps P̂ in [0, 1]).
The registry's plain `ensemble` averages its members with equal weights; here the weights are fitted,
per worker, and only on the training queries: each member is cross-fitted on `n_folds` inner folds of
the training set to give honest out-of-fold P̂, the level-1 weights are fitted on those, and the
members are then refitted on every training query for prediction. Nothing outside the rows given to
`fit` is read. Quality is the stacked P̂(correct), so the expected-utility rule q̂ − λ·c traces the
cost curve (issue 28's goal is read off that curve).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import KFold

from models.base import Router, RoutingData

EPS = 1e-4


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, EPS, 1 - EPS)
    return np.log(p / (1 - p))


class StackedRouter(Router):
    """members: registry names of per-worker outcome estimators (their quality must be a P̂ in [0, 1])."""

    name = "stacked"

    def __init__(self, members: tuple[str, ...] = ("knn", "logistic", "mlp", "mf", "mtrouter", "embedllm", "routerdc_cal"),
                 n_folds: int = 3, C: float = 1.0, seed: int = 0, *, make: Callable[[str, int], Router]):
        # make: registry name, seed → a fresh member (models/registry.py: make_router, which passes itself:
        # the registry imports this package, so this package does not import the registry).
        if len(members) < 2:
            raise ValueError(f"a stack needs at least two members, got {members}")
        if n_folds < 2:
            raise ValueError(f"n_folds must be ≥ 2, got {n_folds}")
        self.members, self.n_folds, self.C, self.seed = tuple(members), n_folds, C, seed
        self.make = make
        self.fitted_: list[Router] | None = None

    def _make(self, name: str) -> Router:
        return self.make(name, self.seed)

    def _member_logits(self, routers: list[Router], data: RoutingData) -> np.ndarray:
        """(n, w, members) logits of each member's P̂."""
        return np.stack([_logit(np.asarray(r.predict_quality(data), dtype=float)) for r in routers], axis=-1)

    def out_of_fold(self, data: RoutingData) -> np.ndarray:
        """(n, w, members) out-of-fold logits: each training query scored by members fitted without it."""
        out = np.zeros((len(data), len(data.workers), len(self.members)))
        for fit_rows, held in KFold(self.n_folds, shuffle=True, random_state=self.seed).split(np.arange(len(data))):
            routers = [self._make(m).fit(data.subset(fit_rows)) for m in self.members]
            out[held] = self._member_logits(routers, data.subset(held))
        return out

    def fit(self, data: RoutingData) -> "StackedRouter":
        if len(data) < 5 * self.n_folds:
            raise ValueError(f"StackedRouter needs at least {5 * self.n_folds} training queries, got {len(data)}")
        oof = self.out_of_fold(data)
        self.level1_ = []
        for j in range(len(data.workers)):
            y = data.scores[:, j]
            keep = ~np.isnan(y)
            labels = (y[keep] > 0.5).astype(int)
            if len(np.unique(labels)) < 2:  # a worker always right (or wrong) on train: its base rate
                self.level1_.append(float(labels.mean()) if len(labels) else 0.5)
                continue
            self.level1_.append(LogisticRegression(C=self.C, max_iter=1000).fit(oof[keep, j, :], labels))
        self.fitted_ = [self._make(m).fit(data) for m in self.members]
        return self

    def weights(self) -> np.ndarray:
        """(w, members) level-1 weights (NaN for a worker served by its base rate)."""
        return np.array([m.coef_[0] if hasattr(m, "coef_") else np.full(len(self.members), np.nan) for m in self.level1_])

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.fitted_ is None:
            raise RuntimeError("StackedRouter.predict_quality before fit")
        z = self._member_logits(self.fitted_, data)
        cols = [np.full(len(data), m) if isinstance(m, float) else m.predict_proba(z[:, j, :])[:, 1]
                for j, m in enumerate(self.level1_)]
        return np.stack(cols, axis=1)
