"""Per-worker linear outcome models (logistic regression, the cascade's scorer) and an averaging ensemble."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence

import numpy as np
from sklearn.linear_model import LogisticRegressionCV, RidgeCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from models.base import Router, RoutingData
from models.baselines.features import QueryFeaturizer, is_binary, single_threaded

C_GRID = np.logspace(-4, 1, 8)  # on standardised features


def _quiet_lr_options() -> dict:
    """scikit-learn ≥ 1.8 warns unless these are explicit; older releases do not know them."""
    params = inspect.signature(LogisticRegressionCV).parameters
    extra = {"l1_ratios": (0.0,)} if "l1_ratios" in params else {}
    if "use_legacy_attributes" in params:
        extra["use_legacy_attributes"] = False
    return extra


def fit_outcome_model(x: np.ndarray, y: np.ndarray, seed: int = 0):
    """A calibrated P(correct | x) for one worker: L2 logistic regression on standardised features
    with C chosen by inner 5-fold CV on log loss (continuous scores: ridge with its alpha chosen by
    efficient leave-one-out). Returns a callable x → predicted quality."""
    keep = ~np.isnan(y)
    x, y = x[keep], y[keep]
    if len(np.unique(y)) < 2:
        constant = float(y.mean()) if len(y) else 0.5
        return lambda z: np.full(len(z), constant)
    if is_binary(y):
        folds = int(min(5, np.bincount(y.astype(int)).min()))
        if folds < 2:  # a single minority example cannot be cross-validated: use the base rate
            constant = float(y.mean())
            return lambda z: np.full(len(z), constant)
        model = make_pipeline(
            StandardScaler(),
            LogisticRegressionCV(Cs=C_GRID, cv=folds, scoring="neg_log_loss", max_iter=3000, random_state=seed,
                                 **_quiet_lr_options()),
        )
        with single_threaded():
            model.fit(x, y.astype(int))
        return lambda z: model.predict_proba(z)[:, 1]
    model = make_pipeline(StandardScaler(), RidgeCV(alphas=np.logspace(-1, 4, 8)))
    with single_threaded():
        model.fit(x, y)
    return lambda z: np.clip(model.predict(z), 0.0, 1.0)


class LogisticRouter(Router):
    """One L2 logistic regression per worker on (embedding ⊕ surface features)."""

    name = "logistic"

    def __init__(self, use_surface: bool = True, seed: int = 0, encoder=None):
        self.featurizer = QueryFeaturizer(use_surface=use_surface, encoder=encoder)
        self.seed = seed
        self.models_: list | None = None

    def fit(self, data: RoutingData) -> "LogisticRouter":
        x = self.featurizer.fit(data).transform(data)
        scores = np.asarray(data.scores, dtype=float)
        self.models_ = [fit_outcome_model(x, scores[:, j], self.seed) for j in range(scores.shape[1])]
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.models_ is None:
            raise RuntimeError("LogisticRouter.predict_quality before fit")
        x = self.featurizer.transform(data)
        return np.stack([m(x) for m in self.models_], axis=1)


class EnsembleRouter(Router):
    """Mean of the members' predicted qualities. Equal weights on purpose: no weight is fitted, so
    nothing is tuned on data the members did not already restrict themselves to."""

    def __init__(self, members: Sequence[Callable[[], Router]] | Sequence[Router], name: str = "ensemble"):
        if not members:
            raise ValueError("EnsembleRouter needs at least one member")
        self.member_factories = list(members)
        self.name = name
        self.members_: list[Router] | None = None

    def fit(self, data: RoutingData) -> "EnsembleRouter":
        self.members_ = [(m() if callable(m) and not isinstance(m, Router) else m).fit(data) for m in self.member_factories]
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.members_ is None:
            raise RuntimeError("EnsembleRouter.predict_quality before fit")
        return np.mean([m.predict_quality(data) for m in self.members_], axis=0)
