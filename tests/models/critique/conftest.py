"""A tiny synthetic logged-outcome environment: two agents, strong (index 0) right on 90% of queries,
weak right on 60%, and a draft feature that says whether the draft is right (so verification is
learnable), with a little noise. The strong agent's cost varies by query (0.01–0.03 USD)."""

from __future__ import annotations

import numpy as np
import pytest

from models.critique.env import LoggedOutcomeEnv


def synthetic_env(n: int = 200, seed: int = 0, horizon: int = 3) -> LoggedOutcomeEnv:
    rng = np.random.default_rng(seed)
    correct = np.stack([rng.random(n) < 0.9, rng.random(n) < 0.6], axis=1).astype(float)
    strong_cost = 0.01 + 0.02 * rng.random(n)  # USD; the question's features tell it (as its length would)
    query_x = np.concatenate([rng.normal(size=(n, 3)), (strong_cost[:, None] - 0.02) / 0.006], axis=1).astype(np.float32)
    draft_x = np.concatenate([2 * correct[:, :, None] - 1 + 0.3 * rng.normal(size=(n, 2, 1)),
                              rng.normal(size=(n, 2, 2))], axis=2).astype(np.float32)
    costs = np.stack([strong_cost, np.full(n, 0.001)], axis=1)
    return LoggedOutcomeEnv(["strong", "weak"], correct, costs, query_x, draft_x, horizon)


@pytest.fixture
def env() -> LoggedOutcomeEnv:
    return synthetic_env()
