"""Calibrated per-worker success probabilities with expected-utility selection.

Source: the expected-utility rule argmax_k P̂(k right | x) − λ·c_k is RouterBench's cost-aware
selection (Hu et al. 2024, arXiv 2403.12031, its "predictive routers") and the shared rule of
models/base.py; it picks the right worker only if the P̂ of different workers are on one scale,
which separately fitted classifiers do not promise. So each worker's P̂ is recalibrated on a
validation fold the base model never saw: isotonic regression (Zadrozny & Elkan, KDD 2002), or
Platt's sigmoid (Platt 1999) for small folds. Under a request's budget, serving picks the most
probable affordable worker (evaluation.serving.single_turn.choose_within_budget) from the same calibrated P̂.

base: "logistic" (models.baselines.linear.LogisticRouter: L2 logistic regression on embedding ⊕
surface features, C by inner folds), "knn" (models.baselines.knn.KNNRouter), or "logistic+knn"
(their mean, calibrated as one score).
"""

from __future__ import annotations

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

from models.base import Router, RoutingData
from models.baselines.knn import KNNRouter
from models.baselines.linear import LogisticRouter
from models.kworkers.validation import split_data

BASES = ("logistic", "knn", "logistic+knn")
ISOTONIC_MIN = 200  # below this many validation queries a step function overfits: Platt scaling


class CalibratedRouter(Router):
    """Base per-worker P̂ fitted on (1 − val_fraction) of the training queries, recalibrated per
    worker on the rest (the validation fold)."""

    name = "calibrated"

    def __init__(self, base: str = "logistic", val_fraction: float = 0.25, method: str = "auto", seed: int = 0,
                 encoder=None):
        if base not in BASES:
            raise ValueError(f"base must be one of {BASES}, got {base!r}")
        if method not in ("auto", "isotonic", "sigmoid"):
            raise ValueError(f"method must be auto, isotonic or sigmoid, got {method!r}")
        self.base, self.val_fraction, self.method, self.seed, self.encoder = base, val_fraction, method, seed, encoder
        self.members_: list[Router] | None = None

    def _members(self) -> list[Router]:
        names = self.base.split("+")
        return [LogisticRouter(seed=self.seed, encoder=self.encoder) if n == "logistic" else KNNRouter(encoder=self.encoder)
                for n in names]

    def _raw(self, data: RoutingData) -> np.ndarray:
        return np.mean([m.predict_quality(data) for m in self.members_], axis=0)

    def fit(self, data: RoutingData) -> "CalibratedRouter":
        fit_on, val = split_data(data, self.val_fraction, self.seed)
        self.members_ = [m.fit(fit_on) for m in self._members()]
        raw = self._raw(val)
        method = self.method if self.method != "auto" else ("isotonic" if len(val) >= ISOTONIC_MIN else "sigmoid")
        self.method_ = method
        self.calibrators_ = [self._calibrator(raw[:, j], val.scores[:, j], method) for j in range(len(data.workers))]
        return self

    @staticmethod
    def _calibrator(p: np.ndarray, y: np.ndarray, method: str):
        keep = ~np.isnan(y)
        p, y = p[keep], y[keep]
        if len(np.unique(y)) < 2 or len(np.unique(p)) < 2:  # nothing to map: the fold's base rate
            rate = float(y.mean()) if len(y) else 0.5
            return lambda q: np.full(len(q), rate)
        if method == "isotonic":
            iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(p, y)
            return iso.predict
        logit = np.log(np.clip(p, 1e-6, 1 - 1e-6) / np.clip(1 - p, 1e-6, 1)).reshape(-1, 1)
        platt = LogisticRegression(C=1e4).fit(logit, (y > 0.5).astype(int))
        return lambda q: platt.predict_proba(
            np.log(np.clip(q, 1e-6, 1 - 1e-6) / np.clip(1 - q, 1e-6, 1)).reshape(-1, 1))[:, 1]

    def recalibrate(self, sample: RoutingData) -> "CalibratedRouter":
        """Refit only the calibration maps, on `sample` (e.g. a small labelled sample of a new table
        whose queries differ from the training ones): the base models keep what they learned, the
        calibrators learn what their scores mean on the new queries (issue 28, item 3)."""
        if self.members_ is None:
            raise RuntimeError("CalibratedRouter.recalibrate before fit")
        raw = self._raw(sample)
        method = self.method if self.method != "auto" else ("isotonic" if len(sample) >= ISOTONIC_MIN else "sigmoid")
        self.calibrators_ = [self._calibrator(raw[:, j], sample.scores[:, j], method) for j in range(raw.shape[1])]
        self.method_ = method
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        if self.members_ is None:
            raise RuntimeError("CalibratedRouter.predict_quality before fit")
        raw = self._raw(data)
        return np.stack([cal(raw[:, j]) for j, cal in enumerate(self.calibrators_)], axis=1)
