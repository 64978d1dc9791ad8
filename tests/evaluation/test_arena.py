"""The arena's comparisons (evaluation/arena.py) on hand-made tables whose answers are known: `constant`
marking, paired differences, the references read at a row's own cost, and the LM rows read from
critique-lm's held-out records (evaluation/arena_report.py)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from evaluation.arena import (Curve, Outcome, References, action_shares, arena_row, chord_reference, is_constant,
                              matched_reference, paired_difference, pareto_front)


def outcome(policy, correct, usd, strong, actions=None, rows=None, family="trivial", seed=0) -> Outcome:
    n = len(correct)
    return Outcome(policy, family, seed, np.arange(n) if rows is None else np.asarray(rows),
                   np.asarray(correct, float), np.asarray(usd, float), np.asarray(strong, float),
                   actions or ["weak"] * n)


def test_constant_means_one_action_on_more_than_the_threshold():
    assert is_constant(action_shares(["a"] * 91 + ["b"] * 9), 0.9)
    assert not is_constant(action_shares(["a"] * 90 + ["b"] * 10), 0.9)  # exactly 90 %: not constant
    assert action_shares(["b", "a", "a", "a"]) == {"a": 0.75, "b": 0.25}


def test_paired_difference_is_the_mean_difference_with_an_interval_around_it():
    same = paired_difference(np.array([1, 0, 1, 1.0]), np.array([1, 0, 1, 1.0]), 200, 0)
    assert same == {"diff": 0.0, "lo": 0.0, "hi": 0.0}
    ours, theirs = np.r_[np.ones(40), np.zeros(60)], np.zeros(100)
    d = paired_difference(ours, theirs, 500, 0)
    assert d["diff"] == pytest.approx(0.4) and 0.28 < d["lo"] < 0.4 < d["hi"] < 0.52
    # paired: a constant shift is read exactly, whatever the queries' spread
    base = np.random.default_rng(1).random(50)
    shifted = paired_difference(base + 0.1, base, 200, 0)
    assert shifted["lo"] == pytest.approx(0.1) and shifted["hi"] == pytest.approx(0.1)


def two_point_curve() -> Curve:
    """Knob 0: every query on the cheap worker (USD 1, right on queries 0, 1); knob 1: every query on the
    dear one (USD 3, right on queries 1, 2, 3)."""
    correct = np.array([[1, 1, 0, 0], [0, 1, 1, 1]], float)
    return Curve(np.array([0.0, 1.0]), correct, np.array([[1.0] * 4, [3.0] * 4]), np.array([[0.0] * 4, [1.0] * 4]))


def test_a_reference_is_read_at_the_rows_own_cost_between_its_neighbouring_points():
    curve, cols = two_point_curve(), np.arange(4)
    per_query, info = matched_reference(curve, cols, "usd", 2.0)  # halfway: half of each knob
    np.testing.assert_allclose(per_query, [0.5, 1.0, 0.5, 0.5])
    assert info == {"reference_usd": 2.0, "reference_accuracy": 0.625}
    below, _ = matched_reference(curve, cols, "usd", 0.5)  # cheaper than any point: the cheapest
    np.testing.assert_allclose(below, curve.correct[0])
    on_calls, info = matched_reference(curve, cols, "strong", 0.25)
    np.testing.assert_allclose(on_calls, 0.75 * curve.correct[0] + 0.25 * curve.correct[1])
    subset, _ = matched_reference(curve, np.array([2, 3]), "usd", 3.0)  # the columns asked for only
    np.testing.assert_allclose(subset, [1, 1])


def test_the_random_mix_at_equal_usd_is_the_chord_between_the_two_workers():
    weak = outcome("always weak", [1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0])
    strong = outcome("always strong", [1, 1, 1, 0], [5, 5, 5, 5], [1, 1, 1, 1])
    per_query, info = chord_reference(weak, strong, np.arange(4), 2.0)  # p = (2 − 1) / (5 − 1)
    assert info["strong_share"] == pytest.approx(0.25)
    np.testing.assert_allclose(per_query, [1, 0.25, 0.25, 0])


def test_a_row_is_compared_with_every_reference_on_its_own_queries():
    weak = outcome("always weak", [1, 0, 0, 0], [1] * 4, [0] * 4)
    strong = outcome("always strong", [1, 1, 1, 0], [3] * 4, [1] * 4)
    refs = References(np.array([10, 11, 12, 13]), [two_point_curve()], [two_point_curve()], weak, strong)
    # a policy that calls the dear worker on query 12 only (USD 1.5, 0.25 calls), right on 10, 12
    row = outcome("router", [1, 0, 1, 0], [1, 1, 3, 1], [0, 0, 1, 0], ["weak", "weak", "strong", "weak"],
                  rows=[10, 11, 12, 13], family="router")
    sft = outcome("router SFT", [1, 0, 0, 0], [1] * 4, [0] * 4, rows=[10, 11, 12, 13], family="router")
    result = arena_row([row], refs, 200, 0, 0.9, sft=[sft])
    assert (result["accuracy"], result["usd_per_query"], result["gpt4_calls_per_query"]) == (0.5, 1.5, 0.25)
    assert result["action_shares"] == {"strong": 0.25, "weak": 0.75} and not result["constant"]
    c = result["comparisons"]
    # the curve at USD 1.5 (a quarter of the way): per query .75·[1,1,0,0] + .25·[0,1,1,1] → mean 0.5625
    assert c["vs_logistic_at_usd"]["diff"] == pytest.approx(0.5 - 0.5625)
    assert c["vs_cascade_at_gpt4_calls"]["diff"] == pytest.approx(0.5 - 0.5625)  # 0.25 calls: the same mix
    # the chord at USD 1.5: p = (1.5 − 1) / (3 − 1) = 0.25 → .75·[1,0,0,0] + .25·[1,1,1,0] → mean 0.375
    assert c["vs_random_mix_at_usd"]["diff"] == pytest.approx(0.5 - 0.375)
    assert c["vs_sft_start"]["diff"] == pytest.approx(0.25) and c["vs_sft_start"]["sft_start"] == "router SFT"
    for d in c.values():
        assert d["lo"] <= d["diff"] <= d["hi"]
    # an LM row read on two of the test queries is paired on those two only
    sub = outcome("lm", [1, 1], [3, 3], [1, 1], ["strong"] * 2, rows=[12, 13], family="critique_lm")
    sub_row = arena_row([sub], refs, 200, 0, 0.9)
    assert sub_row["test_queries"] == 2 and sub_row["constant"]
    assert sub_row["comparisons"]["vs_random_mix_at_usd"]["diff"] == pytest.approx(1 - 0.5)  # strong: [1, 0]
    with pytest.raises(ValueError, match="not a test query"):
        arena_row([outcome("x", [1], [1], [0], rows=[99])], refs, 50, 0, 0.9)


def test_seeds_are_averaged_query_by_query():
    a = outcome("random", [1, 0], [1, 3], [0, 1], ["weak", "strong"], seed=0)
    b = outcome("random", [0, 0], [3, 1], [1, 0], ["strong", "weak"], seed=1)
    weak, strong = outcome("w", [0, 0], [1, 1], [0, 0]), outcome("s", [1, 1], [3, 3], [1, 1])
    refs = References(np.arange(2), [two_point_curve()], [two_point_curve()], weak, strong)
    row = arena_row([a, b], refs, 50, 0, 0.9)
    assert row["seeds"] == [0, 1] and row["accuracy"] == 0.25 and row["usd_per_query"] == 2.0
    assert row["action_shares"] == {"strong": 0.5, "weak": 0.5}


def test_the_pareto_front_keeps_the_points_nothing_beats():
    usd, acc = np.array([1.0, 2.0, 2.0, 3.0, 4.0]), np.array([0.6, 0.7, 0.65, 0.7, 0.9])
    assert pareto_front(usd, acc).tolist() == [0, 1, 4]


def test_the_lm_rows_are_read_from_critique_lms_held_out_records(tmp_path):
    """evaluation/critique_lm.py's per-query records → rows paired with their SFT start (hand-made)."""
    from evaluation.arena_config import ArenaRun, arena_config
    from evaluation.arena_report import lm_outcomes

    def record(correct, strong):
        return {"rows": [10, 11], "correct": correct, "usd": [1.0 + 2 * s for s in strong], "strong_calls": strong,
                "final": ["gpt-4" if s else "mixtral" for s in strong]}

    controllers = {"warmup_only": {"held_out": record([0, 0], [0, 0]),
                                   "fitted_verdict": {"held_out": record([1, 0], [1, 0]), "threshold": 0.3}},
                   "with_multipliers": {"held_out": record([1, 1], [1, 1]), "decisions_changed_by_rl": 0.5,
                                        "fitted_verdict": {"held_out": record([1, 0], [0, 0])}}}
    (tmp_path / "critique_seed0.json").write_text(json.dumps({"per_seed": {"0": {"controllers": controllers}}}))
    corl = {"corl_held_out": {m: record([1, 0], [0, 0]) for m in ("low", "medium", "high")},
            "corl_warmup_held_out": {m: record([0, 0], [0, 0]) for m in ("low", "medium", "high")}}
    (tmp_path / "corl_seed0.json").write_text(json.dumps({"per_seed": {"0": corl}}))
    run = ArenaRun(arena_config({"lm": {"seeds": [0]}}), None, None)
    outcomes, starts, missing = lm_outcomes(tmp_path, run)
    assert missing == []
    rl = outcomes["critique-and-route LM: RL, greedy"][0]
    assert rl.rows.tolist() == [10, 11] and rl.actions == ["gpt-4", "gpt-4"] and rl.meta["evidence"]["decisions_changed_by_rl"] == 0.5
    assert starts["critique-and-route LM: RL, greedy"] == "critique-and-route LM: SFT start, greedy"
    assert starts["critique-and-route LM: RL, fitted verdict threshold on val"] == \
        "critique-and-route LM: SFT start, fitted verdict threshold on val"
    assert starts["CoRL LM: RL, high budget"] == "CoRL LM: SFT start, high budget"
    assert len(outcomes) == 4 + 6
    none, _, missing = lm_outcomes(tmp_path / "empty", run)
    assert not none and {m["family"] for m in missing} == {"critique_lm", "corl_lm"}


def test_the_orchestrator_hook_reads_held_out_records_when_switched_on(tmp_path):
    from collections import defaultdict

    from evaluation.arena_config import OrchestratorSettings
    from evaluation.arena_report import orchestrator_outcomes

    by_policy, starts = defaultdict(list), {}
    off = orchestrator_outcomes(tmp_path, OrchestratorSettings(), by_policy, starts)
    assert off[0]["family"] == "orchestrator" and "run is false" in off[0]["reason"] and not by_policy
    on = OrchestratorSettings(run=True)
    assert "holds no record" in orchestrator_outcomes(tmp_path, on, by_policy, starts)[0]["reason"]
    record = {"rows": [1, 2], "correct": [1, 0], "usd": [0.1, 0.2], "strong_calls": [0, 1], "final": ["a", "b"]}
    (tmp_path / "agentic_seed0.json").write_text(json.dumps({"policy": "Agentic-GRPO", "seed": 0, "held_out": record,
                                                             "sft_start": record}))
    assert orchestrator_outcomes(tmp_path, on, by_policy, starts) == []
    assert by_policy["Agentic-GRPO"][0].family == "orchestrator" and starts["Agentic-GRPO"] == "Agentic-GRPO: SFT start"
