"""Evaluating a trained controller on held-out queries of the logged-outcome environment.

Greedy decoding (002 Table 9: evaluation temperature 0). Usage budgets at evaluation (002 §4.2,
Table 2): "once an agent's budget is exhausted, incoming requests are automatically routed to the
next-best available agent". Agent k may make at most ⌊ρ_k·n⌋ calls over the n evaluated queries,
processed in order; a route to an exhausted agent goes to the allowed agent the policy ranks next,
and when no other agent is left the current draft is kept. Since every query makes ≥ 1 call, this
also holds k's share of all calls (eq. 2's form) to ≤ ρ_k.

APGR (RouteLLM) needs a score per query to sweep: the controller's probability that the final answer
is the strongest agent's, computed exactly from π_θ over the (deterministic) tree of logged drafts.
"""

from __future__ import annotations

import numpy as np

from models.critique.env import STOP, LoggedOutcomeEnv
from models.critique.policy import ControllerPolicy
from routerops import metrics


def state_probabilities(policy: ControllerPolicy, env: LoggedOutcomeEnv, rows: np.ndarray,
                        extra: np.ndarray | None = None) -> dict[tuple[int, int], np.ndarray]:
    """{(turn, author): (m, A) π_θ(· | s)} for every state a query can reach (author −1 at turn 1).
    `extra`: (m, e) features appended to the state's (CoRL's budget mode)."""
    out = {}
    states = [(1, -1)] + [(t, k) for t in range(2, env.horizon + 1) for k in range(env.n_agents)]
    for turn, author in states:
        authors = np.full(len(rows), author)
        x = env.features(rows, turn, authors)
        if extra is not None:
            x = np.concatenate([x, extra], axis=1)
        out[(turn, author)] = policy.probabilities(x, env.mask(turn, authors))
    return out


def final_author_probability(probs: dict, env: LoggedOutcomeEnv) -> np.ndarray:
    """(m, K) P(the final answer is agent k's) under π_θ at temperature 1."""
    first = probs[(1, -1)]
    mass = first[:, 1:].copy()  # the author distribution at turn 2
    final = np.zeros_like(mass)
    for turn in range(2, env.horizon + 1):
        nxt = np.zeros_like(mass)
        for k in range(env.n_agents):
            p = probs[(turn, k)]
            if turn == env.horizon:  # verdict only: the draft stands either way
                final[:, k] += mass[:, k]
                continue
            final[:, k] += mass[:, k] * p[:, STOP]
            nxt += mass[:, k : k + 1] * p[:, 1:]
        mass = nxt
    return final


def greedy_episodes(probs: dict, env: LoggedOutcomeEnv, rows: np.ndarray, rho: np.ndarray | None = None) -> dict:
    """Run the greedy controller on `rows` in order, with ρ budgets passed through when given."""
    m, k = len(rows), env.n_agents
    cap = np.full(k, np.inf) if rho is None else np.floor(np.asarray(rho, dtype=float) * m)
    calls = np.zeros((m, k), dtype=int)
    used = np.zeros(k)
    final = np.zeros(m, dtype=int)
    turns = np.zeros(m, dtype=int)
    passes = 0
    verdicts = []  # (draft correct, accepted) at turn 2
    for i, q in enumerate(rows):
        author, turn = -1, 1
        while True:
            p = probs[(turn, author)][i]
            choice = int(np.argmax(p))
            if turn > 1:
                verdicts.append((turn, author, env.correct[q, author], choice == STOP))
                if choice == STOP or turn == env.horizon:
                    break
            ranked = [a for a in np.argsort(-p, kind="stable") if a != STOP and p[a] > 0 and used[a - 1] < cap[a - 1]]
            if not ranked:  # every other agent is spent: the draft stands (turn 1 always has agent ρ = 1)
                passes += 1
                break
            passes += int(ranked[0] != choice)
            author = int(ranked[0]) - 1
            used[author] += 1
            calls[i, author] += 1
            turn += 1
        final[i], turns[i] = author, turn
    correct = env.correct[rows, final]
    return {"final": final, "calls": calls, "correct": correct, "turns": turns, "passes": passes,
            "cost": (calls * env.costs[rows]).sum(axis=1), "verdicts": verdicts}


def episode_metrics(episodes: dict, env: LoggedOutcomeEnv, rows: np.ndarray) -> dict[str, float]:
    """Accuracy, calls and shares per agent, USD per query, PGR at this operating point, turn-2
    verification confusion (002 App. A.4, drafts of every agent but the strongest)."""
    calls = episodes["calls"].sum(axis=0)
    acc = float(episodes["correct"].mean())
    single = env.correct[rows].mean(axis=0)
    out = {"queries": len(rows), "accuracy": acc, "usd_per_query": float(episodes["cost"].mean()),
           "turns": float(episodes["turns"].mean()), "budget_passes": int(episodes["passes"]),
           "strong_call_share": float(calls[0] / max(calls.sum(), 1)),
           "strong_calls_per_query": float(calls[0] / len(rows))}
    if single[0] != single[-1]:
        out["pgr"] = float((acc - single[-1]) / (single[0] - single[-1]))
    for j, agent in enumerate(env.agents):
        out[f"calls_per_query:{agent}"] = float(calls[j] / len(rows))
        out[f"call_share:{agent}"] = float(calls[j] / max(calls.sum(), 1))
        out[f"final_share:{agent}"] = float(np.mean(episodes["final"] == j))
    seen = [(right, accepted) for turn, author, right, accepted in episodes["verdicts"] if turn == 2 and author > 0]
    for name, right, accepted in (("true_accept", 1, True), ("false_reject", 1, False),
                                  ("false_accept", 0, True), ("true_reject", 0, False)):
        out[f"verify:{name}"] = int(sum(1 for r, a in seen if r == right and a == accepted))
    return out


def apgr_of_controller(probs: dict, env: LoggedOutcomeEnv, rows: np.ndarray) -> float:
    """RouteLLM's APGR of the score P(final answer = strongest agent's), on a two-agent pool."""
    score = final_author_probability(probs, env)[:, 0]
    strong, weak = env.correct[rows, 0], env.correct[rows, -1]
    if env.n_agents != 2 or np.unique(score).size < 2 or strong.mean() == weak.mean():
        return float("nan")
    return float(metrics.apgr(score, strong, weak))
