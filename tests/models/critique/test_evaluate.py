"""Evaluation: usage budgets passed through to the next-best agent (002 §4.2), the exact probability of
the final author, APGR of that score, the masks of each turn."""

from __future__ import annotations

import numpy as np
import pytest

from models.critique.evaluate import apgr_of_controller, episode_metrics, final_author_probability, greedy_episodes


def _probs(n: int, first: list[float], accept: float = 1.0, horizon: int = 3) -> dict:
    """Hand-made π(· | s) for every state: turn 1 by `first`, later P(stop) = accept."""
    probs = {(1, -1): np.tile(first, (n, 1))}
    for turn in range(2, horizon + 1):
        probs[(turn, 0)] = np.tile([accept, 0.0, 1 - accept], (n, 1))  # strong's draft: stop or route to weak
        probs[(turn, 1)] = np.tile([accept, 1 - accept, 0.0], (n, 1))  # weak's draft: stop or route to strong
    return probs


def test_budget_passes_requests_to_the_next_best_agent(env):
    rows = np.arange(8)
    probs = _probs(8, [0.0, 0.9, 0.1])  # everyone wants the strong agent, then accepts
    free = greedy_episodes(probs, env, rows)
    assert free["calls"][:, 0].sum() == 8 and free["passes"] == 0
    capped = greedy_episodes(probs, env, rows, rho=np.array([0.25, 1.0]))
    # ⌊0.25 · 8⌋ = 2 strong calls: the first two queries get it, the other six pass to the weak agent.
    assert capped["calls"][:, 0].tolist() == [1, 1, 0, 0, 0, 0, 0, 0]
    assert capped["final"].tolist() == [0, 0, 1, 1, 1, 1, 1, 1]
    assert capped["passes"] == 6
    m = episode_metrics(capped, env, rows)
    assert m["strong_call_share"] == pytest.approx(0.25) and m["strong_calls_per_query"] == pytest.approx(0.25)


def test_a_rejected_draft_with_every_other_agent_spent_stands(env):
    rows = np.arange(4)
    probs = _probs(4, [0.0, 0.0, 1.0], accept=0.0)  # weak first, then always reject
    capped = greedy_episodes(probs, env, rows, rho=np.array([0.25, 1.0]))
    # One strong call allowed (⌊0.25·4⌋): query 0 escalates; the rest keep the weak draft.
    assert capped["final"].tolist() == [0, 1, 1, 1]
    assert capped["calls"].sum(axis=0).tolist() == [1, 4]
    assert capped["cost"] == pytest.approx(env.costs[rows, 1] + np.array([env.costs[0, 0], 0, 0, 0]))


def test_final_author_probability_by_hand(env):
    # Turn 1: strong 0.3, weak 0.7. Turn 2: accept 0.6, else route to the other. Turn 3: the draft stands.
    probs = _probs(1, [0.0, 0.3, 0.7], accept=0.6)
    final = final_author_probability(probs, env)
    # strong final = 0.3·0.6 + 0.7·0.4 (weak rejected → strong, stands at T) = 0.18 + 0.28 = 0.46
    assert final[0] == pytest.approx([0.46, 0.54])


def test_apgr_of_a_controller_that_escalates_exactly_the_weak_mistakes(env):
    rows = np.arange(len(env))
    n = len(rows)
    probs = _probs(n, [0.0, 0.0, 1.0])
    # P(reject) high on the wrong weak drafts, low on the right ones, with a little per-query spread
    wrong = 0.8 * (1 - env.correct[:, 1]) + 0.1 + 0.05 * np.random.default_rng(0).random(n)
    for turn in (2, 3):  # reject mostly the wrong weak drafts
        probs[(turn, 1)] = np.stack([1 - wrong, wrong, np.zeros(n)], axis=1)
    assert apgr_of_controller(probs, env, rows) > 0.75  # a random score gets about 0.5


def test_masks(env):
    assert env.mask(1, np.array([-1])).tolist() == [[False, True, True]]  # must route at turn 1
    assert env.mask(2, np.array([1])).tolist() == [[True, True, False]]  # stop or route to another agent
    assert env.mask(3, np.array([0])).tolist() == [[True, False, True]]  # turn T: accept or one reject
