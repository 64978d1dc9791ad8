"""Greedy evaluation of the LM controllers on held-out queries (002 Table 9: evaluation temperature 0).

Critique: the episode of each query, turn by turn, every active query's turn in one respond() call.
With `rho`, agent k may make at most ⌊ρ_k·m⌋ calls over the m queries (002 §4.2, Table 2: a route to an
exhausted agent goes to the next-best available one: at turn 1 the next weaker agent, after a False
verdict the next stronger one above the draft's author, else the draft stands). Within a turn the
queries are served in order; all turn-1 calls are served before turn-2 calls (ours: the paper
processes requests one by one).

Metrics: accuracy, calls and USD per query, the strongest agent's share of all calls (eq. 2's
form, the paper's "< 25% of total calls"), malformed turns, and App. A.4's turn-2 verification
confusion on drafts of every agent but the strongest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from models.critique.lm_config import RewardSettings
from models.critique.lm_env import MODES, OutcomeTable, corl_step, parse_turn, turn_messages, turn_step
from models.critique.lm_prompts import corl_messages, parse_corl
from routerops.orchestra.controller import Controller


def greedy_episodes(controller: Controller, table: OutcomeTable, rows: Sequence[int], horizon: int,
                    rewards: RewardSettings, draft_tail: int, tokenizer: Any = None,
                    rho: np.ndarray | None = None) -> dict:
    rows = np.asarray(rows)
    m, k = len(rows), len(table.agents)
    cap = np.full(k, np.inf) if rho is None else np.floor(np.asarray(rho, dtype=float) * m)
    used = np.zeros(k)
    calls = np.zeros((m, k), dtype=int)
    final = np.full(m, -1)
    turns = np.zeros(m, dtype=int)
    malformed = np.zeros(m, dtype=int)
    decisions: list[list[str]] = [[] for _ in range(m)]
    verdicts = []  # (turn, author, draft right, accepted)
    active = [(i, -1) for i in range(m)]  # (row index, author)
    zero = np.zeros(k)
    for turn in range(1, horizon + 1):
        if not active:
            break
        outputs = controller.respond([turn_messages(table, int(rows[i]), a, draft_tail, tokenizer) for i, a in active])
        nxt = []
        for (i, author), out in zip(active, outputs):
            q = int(rows[i])
            parsed = parse_turn(table, author, out.text)
            step = turn_step(table, q, turn, author, parsed, horizon, zero, rewards)
            turns[i], malformed[i] = turn, malformed[i] + int(step.malformed)
            decisions[i].append("malformed" if step.malformed else
                                f"route:{step.called}" if turn == 1 else f"verdict:{step.verdict}:{step.called}")
            if turn > 1 and not step.malformed:  # a malformed turn wrote no verdict (counted in `malformed`)
                verdicts.append((turn, author, int(table.correct[q, author]), bool(step.verdict)))
            called = step.called
            if called < 0:  # a stop, or a False verdict with nothing to call: the draft stands
                final[i] = step.final if step.final >= 0 else author
                continue
            if used[called] >= cap[called]:  # ρ pass-through
                if turn == 1:
                    options = [a for a in range(called - 1, -1, -1) if used[a] < cap[a]]
                else:
                    options = [a for a in range(called + 1, k) if used[a] < cap[a]]
                if not options:
                    final[i] = max(author, 0)
                    continue
                called = options[0]
            used[called] += 1
            calls[i, called] += 1
            ends = (called == table.strongest and not rewards.verify_strongest) or turn == horizon
            if ends:
                final[i] = called
            else:
                nxt.append((i, called))
        active = nxt
    for i, a in active:  # cut by the horizon while holding a draft
        final[i] = a
    correct = table.correct[rows, final]
    cost = (calls * table.costs[rows]).sum(axis=1)
    return {"final": final, "calls": calls, "correct": correct, "cost": cost, "turns": turns,
            "malformed": malformed, "decisions": decisions, "verdicts": verdicts}


def episode_metrics(ep: dict, table: OutcomeTable) -> dict[str, float]:
    calls = ep["calls"].sum(axis=0)
    m = len(ep["final"])
    s = table.strongest
    out = {"queries": m, "accuracy": float(ep["correct"].mean()), "usd_per_query": float(ep["cost"].mean()),
           "calls_per_query": float(calls.sum() / m), "strong_call_share": float(calls[s] / max(calls.sum(), 1)),
           "strong_calls_per_query": float(calls[s] / m), "turns": float(ep["turns"].mean()),
           "malformed_turns_per_query": float(ep["malformed"].mean())}
    for j, agent in enumerate(table.agents):
        out[f"final_share:{agent}"] = float(np.mean(ep["final"] == j))
    seen = [(r, a) for turn, author, r, a in ep["verdicts"] if turn == 2 and author != s]
    for name, right, accepted in (("true_accept", 1, True), ("false_reject", 1, False),
                                  ("false_accept", 0, True), ("true_reject", 0, False)):
        out[f"verify:{name}"] = int(sum(1 for r, a in seen if r == right and a == accepted))
    out["verify:accuracy"] = float(np.mean([r == a for r, a in seen])) if seen else float("nan")
    return out


def corl_greedy(controller: Controller, table: OutcomeTable, rows: Sequence[int], budgets: np.ndarray) -> dict:
    """Per budget mode, greedy: expert-call ratio (003 §4.5), USD per query, accuracy, reward.
    `budgets` (3, len(rows)): B per (mode, query), drawn as in training (models/critique/corl_budgets.py)."""
    budgets = np.asarray(budgets, dtype=float).reshape(len(MODES), len(rows))
    expert = table.agents[table.strongest]
    out = {}
    for m, mode in enumerate(MODES):
        outputs = controller.respond([corl_messages(table.questions[int(q)], expert, mode, table.template) for q in rows])
        steps = [corl_step(table, int(q), parse_corl(o.text, expert), b, 0.0)
                 for q, o, b in zip(rows, outputs, budgets[m])]
        agent = np.array([s.called for s in steps])
        cost = table.costs[np.asarray(rows), agent]
        correct = table.correct[np.asarray(rows), agent]
        out[mode] = {"budget_usd": float(np.mean(budgets[m])), "queries": len(rows),
                     "budget_binds_expert_share": float(np.mean(table.costs[np.asarray(rows), table.strongest] > budgets[m])),
                     "expert_call_ratio": float(np.mean(agent == table.strongest)),
                     "usd_per_query": float(cost.mean()), "accuracy": float(correct.mean()),
                     "reward": float(np.mean(correct * (cost <= budgets[m]))),
                     "malformed_share": float(np.mean([s.malformed for s in steps])),
                     "decisions": agent.tolist()}
    return out


def at_share(score: np.ndarray, strong: np.ndarray, weak: np.ndarray, share: float, cascade: bool) -> np.ndarray:
    """Per-query correctness of a single-turn router (or a cascade) run at strong-agent call share
    `share`: the router sends the top `share` of queries by score to the strong agent (one call each);
    the cascade calls the weak agent on every query and escalates the top e by score, e/(1+e) = share."""
    m = len(score)
    frac = min(share / (1 - share), 1.0) if cascade and share < 1 else (1.0 if cascade else share)
    n_strong = int(round(frac * m))
    chosen = np.zeros(m, dtype=bool)
    chosen[np.argsort(-score, kind="stable")[:n_strong]] = True
    return np.where(chosen, strong, weak).astype(float)


def paired_bootstrap(a: np.ndarray, b: np.ndarray, n_boot: int, seed: int = 0) -> dict[str, float]:
    """Mean of a − b over queries with a 95% percentile interval from paired resamples of the queries."""
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    out = {"diff": float(diff.mean())}
    if n_boot > 0 and len(diff) > 1:
        rng = np.random.default_rng(seed)
        idx = rng.integers(0, len(diff), size=(n_boot, len(diff)))
        boots = diff[idx].mean(axis=1)
        out["lo"], out["hi"] = (float(v) for v in np.percentile(boots, [2.5, 97.5]))
    return out


def decisions_changed(before: dict, after: dict) -> float:
    """Share of the queries whose greedy decision sequence differs between two controllers."""
    pairs = list(zip(before["decisions"], after["decisions"]))
    return float(np.mean([x != y for x, y in pairs])) if pairs else float("nan")
