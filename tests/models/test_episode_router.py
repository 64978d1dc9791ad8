"""Episode-level baselines (MTRouter §4.1): one router decision at turn 0, kept for the episode."""

from __future__ import annotations

import random

import numpy as np
import pandas as pd
import pytest

from models.registry import make_router
from models.episode_router import EpisodeLevelPolicy, episode_grid, episode_level_policies
from routerops.errors import InputError
from routerops.types import STOP, Action, EpisodeState, Task, TurnRecord

PLANTS = ["Your task is to find a plant in the greenhouse.", "Your task is to find a tree in the garden.",
          "Your task is to find a flower near the house.", "Your task is to find a bush in the yard."]
BOILS = ["Your task is to boil water on the stove.", "Your task is to boil tin in the foundry.",
         "Your task is to boil ice cream in a pot.", "Your task is to boil chocolate on the stove."]


def episodes_frame() -> tuple[pd.DataFrame, dict[str, str]]:
    """Single-model episodes in ScienceWorld's score range: `big` solves plant tasks, `small` boils."""
    prompts, rows = {}, []
    for kind, texts in (("plant", PLANTS), ("boil", BOILS)):
        for i, text in enumerate(texts):
            task_id = f"{kind}-{i}"
            prompts[task_id] = text
            for worker, cost in (("big", 0.02), ("small", 0.001)):
                good = (kind == "plant") == (worker == "big")
                rows.append({"task_id": task_id, "policy": f"single/{worker}/answer", "score": 100.0 if good else -100.0,
                             "cost_usd": cost, "error": "", "split": "train"})
    rows.append({"task_id": "boil-0", "policy": "uniform_random", "score": 100.0, "cost_usd": 0.5, "error": "",
                 "split": "train"})
    return pd.DataFrame(rows), prompts


def test_grid_rescales_scores_and_uses_only_single_model_episodes():
    episodes, prompts = episodes_frame()
    grid = episode_grid(episodes, prompts, score_bounds=(-100, 100))
    assert grid.workers == ["big", "small"]
    assert len(grid) == 8
    plant = grid.query_ids.index("plant-0")
    np.testing.assert_allclose(grid.scores[plant], [1.0, 0.0])
    np.testing.assert_allclose(grid.costs[plant], [0.02, 0.001])  # the random router's $0.5 is not in it


def test_grid_drops_a_task_a_model_did_not_finish():
    episodes, prompts = episodes_frame()
    episodes.loc[(episodes.task_id == "plant-1") & (episodes.policy == "single/big/answer"), "error"] = "timeout"
    grid = episode_grid(episodes, prompts, score_bounds=(-100, 100))
    assert "plant-1" not in grid.query_ids and len(grid) == 7


def test_grid_rejects_bad_input():
    episodes, prompts = episodes_frame()
    with pytest.raises(InputError, match="single-model"):
        episode_grid(episodes[episodes.policy == "uniform_random"], prompts)
    with pytest.raises(InputError, match="task text"):
        episode_grid(episodes, {k: v for k, v in prompts.items() if k != "boil-2"})
    with pytest.raises(InputError, match="low < high"):
        episode_grid(episodes, prompts, score_bounds=(1, 1))


@pytest.fixture(scope="module")
def policy() -> EpisodeLevelPolicy:
    episodes, prompts = episodes_frame()
    return episode_level_policies(["knn"], episodes, prompts, score_bounds=(-100, 100))[0]


def turn(worker: str) -> TurnRecord:
    return TurnRecord(turn_index=0, actor="router", worker=worker, primitive="answer", message="", response="",
                      prompt_tokens=1, completion_tokens=1, cached_tokens=0, latency_s=0.0, cost_usd=0.0,
                      errors=[], propensity=1.0)


ACTIONS = [Action("big", "answer"), Action("small", "answer")]


def test_first_decision_follows_the_task(policy):
    assert policy.name == "episode/knn"
    assert policy.choose_model("Your task is to find a plant in the forest.") == "big"
    assert policy.choose_model("Your task is to boil salt water on the stove.") == "small"


def test_the_turn_zero_model_is_kept_for_the_whole_episode(policy):
    state = EpisodeState(task=Task("t", "scienceworld", "test", "Your task is to boil water.", ""), turn_limit=5)
    first = policy.act(state, ACTIONS, random.Random(0))
    assert first.worker == "small"
    # Whatever the later observations say, the episode-level router does not switch.
    state.turns, state.observation = [turn("big")], "You see a plant."
    assert policy.act(state, ACTIONS, random.Random(0)).worker == "big"


def test_stops_when_done_answered_out_of_turns_or_unaffordable(policy):
    task = Task("t", "scienceworld", "test", "Your task is to find a plant.", "")
    assert policy.act(EpisodeState(task=task, turn_limit=5, done=True), ACTIONS, random.Random(0)) == STOP
    assert policy.act(EpisodeState(task=task, turn_limit=5, answer="done"), ACTIONS, random.Random(0)) == STOP
    assert policy.act(EpisodeState(task=task, turn_limit=1, turns=[turn("big")]), ACTIONS, random.Random(0)) == STOP
    assert policy.act(EpisodeState(task=task, turn_limit=5), [Action("small", "answer")], random.Random(0)) == STOP


def test_cost_weight_moves_the_choice_to_the_cheaper_model():
    episodes, prompts = episodes_frame()
    grid = episode_grid(episodes, prompts, score_bounds=(-100, 100))
    dear = EpisodeLevelPolicy(make_router("logistic"), grid, name="episode/logistic", cost_weight=0.0)
    cheap = EpisodeLevelPolicy(make_router("logistic"), grid, name="episode/logistic", cost_weight=1e4)
    text = "Your task is to find a plant in the forest."
    assert dear.choose_model(text) == "big"
    assert cheap.choose_model(text) == "small"
