"""Cascade (FrugalGPT, Chen et al. 2023, §3 'LLM cascade'; AutoMix's try-cheap-first): call workers
from cheapest to dearest and stop at the first answer a scorer trusts.

On a replay table the scorer is a learned per-worker P(correct) — a logistic regression on the query
embedding and surface features, plus the embedding of that worker's own logged answer when the table
has response text (FrugalGPT's scorer reads the query *and* the answer). The knob is the acceptance
threshold; the cost of a query is the sum over every worker the cascade called, not just the last.
"""

from __future__ import annotations

import numpy as np

from models.base import Router, RoutingData
from models.baselines.features import QueryFeaturizer, surface_features
from models.baselines.linear import fit_outcome_model
from models.embeddings import default_encoder


class Cascade(Router):
    """Try workers cheapest-first; accept worker j's answer when P̂(j correct) ≥ threshold."""

    name = "cascade"
    knob_name = "threshold"

    def __init__(self, use_responses: bool = True, seed: int = 0, encoder=None):
        self.use_responses = use_responses
        self.seed = seed
        self.encoder = encoder
        self.featurizer = QueryFeaturizer(encoder=encoder)
        self.scorers_: list | None = None

    def _encoder(self):
        if self.encoder is None:
            return default_encoder()
        return self.encoder

    def _worker_features(self, data: RoutingData, query_x: np.ndarray, j: int) -> np.ndarray:
        """What the scorer sees after calling worker j: the query, and j's answer if it was logged."""
        if not self.reads_responses_:
            return query_x
        answers = [row[j] or "" for row in data.responses]
        answer_x = self._encoder().encode(answers)
        answer_stats = (surface_features(answers) - self.answer_mean_[j]) / self.answer_std_[j]
        return np.concatenate([query_x, answer_x, answer_stats], axis=1)

    def fit(self, data: RoutingData) -> "Cascade":
        self.reads_responses_ = self.use_responses and data.responses is not None
        query_x = self.featurizer.fit(data).transform(data)
        scores = np.asarray(data.scores, dtype=float)
        if self.reads_responses_:
            stats = [surface_features([row[j] or "" for row in data.responses]) for j in range(len(data.workers))]
            self.answer_mean_ = [s.mean(axis=0) for s in stats]
            self.answer_std_ = [s.std(axis=0) + 1e-6 for s in stats]
        self.scorers_ = [
            fit_outcome_model(self._worker_features(data, query_x, j), scores[:, j], self.seed)
            for j in range(len(data.workers))
        ]
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        """P̂(worker j is correct) for every j; `decide` only ever reads those of workers it called."""
        if self.scorers_ is None:
            raise RuntimeError("Cascade.predict_quality before fit")
        if self.reads_responses_ and data.responses is None:
            raise ValueError("this cascade was fitted with response text; the data to route has none")
        query_x = self.featurizer.transform(data)
        return np.stack(
            [scorer(self._worker_features(data, query_x, j)) for j, scorer in enumerate(self.scorers_)], axis=1
        )

    def decide(self, quality: np.ndarray, costs: np.ndarray, knob: float) -> tuple[np.ndarray, np.ndarray]:
        """Answering worker and USD paid for threshold `knob`: the first worker (cheapest-first) whose
        P̂ ≥ knob answers, the dearest answers if none passes, and every call on the way is paid."""
        order = np.argsort(costs, axis=1, kind="stable")
        rows = np.arange(len(quality))[:, None]
        accepted = quality[rows, order] >= knob
        accepted[:, -1] = True
        stop = np.argmax(accepted, axis=1)
        paid = np.cumsum(costs[rows, order], axis=1)[np.arange(len(quality)), stop]
        return order[np.arange(len(quality)), stop], paid

    def route(self, data: RoutingData, threshold: float = 0.5) -> np.ndarray:  # type: ignore[override]
        """For a cascade the knob is the acceptance threshold, not a cost weight."""
        return self.route_with_cost(data, threshold)[0]
