"""Rewards of the two controllers, as pure vectorised functions.

Critique-and-route (paper 002 §3.2–3.3). Each action a_t carries a verdict on the current draft and,
unless it stops, a routing decision:
    eq. 1   r_t = 0.5·R_r(s_t, a_t) + 0.5·R_v(s_t, a_t)
            R_r = 1(the routed agent's answer is correct);  R_v = 1(the verdict is correct)
            boundary cases (§3.2): R_v(s_1, a_1) = 0 (no draft yet), R_r(s_T, a_T) = 0 (no routing at T),
            and a stop routes nowhere, so its R_r = 0 too
    eq. 3   R'_r = R_r − Σ_k 2ξ_k·1(f(a_t) = k);   R' = 0.5·R'_r + 0.5·R_v
so every call of agent k costs 0.5·2ξ_k = ξ_k of reward: App. D eq. 10's Σ_k ξ_k·1(f(a_t) = k).

CoRL (paper 003 §3.3). The equations are lost from our copy of the paper; the text defines them:
    eq. 5   r_c = 1(cost(τ) ≤ B)   "comparing the cost for obtaining the rollout with a budget B";
            §5: a rollout whose cost "exceeds the budget ... result[s] in a final reward of zero"
    eq. 6–7 r = r_p · r_c,  r_p = accuracy of the final answer
"""

from __future__ import annotations

import numpy as np

STOP = 0  # action 0 stops (verdict True); action 1 + k routes to agent k (verdict False)


def critique_reward(turn: int, horizon: int, author: np.ndarray, action: np.ndarray, correct: np.ndarray,
                    xi: np.ndarray, routing_weight: float = 0.5) -> dict[str, np.ndarray]:
    """Per-action reward of eq. 3 for actions taken at `turn` (1-based) of a `horizon`-turn episode.

    author: (m,) index of the agent whose draft the state holds, −1 at turn 1 (no draft);
    action: (m,) 0 = stop, 1 + k = route to agent k (at turn T: verdict False, nobody is called);
    correct: (m, K) 0/1 correctness of every agent's logged answer on the action's query;
    xi: (K,) Lagrange multipliers. Returns r (eq. 3), r_routing (R_r), r_verify (R_v), penalty, called.
    """
    author, action = np.asarray(author), np.asarray(action)
    correct = np.asarray(correct, dtype=float)
    rows = np.arange(len(action))
    routes = action != STOP
    called = np.where(routes & (turn < horizon), action - 1, -1)  # §3.2: no routing at turn T
    r_routing = np.where(called >= 0, correct[rows, np.maximum(called, 0)], 0.0)
    penalty = np.where(called >= 0, 2.0 * np.asarray(xi, dtype=float)[np.maximum(called, 0)], 0.0)
    if turn == 1:
        r_verify = np.zeros(len(action))  # §3.2: R_v(s_1, a_1) = 0
    else:
        draft_right = correct[rows, author]
        # Verdict True (stop) is right on a correct draft; verdict False (route) on a wrong one.
        r_verify = np.where(routes, 1.0 - draft_right, draft_right)
    reward = routing_weight * (r_routing - penalty) + (1.0 - routing_weight) * r_verify
    return {"reward": reward, "r_routing": r_routing, "r_verify": r_verify, "penalty": penalty, "called": called}


def corl_reward(final_correct: np.ndarray, cost: np.ndarray, budget: np.ndarray) -> dict[str, np.ndarray]:
    """CoRL eq. 5–7: r = r_p · r_c with r_c = 1(cost ≤ B), per rollout."""
    r_p = np.asarray(final_correct, dtype=float)
    r_c = (np.asarray(cost, dtype=float) <= np.asarray(budget, dtype=float)).astype(float)
    return {"reward": r_p * r_c, "r_performance": r_p, "r_cost": r_c}
