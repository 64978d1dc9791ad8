"""experiments/ope_simulation.py's simulation on a small synthetic table (the committed run uses RouteLLM's
GSM8K table): the policies, the truth on the logged queries and the per-estimator summary."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

def test_simulated_logs_give_every_estimate_its_truth_and_the_summary_its_coverage(bench):
    rng = np.random.default_rng(0)
    n = 300
    p_strong = rng.uniform(0.3, 1.0, n)
    scores = np.stack([rng.random(n) < p_strong - 0.25, rng.random(n) < p_strong], axis=1).astype(float)
    data = SimpleNamespace(scores=scores, costs=np.tile([1e-4, 1e-3], (n, 1)), workers=["weak", "strong"])
    quality = np.stack([p_strong - 0.25, p_strong], axis=1) + 0.05 * rng.standard_normal((n, 2))
    qualities = {"logistic": quality, "knn": quality[:, ::-1], "mf": quality + 0.1}
    mean_cost = data.costs.mean(axis=0)
    lam = bench.half_strong_lambda(quality, mean_cost)
    pols = bench.policies(data, qualities, lam, mean_cost)
    assert abs(pols["champion (greedy)"][0][:, 1].mean() - 0.5) < 0.05  # λ: GPT-4-like worker on half
    records = bench.simulate(data, pols, quality, lam, 0.2, n_logs=3, n_boot=100, seed=0)
    assert len(records) == 3 * len(pols) * 4 * 3  # logs × policies × estimators × metrics
    single = [r for r in records if r["policy"] == "single:strong" and r["metric"] == "usd"]
    assert all(r["truth"] == pytest.approx(1e-3) for r in single)
    summary = bench.summarise(records)
    assert {s["estimator"] for s in summary} == {"ips", "snips", "dr", "dr_fitted"}
    assert all(0 <= s["coverage"] <= 1 and s["rmse"] >= 0 and s["logs"] == 3 for s in summary)


def test_k_worker_lambda_sends_half_the_queries_past_the_cheapest_worker(bench):
    """The demo grid has K = 4 workers: λ is found by bisection on the share past the cheapest one."""
    rng = np.random.default_rng(1)
    quality = rng.random((400, 4))
    mean_cost = np.array([1e-5, 4e-4, 2e-4, 1e-3])
    lam = bench.half_strong_lambda(quality, mean_cost)
    share = (bench.greedy(quality, mean_cost, lam) != 0).mean()
    assert abs(share - 0.5) <= 0.01
    assert (bench.greedy(quality, mean_cost, lam * 2) != 0).mean() < share  # dearer λ: fewer escalations
