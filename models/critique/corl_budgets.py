"""CoRL's cost budgets B drawn per query from the table's token-cost spread (003 §3.3; issue 39 item 3).

Why not one fixed B per mode: on RouteLLM's GSM8K table GPT-4-1106's logged answers cost $0.0149–0.0300
per query (5–95 %: $0.0155–0.0221, train rows of the arena split) and Mixtral's $0.00083–0.00105, so a
fixed B admits GPT-4 on (almost) every query or on none (`benchmarks/corl_budget_bound.py`): the fixed
budgets (0.001, 0.02, 1000) made low = "no expert", medium ≈ high = "expert allowed on 85–100 %", a mode
switch rather than per-query control.

Drawn instead: for a state (query q, mode m) the budget is B = Q(U), Q the quantile function of the
strong agent's logged costs on the *training* rows and U ~ Uniform(1 − s_m − h_m, 1 − s_m + h_m),
h_m = min(s_m, 1 − s_m). Then P(expert's cost on q > B) averages s_m over the training rows: mode m's
budget **binds on a stated share s_m of queries** (`corl.bind_shares`, low / medium / high), and which
queries it binds on is drawn per state — more often on those whose expert answer is long. The weak
agent's cost is far below Q(0) here (19–23× cheaper per query), so "self" never breaks a budget.

What that makes reachable: with the expert right with probability p_e(q) and the weak agent p_w(q), the
expected eq. 7 reward of calling the expert in mode m is ≈ p_e(q)·(1 − s_m) against p_w(q) for self, so
the best decision calls the expert iff p_w(q) < (1 − s_m)·p_e(q) — a per-query threshold that moves
with the mode (0.1, 0.5, 0.9 of p_e at the default shares), giving low < medium < high in expert share
by per-query decisions, not a switch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

DRAWS = ("per_query", "fixed")


def draw_window(share: float) -> tuple[float, float]:
    """U's interval for a bind share s: centred on 1 − s, as wide as [0, 1] allows (mean of 1 − U = s)."""
    half = min(share, 1.0 - share)
    return 1.0 - share - half, 1.0 - share + half


class BudgetDraw:
    """Per-state budgets for the three modes from the strong agent's training costs."""

    def __init__(self, strong_costs: Sequence[float], bind_shares: Sequence[float]):
        costs = np.sort(np.asarray(strong_costs, dtype=float))
        if costs.size == 0:
            raise ValueError("a budget draw needs the strong agent's costs on ≥ 1 training row")
        self.costs = costs
        self.shares = tuple(float(s) for s in bind_shares)

    def draw(self, modes: Sequence[int], rng: np.random.Generator) -> np.ndarray:
        """One budget B per state, for each state's mode index (0 low, 1 medium, 2 high)."""
        modes = np.asarray(modes, dtype=int)
        windows = np.array([draw_window(self.shares[m]) for m in modes]).reshape(-1, 2)
        u = rng.uniform(windows[:, 0], windows[:, 1]) if len(modes) else np.zeros(0)
        return np.quantile(self.costs, np.clip(u, 0.0, 1.0))

    def bind_rate(self, costs: Sequence[float], mode: int, rng: np.random.Generator, draws: int = 64) -> float:
        """Share of (query, draw) pairs whose `costs` exceed a budget drawn for `mode` (a check)."""
        costs = np.asarray(costs, dtype=float)
        budgets = self.draw(np.full(len(costs) * draws, mode), rng).reshape(len(costs), draws)
        return float((costs[:, None] > budgets).mean())


def state_budgets(corl_settings, table, train_rows: Sequence[int], modes: Sequence[int],
                  rng: np.random.Generator) -> np.ndarray:
    """B per state: drawn per query (`budget_draw: per_query`) or the mode's fixed `budgets` entry."""
    modes = np.asarray(modes, dtype=int)
    if corl_settings.budget_draw == "fixed":
        return np.asarray(corl_settings.budgets, dtype=float)[modes]
    draw = BudgetDraw(table.costs[np.asarray(train_rows, dtype=int), table.strongest], corl_settings.bind_shares)
    return draw.draw(modes, rng)
