"""Eq. 1 / eq. 3 of paper 002 and CoRL's eq. 5–7, against values computed by hand."""

from __future__ import annotations

import numpy as np
import pytest

from models.critique.rewards import corl_reward, critique_reward

XI = np.array([0.25, 0.0])  # ξ of the strong and the weak agent (002 Table 9, two agents)
# correct[i] = (strong right, weak right) of the query of action i
CORRECT = np.array([[1, 0], [1, 1], [0, 1], [1, 0]], dtype=float)


def test_turn_one_routing_reward_and_penalty():
    # Turn 1, no draft: R_v = 0. Route to strong (action 1) on queries 0, 2; to weak (action 2) on 1, 3.
    out = critique_reward(1, 3, np.full(4, -1), np.array([1, 2, 1, 2]), CORRECT, XI)
    # q0: 0.5·(R_r 1 − 2·0.25) = 0.25; q1: 0.5·(1 − 0) = 0.5; q2: 0.5·(0 − 0.5) = −0.25; q3: 0.5·(0 − 0) = 0
    assert out["reward"] == pytest.approx([0.25, 0.5, -0.25, 0.0])
    assert out["penalty"] == pytest.approx([0.5, 0.0, 0.5, 0.0])  # 2ξ_k per call of agent k
    assert out["r_verify"] == pytest.approx([0, 0, 0, 0])
    assert list(out["called"]) == [0, 1, 0, 1]


def test_verification_and_rerouting_reward():
    # Turn 2 of 3, every draft by the weak agent (author 1). q0: weak wrong, reject and route to strong;
    # q1: weak right, stop; q2: weak right, reject (wrongly) to strong; q3: weak wrong, stop (wrongly).
    out = critique_reward(2, 3, np.ones(4, int), np.array([1, 0, 1, 0]), CORRECT, XI)
    # q0: 0.5·(1 − 0.5) + 0.5·1 = 0.75; q1: 0 + 0.5·1 = 0.5; q2: 0.5·(0 − 0.5) + 0.5·0 = −0.25; q3: 0
    assert out["reward"] == pytest.approx([0.75, 0.5, -0.25, 0.0])
    assert out["r_routing"] == pytest.approx([1, 0, 0, 0])  # a stop routes nowhere
    assert list(out["called"]) == [0, -1, 0, -1]


def test_last_turn_is_a_verdict_only():
    # Turn T = 3: R_r(s_T, a_T) = 0 and nobody is called, so no penalty either; 0.5·R_v remains.
    out = critique_reward(3, 3, np.ones(4, int), np.array([1, 0, 1, 0]), CORRECT, XI)
    assert out["reward"] == pytest.approx([0.5, 0.5, 0.0, 0.0])
    assert out["penalty"] == pytest.approx([0, 0, 0, 0])
    assert list(out["called"]) == [-1, -1, -1, -1]


def test_without_multipliers_the_strong_route_is_worth_more():
    with_xi = critique_reward(1, 3, np.array([-1]), np.array([1]), np.array([[1.0, 1.0]]), XI)["reward"]
    without = critique_reward(1, 3, np.array([-1]), np.array([1]), np.array([[1.0, 1.0]]), np.zeros(2))["reward"]
    assert without - with_xi == pytest.approx(0.25)  # 0.5 · 2ξ_strong


def test_corl_reward_is_performance_times_the_budget_indicator():
    out = corl_reward(np.array([1, 1, 0, 1]), np.array([0.001, 0.02, 0.001, 0.0050]), np.array([0.01, 0.01, 0.01, 0.005]))
    assert out["reward"] == pytest.approx([1, 0, 0, 1])  # over budget → 0; wrong → 0; cost == B is within
    assert out["r_cost"] == pytest.approx([1, 0, 1, 1])
