"""experiments/k_worker_crossfit.py: an ensemble is its members' out-of-fold mean; read-outs on the whole table."""

from __future__ import annotations

import numpy as np


def _table(n: int = 80, seed: int = 0):
    from models.base import RoutingData

    rng = np.random.default_rng(seed)
    puzzle = rng.random(n) < 0.75  # so w0 where it is right and w2 elsewhere costs under half of w2 alone
    queries = [f"Solve this logic puzzle about houses, case {i}" if puzzle[i] else f"Write a python function, case {i}"
               for i in range(n)]
    scores = np.stack([puzzle, np.zeros(n), np.ones(n)], axis=1).astype(float)  # w0 right on puzzles, w2 always
    return RoutingData(query_ids=[f"q{i}" for i in range(n)], queries=queries, workers=["w0", "w1", "w2"],
                       scores=scores, costs=np.tile([0.1, 0.2, 1.0], (n, 1)),
                       embeddings=rng.normal(size=(n, 8)).astype(np.float32))


def test_an_ensemble_is_its_members_out_of_fold_mean(bench):
    from evaluation.replay import cross_fit
    from models.registry import ENSEMBLES, make_router

    data = _table()
    quality = bench.out_of_fold(["knn", "lexical_ensemble"], data, seed=1)
    members = [cross_fit(data, lambda s, _n=m: make_router(_n, s), k=5, seed=1) for m in ENSEMBLES["lexical_ensemble"]]
    np.testing.assert_allclose(quality["lexical_ensemble"], np.mean(members, axis=0))
    np.testing.assert_allclose(quality["knn"], members[0])


def test_read_outs_on_the_whole_table(bench):
    data = _table()
    perfect = data.scores.copy()  # knows who is right: w0 on puzzles, else w2
    row, ops = bench.read("knn", perfect, data, best=2)
    assert row["acc_at_50"] == 1.0 and row["cost_ratio_to_match_best"] < 0.6  # w2 only where w0 fails
    assert row["gap_at_50_lo"] <= 0 <= row["gap_at_50_hi"]  # as accurate as w2: the gap interval holds 0
    same = bench.difference(ops, ops, data, best=2)
    assert same["difference_at_50"] == 0 and (same["difference_at_50_lo"], same["difference_at_50_hi"]) == (0.0, 0.0)
    text = bench.markdown({"best_single": {"worker": "w2", "accuracy": 1.0}, "n": len(data), "seeds": [0],
                           "rows": {"knn": row}, "paired_differences": [{"first": "knn", "second": "knn", **same}],
                           "protocol": "test"})
    assert "| knn | " in text and "| knn − knn | +0.000 [+0.000, +0.000]" in text
