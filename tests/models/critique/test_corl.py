"""CoRL (paper 003 §3): GAE by hand, the budget mode in the input, and one trained controller whose
expert calls and cost are ordered low < medium < high on held-out queries."""

from __future__ import annotations

import numpy as np
import pytest

from models.critique.corl import evaluate_modes, gae, mode_features, train_corl
from models.critique.policy import ControllerPolicy


def test_gae_by_hand():
    # One trajectory of 2 steps, terminal reward 1 at step 2; V = (0.5, 0.8); and a 1-step one.
    reward = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    value = np.array([[0.5, 0.8, 0.0], [0.3, 0.0, 0.0]])
    valid = np.array([[True, True, False], [True, False, False]])
    adv = gae(reward, value, valid, gamma=1.0, lam=0.5)
    # δ_2 = 1 − 0.8 = 0.2 → A_2 = 0.2; δ_1 = 0 + 0.8 − 0.5 = 0.3 → A_1 = 0.3 + 0.5·0.2 = 0.4
    assert adv[0] == pytest.approx([0.4, 0.2, 0.0])
    assert adv[1] == pytest.approx([-0.3, 0.0, 0.0])  # δ = 0 − 0.3
    assert gae(reward, value, valid, gamma=0.9, lam=1.0)[0, 0] == pytest.approx(0.0 + 0.9 * 0.8 - 0.5 + 0.9 * 0.2)


def test_mode_features():
    assert mode_features(np.array([2, 0])).tolist() == [[0, 0, 1], [1, 0, 0]]


@pytest.mark.slow
def test_one_controller_three_modes_ordered(env):
    # Budgets: low below any expert call (0.01–0.03 USD), medium fits about half of them, high all.
    budgets = (0.005, 0.02, 1000.0)
    policy = ControllerPolicy(env.feature_dim + 3, env.n_actions, hidden=16, value_head=True, seed=0)
    log = train_corl(env, np.arange(150), policy, budgets=budgets, iterations=60, batch=96, lr=1e-2, seed=0)
    assert np.isfinite([r["reward"] for r in log]).all()
    out = evaluate_modes(policy, env, np.arange(150, 200), budgets)
    calls = [out[m]["expert_call_ratio"] for m in ("low", "medium", "high")]
    cost = [out[m]["usd_per_query"] for m in ("low", "medium", "high")]
    assert calls[0] < calls[1] <= calls[2] and cost[0] < cost[1] <= cost[2]


def test_ppo_needs_a_value_head(env):
    with pytest.raises(ValueError, match="value_head"):
        train_corl(env, np.arange(10), ControllerPolicy(env.feature_dim + 3, env.n_actions), budgets=(1, 2, 3),
                   iterations=1, batch=4)
