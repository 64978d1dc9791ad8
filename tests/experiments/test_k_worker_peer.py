"""experiments/k_worker_peer.py: the peer's decisions are read by k_worker_routing's own read-out (checked
against read-outs computed by hand on a tiny synthetic table), the ratios to our counterparts, and, where
the peer's venv exists (experiments/peer_env.sh; CI has none), one real llmrouter-lib fit end to end."""

from __future__ import annotations


import numpy as np
import pytest

from models.base import RoutingData

def table(n: int, seed: int) -> RoutingData:
    """Three workers at $1 / $2 / $10 a query: cheap is right on 50 % of queries, mid on 60 %, dear on
    80 % (the best single); 8-d vectors that carry which worker is right, for the peer's fit."""
    rng = np.random.default_rng(seed)
    scores = (rng.random((n, 3)) < [0.5, 0.6, 0.8]).astype(float)
    costs = np.tile([1.0, 2.0, 10.0], (n, 1))
    vectors = np.hstack([3 * scores, 0.3 * rng.normal(size=(n, 5))]).astype(np.float32)
    return RoutingData(query_ids=[f"q{i}" for i in range(n)], queries=[f"query {i}" for i in range(n)],
                       workers=["cheap", "mid", "dear"], scores=scores, costs=costs, embeddings=vectors)


def points(test: RoutingData) -> np.ndarray:
    """Four operating points: all cheap, all mid, cheapest-correct (the oracle), all dear."""
    right = test.scores > 0.5
    oracle = np.where(right.any(axis=1), right.argmax(axis=1), 0)
    return np.stack([np.zeros(len(test), int), np.ones(len(test), int), oracle, np.full(len(test), 2)])


def by_hand(choices: np.ndarray, data: RoutingData, budget: float) -> float | None:
    rows = np.arange(len(data))
    acc = np.array([data.scores[rows, c].mean() for c in choices])
    usd = np.array([data.costs[rows, c].mean() for c in choices])
    ok = usd <= budget * data.costs[:, 2].mean()
    return float(acc[ok].max()) if ok.any() else None


def test_decisions_survive_the_quality_encoding_at_every_operating_point(bench):
    test = table(50, 0)
    router = bench.PeerDecisions(3)
    choices = points(test)
    quality = router.encode(choices)
    assert bench.grid_covers_every_point(router, quality, test.costs)
    for m, expected in enumerate(choices):
        got, paid = router.decide(quality, test.costs, m + 0.37)
        np.testing.assert_array_equal(got, expected)
        np.testing.assert_array_equal(paid, test.costs[np.arange(len(test)), expected])


def test_the_read_out_matches_one_computed_by_hand(bench):
    val, test = table(200, 1), table(240, 2)
    choices = np.hstack([points(val), points(test)])
    best, ref_val, ref_test = bench.reference(val, test)
    assert test.workers[best] == "dear"
    row = bench.peer_readout(choices, val, test, best, ref_val, ref_test)
    test_choices = choices[:, len(val):]
    for fraction, key in ((0.15, "acc_at_15"), (0.5, "acc_at_50"), (10.0, "best_accuracy")):
        assert row[key] == pytest.approx(by_hand(test_choices, test, fraction))
    # The oracle costs ≤ $2 < 50 % of $10 and beats the dear worker: its gap's interval lies above 0.
    assert row["acc_at_50"] > test.scores[:, 2].mean() and row["gap_at_50_lo"] > 0
    # Only "all cheap" ($1) fits 15 %: that is both the curve's and the val-chosen read-out.
    assert row["acc_at_15"] == row["val_chosen_acc_at_15"] == pytest.approx(test.scores[:, 0].mean())


def test_ratios_are_peer_over_our_counterpart_and_none_where_either_is_missing(bench):
    peer = {"knn": {"acc_at_15": 0.5, "acc_at_50": None, "best_accuracy": 0.6}}
    ours = {"knn": {"acc_at_15": 0.625, "acc_at_50": 0.6, "best_accuracy": 0.6}}
    got = bench.side_by_side(peer, ours)["knn"]
    assert got == {"counterpart": "knn", "acc_at_15": pytest.approx(0.8), "acc_at_50": None, "best_accuracy": 1.0}


@pytest.mark.slow
def test_the_peer_side_fits_llmrouter_lib_and_follows_its_label(bench, tmp_path):
    if not bench.DEFAULT_PEER_PYTHON.is_file():
        pytest.skip(f"no peer venv at {bench.DEFAULT_PEER_PYTHON} (experiments/peer_env.sh makes it; CI has none)")
    train, val, test = table(60, 3), table(20, 4), table(20, 5)
    inputs, out = tmp_path / "inputs.npz", tmp_path / "decisions.npz"
    bench.export_inputs(inputs, train, val, test, [0.01, 100.0])
    bench.run_peer_side(bench.DEFAULT_PEER_PYTHON, inputs, out, ["knn"], [0], tmp_path / "peer.log")
    choices = np.load(out)["knn/s0"]
    assert choices.shape == (2, len(val) + len(test))
    # λ = 100 (in dearest-worker cost units) outweighs any score: every label, so every decision, is "cheap".
    assert (choices[1] == 0).all()
    # λ = 0.01: the cheapest correct worker is the label; the vectors carry the scores, so kNN finds it.
    scored = np.vstack([val.scores, test.scores])
    right = scored > 0.5
    label = np.where(right.any(axis=1), right.argmax(axis=1), 0)
    assert (choices[0] == label).mean() > 0.9
