"""Single-turn routers as episode-level baselines for multi-turn environments (MTRouter §4.1).

The paper compares MTRouter with "single-turn routers (episode-level)": a router that makes one
routing decision at the start of an episode from the initial task, then keeps that model for every
later turn. Any `models.base.Router` (kNN, logistic, MF, MLP, ...) becomes one here:

- training data: the single-model episodes on the training tasks form a complete task × model grid
  (every model ran every training task, §3.4), with the final score rescaled to [0, 1] and the
  episode's USD as the cost;
- acting: at turn 0 the router's cost-aware rule picks argmax_w q̂(task, w) − λ·ĉ(w), with ĉ(w) the
  model's mean episode cost in training; later turns repeat that model until the environment ends
  the episode, an answer is submitted, or the turn limit is reached.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from models.base import Router, RoutingData
from models.registry import make_router
from routerops.errors import InputError
from routerops.types import STOP, Action, EpisodeState

SINGLE_PREFIX = "single/"


def episode_grid(episodes: pd.DataFrame, prompts: Mapping[str, str],
                 score_bounds: tuple[float, float] = (0.0, 1.0)) -> RoutingData:
    """Task × model grid of the single-model episodes: score rescaled from `score_bounds` to [0, 1]
    (e.g. ScienceWorld's [-100, 100]), cost = the episode's USD. Tasks some model did not finish
    without a worker error are dropped, so the grid is complete."""
    single = episodes[episodes["policy"].str.startswith(SINGLE_PREFIX)]
    if single.empty:
        raise InputError("episodes", "policy", "no single-model episodes to train an episode-level router on")
    lo, hi = score_bounds
    if not hi > lo:
        raise InputError("score_bounds", "score_bounds", f"need low < high, got {score_bounds}")
    single = single.assign(worker=single["policy"].str.split("/").str[1],
                           unit_score=((single["score"] - lo) / (hi - lo)).clip(0.0, 1.0))
    if "error" in single.columns:
        single = single[single["error"].fillna("") == ""]
    wide = single.pivot_table(index="task_id", columns="worker", values=["unit_score", "cost_usd"], aggfunc="mean")
    wide = wide.dropna()
    if wide.empty:
        raise InputError("episodes", "task_id", "no task was finished by every model: the grid is empty")
    missing = sorted(set(wide.index) - set(prompts))
    if missing:
        raise InputError("prompts", "task_id", f"no task text for {missing[0]!r}")
    workers = sorted(single["worker"].unique())
    task_ids = list(wide.index)
    return RoutingData(query_ids=task_ids, queries=[prompts[t] for t in task_ids], workers=workers,
                       scores=wide["unit_score"][workers].to_numpy(float), costs=wide["cost_usd"][workers].to_numpy(float))


class EpisodeLevelPolicy:
    """routerops.types.Policy: one router decision on the task at turn 0, kept for the whole episode."""

    def __init__(self, router: Router, grid: RoutingData, name: str, primitive: str = "answer",
                 cost_weight: float = 0.0, stop_when_answered: bool = True, version: str = "1"):
        self.router = router.fit(grid)
        self.workers = list(grid.workers)
        self.mean_cost = grid.costs.mean(axis=0)
        self.name = name
        self.version = f"{version};lambda={cost_weight}"
        self.primitive = primitive
        self.cost_weight = cost_weight
        self.stop_when_answered = stop_when_answered
        self.seed = 0

    def choose_model(self, task_prompt: str) -> str:
        """argmax_w q̂(task, w) − λ·ĉ(w), ties to the cheaper model (models.base.choose_workers)."""
        one = RoutingData(query_ids=["task"], queries=[task_prompt], workers=self.workers,
                          scores=np.full((1, len(self.workers)), np.nan), costs=self.mean_cost[None, :])
        return self.workers[int(self.router.route(one, self.cost_weight)[0])]

    def act(self, state: EpisodeState, actions: Sequence[Action], rng: random.Random) -> Action:
        if state.done or len(state.turns) >= state.turn_limit:
            return STOP
        if self.stop_when_answered and state.answer is not None:
            return STOP
        worker = state.turns[0].worker if state.turns else self.choose_model(state.task.prompt)
        if not any(a.worker == worker and a.primitive == self.primitive for a in actions):
            return STOP  # the committed model is no longer affordable: an episode-level router has no fallback
        return Action(worker, self.primitive, 1.0)


def episode_level_policies(router_names: Sequence[str], episodes: pd.DataFrame, prompts: Mapping[str, str],
                           score_bounds: tuple[float, float], seed: int = 0,
                           cost_weight: float = 0.0) -> list[EpisodeLevelPolicy]:
    """One EpisodeLevelPolicy per registry name (models.registry.make_router), all on one grid."""
    grid = episode_grid(episodes, prompts, score_bounds)
    return [EpisodeLevelPolicy(make_router(name, seed), grid, name=f"episode/{name}", cost_weight=cost_weight)
            for name in router_names]
