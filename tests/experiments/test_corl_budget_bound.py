"""experiments/corl_budget_bound.py's rewards and length rule on hand-made rows (the table's numbers are not asserted)."""

from __future__ import annotations

import numpy as np
import pytest

# Two agents: column 0 answers itself (cheap), column 1 is the expert.
CORRECT = np.array([[1, 1], [0, 1], [0, 1], [1, 0]], dtype=float)
COST = np.array([[0.0005, 0.010], [0.0005, 0.030], [0.0005, 0.015], [0.0005, 0.012]])
LENGTHS = np.array([100.0, 400.0, 150.0, 500.0])


def test_a_mode_s_rewards_count_an_over_budget_expert_answer_as_zero(bench):
    row = bench.mode_rewards(CORRECT, COST, 1, 0.02)
    # the expert is right on rows 0-2 but over $0.02 on row 1: 2 of 4 earn
    assert row["expert_always"] == 0.5 and row["self_always"] == 0.5 and row["expert_over_budget"] == 0.25
    # per query: row 0 tie (1, 1), row 1 neither, row 2 the expert, row 3 itself
    assert row["oracle"] == 0.75 and row["oracle_expert_share"] == 0.25
    assert bench.mode_rewards(CORRECT, COST, 1, 0.001)["expert_always"] == 0.0


def test_the_length_rule_calls_the_expert_on_the_short_questions_that_pay(bench):
    cut = bench.length_rule(LENGTHS, CORRECT, COST, 1, 0.02)
    # rows 0 and 2 (≤ 150 characters) go to the expert; the long rows answer themselves: row 1's expert
    # answer would be over budget, row 3's wrong. 400 earns as much (row 1 earns 0 either way): the smaller wins.
    assert cut == 150.0
    applied = bench.apply_rule(cut, LENGTHS, CORRECT, COST, 1, 0.02)
    assert applied == {"reward": pytest.approx(0.75), "expert_share": 0.5}
    assert bench.length_rule(LENGTHS, CORRECT, COST, 1, 0.001) == 99.0  # below every length: never the expert


def test_the_auc_needs_both_classes(bench):
    assert bench.length_auc(LENGTHS, np.array([False, True, False, False])) == pytest.approx(2 / 3)
    assert bench.length_auc(LENGTHS, np.zeros(4, dtype=bool)) is None
