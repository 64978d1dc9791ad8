"""Paper 002's backward pass over Algorithm 1's rollout tree (App. E.1.1 eqs. 14–16; Alg. 1 lines
21–28), as an advantage estimator over a flat list of tree nodes, for the shared RL core
(models/orchestrator/rl.py: one advantage per controller turn, here one turn per node).

A node is one sampled action a_t^(b,i): the state s_t^b it was sampled from (`state`), its modified
reward r_t^(b,i) (eq. 3 / eq. 13) and the state s_{t+1}^(b,i) it led to (`child`, −1 when the action
ended the episode). Every state's G nodes form its group. Then, from the leaves up:

    eq. 15  Q̂_t^(b,i) = r_t^(b,i) + γ·V̂_{t+1}(s_{t+1}^(b,i))        V̂ of no state (terminal) = 0
    eq. 14  V̂_t(s_t^b) = (1/G)·Σ_i Q̂_t^(b,i)                         V̂_{T+1}(·) = 0
    eq. 16  A_t^(b,i) = Q̂_t^(b,i) − (1/G)·Σ_j Q̂_t^(b,j)              no std normalisation (App. E.1.2)

models/critique/grpo.py's `tree_advantages` computes the same over per-level arrays for the MLP
ablation; this form takes any tree (uneven groups, any depth) and is checked against it in the tests.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np


def tree_backward_pass(state: np.ndarray, reward: np.ndarray, child: np.ndarray,
                       gamma: float = 1.0) -> tuple[np.ndarray, np.ndarray, dict[int, float]]:
    """(A, Q̂, V̂) for nodes given as arrays `state` (N,), `reward` (N,), `child` (N,; −1 = terminal).
    A and Q̂ are per node, V̂ per state id. A child state must be some node's `state` or have no node
    (a state never expanded, e.g. cut by the horizon, has V̂ = 0 as V̂_{T+1})."""
    state, child = np.asarray(state, dtype=np.int64), np.asarray(child, dtype=np.int64)
    reward = np.asarray(reward, dtype=float)
    if not (len(state) == len(reward) == len(child)):
        raise ValueError("state, reward and child must have one entry per node")
    members: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(state.tolist()):
        members[s].append(i)
    parent_state = {int(c): int(s) for s, c in zip(state, child) if c >= 0}

    def depth(s: int) -> int:
        d, seen = 0, set()
        while s in parent_state:
            if s in seen:
                raise ValueError("the nodes do not form a tree (a cycle of states)")
            seen.add(s)
            s, d = parent_state[s], d + 1
        return d

    value: dict[int, float] = {}
    q = np.zeros(len(state))
    adv = np.zeros(len(state))
    for s in sorted(members, key=depth, reverse=True):  # children before parents
        nodes = members[s]
        for i in nodes:
            c = int(child[i])
            q[i] = reward[i] + gamma * (value.get(c, 0.0) if c >= 0 else 0.0)  # eq. 15
        value[s] = float(q[nodes].mean())  # eq. 14
        adv[nodes] = q[nodes] - value[s]  # eq. 16
    return adv, q, value
