"""A synthetic logged-outcome table with learnable structure, for tests and latency benchmarks.

Queries belong to topics and have a difficulty; dearer workers are more skilled, and each worker has
its own strength per topic, so a router that reads the embedding can beat every single worker.
Per-query costs keep the same worker order on every query (cost = worker price × query length), so
single-worker baselines bracket any one-call router's cost.
"""

from __future__ import annotations

import numpy as np

from models.base import RoutingData


def make_synthetic_table(n_queries: int = 300, n_workers: int = 3, dim: int = 32, n_topics: int = 6,
                         seed: int = 0) -> RoutingData:
    rng = np.random.default_rng(seed)
    topic = rng.integers(n_topics, size=n_queries)
    difficulty = rng.random(n_queries)
    centers = rng.normal(size=(n_topics, dim))
    hardness_direction = rng.normal(size=dim)
    emb = centers[topic] + 0.6 * rng.normal(size=(n_queries, dim)) + 1.5 * difficulty[:, None] * hardness_direction
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)

    skill = np.linspace(0.0, 0.5, n_workers)  # worker j is dearer and better on average than j-1
    affinity = rng.normal(scale=0.35, size=(n_workers, n_topics))
    logits = 6.0 * (skill[None, :] + affinity[:, topic].T - difficulty[:, None] + 0.6)
    scores = (rng.random((n_queries, n_workers)) < 1 / (1 + np.exp(-logits))).astype(float)

    n_numbers = 1 + np.round(difficulty * 6).astype(int)  # harder questions mention more quantities
    queries = [
        f"Topic {t}: " + " plus ".join(str(v) for v in rng.integers(2, 99, size=k)) + " is how much?"
        for t, k in zip(topic, n_numbers)
    ]
    length = np.array([len(q) for q in queries], dtype=float)
    price = np.geomspace(1e-4, 2e-2, n_workers)  # USD per 100 characters
    costs = price[None, :] * (length[:, None] / 100.0)
    return RoutingData(
        query_ids=[f"q{i:05d}" for i in range(n_queries)],
        queries=queries,
        workers=[f"w{j}" for j in range(n_workers)],
        scores=scores,
        costs=costs,
        embeddings=emb.astype(np.float32),
        worker_attributes={f"w{j}": {"skill": float(skill[j])} for j in range(n_workers)},
    )
