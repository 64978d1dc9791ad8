"""Tree GRPO of paper 002 Algorithm 1: eq. 14–16 advantages (no std normalisation), the per-prefix
weights of line 29, the rollout tree's structure, the multiplier update, and a small training run."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from models.critique.evaluate import episode_metrics, greedy_episodes, state_probabilities
from models.critique.grpo import (prefix_weights, rollout_tree, train_critique, tree_advantages,
                                  update_multipliers, usage_shares)
from models.critique.policy import ControllerPolicy


def test_tree_advantages_by_hand():
    # G = 2. Turn 1: action 0 ends with r = 0.25, action 1 continues to prefix 0 of turn 2 with r = 0.5.
    # Turn 2 (prefix 0): rewards 0.5 and 0.0, both terminal.
    rewards = [np.array([[0.25, 0.5]]), np.array([[0.5, 0.0]])]
    children = [np.array([[-1, 0]]), np.array([[-1, -1]])]
    adv, q, v = tree_advantages(rewards, children, gamma=1.0)
    # V̂_2 = (0.5 + 0)/2 = 0.25; Q̂_1 = [0.25, 0.5 + 0.25] = [0.25, 0.75]; V̂_1 = 0.5
    assert v[1] == pytest.approx([0.25]) and q[0] == pytest.approx(np.array([[0.25, 0.75]])) and v[0] == pytest.approx([0.5])
    # eq. 16: Q̂ − mean, NOT divided by the std (which would give ±1 here)
    assert adv[0] == pytest.approx(np.array([[-0.25, 0.25]]))
    assert adv[1] == pytest.approx(np.array([[0.25, -0.25]]))


def test_tree_advantages_discount():
    rewards = [np.array([[0.25, 0.5]]), np.array([[0.5, 0.0]])]
    children = [np.array([[-1, 0]]), np.array([[-1, -1]])]
    adv, q, _ = tree_advantages(rewards, children, gamma=0.5)
    assert q[0] == pytest.approx(np.array([[0.25, 0.5 + 0.5 * 0.25]]))  # eq. 15 with γ = 0.5
    assert adv[0] == pytest.approx(np.array([[-0.1875, 0.1875]]))


def test_tree_advantages_sign_with_three_levels():
    # G = 2, one query; a bad first route (r = −0.25, continues) against a good one (r = 0.5, stops).
    rewards = [np.array([[-0.25, 0.5]]), np.array([[0.0, 0.75]]), np.array([[0.5, 0.0]])]
    children = [np.array([[0, -1]]), np.array([[-1, 0]]), np.array([[-1, -1]])]
    adv, q, v = tree_advantages(rewards, children)
    # V̂_3 = 0.25; Q̂_2 = [0, 1.0], V̂_2 = 0.5; Q̂_1 = [0.25, 0.5], V̂_1 = 0.375
    assert q[1] == pytest.approx(np.array([[0.0, 1.0]])) and v[0] == pytest.approx([0.375])
    assert adv[0] == pytest.approx(np.array([[-0.125, 0.125]]))


def test_prefix_weights_scale_by_group_batch_and_last_turn_prefixes(env):
    sample = lambda x, mask, n: np.where(mask[:, 1:2], 1, 2).repeat(n, axis=1)  # always route (to strong if allowed)
    levels = rollout_tree(env, np.array([0, 1]), sample, group=2, xi=np.zeros(2))
    # Two queries, G = 2: turn 1 has 1 prefix per query, turn 2 has 2, turn 3 has 4 (everyone routes).
    assert [len(lv.query) for lv in levels] == [2, 4, 8]
    w = prefix_weights(levels, n_queries=2, group=2, horizon=3)
    assert w[0] == pytest.approx([1 / (4 * 2 * 2)] * 2)  # 1/(|B_T| · G · |D_b|) = 1/16
    assert all(np.allclose(x, 1 / 16) for x in w)


def test_rollout_tree_children_and_rewards(env):
    # Turn 1: action 2 (weak) then 1 (strong); later always stop.
    def sample(x, mask, n):
        if not mask[:, 0].any():  # turn 1
            return np.tile([2, 1], (len(x), 1))
        return np.zeros((len(x), n), int)

    levels = rollout_tree(env, np.array([5]), sample, group=2, xi=np.array([0.25, 0.0]))
    assert len(levels) == 2
    assert levels[0].child.tolist() == [[0, 1]]
    assert levels[1].author.tolist() == [1, 0]
    s, w = env.correct[5]
    assert levels[0].rewards[0] == pytest.approx([0.5 * w, 0.5 * (s - 0.5)])
    assert levels[1].rewards[:, 0] == pytest.approx([0.5 * w, 0.5 * s])  # verdict True on each draft
    assert (levels[1].child == -1).all()


def test_usage_shares_weight_nodes_by_their_probability(env):
    sample = lambda x, mask, n: np.where(mask[:, 1:2], 1, 2).repeat(n, axis=1)
    levels = rollout_tree(env, np.array([0]), sample, group=2, xi=np.zeros(2))
    # Every trajectory calls strong at turn 1 and weak at turn 2 (turn 3 calls nobody).
    assert usage_shares(levels, 2, 2) == pytest.approx([1.0, 1.0])


def test_multiplier_update_by_hand():
    # usage 0.6 strong, 1.0 weak calls per query → shares 0.375, 0.625; ρ = (0.25, 1); η = 0.1
    xi = update_multipliers(np.array([0.25, 0.0]), np.array([0.6, 1.0]), np.array([0.25, 1.0]), 0.1)
    assert xi == pytest.approx([0.25 + 0.1 * 0.125, 0.0])  # the weak one would go negative: clipped at 0
    assert update_multipliers(np.array([0.3, 0.0]), np.array([0.0, 1.0]), np.array([0.25, 1.0]), 0.1) == \
        pytest.approx([0.275, 0.0])


def test_grpo_step_moves_probability_toward_positive_advantage(env):
    policy = ControllerPolicy(env.feature_dim, env.n_actions, hidden=8, seed=0)
    before = policy.probabilities(env.features(np.arange(50), 1, np.full(50, -1)), env.mask(1, np.full(50, -1)))
    # ξ = 0: routing to strong at turn 1 (right 90%) out-earns weak (60%), so P(strong) must rise.
    train_critique(env, np.arange(50), policy, iterations=5, batch=32, group=4, xi=np.zeros(2), rho=np.ones(2),
                   lr=1e-2, seed=0)
    after = policy.probabilities(env.features(np.arange(50), 1, np.full(50, -1)), env.mask(1, np.full(50, -1)))
    assert after[:, 1].mean() > before[:, 1].mean()


@pytest.mark.slow
def test_small_training_run_and_what_the_multipliers_do(env):
    """Tiny scale (60 iterations, 150 queries). Under eq. 3 with γ = 1 every extra turn earns another
    verdict reward (0.5·R_v), worth more than the paper's penalty 0.5·2ξ = 0.25 of a strong call, so
    fixed multipliers leave "weak, then strong, then a verdict" optimal on every query (README,
    Critique-and-route). Dual ascent raises ξ_strong until the usage budget ρ = 0.25 holds."""
    train, held_out = np.arange(150), np.arange(150, 200)
    shares = {}
    for name, xi, dual in (("without", np.zeros(2), 0.0), ("with", np.array([0.25, 0.0]), 0.0),
                           ("dual", np.array([0.25, 0.0]), 0.2)):
        policy = ControllerPolicy(env.feature_dim, env.n_actions, hidden=16, seed=0)
        params = [p.detach().clone() for p in policy.parameters()]
        log = train_critique(env, train, policy, iterations=60, batch=64, group=4, xi=xi, rho=np.array([0.25, 1.0]),
                             lr=1e-2, seed=0, multiplier_lr=dual)
        assert np.isfinite([r["loss"] for r in log.rows]).all()
        assert any(not torch.equal(a, b) for a, b in zip(params, policy.parameters()))
        episodes = greedy_episodes(state_probabilities(policy, env, held_out), env, held_out)
        shares[name] = episode_metrics(episodes, env, held_out)["strong_call_share"]
        if dual:
            assert log.final_xi[0] > 0.25 and log.final_xi[1] == 0.0
    assert shares["without"] == pytest.approx(0.5, abs=0.05)  # one strong and one weak call per query
    assert shares["with"] == pytest.approx(0.5, abs=0.05)
    assert shares["dual"] <= 0.25
