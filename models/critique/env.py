"""The controller's environment over logged outcomes: every agent's draft (full response) and its
correctness are in the table, so a "call" is a look-up and no model runs.

A state is (query, turn t, author of the current draft): paper 002 §3.2's s_t = (q, c', g_{t−1}), with
the draft g_{t−1} read from the log. Actions are 0 = stop (verdict True) and 1 + k = route to agent k
(verdict False). Masks follow §3.1 and App. B: at turn 1 the controller must route (there is no draft
to accept); later it may stop or route to *another* agent; at turn T routing is over (R_r(s_T, a_T) = 0)
so only "accept" and one "reject" verdict remain. A logged agent answers the same way each time it
is called (the log holds one response per agent), so re-calling an agent returns its logged draft.

Features are frozen: the MiniLM embedding and surface statistics of the question and of the draft
(models.baselines.features, the cascade's answer features), a one-hot of the draft's author and of
the turn. Agents are ordered strongest first (by logged accuracy on the training rows), so ξ and ρ,
given by strength rank, line up with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from models.base import RoutingData
from models.baselines.features import require_embeddings, surface_features
from routerops.errors import InputError

STOP = 0


@dataclass
class LoggedOutcomeEnv:
    """n queries × K agents, agents strongest first."""

    agents: list[str]
    correct: np.ndarray  # (n, K) 0/1
    costs: np.ndarray  # (n, K) USD per call
    query_x: np.ndarray  # (n, dq) frozen question features
    draft_x: np.ndarray  # (n, K, dd) frozen features of each agent's logged draft
    horizon: int = 3

    def __post_init__(self) -> None:
        n, k = self.correct.shape
        if k < 2:
            raise InputError("logged outcomes", "worker", f"a controller needs ≥ 2 agents, the table has {k}")
        if self.costs.shape != (n, k) or len(self.query_x) != n or self.draft_x.shape[:2] != (n, k):
            raise ValueError("LoggedOutcomeEnv: scores, costs and features disagree on (queries, agents)")
        if self.horizon < 2:
            raise InputError("critique", "grpo.horizon", "needs ≥ 2 turns: route, then verify")

    @property
    def n_agents(self) -> int:
        return self.correct.shape[1]

    @property
    def n_actions(self) -> int:
        return 1 + self.n_agents

    @property
    def feature_dim(self) -> int:
        return self.query_x.shape[1] + self.draft_x.shape[2] + self.n_agents + self.horizon

    def __len__(self) -> int:
        return len(self.correct)

    def features(self, query: np.ndarray, turn: int, author: np.ndarray) -> np.ndarray:
        """(m, feature_dim) state features: question ⊕ draft (zeros at turn 1) ⊕ author ⊕ turn."""
        query, author = np.asarray(query), np.asarray(author)
        m = len(query)
        has_draft = author >= 0
        draft = np.zeros((m, self.draft_x.shape[2]), dtype=np.float32)
        draft[has_draft] = self.draft_x[query[has_draft], author[has_draft]]
        who = np.zeros((m, self.n_agents), dtype=np.float32)
        who[np.flatnonzero(has_draft), author[has_draft]] = 1.0
        when = np.zeros((m, self.horizon), dtype=np.float32)
        when[:, turn - 1] = 1.0
        return np.concatenate([self.query_x[query], draft, who, when], axis=1).astype(np.float32, copy=False)

    def mask(self, turn: int, author: np.ndarray) -> np.ndarray:
        """(m, n_actions) bool: the actions allowed in each state (see the module docstring)."""
        author = np.asarray(author)
        m, k = len(author), self.n_agents
        allowed = np.ones((m, 1 + k), dtype=bool)
        if turn == 1:
            allowed[:, STOP] = False
            return allowed
        allowed[np.arange(m), 1 + author] = False  # route to *another* agent
        if turn == self.horizon:  # verdict only: keep one "reject", the first agent that is not the author
            first_other = np.where(author == 0, 1, 0)
            allowed[:, 1:] = False
            allowed[np.arange(m), 1 + first_other] = True
        return allowed

    def subset(self, idx: np.ndarray) -> "LoggedOutcomeEnv":
        idx = np.asarray(idx)
        return LoggedOutcomeEnv(self.agents, self.correct[idx], self.costs[idx], self.query_x[idx],
                                self.draft_x[idx], self.horizon)


def _standardised(stats: np.ndarray, fit_rows: np.ndarray) -> np.ndarray:
    mean = stats[fit_rows].reshape(-1, stats.shape[-1]).mean(axis=0)
    std = stats[fit_rows].reshape(-1, stats.shape[-1]).std(axis=0) + 1e-6
    return ((stats - mean) / std).astype(np.float32)


def env_from_routing_data(data: RoutingData, horizon: int = 3, encoder=None,
                          fit_rows: np.ndarray | None = None) -> LoggedOutcomeEnv:
    """The environment of a logged-outcome table with response text. Agents are ordered strongest
    first by accuracy on `fit_rows` (default all; ties: dearer first); surface statistics are
    standardised on `fit_rows` too, so nothing of a held-out query's outcome shapes the features."""
    if data.responses is None:
        raise InputError("logged outcomes", "response", "the controller reads each agent's draft: the table "
                         "needs a `response` column (docs/replay_format.md)")
    n, k = data.scores.shape
    fit_rows = np.arange(n) if fit_rows is None else np.asarray(fit_rows)
    accuracy, cost = data.scores[fit_rows].mean(axis=0), data.costs[fit_rows].mean(axis=0)
    order = np.lexsort((-cost, -accuracy))  # strongest first
    queries = require_embeddings(data, encoder)
    drafts = [[row[j] or "" for row in data.responses] for j in order]
    if encoder is None:
        from models.embeddings import default_encoder

        encoder = default_encoder()
    draft_emb = np.stack([encoder.encode(d) for d in drafts], axis=1)  # (n, K, d)
    query_stats = _standardised(surface_features(data.queries), fit_rows)
    draft_stats = _standardised(np.stack([surface_features(d) for d in drafts], axis=1), fit_rows)
    return LoggedOutcomeEnv(
        agents=[data.workers[j] for j in order],
        correct=np.asarray(data.scores[:, order], dtype=float),
        costs=np.asarray(data.costs[:, order], dtype=float),
        query_x=np.concatenate([queries, query_stats], axis=1).astype(np.float32),
        draft_x=np.concatenate([draft_emb, draft_stats], axis=2).astype(np.float32),
        horizon=horizon,
    )


def by_rank(values: tuple | list, n_agents: int) -> np.ndarray:
    """Per-agent values (strongest first) from a by-strength-rank list such as ξ = (0.25, 0.125, 0):
    the weakest agent takes the last entry, the others the first ones (K = 2: ξ = (0.25, 0))."""
    values = list(values)
    if n_agents > len(values):
        raise InputError("critique", "grpo.xi", f"{len(values)} entries for {n_agents} agents")
    return np.asarray(values[: n_agents - 1] + values[-1:], dtype=float)
