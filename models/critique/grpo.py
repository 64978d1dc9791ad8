"""GRPO over the multi-turn rollout tree of paper 002 (Algorithm 1, App. E) with the Lagrangian reward.

For each query of a mini-batch D_b, the tree is rooted at s_1 = (q, c); every active prefix state s_t^b
branches into G sampled actions a_t^(b,i) (line 7), each gets the modified reward r_t^(b,i) = R'(eq. 3,
line 16), and each routing action calls its agent to give the child state s_{t+1}^(b,i) (lines 10–12).
Then, backward over the tree (lines 21–28):
    eq. 15  Q̂_t^(b,i) = r_t^(b,i) + γ·V̂_{t+1}(s_{t+1}^(b,i))      (V̂ of a terminal child = 0)
    eq. 14  V̂_t(s_t^b) = (1/G)·Σ_i Q̂_t^(b,i),    V̂_{T+1} = 0
    eq. 16  A_t^(b,i) = Q̂_t^(b,i) − (1/G)·Σ_j Q̂_t^(b,j)         — no std normalisation (App. E.1.2)
and the update ascends eq. 24, Σ_t (1/G)·Σ_i ∇log π_θ(a_t^(b,i) | s_t^b)·A_t^(b,i), summed over the
tree's prefixes, scaled by 1/|B_T| per query (line 29) and averaged over D_b (line 31). On-policy (one
step per batch, θ = θ_old), so eq. 23's ratio is 1 and its gradient is eq. 24's.

The Lagrange multipliers ξ are fixed hyper-parameters in the paper (Prop. 3.1, Table 9);
`update_multipliers` adds optional dual ascent on the measured usage share (grpo.multiplier_lr > 0).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from models.critique.env import LoggedOutcomeEnv
from models.critique.policy import ControllerPolicy
from models.critique.rewards import critique_reward


@dataclass
class Level:
    """The prefixes B_t of one turn across the batch's trees, each with its G sampled actions."""

    turn: int
    query: np.ndarray  # (P,) row of the environment
    owner: np.ndarray  # (P,) which tree (query of the mini-batch) the prefix belongs to
    author: np.ndarray  # (P,) author of the prefix's draft (−1 at turn 1)
    actions: np.ndarray = field(default=None)  # (P, G)
    rewards: np.ndarray = field(default=None)  # (P, G) r_t^(b,i) of eq. 3
    child: np.ndarray = field(default=None)  # (P, G) index of the child prefix in the next level, −1 if terminal
    called: np.ndarray = field(default=None)  # (P, G) agent called by the action, −1 if none
    parts: dict = field(default_factory=dict)  # reward components (R_r, R_v, penalty), each (P, G)


Sampler = Callable[[np.ndarray, np.ndarray, int], np.ndarray]  # (features, mask, n) → (m, n) actions


def rollout_tree(env: LoggedOutcomeEnv, batch: np.ndarray, sample: Sampler, group: int, xi: np.ndarray,
                 routing_weight: float = 0.5) -> list[Level]:
    """Algorithm 1 lines 4–20 for every query of `batch` at once: one Level per turn 1..T."""
    batch = np.asarray(batch)
    levels = []
    level = Level(1, batch, np.arange(len(batch)), np.full(len(batch), -1))
    for turn in range(1, env.horizon + 1):
        x, mask = env.features(level.query, turn, level.author), env.mask(turn, level.author)
        actions = sample(x, mask, group)
        flat_q, flat_a = np.repeat(level.query, group), actions.reshape(-1)
        parts = critique_reward(turn, env.horizon, np.repeat(level.author, group), flat_a, env.correct[flat_q],
                                xi, routing_weight)
        level.actions = actions
        level.rewards = parts.pop("reward").reshape(-1, group)
        level.called = parts.pop("called").reshape(-1, group)
        level.parts = {k: v.reshape(-1, group) for k, v in parts.items()}
        continues = level.called >= 0  # a routing action before turn T calls an agent: non-terminal child
        level.child = np.where(continues, np.cumsum(continues).reshape(continues.shape) - 1, -1)
        levels.append(level)
        if not continues.any():
            break
        rows = np.nonzero(continues)
        level = Level(turn + 1, level.query[rows[0]], level.owner[rows[0]], level.called[rows])
    return levels


def tree_advantages(rewards: list[np.ndarray], children: list[np.ndarray], gamma: float = 1.0):
    """Eq. 14–16 backward over the tree. rewards[t], children[t]: (P_t, G) per level, children index
    the next level's prefixes (−1 = terminal). Returns (A, Q, V) lists per level; V[t] is (P_t,)."""
    n = len(rewards)
    adv, q_values, v_values = [None] * n, [None] * n, [None] * n
    next_v = np.zeros(0)
    for t in reversed(range(n)):
        child = children[t]
        v_child = np.where(child >= 0, next_v[np.maximum(child, 0)] if next_v.size else 0.0, 0.0)  # V̂_{T+1} = 0
        q = rewards[t] + gamma * v_child  # eq. 15
        v = q.mean(axis=1)  # eq. 14
        adv[t], q_values[t], v_values[t] = q - v[:, None], q, v  # eq. 16: no division by a std
        next_v = v
    return adv, q_values, v_values


def prefix_weights(levels: list[Level], n_queries: int, group: int, horizon: int) -> list[np.ndarray]:
    """Per-prefix weight of eq. 24's sum: 1/G (the inner mean), 1/|B_T| of the prefix's tree (Algorithm 1
    line 29; a tree whose every branch stopped before T has B_T = ∅, read as 1) and 1/|D_b| (line 31)."""
    b_t = np.zeros(n_queries)
    for level in levels:
        if level.turn == horizon:
            np.add.at(b_t, level.owner, 1.0)
    scale = 1.0 / (np.maximum(b_t, 1.0) * group * n_queries)
    return [scale[level.owner] for level in levels]


def grpo_loss(policy: ControllerPolicy, env: LoggedOutcomeEnv, levels: list[Level], advantages: list[np.ndarray],
              weights: list[np.ndarray]) -> torch.Tensor:
    """−(eq. 24 surrogate): minimising it ascends Σ w·log π_θ(a|s)·A over every node of the trees."""
    total = torch.zeros(())
    for level, adv, w in zip(levels, advantages, weights):
        logp = policy.log_probs(env.features(level.query, level.turn, level.author), env.mask(level.turn, level.author))
        chosen = logp.gather(1, torch.as_tensor(level.actions, dtype=torch.long))  # (P, G)
        total = total - (torch.as_tensor(w[:, None] * adv, dtype=logp.dtype) * chosen).sum()
    return total


def usage_shares(levels: list[Level], n_agents: int, group: int) -> np.ndarray:
    """Expected calls of each agent per query under the sampling policy, from the tree: a node at turn
    t stands for probability 1/G^t of the query's trajectories, so its calls count G^(−t)."""
    calls = np.zeros(n_agents)
    n_queries = len(levels[0].query)
    for level in levels:
        made = level.called[level.called >= 0]
        np.add.at(calls, made, float(group) ** (-level.turn))
    return calls / n_queries


def update_multipliers(xi: np.ndarray, usage: np.ndarray, rho: np.ndarray, lr: float) -> np.ndarray:
    """Dual ascent on eq. 2's constraints: ξ_k ← max(0, ξ_k + η·(u_k / Σ_k' u_k' − ρ_k)), u the expected
    calls per query (the share form of eq. 2: calls of k against ρ_k times all calls)."""
    usage = np.asarray(usage, dtype=float)
    share = usage / usage.sum() if usage.sum() > 0 else np.zeros_like(usage)
    return np.maximum(0.0, np.asarray(xi, dtype=float) + lr * (share - np.asarray(rho, dtype=float)))


@dataclass
class TrainLog:
    """Per iteration: mean modified reward per query, its components, usage and the multipliers."""

    rows: list[dict] = field(default_factory=list)
    final_xi: np.ndarray | None = None  # the multipliers after the last update


def train_critique(env: LoggedOutcomeEnv, train_rows: np.ndarray, policy: ControllerPolicy, *, iterations: int,
                   batch: int, group: int, xi: np.ndarray, rho: np.ndarray, gamma: float = 1.0,
                   routing_weight: float = 0.5, lr: float = 3e-3, weight_decay: float = 1e-4,
                   multiplier_lr: float = 0.0, seed: int = 0, progress: Callable[[int, dict], None] | None = None
                   ) -> TrainLog:
    """Algorithm 1: S iterations of tree rollouts on mini-batches of `train_rows`, eq. 16 advantages,
    one on-policy step of eq. 24 each. Only `train_rows` of `env` are ever sampled."""
    rng = np.random.default_rng(seed)
    optimiser = torch.optim.Adam(policy.parameters(), lr=lr, weight_decay=weight_decay)
    xi = np.asarray(xi, dtype=float).copy()
    log = TrainLog()

    def sample(x, mask, n):
        return policy.sample(x, mask, n, rng)

    for step in range(iterations):
        queries = rng.choice(train_rows, size=min(batch, len(train_rows)), replace=False)
        levels = rollout_tree(env, queries, sample, group, xi, routing_weight)
        adv, q_values, _ = tree_advantages([lv.rewards for lv in levels], [lv.child for lv in levels], gamma)
        weights = prefix_weights(levels, len(queries), group, env.horizon)
        loss = grpo_loss(policy, env, levels, adv, weights)
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        usage = usage_shares(levels, env.n_agents, group)
        row = {"step": step, "loss": float(loss.detach()), "value": float(np.mean(q_values[0])),
               **{f"calls_per_query:{a}": float(u) for a, u in zip(env.agents, usage)},
               **{f"xi:{a}": float(x) for a, x in zip(env.agents, xi)}}
        if multiplier_lr > 0:
            xi = update_multipliers(xi, usage, rho, multiplier_lr)
        log.rows.append(row)
        if progress is not None:
            progress(step, row)
    log.final_xi = xi
    return log
