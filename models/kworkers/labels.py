"""Cost-aware label classification: learn *which* worker to call, not how good each one is.

Source: the peer package of issue 28 (ulab-uiuc/LLMRouter, `llmrouter-lib`), whose MLP router is
trained on the label argmax_k s_k − λ·c_k (the cheapest model that answers right), retrained per λ;
RouteLLM (Ong et al. 2024, arXiv 2406.18665, §4) trains its routers as classifiers of the routing
label for two workers. On 0/1 scores the label at λ → 0⁺ is the cheapest worker that answers right;
a larger λ only caps the price a label may have (a worker's gain is 1 against a cost difference),
so the labels of a per-λ sweep are this one label with the dearest tiers cut off. We fit one
classifier on the λ → 0⁺ label and let the shared rule argmax_k P̂(label = k | x) − λ·c_k trace the
curve: every λ of the sweep is served by one model (and serving's budget rule reads the same P̂).

Ties in price (six of the nine workers cost $0.2 / 1M) go to the worker more often right on the
training queries: the safer label. A query no worker answers is labelled with the cheapest worker
(nothing to gain by paying more), so "hard" queries pull probability towards cheap workers.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import StratifiedKFold
from sklearn.neural_network import MLPClassifier
from sklearn.preprocessing import StandardScaler

from models.base import Router, RoutingData
from models.baselines.features import QueryFeaturizer, single_threaded

C_GRID = (0.003, 0.01, 0.03, 0.1, 0.3)
EARLY_STOP_MIN = 1000


def cheapest_correct_labels(scores: np.ndarray, costs: np.ndarray, threshold: float = 0.5) -> np.ndarray:
    """Per query, the index of the cheapest worker whose score > threshold; price ties to the worker
    with the higher mean score; a query nobody answers → its cheapest worker (same tie rule)."""
    scores = np.nan_to_num(np.asarray(scores, dtype=float), nan=0.0)
    costs = np.asarray(costs, dtype=float)
    strength = scores.mean(axis=0)
    # lexsort keys, last primary: cost, then −strength, then index.
    right = scores > threshold
    big = np.where(right, costs, np.inf)
    labels = np.empty(len(scores), dtype=int)
    for i in range(len(scores)):
        row = big[i] if right[i].any() else costs[i]
        labels[i] = int(np.lexsort((np.arange(len(row)), -strength, row))[0])
    return labels


class CostLabelRouter(Router):
    """A multinomial classifier of the cheapest correct worker; quality = P̂(label = k | x).

    classifier: "logistic" (L2 multinomial logistic regression, C chosen by inner stratified folds on
    log loss) or "mlp" (one hidden layer, early stopping on a seeded 10 % of the training queries).
    balanced: weight labels by inverse frequency (logistic only): the cheapest worker is the label of
    most queries, and unweighted P̂ then name it on nearly every query at every λ (on the nine-model
    table's validation fold: a flat curve at gemma's accuracy). answerable_only: fit on the queries
    some worker answers; the rest carry no signal about whom to call.
    """

    name = "cost_label"

    def __init__(self, classifier: str = "logistic", seed: int = 0, encoder=None, hidden: int = 128,
                 balanced: bool = True, answerable_only: bool = True):
        if classifier not in ("logistic", "mlp"):
            raise ValueError(f"classifier must be 'logistic' or 'mlp', got {classifier!r}")
        self.classifier, self.seed, self.hidden = classifier, seed, hidden
        self.balanced, self.answerable_only = balanced, answerable_only
        self.featurizer = QueryFeaturizer(encoder=encoder)
        self.model_ = None

    def fit(self, data: RoutingData) -> "CostLabelRouter":
        self.featurizer.fit(data)
        x = self.featurizer.transform(data)
        self.scaler_ = StandardScaler().fit(x)
        x = self.scaler_.transform(x)
        y = cheapest_correct_labels(data.scores, data.costs)
        self.n_workers_ = len(data.workers)
        if self.answerable_only:  # no worker right: the query says nothing about whom to call
            keep = (np.nan_to_num(data.scores) > 0.5).any(axis=1)
            if keep.sum() >= 2:
                x, y = x[keep], y[keep]
        if len(np.unique(y)) < 2:  # one label: nothing to classify
            self.constant_ = int(y[0])
            return self
        self.constant_ = None
        with single_threaded():
            self.model_ = self._mlp(x, y) if self.classifier == "mlp" else self._logistic(x, y)
        return self

    def _logistic(self, x: np.ndarray, y: np.ndarray):
        counts = np.bincount(y)
        folds = int(min(3, counts[counts > 0].min()))
        best_c = C_GRID[len(C_GRID) // 2]
        if folds >= 2:  # C by inner folds on log loss (the labels' own likelihood)
            losses = []
            splits = list(StratifiedKFold(folds, shuffle=True, random_state=self.seed).split(x, y))
            for c in C_GRID:
                loss = 0.0
                for fit_rows, held in splits:
                    m = LogisticRegression(C=c, max_iter=2000, class_weight=self._weights()).fit(x[fit_rows], y[fit_rows])
                    p = np.clip(self._expand(m, m.predict_proba(x[held])), 1e-9, 1)
                    loss -= np.log(p[np.arange(len(held)), y[held]]).sum()
                losses.append(loss)
            best_c = C_GRID[int(np.argmin(losses))]
        self.C_ = best_c
        return LogisticRegression(C=best_c, max_iter=2000, class_weight=self._weights()).fit(x, y)

    def _weights(self):
        return "balanced" if self.balanced else None

    def _mlp(self, x: np.ndarray, y: np.ndarray):
        # Early stopping needs a stopping fold large enough to measure accuracy on: below
        # EARLY_STOP_MIN labels the MLP trains for max_iter passes under its L2 penalty instead.
        return MLPClassifier(hidden_layer_sizes=(self.hidden,), alpha=1e-2, early_stopping=len(y) >= EARLY_STOP_MIN,
                             validation_fraction=0.1, n_iter_no_change=10, max_iter=300,
                             random_state=self.seed).fit(x, y)

    def _expand(self, model, proba: np.ndarray) -> np.ndarray:
        """Classifier columns (the labels seen in training) → one column per worker (0 for the rest)."""
        out = np.zeros((len(proba), self.n_workers_))
        out[:, model.classes_.astype(int)] = proba
        return out

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.model_ is None and getattr(self, "constant_", None) is None:
            raise RuntimeError("CostLabelRouter.predict_quality before fit")
        if self.constant_ is not None:
            out = np.zeros((len(data), self.n_workers_))
            out[:, self.constant_] = 1.0
            return out
        x = self.scaler_.transform(self.featurizer.transform(data))
        with single_threaded():
            return self._expand(self.model_, self.model_.predict_proba(x))
