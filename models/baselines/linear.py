"""Per-worker linear outcome models (logistic regression, the cascade's scorer) and an averaging ensemble."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from sklearn.feature_extraction.text import TfidfVectorizer
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression, LogisticRegressionCV, RidgeCV
from sklearn.metrics import log_loss
from sklearn.model_selection import StratifiedShuffleSplit
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from models.base import Router, RoutingData
from models.baselines.features import QueryFeaturizer, is_binary, single_threaded

C_GRID = np.logspace(-4, 1, 8)  # on standardised dense features
C_GRID_SPARSE = np.logspace(-2, 2, 8)  # on TF-IDF ⊕ unit-norm embedding ⊕ standardised surface features
# C is chosen by 5 inner folds up to this many training queries; beyond, by one stratified 20% hold-out
# (HoldOutLogistic): a fifth of the fits, and a hold-out of ≥ 1,000 queries measures log loss as
# steadily as the five folds of a few hundred that small tables need. (A 14k-query replay runs 15
# fits per worker.)
HOLDOUT_ABOVE = 5000
_TFIDF_ANALYZER = TfidfVectorizer(ngram_range=(1, 2)).build_analyzer()  # lowercase word 1–2-grams
# TF-IDF keeps the most frequent n-grams up to this many (with min_df=2). Tables of a few thousand
# queries never reach it; an 11,200-query fold of the replay benchmark has 155k, and L-BFGS's own
# bookkeeping grows with the width: capped, that fold's fit took 13.4 s instead of 20.1 s, with hold-out
# AUC 0.578 / 0.561 instead of 0.576 / 0.554 on its two workers (the rare n-grams mostly fit noise).
TFIDF_MAX_FEATURES = 1 << 16


@functools.lru_cache(maxsize=1 << 16)
def word_ngrams(text: str) -> tuple[str, ...]:
    """TfidfVectorizer's own analysis of `text`, memoised: every fold and seed of a cross-fit tokenises
    the same queries again (~9 s of each TF-IDF fit on an 11k-query fold)."""
    return tuple(_TFIDF_ANALYZER(text))


def _quiet_lr_options() -> dict:
    """scikit-learn ≥ 1.8 warns unless these are explicit; older releases do not know them."""
    params = inspect.signature(LogisticRegressionCV).parameters
    extra = {"l1_ratios": (0.0,)} if "l1_ratios" in params else {}
    if "use_legacy_attributes" in params:
        extra["use_legacy_attributes"] = False
    return extra


@dataclass
class LinearOutcome:
    """q̂ = link(x · coef + intercept) for one worker, with any standardisation folded into coef so a
    decision is one matrix product (sklearn's per-call validation cost ~0.3 ms per worker)."""

    coef: np.ndarray  # (d,)
    intercept: float
    logistic: bool  # sigmoid link (logistic regression) or clip to [0, 1] (ridge)

    def __call__(self, x) -> np.ndarray:
        z = np.asarray(x @ self.coef).ravel() + self.intercept
        return 1.0 / (1.0 + np.exp(-z)) if self.logistic else np.clip(z, 0.0, 1.0)


def _constant(value: float, d: int) -> LinearOutcome:
    return LinearOutcome(np.zeros(d), value, logistic=False)


def _fold(model, logistic: bool) -> LinearOutcome:
    """The fitted pipeline's linear map with standardisation folded in:
    w·(x − μ)/σ + b = (w/σ)·x + b − w·μ/σ."""
    estimator = model[-1]
    coef, intercept = np.ravel(estimator.coef_).astype(float), float(np.ravel(estimator.intercept_)[0])
    if len(model) > 1:  # a StandardScaler in front
        scaler = model[0]
        coef = coef / scaler.scale_
        intercept -= float(coef @ scaler.mean_)
    return LinearOutcome(coef, intercept, logistic)


def fit_outcome_model(x, y: np.ndarray, seed: int = 0) -> LinearOutcome:
    """A calibrated P(correct | x) for one worker: L2 logistic regression with C chosen by inner
    5-fold CV on log loss (by a hold-out above HOLDOUT_ABOVE queries) (continuous scores: ridge with its alpha chosen by efficient leave-one-out).
    Dense features are standardised first; sparse ones (TF-IDF) are used as they are, since scaling
    rare n-grams to unit variance would amplify them. Returns a callable x → predicted quality."""
    keep = ~np.isnan(y)
    x, y = x[keep], y[keep]
    d = x.shape[1]
    if len(np.unique(y)) < 2:
        return _constant(float(y.mean()) if len(y) else 0.5, d)
    steps = [] if sparse.issparse(x) else [StandardScaler()]
    if is_binary(y):
        folds = int(min(5, np.bincount(y.astype(int)).min()))
        if folds < 2:  # a single minority example cannot be cross-validated: use the base rate
            return _constant(float(y.mean()), d)
        grid = C_GRID_SPARSE if sparse.issparse(x) else C_GRID
        if len(y) > HOLDOUT_ABOVE:
            model = make_pipeline(*steps, HoldOutLogistic(grid, seed))
        else:
            model = make_pipeline(*steps, LogisticRegressionCV(
                Cs=grid, cv=folds, scoring="neg_log_loss", max_iter=3000, random_state=seed, **_quiet_lr_options()))
        with single_threaded():
            model.fit(x, y.astype(int))
        return _fold(model, logistic=True)
    model = make_pipeline(*steps, RidgeCV(alphas=np.logspace(-1, 4, 8)))
    with single_threaded():
        model.fit(x, y)
    return _fold(model, logistic=False)


class HoldOutLogistic(BaseEstimator, ClassifierMixin):
    """L2 logistic regression with C chosen on one stratified 20% hold-out, for large tables.

    The penalties are tried from strongest to weakest, each fit warm-started from the last, and the
    search stops at the first grid point whose hold-out log loss is worse than the best so far: the
    weakly regularised end of the grid, where L-BFGS needs thousands of iterations on TF-IDF features
    and which the hold-out rejects anyway, is then never fitted. (Waiting one point more, as until
    issue 8's replay target, chose the same C on both workers of a 11,200-query fold of the replay
    benchmark, where the hold-out losses rise steadily past their minimum, and cost a third of the fit:
    20.1 → 13.3 s.) The final model is refitted on every row at the chosen C.
    """

    PATIENCE = 1

    def __init__(self, Cs=C_GRID, seed: int = 0):
        self.Cs = Cs
        self.seed = seed

    def fit(self, x, y):
        fit_rows, held_rows = next(StratifiedShuffleSplit(n_splits=1, test_size=0.2, random_state=self.seed).split(x, y))
        path = LogisticRegression(max_iter=3000, warm_start=True)
        losses, solutions = [], []
        for c in sorted(self.Cs):
            path.set_params(C=c).fit(x[fit_rows], y[fit_rows])
            losses.append(log_loss(y[held_rows], path.predict_proba(x[held_rows])[:, 1], labels=[0, 1]))
            solutions.append((path.coef_.copy(), path.intercept_.copy()))
            if len(losses) - 1 - int(np.argmin(losses)) >= self.PATIENCE:
                break
        best = int(np.argmin(losses))
        self.C_ = float(sorted(self.Cs)[best])
        self.losses_ = losses
        # The refit on every row starts from the solution at C_ on 80% of them: the same convex
        # objective, so the same optimum (to the solver's tolerance), reached in fewer L-BFGS steps
        # (one worker's model on an 11,200-query TF-IDF fold: 37 instead of 56).
        final = LogisticRegression(C=self.C_, max_iter=3000, warm_start=True)
        final.coef_, final.intercept_ = solutions[best]
        final.fit(x, y)
        self.coef_, self.intercept_, self.classes_ = final.coef_, final.intercept_, final.classes_
        return self


class LogisticRouter(Router):
    """One L2 logistic regression per worker on (embedding ⊕ surface features), optionally ⊕ TF-IDF
    word 1–2-grams of the query (lexical cues of difficulty an embedding smooths over)."""

    name = "logistic"

    def __init__(self, use_surface: bool = True, use_tfidf: bool = False, seed: int = 0, encoder=None):
        self.featurizer = QueryFeaturizer(use_surface=use_surface, encoder=encoder)
        self.use_tfidf = use_tfidf
        self.seed = seed
        self.models_: list | None = None

    def _features(self, data: RoutingData, tfidf=None):
        dense = self.featurizer.transform(data)
        if not self.use_tfidf:
            return dense
        tfidf = self.tfidf_.transform(data.queries) if tfidf is None else tfidf
        return sparse.hstack([tfidf, sparse.csr_matrix(dense)]).tocsr()

    def fit(self, data: RoutingData) -> "LogisticRouter":
        self.featurizer.fit(data)
        tfidf = None
        if self.use_tfidf:  # fit_transform: the training queries are tokenised once, not twice
            self.tfidf_ = TfidfVectorizer(analyzer=word_ngrams, min_df=2, sublinear_tf=True,
                                          max_features=TFIDF_MAX_FEATURES)
            tfidf = self.tfidf_.fit_transform(data.queries)
        x = self._features(data, tfidf)
        scores = np.asarray(data.scores, dtype=float)
        self.models_ = [fit_outcome_model(x, scores[:, j], self.seed) for j in range(scores.shape[1])]
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.models_ is None:
            raise RuntimeError("LogisticRouter.predict_quality before fit")
        x = self._features(data)
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
        self.members_ = [
            (m() if callable(m) and not isinstance(m, Router) else m).fit(data) for m in self.member_factories
        ]
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.members_ is None:
            raise RuntimeError("EnsembleRouter.predict_quality before fit")
        return np.mean([m.predict_quality(data) for m in self.members_], axis=0)
