"""Metrics on hand-computed fixtures (the arithmetic is in the comments) and on synthetic tables."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from routerops import metrics

# ---------------------------------------------------------------- switches and summaries


def test_count_switches_counts_worker_changes_in_turn_order():
    turns = pd.DataFrame({
        "episode_id": ["e1"] * 4 + ["e2"] * 2 + ["e3"],
        "turn_index": [3, 0, 2, 1, 0, 1, 0],
        # e1 in turn order: a, a, b, a -> 2 switches; e2: c, c -> 0; e3: one turn -> 0
        "worker": ["a", "a", "b", "a", "c", "c", "a"],
    })
    assert metrics.count_switches(turns).to_dict() == {"e1": 2, "e2": 0, "e3": 0}


def test_summarise_policies_means_and_totals():
    table = pd.DataFrame({
        "policy": ["p", "p", "p", "q"], "split": "test", "correct": [1.0, 0.0, 1.0, 1.0],
        "score": [1.0, 0.5, 1.0, 1.0], "cost_usd": [0.1, 0.2, 0.3, 1.0], "tokens": [10.0, 20, 30, 40],
        "turns": [1.0, 2, 3, 1], "switches": [0.0, 1, 2, 0], "latency_s": [0.5, 0.5, 0.5, 2.0],
    })
    summary = metrics.summarise_policies(table, n_boot=200).set_index("policy")
    p = summary.loc["p"]
    assert p["n"] == 3 and p["accuracy"] == pytest.approx(2 / 3)
    assert p["usd_per_query"] == pytest.approx(0.2) and p["usd_total"] == pytest.approx(0.6)
    assert (p["tokens_per_query"], p["turns_per_query"], p["switches_per_query"]) == (20, 2, 1)
    assert p["accuracy_lo"] <= p["accuracy"] <= p["accuracy_hi"]
    assert np.isnan(summary.loc["q", "accuracy_lo"])  # one query: no interval


def test_split_breakdown_separates_id_and_ood():
    table = pd.DataFrame({
        "policy": ["p"] * 4, "split": ["test", "test", "ood", "ood"], "correct": [1.0, 1.0, 0.0, 1.0],
        "score": 1.0, "cost_usd": 0.1, "tokens": 1.0, "turns": 1.0, "switches": 0.0, "latency_s": 0.0,
    })
    out = metrics.split_breakdown(table, by="split", n_boot=100).set_index("split")
    assert out.loc["test", "accuracy"] == 1.0 and out.loc["ood", "accuracy"] == 0.5
    assert list(out["policy"]) == ["p", "p"]


# ---------------------------------------------------------------- Pareto frontier


@pytest.mark.parametrize("costs, scores, expected", [
    # (1, .5) and (2, .7) trade off; (3, .6) is beaten by (2, .7); (4, .9) is the most accurate
    ([3, 1, 2, 4], [0.6, 0.5, 0.7, 0.9], [1, 2, 3]),
    # equal cost: the lower score is dominated; equal score: the dearer is dominated
    ([1, 1, 2], [0.5, 0.4, 0.5], [0]),
    # identical points dominate neither each other: both stay
    ([1, 1], [0.5, 0.5], [0, 1]),
    ([5], [0.1], [0]),
    # a free, perfect point dominates everything
    ([0, 1, 2], [1.0, 0.5, 0.9], [0]),
])
def test_pareto_frontier(costs, scores, expected):
    assert metrics.pareto_frontier(costs, scores).tolist() == expected


# ---------------------------------------------------------------- AIQ


def test_non_decreasing_hull_drops_points_under_the_chord_and_after_the_peak():
    # (2, .55) lies under the chord from (1, .5) to (3, .8) (which is .65 at cost 2);
    # (4, .7) comes after the peak (quality falls): both are dropped.
    hull = metrics.non_decreasing_hull([4, 2, 1, 3], [0.7, 0.55, 0.5, 0.8])
    assert hull.tolist() == [[1, 0.5], [3, 0.8]]


def test_aiq_hand_computed():
    # Same points, cost range [0, 5]: x = c / 5, hull vertices at x = .2 (q .5) and x = .6 (q .8),
    # flat at .8 to x = 1, zero before x = .2.
    # area = 0 + .4 * (.5 + .8) / 2 + .4 * .8 = .26 + .32 = .58
    assert metrics.aiq([4, 2, 1, 3], [0.7, 0.55, 0.5, 0.8], 0, 5) == pytest.approx(0.58)


def test_aiq_single_point_and_range_offset():
    # one point (2, .6) on [0, 4]: zero on [0, .5], .6 on [.5, 1] -> .3
    assert metrics.aiq([2], [0.6], 0, 4) == pytest.approx(0.3)
    # range [1, 3]: x = (2 - 1) / 2 = .5 -> the same .3
    assert metrics.aiq([2], [0.6], 1, 3) == pytest.approx(0.3)
    # a point at c_min with quality q gives AIQ = q
    assert metrics.aiq([1, 3], [0.4, 0.4], 1, 3) == pytest.approx(0.4)


def test_aiq_interpolates_linearly_between_operating_points():
    # (0, .2) and (1, 1): mixing them reaches the chord, area = (.2 + 1) / 2 = .6
    assert metrics.aiq([0, 1], [0.2, 1.0], 0, 1) == pytest.approx(0.6)
    # adding a point under the chord changes nothing; one above it raises the area
    assert metrics.aiq([0, 0.5, 1], [0.2, 0.5, 1.0], 0, 1) == pytest.approx(0.6)
    # (0, .2), (.5, .9), (1, 1): .5 * (.2 + .9) / 2 + .5 * (.9 + 1) / 2 = .275 + .475 = .75
    assert metrics.aiq([0, 0.5, 1], [0.2, 0.9, 1.0], 0, 1) == pytest.approx(0.75)


def test_aiq_rejects_costs_outside_the_range():
    with pytest.raises(ValueError):
        metrics.aiq([2], [0.5], 0, 1)


# ---------------------------------------------------------------- RouteLLM APGR / CPT

# Ten queries with router scores 0.0, 0.1, ..., 0.9; the weak model gets the five lowest-scored right,
# the strong model gets all right. Decile edges of the scores are 0, .09, .18, ..., .81, .9, so the
# sweep sends the top k queries to the strong model for k = 10, 9, ..., 1 and then 0 (last edge uses >).
# Accuracy with the top k strong: (k + min(5, 10 - k)) / 10 ->
#   k=0: .5, 1: .6, 2: .7, 3: .8, 4: .9, 5..10: 1.0
SCORES = np.arange(10) / 10
WEAK = np.array([1, 1, 1, 1, 1, 0, 0, 0, 0, 0])
STRONG = np.ones(10)


def test_routellm_curve_hand_computed():
    curve = metrics.routellm_curve(SCORES, STRONG, WEAK)
    assert curve["strong_percentage"].tolist() == pytest.approx([0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100])
    assert curve["accuracy"].tolist() == pytest.approx([0.5, 0.6, 0.7, 0.8, 0.9] + [1.0] * 6)


def test_apgr_hand_computed():
    # AUC over x = share/100 with steps of .1:
    # .1 * [(.5+.6)/2 + (.6+.7)/2 + (.7+.8)/2 + (.8+.9)/2 + (.9+1)/2 + 5 * 1] = .1 * 8.75 = .875
    # weak AUC = .5 * 1, strong AUC = 1 * 1 -> APGR = (.875 - .5) / (1 - .5) = .75
    assert metrics.routellm_auc(metrics.routellm_curve(SCORES, STRONG, WEAK)) == pytest.approx(0.875)
    assert metrics.apgr(SCORES, STRONG, WEAK) == pytest.approx(0.75)


def test_cpt_hand_computed():
    # CPT(50%): target .5 + .5 * (1 - .5) = .75, between .7 (20%) and .8 (30%) -> 25%
    # CPT(80%): target .9, reached at 40%
    assert metrics.cpt(SCORES, STRONG, WEAK, pgr=0.5) == pytest.approx(25.0)
    assert metrics.cpt(SCORES, STRONG, WEAK, pgr=0.8) == pytest.approx(40.0)


def test_apgr_of_a_random_router_is_about_half():
    rng = np.random.default_rng(0)
    n = 5000
    strong = rng.random(n) < 0.8
    weak = rng.random(n) < 0.4
    values = [metrics.apgr(rng.random(n), strong, weak) for _ in range(5)]
    assert np.mean(values) == pytest.approx(0.5, abs=0.03)


def test_apgr_of_an_oracle_router_beats_random():
    rng = np.random.default_rng(1)
    n = 2000
    strong, weak = rng.random(n) < 0.8, rng.random(n) < 0.4
    oracle_scores = strong.astype(float) - weak.astype(float) + rng.random(n) * 1e-3  # strong-only wins first
    assert metrics.apgr(oracle_scores, strong, weak) > 0.9


# ---------------------------------------------------------------- LLMRouterBench


def test_gain_and_cost_saved_against_best_single():
    # workers: (cost 1, acc .6) and (cost 4, acc .8) -> best single is index 1 (cost 4, acc .8)
    assert metrics.best_single([1, 4, 5], [0.6, 0.8, 0.8]) == 1  # tie at .8 goes to the cheaper
    router_costs, router_scores = [1.5, 2.0, 3.0, 6.0], [0.7, 0.8, 0.82, 0.85]
    gain = metrics.gain_over_best_single(router_costs, router_scores, best_cost=4, best_score=0.8)
    assert gain["any_cost"] == pytest.approx(0.05)  # .85 - .8
    assert gain["matched_cost"] == pytest.approx(0.02)  # best with cost <= 4 is .82
    # cheapest router point reaching .8 costs 2 -> saves 1 - 2/4 = 50%
    assert metrics.cost_saved_at_matched_accuracy(router_costs, router_scores, 4, 0.8) == pytest.approx(0.5)
    assert np.isnan(metrics.cost_saved_at_matched_accuracy([1.0], [0.5], 4, 0.8))


def test_pareto_distance_hand_computed():
    # all points: (0, .5), (10, .9), (6, .5); (6, .5) is dominated by (0, .5); cost scaled by 10.
    # (6, .5) -> x .6: to (0, .5): .6; to (1, .9): hypot(.4, .4) = .5657 -> .5657
    all_c, all_s = [0, 10, 6], [0.5, 0.9, 0.5]
    d = metrics.pareto_distance(all_c, all_s, all_c, all_s)
    assert d == pytest.approx([0, 0, np.hypot(0.4, 0.4)])


# ---------------------------------------------------------------- bootstrap


def test_bootstrap_ci_covers_the_true_accuracy_in_at_least_90_of_100_seeds():
    true_acc, n = 0.7, 200
    covered = 0
    for seed in range(100):
        correct = np.random.default_rng(seed).random(n) < true_acc
        _, lo, hi = metrics.bootstrap_ci(correct, np.mean, n_boot=1000, seed=seed)
        covered += lo <= true_acc <= hi
    assert covered >= 90


def test_bootstrap_ci_of_several_paired_arrays():
    rng = np.random.default_rng(3)
    correct, cost = rng.random(300) < 0.5, rng.random(300) + 0.5

    def accuracy_per_dollar(c, u, axis=-1):
        return c.mean(axis=axis) / u.mean(axis=axis)

    est, lo, hi = metrics.bootstrap_ci((correct, cost), accuracy_per_dollar, n_boot=500, seed=0)
    assert est == pytest.approx(correct.mean() / cost.mean())
    assert lo < est < hi


def test_paired_bootstrap_diff_sees_a_small_consistent_gain():
    # b is a with 5% of its wrong answers fixed: a small gain on the same queries
    rng = np.random.default_rng(7)
    a = (rng.random(1000) < 0.6).astype(float)
    b = a.copy()
    fix = np.flatnonzero(a == 0)[:20]
    b[fix] = 1.0
    diff, lo, hi = metrics.paired_bootstrap_diff(b, a, n_boot=1000, seed=0)
    assert diff == pytest.approx(0.02)
    assert 0 < lo <= diff <= hi  # paired: the gain is significant
    # the unpaired intervals of the two means overlap heavily
    _, a_lo, a_hi = metrics.bootstrap_ci(a, seed=0)
    _, b_lo, b_hi = metrics.bootstrap_ci(b, seed=0)
    assert b_lo < a_hi
    same = metrics.paired_bootstrap_diff(a, a, n_boot=200)
    assert same == (0.0, 0.0, 0.0)


def test_paired_bootstrap_diff_needs_equal_lengths():
    with pytest.raises(ValueError):
        metrics.paired_bootstrap_diff([1, 0, 1], [1, 0])


@pytest.mark.parametrize("n", [11, 21, 60, 101, 250])
def test_apgr_of_resamples_equals_apgr_on_each_resample(n):
    """The counts-based APGR (bootstrap of the replay leaderboard) is RouteLLM's APGR of the resampled
    queries, to the last bit of the deciles: ties and (n − 1)·q landing on an integer included."""
    rng = np.random.default_rng(n)
    for trial in range(40):
        score = rng.normal(size=n) if trial % 2 else rng.integers(0, 4, n) / 3.0
        strong = (rng.random(n) < 0.8).astype(float)
        weak = (rng.random(n) < 0.5).astype(float)
        idx = rng.integers(0, n, n)
        got = metrics.apgr_of_resamples(score, strong, weak, np.bincount(idx, minlength=n)[None, :])[0]
        defined = np.unique(score[idx]).size > 1 and strong[idx].mean() != weak[idx].mean()
        if not defined:
            assert np.isnan(got)
        else:
            assert got == pytest.approx(metrics.apgr(score[idx], strong[idx], weak[idx]), abs=1e-12)


@pytest.mark.parametrize("n", [7, 60, 1001])
def test_apgr_of_resamples_in_blocks_is_bit_identical_to_one_resample_at_a_time(n):
    """The block-wise running sums (the replay bootstrap's speed-up) change no bit of any resample's
    APGR: compared with the one-resample reference, ties, constant resamples and a block boundary
    (more resamples than RESAMPLE_BLOCK) included."""
    from evaluation.replay import resample_counts

    rng = np.random.default_rng(n)
    for score in (rng.normal(size=n), rng.integers(0, 3, n) / 2.0, np.full(n, 0.5)):
        strong = (rng.random(n) < 0.8).astype(float)
        weak = (rng.random(n) < 0.5).astype(float)
        counts = resample_counts(n, metrics.RESAMPLE_BLOCK + 9, seed=n)
        got = metrics.apgr_of_resamples(score, strong, weak, counts)
        order = np.argsort(score, kind="stable")
        quantiles = metrics._qcut_fractions(10)
        expected = [metrics._apgr_of_counts(score[order], strong[order], weak[order], c[order].astype(float),
                                            float(c.sum()), quantiles) for c in counts]
        np.testing.assert_array_equal(got, np.array(expected))
