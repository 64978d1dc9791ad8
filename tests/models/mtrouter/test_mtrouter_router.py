"""Turn-level routing (eq. 8): argmax over candidates, the cost-aware variant, budget and turn
limits; the Policy adapter inside the real rollout engine; the single-turn Router adapter."""

from __future__ import annotations

import asyncio
import numpy as np
import pandas as pd
import pytest

from models.base import RoutingData
from models.mtrouter.router import MTRouter, MTRouterRouter
from routerops.types import STOP, Action, EpisodeState, Task

WORKERS = ("cheap", "mid", "dear")

ACTIONS = [Action(w, "answer") for w in WORKERS]


@pytest.fixture(scope="module")
def router(pool, book, tiny_cfg, tiny_encoder, tables):
    episodes, turns, prompts = tables
    return MTRouter(pool, book, tiny_cfg, tiny_encoder).fit(episodes, turns, prompts)


def state_for(kind: str, budget: float = 1.0, **kw) -> EpisodeState:
    task = Task(f"new-{kind}", "synthetic", "test", f"{kind} puzzle 99: combine the numbers 99 and 102 carefully", "")
    return EpisodeState(task=task, budget_usd=budget, turn_limit=4, **kw)


def test_picks_the_argmax_of_the_estimator(router):
    for kind in ("hard", "easy"):
        state = state_for(kind)
        scores = router.score(router.history_features(state), list(WORKERS))
        assert router.select(state, ACTIONS).worker == WORKERS[int(np.argmax(scores))]
    # and what it learned from the logs: only the dear worker solves hard tasks
    assert router.select(state_for("hard"), ACTIONS).worker == "dear"


def test_cost_weight_trades_score_for_cost(router):
    base = router.cfg
    try:
        router.cfg = base.replace(cost_weight=1e6)  # any score difference is worth less than the cost gap
        assert router.select(state_for("easy"), ACTIONS).worker == "cheap"
        assert router.select(state_for("hard"), ACTIONS).worker == "cheap"
    finally:
        router.cfg = base


@pytest.mark.parametrize("budget", [1.0, 1e-3, 1e-4, 1e-6])
def test_never_returns_an_unaffordable_action(router, budget):
    choice = router.select(state_for("hard", budget=budget), ACTIONS)
    if choice.primitive == STOP.primitive:
        assert all(router.expected_cost[w] > budget for w in WORKERS)
    else:
        assert router.expected_cost[choice.worker] <= budget
        assert choice in [Action(a.worker, a.primitive, 1.0) for a in ACTIONS]


def test_stops_at_turn_limit_on_answer_and_with_nothing_offered(router):
    assert router.select(_at_limit(), ACTIONS) == STOP
    assert router.select(state_for("hard", answer="42"), ACTIONS) == STOP
    assert router.select(state_for("hard"), []) == STOP


def _at_limit() -> EpisodeState:
    state = state_for("hard")
    state.turn_limit = 0
    return state


def test_only_offered_actions_are_considered(router):
    assert router.select(state_for("hard"), [Action("cheap", "answer"), Action("mid", "answer")]).worker in ("cheap", "mid")


def test_policy_adapter_runs_in_the_rollout_engine(router, book):
    from routerops.envs.replay import ReplayEnvironment, replay_tasks, replay_workers
    from routerops.rollout import run_episode

    rows = []
    for i, kind in enumerate(["hard", "easy"]):
        for w in WORKERS:
            query = f"{kind} puzzle {i}: combine the numbers {i} and {i + 3} carefully"
            rows.append({"dataset": "synthetic", "query_id": f"q{i}", "query": query,
                         "worker": w, "score": 1.0 if kind == "easy" or w == "dear" else 0.0, "prompt_tokens": 100,
                         "completion_tokens": 20, "response": f"The answer is {i}"})
    frame = pd.DataFrame(rows)
    env, workers = ReplayEnvironment(frame), replay_workers(frame)
    policy = router.policy()
    for task in replay_tasks(frame):
        episode, turns = asyncio.run(run_episode(task, policy, env, workers, book, budget_usd=1.0, turn_limit=3,
                                                 run_id="t", seed=0))
        assert len(turns) == 1 and episode["cost_usd"] <= 1.0  # answered once, then stopped
        if task.prompt.startswith("hard"):
            assert turns[0]["worker"] == "dear" and episode["score"] == 1.0


def test_single_turn_router_on_logged_outcomes(tiny_cfg, tiny_encoder):
    rng = np.random.default_rng(0)
    kinds = rng.choice(["hard", "easy"], size=80)
    queries = [f"{k} puzzle {i}: combine the numbers {i} and {i + 3}" for i, k in enumerate(kinds)]
    scores = np.array([[1.0 if k == "easy" or w == "dear" else 0.0 for w in WORKERS] for k in kinds])
    costs = np.tile([1e-5, 1e-4, 1e-3], (80, 1))
    data = RoutingData([str(i) for i in range(80)], queries, list(WORKERS), scores, costs)
    router = MTRouterRouter(tiny_cfg, tiny_encoder, seed=1).fit(data.subset(np.arange(60)))
    test = data.subset(np.arange(60, 80))
    quality = router.predict_quality(test)
    assert quality.shape == (20, 3) and np.isfinite(quality).all()
    hard = np.array([q.startswith("hard") for q in test.queries])
    assert (router.route(test)[hard] == 2).all()  # argmax → dear on hard queries
    assert (router.route(test, cost_weight=1e4)[~hard] == 0).all()  # cost-aware → cheap on easy ones
