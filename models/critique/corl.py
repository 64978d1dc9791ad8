"""CoRL budget modes (paper 003 §3) on the critique controller's logged-outcome environment.

The controller "answers itself or calls experts": on a two-model table, answering itself is the cheap
model's logged answer and the expert is the strong model (each priced by its logged tokens). It is
the same environment and policy as the critique controller (models/critique/env.py, policy.py): turn
1 picks self or expert, later turns read the draft and stop or call the other, up to T turns.

- The budget mode m ∈ {low, medium, high} is part of the controller's input (§3.3 eq. 8: in the
  prompt), as a one-hot appended to the state features; each training query draws its mode uniformly.
- The mode sets the cost budget B of the reward: r = r_p · r_c, r_c = 1(cost ≤ B) (eq. 5–7,
  models/critique/rewards.py), given once, when the episode ends.
- PPO as the paper (§3.2 eq. 4, "Following Jin et al. 2025b"): clipped ratio (ε = 0.2), GAE from a
  learned value function V_φ (its own network and learning rate, §4.2), KL to the reference (initial)
  policy with coefficient 0.001 (App. A). The KL is exact: the action set is small. No token mask is
  needed: every action here is the controller's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from models.critique.env import STOP, LoggedOutcomeEnv
from models.critique.evaluate import greedy_episodes, state_probabilities
from models.critique.policy import ControllerPolicy
from models.critique.rewards import corl_reward

MODES = ("low", "medium", "high")


def mode_features(modes: np.ndarray) -> np.ndarray:
    """(m, 3) one-hot of the budget mode index (0 low, 1 medium, 2 high)."""
    out = np.zeros((len(modes), len(MODES)), dtype=np.float32)
    out[np.arange(len(modes)), np.asarray(modes)] = 1.0
    return out


@dataclass
class Batch:
    """B trajectories, padded to T steps: x (B,T,d), mask (B,T,A), action, logp, value, reward, valid (B,T)."""

    x: np.ndarray
    mask: np.ndarray
    action: np.ndarray
    logp: np.ndarray
    value: np.ndarray
    reward: np.ndarray
    valid: np.ndarray
    cost: np.ndarray  # (B,) USD of the calls
    final_correct: np.ndarray  # (B,)


@torch.no_grad()
def rollout(policy: ControllerPolicy, env: LoggedOutcomeEnv, queries: np.ndarray, modes: np.ndarray,
            budgets: np.ndarray, rng: np.random.Generator) -> Batch:
    """One sampled trajectory per (query, mode); the eq. 7 reward lands on each trajectory's last step."""
    b, horizon = len(queries), env.horizon
    d = env.feature_dim + len(MODES)
    out = Batch(np.zeros((b, horizon, d), np.float32), np.zeros((b, horizon, env.n_actions), bool),
                np.zeros((b, horizon), int), np.zeros((b, horizon)), np.zeros((b, horizon)),
                np.zeros((b, horizon)), np.zeros((b, horizon), bool), np.zeros(b), np.zeros(b))
    author = np.full(b, -1)
    active = np.ones(b, bool)
    extra = mode_features(modes)
    for turn in range(1, horizon + 1):
        rows = np.flatnonzero(active)
        if rows.size == 0:
            break
        t = turn - 1
        x = np.concatenate([env.features(queries[rows], turn, author[rows]), extra[rows]], axis=1)
        mask = env.mask(turn, author[rows])
        logits, value = policy(torch.as_tensor(x), torch.as_tensor(mask))
        logp_all = torch.log_softmax(logits, -1).numpy()
        action = policy.sample(x, mask, 1, rng)[:, 0]
        out.x[rows, t], out.mask[rows, t], out.action[rows, t] = x, mask, action
        out.logp[rows, t] = logp_all[np.arange(len(rows)), action]
        out.value[rows, t], out.valid[rows, t] = value.numpy(), True
        calls = (action != STOP) & (turn < horizon)
        callee = action - 1
        out.cost[rows[calls]] += env.costs[queries[rows[calls]], callee[calls]]
        author[rows[calls]] = callee[calls]
        ends = rows[~calls]
        parts = corl_reward(env.correct[queries[ends], author[ends]], out.cost[ends], budgets[modes[ends]])
        out.reward[ends, t] = parts["reward"]
        out.final_correct[ends] = parts["r_performance"]
        active[ends] = False
    return out


def gae(reward: np.ndarray, value: np.ndarray, valid: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """Generalised Advantage Estimation (Schulman et al. 2015, cited by 003 §3.2) over padded
    trajectories: δ_t = r_t + γ·V(s_{t+1}) − V(s_t) (V = 0 past the last step), A_t = δ_t + γλ·A_{t+1}."""
    b, horizon = reward.shape
    adv = np.zeros((b, horizon))
    next_v, next_a = np.zeros(b), np.zeros(b)
    for t in reversed(range(horizon)):
        delta = reward[:, t] + gamma * next_v - value[:, t]
        adv[:, t] = np.where(valid[:, t], delta + gamma * lam * next_a, 0.0)
        next_v = np.where(valid[:, t], value[:, t], 0.0)
        next_a = adv[:, t]
    return adv


def ppo_loss(policy: ControllerPolicy, reference: ControllerPolicy, batch: Batch, adv: np.ndarray,
             returns: np.ndarray, clip: float, kl: float, value_coef: float) -> tuple[torch.Tensor, dict]:
    """Eq. 4's clipped surrogate (negated), + value_coef·(V_φ − return)², + kl·KL(π_θ ‖ π_ref)."""
    v = batch.valid
    x, mask = torch.as_tensor(batch.x[v]), torch.as_tensor(batch.mask[v])
    logits, value = policy(x, mask)
    logp_all = torch.log_softmax(logits, -1)
    logp = logp_all.gather(1, torch.as_tensor(batch.action[v])[:, None]).squeeze(1)
    a = torch.as_tensor(adv[v], dtype=logp.dtype)
    ratio = torch.exp(logp - torch.as_tensor(batch.logp[v], dtype=logp.dtype))
    surrogate = torch.minimum(ratio * a, torch.clamp(ratio, 1 - clip, 1 + clip) * a).mean()
    value_loss = ((value - torch.as_tensor(returns[v], dtype=value.dtype)) ** 2).mean()
    with torch.no_grad():
        ref_logp = torch.log_softmax(reference(x, mask)[0], -1)
    p = logp_all.exp()
    divergence = (p * (logp_all - ref_logp)).masked_fill(~mask, 0.0).sum(-1).mean()
    loss = -surrogate + value_coef * value_loss + kl * divergence
    return loss, {"surrogate": float(surrogate.detach()), "value_loss": float(value_loss.detach()),
                  "kl": float(divergence.detach())}


def train_corl(env: LoggedOutcomeEnv, train_rows: np.ndarray, policy: ControllerPolicy, *, budgets, iterations: int,
               batch: int, epochs: int = 4, clip: float = 0.2, kl: float = 0.001, gamma: float = 1.0,
               lam: float = 1.0, value_coef: float = 0.5, lr: float = 3e-3, value_lr: float = 1e-2,
               weight_decay: float = 1e-4, seed: int = 0, progress: Callable[[int, dict], None] | None = None
               ) -> list[dict]:
    """PPO over `train_rows` only; each sampled query gets a uniformly drawn budget mode (003 §3.3)."""
    if policy.value is None:
        raise ValueError("CoRL's PPO needs a policy built with value_head=True")
    rng = np.random.default_rng(seed)
    budgets = np.asarray(budgets, dtype=float)
    reference = _frozen_copy(policy)  # π_ref: the policy before training
    value_params = list(policy.value.parameters())
    policy_params = [p for n, p in policy.named_parameters() if not n.startswith("value.")]
    optimiser = torch.optim.Adam([{"params": policy_params, "lr": lr}, {"params": value_params, "lr": value_lr}],
                                 weight_decay=weight_decay)
    log = []
    for step in range(iterations):
        queries = rng.choice(train_rows, size=min(batch, len(train_rows)), replace=False)
        modes = rng.integers(0, len(MODES), size=len(queries))
        data = rollout(policy, env, queries, modes, budgets, rng)
        adv = gae(data.reward, data.value, data.valid, gamma, lam)
        returns = adv + data.value
        # Whitened over the batch's steps, as PPO implementations (verl's included) do.
        flat = adv[data.valid]
        adv = np.where(data.valid, (adv - flat.mean()) / (flat.std() + 1e-8), 0.0)
        for _ in range(epochs):
            loss, parts = ppo_loss(policy, reference, data, adv, returns, clip, kl, value_coef)
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        row = {"step": step, "reward": float(data.reward.sum(axis=1).mean()), **parts,
               **{f"expert_calls:{m}": float(_expert_calls(data, modes == i)) for i, m in enumerate(MODES)}}
        log.append(row)
        if progress is not None:
            progress(step, row)
    return log


def _expert_calls(data: Batch, rows: np.ndarray) -> float:
    calls = (data.action[rows] == 1) & data.valid[rows]  # action 1 routes to agent 0, the strongest
    horizon = data.action.shape[1]
    calls[:, horizon - 1] = False  # turn T calls nobody
    return float(calls.sum(axis=1).mean()) if rows.any() else float("nan")


def _frozen_copy(policy: ControllerPolicy) -> ControllerPolicy:
    reference = copy.deepcopy(policy)
    for p in reference.parameters():
        p.requires_grad_(False)
    return reference


def evaluate_modes(policy: ControllerPolicy, env: LoggedOutcomeEnv, rows: np.ndarray, budgets) -> dict[str, dict]:
    """Per mode, greedy on held-out `rows`: expert-call ratio (expert calls per query, 003 §4.5), USD
    per query, accuracy, and the mode's reward r_p·r_c."""
    budgets = np.asarray(budgets, dtype=float)
    out = {}
    for i, mode in enumerate(MODES):
        probs = state_probabilities(policy, env, rows, extra=mode_features(np.full(len(rows), i)))
        episodes = greedy_episodes(probs, env, rows)
        reward = corl_reward(episodes["correct"], episodes["cost"], budgets[i])["reward"]
        out[mode] = {"budget_usd": float(budgets[i]), "queries": len(rows),
                     "expert_call_ratio": float(episodes["calls"][:, 0].mean()),
                     "self_call_ratio": float(episodes["calls"][:, -1].mean()),
                     "usd_per_query": float(episodes["cost"].mean()),
                     "accuracy": float(episodes["correct"].mean()), "reward": float(reward.mean())}
    return out
