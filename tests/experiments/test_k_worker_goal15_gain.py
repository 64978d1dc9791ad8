"""experiments/k_worker_goal15_gain.py: the gain over the cheap worker, its standard error, and val's choice."""

from __future__ import annotations

import numpy as np
import pytest


def _table(n: int = 80, seed: int = 0):
    from models.base import RoutingData

    rng = np.random.default_rng(seed)
    workers = ["w-a", "gemma-2-9b-it", "w-b"]
    topics = rng.integers(0, 2, size=n)
    # w-b is right exactly on topic 1, gemma on topic 0: a gain that the query's words predict.
    scores = np.stack([rng.random(n) > 0.5, topics == 0, topics == 1], axis=1).astype(float)
    queries = [f"{'alpha' if t == 0 else 'omega'} question number {i}" for i, t in enumerate(topics)]
    emb = rng.normal(size=(n, 8)) + 3 * topics[:, None]
    return RoutingData(query_ids=[f"q{i}" for i in range(n)], queries=queries, workers=workers, scores=scores,
                       costs=np.tile([2.0, 1.0, 2.0], (n, 1)), embeddings=emb)


def test_gain_is_the_up_minus_down_probability_over_the_classes_seen(bench):
    proba = np.array([[0.2, 0.5, 0.3], [0.6, 0.4, 0.0]])
    np.testing.assert_allclose(bench.gain_from_proba(proba, [-1, 0, 1]), [0.1, -0.6])
    np.testing.assert_allclose(bench.gain_from_proba(proba[:, 1:], [0, 1]), [0.3, 0.0])  # never worse on train
    np.testing.assert_allclose(bench.gain_from_proba(proba[:, :2], [-1, 0]), [-0.2, -0.6])  # never better


def test_outcome_difference_and_with_gain_leave_the_cheap_worker_alone(bench):
    scores = np.array([[1.0, 0.0, 0.6], [0.0, 1.0, 0.4]])
    d = bench.outcome_difference(scores, cheap=1)
    np.testing.assert_array_equal(d, [[1, 0, 1], [-1, 0, -1]])
    q = np.array([[0.2, 0.5, 0.9]])
    np.testing.assert_allclose(bench.with_gain(q, np.array([[0.1, 0.7, -0.2]]), cheap=1), [[0.6, 0.5, 0.3]])


def test_knn_gain_se_is_the_neighbours_standard_error(bench):
    scores = np.array([[1, 0], [0, 0], [1, 1], [0, 1]], dtype=float)  # worker 1 is the cheap one
    se = bench.knn_gain_se(np.array([[0, 1, 2, 3]]), scores, cheap=1)
    d0 = np.array([1, 0, 0, -1], dtype=float)
    np.testing.assert_allclose(se, [[d0.std(ddof=1) / 2, 0.0]])


def test_val_choice_never_picks_the_reference_and_breaks_ties_at_50(bench):
    rows = {bench.REFERENCE: {"val_acc_at_15": 0.9, "val_acc_at_50": 0.9},
            "a": {"val_acc_at_15": 0.6, "val_acc_at_50": 0.70}, "b": {"val_acc_at_15": 0.6, "val_acc_at_50": 0.71},
            "c": {"val_acc_at_15": 0.5, "val_acc_at_50": 0.99}}
    assert bench.val_choice(rows) == "b"


def test_every_candidate_is_a_quality_matrix_and_the_gain_model_learns_the_gain(bench):
    data = _table()
    train, held = data.subset(np.arange(60)), data.subset(np.arange(60, 80))
    fitted = bench.Fitted(train, seed=0)
    for name, predict in bench.candidates().items():
        q = predict(fitted, held)
        assert q.shape == (20, 3) and np.isfinite(q).all(), name
    gain = fitted.multinomial_gain(held, C=1.0)
    topic1 = np.array(["omega" in t for t in held.queries])
    assert gain[:, 1].tolist() == [0.0] * 20  # the cheap worker's gain over itself
    assert gain[topic1, 2].mean() > 0 > gain[~topic1, 2].mean()  # w-b gains exactly where gemma fails


def test_fitted_refuses_a_pool_without_the_cheap_worker(bench):
    data = _table()
    data.workers[1] = "another-model"
    with pytest.raises(ValueError):
        bench.Fitted(data, seed=0)


def test_disagreement_auc_reads_only_the_queries_where_the_two_disagree(bench):
    d = np.array([1, -1, 0, 0, 1, -1])
    score = np.array([0.9, 0.1, 5.0, -5.0, 0.8, 0.2])  # the ties' extreme scores must not count
    assert bench.disagreement_auc(score, d) == 1.0
    assert bench.disagreement_auc(-score, d) == 0.0
    assert bench.disagreement_auc(score, np.array([1, 1, 0, 0, 1, 1])) is None  # one side only: undefined


def test_shares_at_budget_add_up_and_respect_the_budget(bench):
    from models.registry import make_router

    data = _table()
    q = np.asarray(data.scores, dtype=float) * 0.8 + 0.1  # a sharp, right estimate
    shares = bench.shares_at_budget(make_router("knn"), q, data, best=0, fraction=0.75)
    assert abs(sum(r["share"] for r in shares.values()) - 1) < 1e-9
    # costs 2 / 1 / 2 against the budget 0.75 × 2 = 1.5: at most half the queries leave gemma
    assert shares["gemma-2-9b-it"]["share"] >= 0.5
    assert all(0 <= r["accuracy"] <= 1 for r in shares.values())
