"""Eq. 1 / eq. 3 of paper 002 on hand-made episodes, the readings as switches (a stop's R_r, a verdict
on the strongest draft), malformed turns penalised, routing only upward; CoRL's r_p·1(cost ≤ B); and
eq. 14–16's backward pass on hand-made trees and against the MLP ablation's level-wise version."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from models.critique.grpo import tree_advantages
from models.critique.lm_config import RewardSettings, critique_lm_config
from models.critique.lm_env import OutcomeTable, corl_step, turn_step
from models.critique.lm_prompts import ACCEPT, REJECT, ROUTE, ParsedTurn
from models.critique.lm_train import dual_ascent
from models.critique.tree_advantages import tree_backward_pass
from routerops.errors import InputError

# Two agents, weaker → stronger: Mixtral (0), GPT-4 (1). Query 0: both right; 1: only GPT-4 right;
# 2: both wrong; 3: only Mixtral right.
TABLE = OutcomeTable(workers=["m", "g"], agents=["Mixtral", "GPT-4"], questions=["q0", "q1", "q2", "q3"],
                     drafts=[["d", "d"]] * 4, correct=np.array([[1, 1], [0, 1], [0, 0], [1, 0]], dtype=float),
                     costs=np.array([[0.0005, 0.018]] * 4))
XI = TABLE.by_strength((0.25, 0.125, 0.0))  # two agents: ξ = (0.25, 0) strongest first → [0, 0.25]
PAPER = RewardSettings()
T = 3


def route(k):
    return ParsedTurn(ROUTE, k)


ACC, REJ_G = ParsedTurn(ACCEPT), ParsedTurn(REJECT, 1)
BAD = ParsedTurn(None, error="missing <model>")


def episode(query, turns, rewards=PAPER, xi=XI):
    """Returns of a scripted episode: the turns' eq. 3 rewards and the final agent."""
    author, out = -1, []
    for t, parsed in enumerate(turns, start=1):
        step = turn_step(TABLE, query, t, author, parsed, T, xi, rewards)
        out.append(step)
        if step.next_author < 0:
            break
        author = step.next_author
    return out


def test_multipliers_map_strongest_first_onto_weaker_to_stronger():
    assert XI.tolist() == [0.0, 0.25]


def test_mixtral_then_accept_a_right_draft():
    # Turn 1: 0.5·R_r(Mixtral right) = 0.5; turn 2: 0.5·R_v(True on a right draft) = 0.5, R_r(stop) = 0.
    steps = episode(0, [route(0), ACC])
    assert [s.reward for s in steps] == [0.5, 0.5] and steps[-1].final == 0
    assert steps[1].r_routing == 0 and steps[1].verdict is True


def test_mixtral_then_reject_to_gpt4_pays_the_multiplier_and_gpt4_ends_the_episode():
    # Query 1: Mixtral wrong. Turn 1: 0; turn 2: 0.5·(R_r 1 − 2·0.25) + 0.5·R_v(False on a wrong draft) 1 = 0.75.
    steps = episode(1, [route(0), REJ_G, ACC])
    assert len(steps) == 2  # the strongest agent's draft ends the episode: the third turn never happens
    assert [s.reward for s in steps] == [0.0, 0.75]
    assert steps[1].called == 1 and steps[1].final == 1 and steps[1].penalty == 0.5


def test_gpt4_first_is_penalised_once_and_ends():
    steps = episode(0, [route(1)])
    assert len(steps) == 1 and steps[0].reward == pytest.approx(0.5 * (1 - 0.5)) and steps[0].final == 1


def test_without_multipliers_escalating_earns_at_least_as_much_as_accepting():
    # The paper's observation (§4.2) in reward terms: with ξ = 0, Mixtral → False → GPT-4 earns
    # 0.5·1(M) + 0.5·1(G) + 0.5·1(M wrong) = 0.5 + 0.5·1(G) ≥ accepting (1(M)) whenever GPT-4 is right.
    zero = np.zeros(2)
    for q in (0, 1):
        escalate = sum(s.reward for s in episode(q, [route(0), REJ_G], xi=zero))
        accept = sum(s.reward for s in episode(q, [route(0), ACC], xi=zero))
        assert escalate >= accept
    # With ξ = (0.25, 0) accepting a right draft beats escalating: 1.0 vs 0.75.
    assert sum(s.reward for s in episode(0, [route(0), ACC])) > sum(s.reward for s in episode(0, [route(0), REJ_G]))


def test_stop_routing_reading_kept_draft_pays_r_r_for_the_kept_draft():
    kept = dataclasses.replace(PAPER, stop_routing="kept_draft")
    steps = episode(0, [route(0), ACC], rewards=kept)
    assert steps[1].r_routing == 1 and steps[1].reward == 1.0
    wrong = episode(1, [route(0), ACC], rewards=kept)
    assert wrong[1].reward == 0.0  # a kept wrong draft: R_r 0, R_v 0


def test_verify_strongest_adds_a_verdict_turn_on_gpt4s_draft():
    on = dataclasses.replace(PAPER, verify_strongest=True)
    steps = episode(2, [route(0), REJ_G, ParsedTurn(REJECT)], rewards=on)  # query 2: both wrong
    assert len(steps) == 3
    # Turn 3 = T: a False verdict on a wrong draft earns R_v = 1; no routing at T; the draft stands.
    assert steps[2].reward == 0.5 and steps[2].called == -1 and steps[2].final == 1
    accept = episode(1, [route(0), REJ_G, ACC], rewards=on)
    assert accept[2].reward == 0.5 and accept[2].final == 1


def test_no_routing_at_the_horizon():
    # T = 2: a False verdict at turn 2 calls nobody; R_r(s_T, a_T) = 0 and the draft stands.
    step = turn_step(TABLE, 1, 2, 0, REJ_G, 2, XI, PAPER)
    assert step.called == -1 and step.final == 0 and step.r_routing == 0 and step.reward == 0.5


def test_malformed_turns_fall_back_and_are_penalised():
    first = turn_step(TABLE, 0, 1, -1, BAD, T, XI, PAPER)
    assert first.malformed and first.called == 0 and first.reward == pytest.approx(0.5 - 0.5)
    later = turn_step(TABLE, 1, 2, 0, BAD, T, XI, PAPER)
    assert later.malformed and later.final == 0 and later.verdict is True and later.reward == pytest.approx(-0.5)
    none = turn_step(TABLE, 1, 2, 0, BAD, T, XI, dataclasses.replace(PAPER, malformed_penalty=0.0))
    assert none.reward == 0.0


def test_corl_reward_is_accuracy_times_the_budget_indicator():
    expert, self_ = ParsedTurn(ROUTE, 1), ParsedTurn(ROUTE, 0)
    assert corl_step(TABLE, 1, expert, 1000.0, 0.5).reward == 1.0
    assert corl_step(TABLE, 1, expert, 0.001, 0.5).reward == 0.0  # GPT-4 costs $0.018 > B
    assert corl_step(TABLE, 3, self_, 0.001, 0.5).reward == 1.0
    assert corl_step(TABLE, 1, BAD, 1000.0, 0.5).reward == -0.5  # fallback self (wrong) − penalty


def test_reward_settings_are_checked():
    with pytest.raises(InputError, match="stop_routing"):
        critique_lm_config({"rewards": {"stop_routing": "half"}})
    with pytest.raises(InputError, match="unknown key"):
        critique_lm_config({"rewards": {"xii": [0.1]}})
    assert critique_lm_config({"rewards": {"xi": [0.5, 0.0], "rho": [0.2, 1.0]}}).rewards.xi == (0.5, 0.0)


def test_dual_ascent_raises_the_multiplier_of_an_overused_agent():
    xi = dual_ascent(np.array([0.0, 0.25]), np.array([1.0, 1.0]), np.array([1.0, 0.25]), 0.2)
    assert xi[1] == pytest.approx(0.25 + 0.2 * (0.5 - 0.25)) and xi[0] == 0.0


# ---- eq. 14–16 ------------------------------------------------------------------------------------

def test_backward_pass_on_a_hand_made_tree():
    # Root state 0 with G = 2 actions: a (r = 0, leads to state 1), b (r = 0.25, terminal).
    # State 1 with G = 2 actions: c (r = 1), d (r = 0.5), both terminal.
    # V(1) = 0.75; Q(a) = 0 + 0.75, Q(b) = 0.25; V(0) = 0.5; A = (0.25, −0.25 | 0.25, −0.25).
    adv, q, v = tree_backward_pass([0, 0, 1, 1], [0.0, 0.25, 1.0, 0.5], [1, -1, -1, -1])
    assert q.tolist() == [0.75, 0.25, 1.0, 0.5]
    assert v == {0: 0.5, 1: 0.75}
    assert adv.tolist() == [0.25, -0.25, 0.25, -0.25]
    adv_g, q_g, _ = tree_backward_pass([0, 0, 1, 1], [0.0, 0.25, 1.0, 0.5], [1, -1, -1, -1], gamma=0.5)
    assert q_g[0] == pytest.approx(0.375)


def test_backward_pass_matches_the_level_wise_version_on_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(20):
        group, levels = 3, []
        states, rewards, children = [], [], []
        next_id, frontier = 1, [0]
        for _t in range(3):
            r = rng.normal(size=(len(frontier), group))
            cont = rng.random((len(frontier), group)) < 0.5
            child = np.where(cont, np.cumsum(cont).reshape(cont.shape) - 1, -1)
            levels.append((r, child))
            new = []
            for p, s in enumerate(frontier):
                for i in range(group):
                    states.append(s)
                    rewards.append(r[p, i])
                    if cont[p, i]:
                        children.append(next_id)
                        new.append(next_id)
                        next_id += 1
                    else:
                        children.append(-1)
            frontier = new
            if not frontier:
                break
        adv_levels, _, _ = tree_advantages([r for r, _ in levels], [c for _, c in levels])
        flat = np.concatenate([a.reshape(-1) for a in adv_levels])
        adv, _, _ = tree_backward_pass(states, rewards, children)
        assert np.allclose(adv, flat)


def test_backward_pass_refuses_mismatched_inputs():
    with pytest.raises(ValueError):
        tree_backward_pass([0, 0], [1.0], [-1, -1])
