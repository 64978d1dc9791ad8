"""Off-policy estimators on a log small enough to compute by hand (routerops/ope.py)."""

from __future__ import annotations

import numpy as np
import pytest

from routerops.errors import InputError
from routerops.ope import (BanditLog, NoSupportError, OPEConfig, epsilon_greedy, estimate_policies, one_hot,
                           support_share, wilson_interval)

# Two workers; the logging policy is ε-greedy with ε = 0.5 around worker 0: μ = (0.75, 0.25) on every row.
WORKERS = ["cheap", "strong"]
MU = np.tile([0.75, 0.25], (4, 1))
ACTION = np.array([0, 1, 1, 0])
SCORE = np.array([1.0, 0.0, 1.0, 1.0])
USD = np.array([0.1, 0.3, 0.3, 0.1])
ALWAYS_STRONG, ALWAYS_CHEAP = one_hot(np.ones(4), 2), one_hot(np.zeros(4), 2)


def log() -> BanditLog:
    return BanditLog(WORKERS, ACTION, MU, SCORE, USD)


def config(**kw) -> OPEConfig:
    return OPEConfig(n_boot=200, **kw)


def test_ips_snips_and_dr_match_the_hand_computed_values():
    direct = {"strong": {"accuracy": np.tile([0.9, 0.4], (4, 1))}}
    result = estimate_policies(log(), {"strong": ALWAYS_STRONG, "cheap": ALWAYS_CHEAP}, config(cost_weight=1.0),
                               direct)
    # always-strong: w = (0, 4, 4, 0)
    assert result.value("strong", "ips", "accuracy") == pytest.approx((4 * 0 + 4 * 1) / 4)  # 1.0
    assert result.value("strong", "snips", "accuracy") == pytest.approx(4 / 8)
    assert result.value("strong", "ips", "usd") == pytest.approx((4 * 0.3 + 4 * 0.3) / 4)  # 0.6
    assert result.value("strong", "snips", "usd") == pytest.approx(0.3)  # its true cost per call
    assert result.value("strong", "ips", "objective") == pytest.approx((4 * -0.3 + 4 * 0.7) / 4)  # λ = 1
    # DR (Dudík et al. 2011 eq. 3): 0.4 + w_i (r_i − q̂(a_i)) per row = 0.4, −1.2, 2.8, 0.4
    assert result.value("strong", "dr", "accuracy") == pytest.approx((0.4 - 1.2 + 2.8 + 0.4) / 4)
    # always-cheap: w = (4/3, 0, 0, 4/3)
    assert result.value("cheap", "ips", "accuracy") == pytest.approx(2 / 3)
    assert result.value("cheap", "snips", "accuracy") == pytest.approx(1.0)
    rows = {(r["policy"], r["estimator"], r["metric"]): r for r in result.rows}
    assert ("cheap", "dr", "accuracy") not in rows  # no direct model given for it: no DR
    strong = rows[("strong", "ips", "accuracy")]
    assert strong["ess"] == pytest.approx(8 ** 2 / 32) and strong["support"] == 1.0 and strong["n"] == 4
    assert rows[("cheap", "snips", "accuracy")]["ess"] == pytest.approx(2.0)
    for row in result.rows:
        assert row["ci_low"] <= row["value"] <= row["ci_high"]


def test_wilson_interval_matches_the_textbook_values():
    # 5 of 10 at 95 %: (0.2366, 0.7634); 0 of 10: (0, 0.2775) (Newcombe 1998, Tab. I's method 3).
    assert wilson_interval(0.5, 10, 0.95) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson_interval(0.0, 10, 0.95) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson_interval(0.7, 0.0, 0.95) == (0.0, 1.0)  # no effective sample: no information


def test_snips_accuracy_intervals_are_at_least_wilsons_at_the_effective_sample_size():
    floored = estimate_policies(log(), {"cheap": ALWAYS_CHEAP}, config())
    plain = estimate_policies(log(), {"cheap": ALWAYS_CHEAP}, config(wilson_floor=False))

    def row(result, estimator, metric="accuracy"):
        return next(r for r in result.rows if (r["estimator"], r["metric"]) == (estimator, metric))

    # always-cheap: SNIPS 1.0 from two rows of equal weight (ESS 2); every resample gives 1.0 too
    assert (row(plain, "snips")["ci_low"], row(plain, "snips")["ci_high"]) == (1.0, 1.0)
    low, high = wilson_interval(1.0, 2.0, 0.95)
    assert row(floored, "snips")["ci_low"] == pytest.approx(low) and low < 0.5 and high == 1.0
    assert row(floored, "snips")["ci_method"] == "percentile ∪ wilson(ess)"
    for estimator, metric in (("ips", "accuracy"), ("snips", "usd")):  # other rows keep the percentile interval
        assert row(floored, estimator, metric)["ci_low"] == row(plain, estimator, metric)["ci_low"]
        assert row(floored, estimator, metric)["ci_method"] == "percentile"


def test_clipping_caps_the_weights_and_the_output_says_so():
    result = estimate_policies(log(), {"strong": ALWAYS_STRONG}, config(clip=3.0))
    row = next(r for r in result.rows if r["estimator"] == "ips" and r["metric"] == "accuracy")
    assert row["value"] == pytest.approx(3 / 4) and row["n_clipped"] == 2 and row["clip"] == 3.0
    assert row["max_weight"] == 3.0


def test_a_paired_difference_resamples_both_policies_jointly():
    result = estimate_policies(log(), {"strong": ALWAYS_STRONG, "same": ALWAYS_STRONG.copy()}, config())
    assert result.paired_difference("strong", "same", "snips", "accuracy") == (0.0, 0.0, 0.0)


def test_a_deterministic_log_refuses_a_challenger_and_reports_the_supported_share():
    greedy = np.zeros(4, dtype=int)
    mu = epsilon_greedy(greedy, np.ones((4, 2), bool), 0.0)  # ε = 0: the champion's choice with probability 1
    deterministic = BanditLog(WORKERS, greedy, mu, SCORE, USD)
    challenger = one_hot(np.array([0, 1, 1, 0]), 2)  # differs from the champion on half the traffic
    assert support_share(deterministic, challenger) == pytest.approx(0.5)
    with pytest.raises(NoSupportError, match=r"only 50\.0% of the traffic has support.*ε = 0") as err:
        estimate_policies(deterministic, {"challenger": challenger}, config())
    assert err.value.support == pytest.approx(0.5)
    # The champion itself is fully supported: its on-policy mean.
    same = estimate_policies(deterministic, {"champion": one_hot(greedy, 2)}, config())
    assert same.value("champion", "snips", "accuracy") == pytest.approx(SCORE.mean())


def test_epsilon_greedy_spreads_epsilon_over_the_affordable_workers_only():
    allowed = np.array([[True, True, True], [True, False, True]])
    probs = epsilon_greedy(np.array([2, 0]), allowed, 0.3)
    assert probs == pytest.approx(np.array([[0.1, 0.1, 0.8], [0.85, 0.0, 0.15]]))


def test_estimates_are_unbiased_and_cover_on_a_large_synthetic_log():
    rng = np.random.default_rng(0)
    n, truth = 4000, 0.7
    greedy = np.zeros(n, dtype=int)
    mu = epsilon_greedy(greedy, np.ones((n, 2), bool), 0.2)
    action = (rng.random(n) < mu[:, 1]).astype(int)
    score = np.where(action == 1, rng.random(n) < truth, rng.random(n) < 0.4).astype(float)
    result = estimate_policies(BanditLog(WORKERS, action, mu, score, np.ones(n)),
                               {"strong": one_hot(np.ones(n), 2)}, config())
    for estimator in ("ips", "snips"):
        row = next(r for r in result.rows if r["estimator"] == estimator and r["metric"] == "accuracy")
        assert row["ci_low"] < truth < row["ci_high"] and abs(row["value"] - truth) < 0.08


def test_bad_input_is_an_input_error():
    with pytest.raises(InputError, match="sum to 1"):
        BanditLog(WORKERS, ACTION, np.tile([0.5, 0.2], (4, 1)), SCORE, USD)
    with pytest.raises(InputError, match="propensity 0"):
        BanditLog(WORKERS, ACTION, np.tile([1.0, 0.0], (4, 1)), SCORE, USD)
    with pytest.raises(InputError, match="unknown key"):
        OPEConfig.from_dict({"n_bootstrap": 10})
    with pytest.raises(InputError, match="estimators"):
        OPEConfig(estimators=("magic",))
