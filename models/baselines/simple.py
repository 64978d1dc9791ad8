"""Reference points every learned router is compared with: each single worker, random, and the oracle."""

from __future__ import annotations

import hashlib

import numpy as np

from models.base import Router, RoutingData


class SingleWorker(Router):
    """Always the same worker, whatever the cost weight: one end of every router's cost range."""

    def __init__(self, worker: str):
        self.worker = worker
        self.name = f"single:{worker}"

    def fit(self, data: RoutingData) -> "SingleWorker":
        self._index(data)
        return self

    def _index(self, data: RoutingData) -> int:
        if self.worker not in data.workers:
            raise KeyError(f"SingleWorker: {self.worker!r} is not one of the table's workers {data.workers}")
        return data.workers.index(self.worker)

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        quality = np.zeros((len(data), len(data.workers)))
        quality[:, self._index(data)] = 1.0
        return quality

    def decide(self, quality: np.ndarray, costs: np.ndarray, knob: float) -> tuple[np.ndarray, np.ndarray]:
        # The knob is ignored on purpose: a single-worker baseline never trades quality for cost.
        choice = np.argmax(quality, axis=1)
        return choice, costs[np.arange(len(choice)), choice]


class RandomRouter(Router):
    """Uniform random quality per (query, worker).

    Under the cost-weight sweep this gives a random mix that drifts toward cheap workers as λ grows;
    for APGR the difference of two random scores is RouteLLM's random router (Table 3, APGR ≈ 0.5).
    Seeded by (seed, query id) so a query gets the same draw whichever fold or batch it is in.
    """

    name = "random"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def fit(self, data: RoutingData) -> "RandomRouter":
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        w = len(data.workers)
        return np.stack([self._draw(qid, w) for qid in data.query_ids]) if len(data) else np.zeros((0, w))

    def _draw(self, query_id: str, w: int) -> np.ndarray:
        digest = int.from_bytes(hashlib.sha256(query_id.encode()).digest()[:8], "little")
        return np.random.default_rng([self.seed, digest]).random(w)


class Oracle(Router):
    """Sees the logged outcome: quality = observed score, minus a vanishing multiple of the cost so
    that, among equally good workers, the cheaper ranks higher. λ = 0 then picks the cheapest correct
    worker (the upper bound of any router), and its strong-minus-weak score orders 'only the strong
    one is right' first and 'only the weak one is right' last, as RouteLLM's optimal curve does."""

    name = "oracle"
    tie_break = 1e-6  # far below any score difference, so it only ever orders ties

    def fit(self, data: RoutingData) -> "Oracle":
        return self

    def predict_quality(self, data: RoutingData) -> np.ndarray:
        costs = np.asarray(data.costs, dtype=float)
        scale = costs.max() if costs.size and costs.max() > 0 else 1.0
        return np.asarray(data.scores, dtype=float) - self.tie_break * costs / scale
