"""experiments/k_worker_goal15_val.py: a training query's neighbour rates never read its own outcome."""

from __future__ import annotations

import numpy as np

from evaluation import kworker_readout


def _table(n: int = 60, w: int = 3, seed: int = 0):
    from models.base import RoutingData

    rng = np.random.default_rng(seed)
    return RoutingData(query_ids=[f"q{i}" for i in range(n)], queries=[f"query {i}" for i in range(n)],
                       workers=[f"w{j}" for j in range(w)], scores=(rng.random((n, w)) > 0.5).astype(float),
                       costs=np.ones((n, w)), embeddings=rng.normal(size=(n, 8)))


def test_loo_rates_are_the_router_refitted_without_the_query(bench):
    from models.baselines.knn import KNNRouter

    data = _table()
    router = KNNRouter(k=5).fit(data)
    rates = kworker_readout.loo_rates(router)
    for i in (0, 17, 59):
        rest = data.subset(np.setdiff1d(np.arange(len(data)), [i]))
        alone = KNNRouter(k=5).fit(rest).predict_quality(data.subset([i]))[0]
        np.testing.assert_allclose(rates[i], alone)


def test_rate_block_is_standardised_and_scaled(bench):
    rates = np.random.default_rng(1).random((40, 6))
    logit = kworker_readout.clipped_logit(rates)
    block = bench.rate_block(rates, logit.mean(axis=0), logit.std(axis=0), weight=3.0).toarray()
    assert block.shape == (40, 6)
    np.testing.assert_allclose(np.sqrt((block**2).sum(axis=1)).mean(), 3.0, rtol=0.2)  # mean row norm ≈ weight
    assert np.isfinite(kworker_readout.clipped_logit(np.array([0.0, 1.0]))).all()  # 0 / 1 rates are clipped, not ±inf


def test_calibration_maps_are_per_worker_probabilities_and_bad_methods_fail(bench):
    import pytest

    rng = np.random.default_rng(2)
    oof = rng.random((200, 2))
    scores = (rng.random((200, 2)) < oof ** 2).astype(float)  # true P(correct) = q², not q
    grid = np.tile(np.linspace(0.05, 0.95, 10)[:, None], (1, 2))
    for method in ("isotonic", "platt"):
        mapped = bench.calibrated(oof, scores, grid, method)
        assert mapped.shape == grid.shape and ((mapped >= 0) & (mapped <= 1)).all()
        assert (np.diff(mapped, axis=0) >= -1e-12).all()  # monotone in the predicted quality
        assert mapped[0].max() < grid[0, 0] + 0.1 and mapped[-1].min() > 0.6  # pulled towards q²
    with pytest.raises(ValueError, match="unknown calibration"):
        bench.calibrated(oof, scores, grid, "beta")


def test_val_markdown_lists_every_candidate_and_the_test_read_out_only_after_test(bench):
    rows = {"lexical_ensemble (reference)": {"val_acc_at_15": 0.62, "val_acc_at_50": 0.679, "val_best_accuracy": 0.69},
            "candidate": {"val_acc_at_15": 0.625, "val_acc_at_50": 0.67, "val_best_accuracy": 0.68}}
    text = kworker_readout.val_markdown({"rows": rows, "test": None}, "nemotron", 0.635)
    assert text.startswith("val's best single model: nemotron 0.635") and "| candidate | 0.625 | 0.670 | 0.680 |" in text
    assert "**test**" not in text
    read = {"acc_at_15": 0.61, "acc_at_50": 0.64, "val_chosen_acc_at_15": 0.6, "gap_at_15_lo": -0.02,
            "gap_at_15_hi": 0.02, "cost_ratio_to_match_best": 0.148}
    test = {"val_chosen": "candidate", "best_single": {"worker": "nemotron", "accuracy": 0.61},
            "candidate": read, "lexical_ensemble (reference)": {**read, "cost_ratio_to_match_best": None}}
    text = kworker_readout.val_markdown({"rows": rows, "test": test}, "nemotron", 0.635)
    assert "| candidate | 0.610 | 0.640 | 0.600 | [-0.020, +0.020] | 14.8 % |" in text
    assert "| lexical_ensemble (reference) | 0.610 | 0.640 | 0.600 | [-0.020, +0.020] | — |" in text
