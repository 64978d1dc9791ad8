"""CoRL's budgets drawn per query (models/critique/corl_budgets.py, issue 39 item 3): each mode binds on
its stated share of queries, never on the cheap agent, and the expected eq. 7 reward of an expert call
falls from high to low mode, so the modes can differ by per-query decisions."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models.critique.corl_budgets import BudgetDraw, draw_window, state_budgets
from models.critique.lm_config import CorlLMSettings
from models.critique.lm_env import OutcomeTable
from routerops.errors import InputError

RNG_COSTS = np.random.default_rng(3)
STRONG = RNG_COSTS.uniform(0.015, 0.03, size=400)  # GPT-4-like spread, as the RouteLLM table's
WEAK = STRONG / 20


@pytest.mark.parametrize("mode, share", [(0, 0.9), (1, 0.5), (2, 0.1)])
def test_each_mode_binds_on_its_stated_share_of_queries_and_never_on_the_cheap_agent(mode, share):
    draw = BudgetDraw(STRONG, (0.9, 0.5, 0.1))
    rng = np.random.default_rng(0)
    assert draw.bind_rate(STRONG, mode, rng) == pytest.approx(share, abs=0.02)
    assert draw.bind_rate(WEAK, mode, rng) == 0.0
    lo, hi = draw_window(share)
    assert 0 <= lo <= hi <= 1 and (lo + hi) / 2 == pytest.approx(1 - share)


def test_budgets_vary_per_query_within_a_mode_and_fixed_mode_keeps_one_b_per_mode():
    table = OutcomeTable(["w", "s"], ["w", "s"], ["q"] * 400, [["", ""]] * 400,
                         np.ones((400, 2)), np.stack([WEAK, STRONG], axis=1))
    modes = np.repeat([0, 1, 2], 50)
    drawn = state_budgets(CorlLMSettings(), table, np.arange(400), modes, np.random.default_rng(1)).reshape(3, 50)
    assert all(len(np.unique(row)) > 40 for row in drawn)  # drawn per state, not one B per mode
    assert drawn[0].mean() < drawn[1].mean() < drawn[2].mean()
    fixed = dataclasses.replace(CorlLMSettings(), budget_draw="fixed")
    assert state_budgets(fixed, table, np.arange(400), [0, 1, 2], np.random.default_rng(1)).tolist() == [0.001, 0.02, 1000.0]


def test_an_expert_call_earns_less_in_expectation_the_lower_the_mode():
    # A query the expert solves and the cheap agent does not: r = 1(expert's cost ≤ B) in expectation.
    draw = BudgetDraw(STRONG, (0.9, 0.5, 0.1))
    rng = np.random.default_rng(2)
    earned = [float(np.mean(STRONG[200] <= draw.draw(np.full(4000, m), rng))) for m in range(3)]
    assert earned[0] < earned[1] < earned[2]


@pytest.mark.parametrize("shares", [(0.1, 0.5, 0.9), (0.9, 0.5), (1.2, 0.5, 0.1)])
def test_bind_shares_must_be_three_shares_binding_least_in_high(shares):
    with pytest.raises(InputError, match="bind_shares"):
        CorlLMSettings(bind_shares=shares).validate("params.yaml", "critique_lm.corl")
