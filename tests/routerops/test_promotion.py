"""The promotion rule: promote only beyond the paired bootstrap interval."""

from __future__ import annotations

import json

import numpy as np
import pytest

from routerops import metrics
from routerops.promotion import GateConfig, Outcomes, decide_promotion, objective_value

CFG = GateConfig(objective="accuracy_at_budget", n_boot=1000, seed=0)


def one_point(correct: np.ndarray, usd: float = 0.01) -> Outcomes:
    return Outcomes(correct[None, :], np.full((1, len(correct)), usd))


def test_first_candidate_is_promoted_without_a_champion():
    decision = decide_promotion(one_point(np.zeros(50)), None, CFG)
    assert decision.promote and decision.champion_score is None and decision.ci_low is None
    assert decision.candidate_score == 0.0 and decision.n == 50


def test_clearly_better_candidate_is_promoted_with_the_paired_interval():
    rng = np.random.default_rng(0)
    champion = (rng.random(200) < 0.5).astype(float)
    candidate = np.maximum(champion, (rng.random(200) < 0.4).astype(float))  # fixes ~40% of the misses
    decision = decide_promotion(one_point(candidate), one_point(champion), CFG)
    diff, low, high = metrics.paired_bootstrap_diff(candidate, champion, n_boot=1000, seed=0)
    assert decision.promote and decision.ci_low > 0
    assert (decision.diff, decision.ci_low, decision.ci_high) == pytest.approx((diff, low, high))
    assert decision.candidate_score == pytest.approx(candidate.mean())
    assert decision.champion_score == pytest.approx(champion.mean())


def test_a_difference_inside_the_noise_keeps_the_champion():
    rng = np.random.default_rng(1)
    champion = (rng.random(60) < 0.6).astype(float)
    candidate = champion.copy()
    candidate[np.flatnonzero(candidate == 0)[:2]] = 1.0  # two more right answers out of 60
    decision = decide_promotion(one_point(candidate), one_point(champion), CFG)
    assert decision.diff > 0 and decision.ci_low <= 0 and not decision.promote
    assert "beyond the noise" in decision.reason


def test_worse_candidate_is_refused_and_min_improvement_raises_the_bar():
    rng = np.random.default_rng(2)
    good = (rng.random(300) < 0.8).astype(float)
    bad = good * (rng.random(300) < 0.7)
    assert not decide_promotion(one_point(bad), one_point(good), CFG).promote
    better = decide_promotion(one_point(good), one_point(bad), CFG)
    assert better.promote
    strict = GateConfig(objective="accuracy_at_budget", n_boot=1000, min_improvement=better.ci_low + 0.01)
    assert not decide_promotion(one_point(good), one_point(bad), strict).promote


def curve(n: int, accuracy_per_point: list[float], usd: list[float], seed: int) -> Outcomes:
    rng = np.random.default_rng(seed)
    correct = np.stack([(rng.random(n) < a).astype(float) for a in accuracy_per_point])
    return Outcomes(correct, np.tile(np.array(usd)[:, None], (1, n)))


def test_aiq_objective_compares_curves_in_one_cost_window():
    window = (0.001, 0.01)
    strong = curve(300, [0.55, 0.85, 0.9], [0.001, 0.003, 0.01], seed=3)
    weak = curve(300, [0.5, 0.6, 0.9], [0.001, 0.008, 0.01], seed=4)
    cfg = GateConfig(objective="aiq", n_boot=300)
    assert objective_value(strong, "aiq", window) > objective_value(weak, "aiq", window)
    decision = decide_promotion(strong, weak, cfg, window=window)
    assert decision.promote and decision.ci_low > 0 and decision.evidence["cost_window_usd"] == list(window)
    assert not decide_promotion(weak, strong, cfg, window=window).promote
    with pytest.raises(ValueError, match="cost window"):
        decide_promotion(strong, weak, cfg)


def test_decision_record_is_json_and_names_its_evidence():
    decision = decide_promotion(one_point(np.ones(30)), one_point(np.zeros(30)), CFG, evidence={"test_sha256": "ab"})
    record = json.loads(json.dumps(decision.to_dict()))
    assert record["promote"] is True and record["evidence"]["test_sha256"] == "ab"
    assert record["config"]["objective"] == "accuracy_at_budget" and record["n"] == 30
    assert record["ci_low"] == pytest.approx(1.0)  # every query improves by exactly 1: no spread


def test_too_few_queries_refuses_and_unpaired_inputs_are_rejected():
    tiny = decide_promotion(one_point(np.ones(1)), one_point(np.zeros(1)), CFG)
    assert not tiny.promote and "too few" in tiny.reason
    assert json.loads(json.dumps(tiny.to_dict()))["ci_low"] is None
    with pytest.raises(ValueError, match="same split"):
        decide_promotion(one_point(np.ones(10)), one_point(np.ones(11)), CFG)


@pytest.mark.parametrize("kwargs, match", [
    ({"objective": "f1"}, "objective"), ({"confidence": 1.0}, "confidence"), ({"n_boot": 10}, "n_boot"),
    ({"budget_usd": -1.0}, "budget_usd"),
])
def test_bad_gate_config_is_rejected(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GateConfig(**kwargs)


def test_outcomes_shapes_are_checked():
    with pytest.raises(ValueError):
        Outcomes(np.ones((2, 5)), np.ones((1, 5)))
    assert Outcomes(np.ones(4), np.zeros(4)).correct.shape == (1, 4)
