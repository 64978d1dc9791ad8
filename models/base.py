"""The one router interface every baseline and learned router implements.

A router sees queries (text, and cached embeddings when it wants them) and the pool's workers with
their per-query cost, and returns an estimated quality for every (query, worker). The cost-aware
decision rule is shared: pick argmax_w  q̂(x, w) − λ · c(x, w), where λ (cost weight: the inverse of
the willingness to pay, in quality per USD) is the one knob that sweeps the accuracy–cost curve.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np


@dataclass
class RoutingData:
    """A wide view of logged outcomes: n queries × w workers.

    `scores` is the observed quality (1/0 correctness or a score in [0, 1]); `costs` is USD per call
    derived from tokens under a price book; `embeddings` are cached query embeddings (n × d) or None.
    """

    query_ids: list[str]
    queries: list[str]
    workers: list[str]
    scores: np.ndarray  # (n, w) float
    costs: np.ndarray  # (n, w) float, USD
    embeddings: np.ndarray | None = None  # (n, d) float32
    worker_attributes: dict[str, dict[str, float]] = field(default_factory=dict)
    # Optional logged response text, responses[i][j] = worker j's answer to query i ("" if none): a
    # cascade's scorer may read the answer of a worker it has already paid for (FrugalGPT §3).
    responses: list[list[str]] | None = None

    def subset(self, idx: np.ndarray) -> "RoutingData":
        idx = np.asarray(idx)
        return RoutingData(
            query_ids=[self.query_ids[i] for i in idx],
            queries=[self.queries[i] for i in idx],
            workers=list(self.workers),
            scores=self.scores[idx],
            costs=self.costs[idx],
            embeddings=None if self.embeddings is None else self.embeddings[idx],
            worker_attributes=self.worker_attributes,
            responses=None if self.responses is None else [self.responses[i] for i in idx],
        )

    def __len__(self) -> int:
        return len(self.query_ids)


class Router(ABC):
    """Fit on training queries; estimate each worker's quality on new ones."""

    name: str = "router"
    # The knob that sweeps the accuracy–cost curve: "cost_weight" (λ of the shared rule) for most
    # routers, "threshold" for cascades. Evaluation reads it to pick the grid.
    knob_name: str = "cost_weight"

    @abstractmethod
    def fit(self, data: RoutingData) -> "Router": ...

    @abstractmethod
    def predict_quality(self, data: RoutingData) -> np.ndarray:
        """(n, w) estimated quality of each worker on each query (higher is better)."""

    def route(self, data: RoutingData, cost_weight: float = 0.0) -> np.ndarray:
        """Index of the chosen worker per query under the cost-aware rule  q̂ − λ·c."""
        return choose_workers(self.predict_quality(data), data.costs, cost_weight)

    def decide(self, quality: np.ndarray, costs: np.ndarray, knob: float) -> tuple[np.ndarray, np.ndarray]:
        """(answering worker, USD paid) per query from precomputed quality. A router that calls
        several workers per query (a cascade) overrides this so evaluation charges every call."""
        choice = choose_workers(quality, costs, knob)
        return choice, costs[np.arange(len(choice)), choice]

    def route_with_cost(self, data: RoutingData, knob: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
        return self.decide(self.predict_quality(data), data.costs, knob)


def choose_workers(quality: np.ndarray, costs: np.ndarray, lam: float) -> np.ndarray:
    """argmax_w  q̂ − λ·c; ties go to the cheaper worker so λ → ∞ never raises cost."""
    utility = quality - lam * costs
    # Break exact ties by cost: subtract a vanishing multiple of the cost rank.
    order = np.argsort(np.argsort(costs, axis=1), axis=1)
    return np.argmax(utility - 1e-9 * order, axis=1)
