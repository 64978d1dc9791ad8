"""The advantage estimators of paper 004 App. B, each against an example computed by hand (the arithmetic
is in the comments; equation labels B.n follow models/orchestrator/advantages.py), plus the invariants of
group normalisation, the √c cost normaliser's rolling buffer, token spreading and config validation.

The examples compare with abs=1e-4: the hand arithmetic drops ε = 1e-6 from σ + ε, which moves no
value by more than ~2e-5 here (ε/σ ≤ 1e-5 for every σ below, times |A| ≤ 3)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from models.orchestrator.advantages import (
    AdvantageConfig,
    CostNormaliser,
    InvalidSetting,
    Rollout,
    RolloutGroup,
    Turn,
    advantage_config,
    group_normalised,
    masked_token_advantages,
    shaped_turn_scores,
    terminal_rewards,
    token_advantages,
    trajectory_advantages,
    turn_advantages,
)
from routerops.errors import InputError

SQRT_3_2 = math.sqrt(1.5)  # (d) / (d·√(2/3)): a cohort [m+d, m, m−d] normalises to ±√(3/2), 0
SQRT_2 = math.sqrt(2)


def config(estimator: str, **overrides) -> AdvantageConfig:
    return AdvantageConfig(estimator=estimator, **{"group_size": 4, **overrides})


def as_lists(advantages) -> list[list[float]]:
    return [a.tolist() for a in advantages]


def approx_rows(expected: list[list[float]]):
    return [pytest.approx(row, abs=1e-4) for row in expected]


# The four rollouts that the GRPO, MT-GRPO and Agentic-GRPO examples share (α = 0.1, the default).
#   B.1  R = V − 0.1·C:  r0: 1 − 0.1·1 = 0.9   r1: 0.6 − 0 = 0.6   r2: 0.5 − 0 = 0.5   r3: 0.3 − 0.1·1 = 0.2
#   B.2  R̄ = 2.2 / 4 = 0.55; deviations +0.35, +0.05, −0.05, −0.35;
#        σ² = (0.1225 + 0.0025 + 0.0025 + 0.1225) / 4 = 0.0625, σ = 0.25
#        A_g = deviation / 0.25 = [1.4, 0.2, −0.2, −1.4]
A_G = [1.4, 0.2, -0.2, -1.4]


def example_group(**turn_fields) -> RolloutGroup:
    """r0, r1 and r3 take two turns, r2 answers directly in one. `turn_fields` maps a Turn field to
    one list of values per rollout; a turn's cost is 0 unless given."""
    verifiers_and_costs = ((1.0, 1.0), (0.6, 0.0), (0.5, 0.0), (0.3, 1.0))
    lengths = (2, 2, 1, 2)
    rollouts = []
    for i, ((verifier, cost), n) in enumerate(zip(verifiers_and_costs, lengths)):
        turns = [Turn(**{"cost": 0.0, **{name: values[i][t] for name, values in turn_fields.items()}})
                 for t in range(n)]
        rollouts.append(Rollout(verifier=verifier, cost=cost, turns=tuple(turns)))
    return RolloutGroup(task="q1", rollouts=tuple(rollouts))


def test_grpo_gives_every_turn_its_rollouts_group_advantage():
    group = example_group()
    assert terminal_rewards(group, 0.1).tolist() == pytest.approx([0.9, 0.6, 0.5, 0.2])
    assert trajectory_advantages(group, config("grpo")).tolist() == pytest.approx(A_G, abs=1e-4)
    # App. B: "every turn in the same trajectory receives the same advantage".
    assert as_lists(turn_advantages(config("grpo"), group)) == approx_rows(
        [[1.4, 1.4], [0.2, 0.2], [-0.2], [-1.4, -1.4]])


def test_mt_grpo_adds_rho_times_the_turn_normalised_score():
    # U_t per turn; B.6 compares turns of the same index (App. B: "same task and same turn").
    #   t = 0: U = [1, 1, 0, 0]: Ū = 0.5, σ = 0.5 → B = [+1, +1, −1, −1]
    #   t = 1 (r2 has no turn 1): U = [1, 0, 0] for r0, r1, r3: Ū = 1/3, deviations 2/3, −1/3, −1/3,
    #        σ² = (4/9 + 1/9 + 1/9) / 3 = 2/9, σ = √2/3 → B = [√2, −1/√2, −1/√2] = [1.41421, −0.70711, −0.70711]
    # B.7 with ρ = 0.5: Â = A_g + 0.5·B
    #   r0: 1.4 + 0.5 = 1.9,   1.4 + 0.70711 = 2.10711
    #   r1: 0.2 + 0.5 = 0.7,   0.2 − 0.35355 = −0.15355
    #   r2: −0.2 − 0.5 = −0.7
    #   r3: −1.4 − 0.5 = −1.9, −1.4 − 0.35355 = −1.75355
    group = example_group(score=[[1, 1], [1, 0], [0], [0, 0]])
    assert as_lists(turn_advantages(config("mt_grpo", rho=0.5), group)) == approx_rows(
        [[1.9, 1.4 + SQRT_2 / 2], [0.7, 0.2 - SQRT_2 / 4], [-0.7], [-1.9, -1.4 - SQRT_2 / 4]])
    # ρ = 0 leaves the terminal signal alone: MT-GRPO reduces to GRPO.
    assert as_lists(turn_advantages(config("mt_grpo", rho=0.0), group)) == as_lists(
        turn_advantages(config("grpo"), group))


def test_agentic_grpo_adds_the_cohort_normalised_shaped_score():
    # B.10 S_t = w_t·R_g + γ·V_t − α·C_t with γ = α = 0.1; R = [0.9, 0.6, 0.5, 0.2] (above).
    #   r0 (w = 1/2 each, the default): t0: 0.45 + 0.1·1 − 0.1·0.5 = 0.5    t1: 0.45 + 0 − 0.05 = 0.4
    #   r1 (w = 1/2 each):              t0: 0.30 + 0   − 0         = 0.3    t1: 0.30 + 0.1 − 0  = 0.4
    #   r2 (one turn, w = 1):           t0: 0.50 + 0.1 − 0         = 0.6    (a final_answer turn)
    #   r3 (w = 0.25, 0.75 given):      t0: 0.05 + 0.05 − 0        = 0.1    t1: 0.15 + 0 − 0.05 = 0.1
    # B.11 over comparable turns (§4.2: same turn index and action type):
    #   (0, route) = r0, r1, r3: S = [0.5, 0.3, 0.1], m = 0.3, d = 0.2, σ = d·√(2/3) → D = [√1.5, 0, −√1.5]
    #   (0, final_answer) = r2 alone → D = 0
    #   (1, route) = r0, r1, r3: S = [0.4, 0.4, 0.1], S̄ = 0.3, deviations 0.1, 0.1, −0.2,
    #        σ² = (0.01 + 0.01 + 0.04) / 3 = 0.02, σ = 0.1·√2 → D = [1/√2, 1/√2, −√2]
    # B.12 A* = A_g + D:
    #   r0: 1.4 + 1.22474 = 2.62474,   1.4 + 0.70711 = 2.10711
    #   r1: 0.2 + 0 = 0.2,             0.2 + 0.70711 = 0.90711
    #   r2: −0.2 + 0 = −0.2
    #   r3: −1.4 − 1.22474 = −2.62474, −1.4 − 1.41421 = −2.81421
    group = example_group(cost=[[0.5, 0.5], [0.0, 0.0], [0.0], [0.0, 0.5]],
                          progress=[[1, 0], [0, 1], [1], [0.5, 0]],
                          credit=[[None, None], [None, None], [None], [0.25, 0.75]],
                          action=[["route", "route"], ["route", "route"], ["final_answer"], ["route", "route"]])
    agentic = config("agentic_grpo")
    assert as_lists(shaped_turn_scores(group, agentic)) == approx_rows([[0.5, 0.4], [0.3, 0.4], [0.6], [0.1, 0.1]])
    assert as_lists(turn_advantages(agentic, group)) == approx_rows(
        [[1.4 + SQRT_3_2, 1.4 + SQRT_2 / 2], [0.2, 0.2 + SQRT_2 / 2], [-0.2], [-1.4 - SQRT_3_2, -1.4 - SQRT_2]])


def tree_group(paths: list[list[str]], rewards: list[tuple[float, float]]) -> RolloutGroup:
    return RolloutGroup(task="q2", rollouts=tuple(
        Rollout(verifier=v, cost=c, turns=tuple(Turn(cost=0.0, node=node) for node in path))
        for path, (v, c) in zip(paths, rewards)))


def test_tree_grpo_normalises_each_branch_among_its_siblings():
    # The tree:  a ─┬─ b ─┬─ b1            r0: R = 1 − 0 = 1.0
    #               │     └─ b2            r1: R = 0 − 0 = 0.0
    #               └─ c ── c1 ─┬─ c1x     r2: R = 1 − 0.1 = 0.9
    #                           └─ c1y     r3: R = 1 − 0.1 = 0.9
    # Node returns (mean R of the rollouts through it): b = 0.5, c = 0.9, c1 = 0.9.
    #   a: the one shared first turn has no sibling → 0
    #   branch after a: b, c = [0.5, 0.9], mean 0.7, σ 0.2 → T_b = −1, T_c = +1
    #   branch after b: b1, b2 = [1.0, 0.0], mean 0.5, σ 0.5 → +1, −1
    #   c1 is c's only child: still c's prefix, so it keeps c's signal, +1
    #   branch after c1: c1x, c1y = [0.9, 0.9], σ = 0 → 0, 0
    group = tree_group([["a", "b", "b1"], ["a", "b", "b2"], ["a", "c", "c1", "c1x"], ["a", "c", "c1", "c1y"]],
                       [(1.0, 0.0), (0.0, 0.0), (1.0, 1.0), (1.0, 1.0)])
    assert as_lists(turn_advantages(config("tree_grpo"), group)) == approx_rows(
        [[0, -1, 1], [0, -1, -1], [0, 1, 1, 0], [0, 1, 1, 0]])


def test_tree_grpo_of_independent_rollouts_is_grpo():
    # No shared node: the four first turns are siblings under the task, so each rollout's nodes carry
    # its B.2 advantage, exactly as GRPO's.
    group = tree_group([["p0", "p0b"], ["q0"], ["r0", "r0b", "r0c"], ["s0"]],
                       [(1.0, 1.0), (0.6, 0.0), (0.5, 0.0), (0.3, 1.0)])
    assert as_lists(turn_advantages(config("tree_grpo"), group)) == as_lists(turn_advantages(config("grpo"), group))


@pytest.mark.parametrize("paths, problem", [
    ([["a", "b"], ["a", "c"], ["x", "b"], ["y"]], "node 'b' follows"),  # one node under two prefixes
    ([["a", "b"], ["a", "b"], ["c"], ["d"]], "must end at its own leaf"),  # two rollouts, one trajectory
    ([["a"], ["a", "b"], ["c"], ["d"]], "must end at its own leaf"),  # continuing past a final turn
])
def test_tree_grpo_refuses_paths_that_are_not_a_tree(paths, problem):
    group = tree_group(paths, [(1.0, 0.0)] * 4)
    with pytest.raises(ValueError, match=problem):
        turn_advantages(config("tree_grpo"), group)


# --- group normalisation invariants --------------------------------------------------------------

def random_group(rng: np.random.Generator, size: int) -> RolloutGroup:
    return RolloutGroup(rollouts=tuple(
        Rollout(verifier=float(rng.integers(0, 2)), cost=float(rng.random()), turns=tuple(
            Turn(cost=float(rng.random()), progress=float(rng.random()), score=float(rng.normal()))
            for _ in range(3)))
        for _ in range(size)))


def test_advantages_are_zero_mean_within_the_group_and_within_each_turn_cohort():
    rng = np.random.default_rng(0)
    values = rng.normal(size=8) * 5 + 3
    normalised = group_normalised(values, 1e-6)
    assert normalised.mean() == pytest.approx(0, abs=1e-12)
    assert normalised.std() == pytest.approx(1, abs=1e-5)  # σ / (σ + ε)
    group = random_group(rng, 8)
    a_g = trajectory_advantages(group, AdvantageConfig())
    assert a_g.mean() == pytest.approx(0, abs=1e-12)
    for estimator in ("mt_grpo", "agentic_grpo"):
        # Every rollout has 3 turns of one action type, so each turn index is one cohort: the local
        # term A − A_g sums to zero across the group at every turn.
        local = np.stack(turn_advantages(AdvantageConfig(estimator=estimator), group)) - a_g[:, None]
        assert local.mean(axis=0) == pytest.approx([0, 0, 0], abs=1e-12)


def test_a_group_whose_rollouts_all_score_alike_gets_exact_zeros():
    # σ = 0: B.2 reads 0 / (0 + ε) = 0. 0.1 × 8 does not average back to 0.1 in floats, and the
    # 1e-17 left over must not be divided by ε.
    assert group_normalised([0.1] * 8, 1e-6).tolist() == [0.0] * 8
    assert group_normalised([7.0], 1e-6).tolist() == [0.0]
    alike = RolloutGroup(rollouts=tuple(
        Rollout(verifier=1.0, cost=0.3, turns=(Turn(cost=0.3, progress=1.0, score=0.5, node=f"n{i}"),))
        for i in range(8)))
    for estimator in ("grpo", "tree_grpo", "mt_grpo", "agentic_grpo"):
        assert as_lists(turn_advantages(AdvantageConfig(estimator=estimator), alike)) == [[0.0]] * 8


# --- the cost term ---------------------------------------------------------------------------------

def test_cost_normaliser_divides_root_cost_by_a_percentile_and_clips_at_one():
    # Costs 0, 1, 4, ..., 100 → √c = 0, 1, ..., 10 (11 values). The 50th percentile is 5, the 90th 9
    # (numpy's linear rule: position 0.9 × 10 = 9).
    median = CostNormaliser(buffer_size=1000, percentile=50)
    median.update([float(k * k) for k in range(11)])
    assert median.scale() == pytest.approx(5.0)
    assert median.normalise(16.0) == pytest.approx(0.8)  # √16 / 5
    assert median.normalise(400.0) == 1.0  # √400 / 5 = 4, clipped
    assert median.normalise(0.0) == 0.0
    ninetieth = CostNormaliser(buffer_size=1000, percentile=90)
    ninetieth.update([float(k * k) for k in range(11)])
    assert ninetieth.normalise(36.0) == pytest.approx(6 / 9)


def test_cost_normaliser_keeps_the_last_thousand_episodes():
    # The maximum (percentile 100) shows exactly which episodes are in the buffer.
    costs = CostNormaliser(buffer_size=1000, percentile=100)
    costs.update([400.0])  # √ = 20, the oldest
    costs.update([100.0] * 999)  # √ = 10
    assert (len(costs), costs.scale()) == (1000, 20.0)
    costs.update([1.0])  # the 1,001st episode evicts the first
    assert (len(costs), costs.scale()) == (1000, 10.0)
    assert costs.normalise(25.0) == pytest.approx(0.5)  # √25 / 10


def test_cost_normaliser_defaults_come_from_the_config_and_bad_costs_are_refused():
    costs = CostNormaliser.for_config(AdvantageConfig())
    assert (costs.root_costs.maxlen, costs.percentile) == (1000, 95.0)  # App. A.8's 1,000-episode buffer
    with pytest.raises(ValueError, match="update\\(\\) it"):
        costs.normalise(1.0)
    with pytest.raises(ValueError, match="finite number ≥ 0"):
        costs.update([1.0, -2.0])
    costs.update([0.0, 0.0])
    assert (costs.normalise(0.0), costs.normalise(3.0)) == (0.0, 1.0)  # a free buffer: scale 0


# --- from turns to tokens --------------------------------------------------------------------------

def test_turn_advantages_spread_onto_the_controllers_tokens():
    assert token_advantages([0.5, -1.0, 2.0], [2, 0, 3]).tolist() == [0.5, 0.5, 2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match="2 turn token counts for 3 turn advantages"):
        token_advantages([0.5, -1.0, 2.0], [2, 3])
    # System/task tokens, turn 1, an observation, turn 2, the template's trailing newline.
    mask = [0, 0, 1, 1, 0, 0, 0, 1, 0]
    assert masked_token_advantages([0.5, -1.0], mask).tolist() == [0, 0, 0.5, 0.5, 0, 0, 0, -1.0, 0]
    with pytest.raises(ValueError, match="2 controller turns but there are 3"):
        masked_token_advantages([0.5, -1.0, 2.0], mask)


# --- configuration and input errors --------------------------------------------------------------

def test_the_config_defaults_are_the_papers():
    default = advantage_config({}, "params.yaml", "orchestra.rl")
    assert (default.estimator, default.alpha, default.group_size, default.cost_buffer) == ("agentic_grpo", 0.1, 8, 1000)
    assert advantage_config({"alpha": 0, "cost_percentile": 90}, "p.yaml").cost_percentile == 90.0  # int → float


@pytest.mark.parametrize("raw, key, problem", [
    ({"alpah": 0.1}, "alpah", "unknown key"),
    ({"group_size": "8"}, "group_size", "expected int"),
    ({"group_size": True}, "group_size", "expected int"),
    ({"estimator": 3}, "estimator", "expected str"),
    ({"estimator": "ppo"}, "estimator", "not one of"),
    ({"alpha": 1.5}, "alpha", "not in \\[0, 1\\]"),
    ({"alpha": float("nan")}, "alpha", "not in \\[0, 1\\]"),
    ({"gamma": -0.1}, "gamma", "≥ 0"),
    ({"group_size": 1}, "group_size", "≥ 2"),
    ({"cost_percentile": 0}, "cost_percentile", "\\(0, 100\\]"),
    ({"epsilon": 0.0}, "epsilon", "> 0"),
])
def test_bad_settings_name_the_file_and_the_key(raw, key, problem):
    with pytest.raises(InputError, match=f"params.yaml: field 'orchestra.rl.{key}': .*{problem}"):
        advantage_config(raw, "params.yaml", "orchestra.rl")


def test_bad_settings_and_groups_built_in_code_are_refused():
    with pytest.raises(InvalidSetting, match="AdvantageConfig.rho"):
        AdvantageConfig(rho=-1.0)
    with pytest.raises(InputError, match="orchestra.rl': expected a mapping"):
        advantage_config([("alpha", 0.1)], "params.yaml", "orchestra.rl")
    with pytest.raises(ValueError, match="rollout 0 verifier V_g: 1.5 is not a number in \\[0, 1\\]"):
        RolloutGroup(rollouts=[Rollout(verifier=1.5, cost=0.0, turns=[Turn(cost=0.0)])])
    with pytest.raises(ValueError, match="rollout 0 turn 0 cost C_t"):
        RolloutGroup(rollouts=[Rollout(verifier=1.0, cost=0.0, turns=[Turn(cost=12.5)])])
    with pytest.raises(ValueError, match="has no turns"):
        RolloutGroup(rollouts=[Rollout(verifier=1.0, cost=0.0, turns=[])])
    with pytest.raises(ValueError, match="on every turn or on none"):
        RolloutGroup(rollouts=[Rollout(verifier=1.0, cost=0.0, turns=[Turn(cost=0.0, credit=0.5), Turn(cost=0.0)])])
    with pytest.raises(ValueError, match="sum to 1.2 > 1"):
        RolloutGroup(rollouts=[Rollout(verifier=1.0, cost=0.0, turns=[Turn(cost=0.0, credit=0.6)] * 2)])
    group = example_group()  # no U_t, V_t or node ids
    with pytest.raises(ValueError, match="4 rollouts, but the config's group size G is 8"):
        turn_advantages(AdvantageConfig(estimator="grpo"), group)
    for estimator, missing in (("mt_grpo", "score \\(U_t\\)"), ("agentic_grpo", "progress \\(V_t\\)"),
                               ("tree_grpo", "node")):
        with pytest.raises(ValueError, match=f"q1: rollout 0 turn 0: {estimator} needs every turn's {missing}"):
            turn_advantages(config(estimator), group)


# ---------------------------------------------------------------- §4.1 eq. 5, §4.2 eq. 6, GiGPO (B.8–B.9)


def eq5_group() -> RolloutGroup:
    """Two correct rollouts (the first at the top of the cost scale) and two the verifier rejects."""
    return RolloutGroup(task="q5", rollouts=(
        Rollout(verifier=1.0, cost=1.0, turns=(Turn(cost=0.5), Turn(cost=0.5))),
        Rollout(verifier=1.0, cost=0.5, turns=(Turn(cost=0.5),)),
        Rollout(verifier=0.0, cost=1.0, turns=(Turn(cost=1.0),), schema_share=1.0),
        Rollout(verifier=0.0, cost=0.0, turns=(Turn(cost=0.0), Turn(cost=0.0)), schema_share=0.5)))


def test_eq5_gates_the_cost_reward_on_the_verifier_and_caps_the_schema_term():
    # §4.1 eq. 5, α = 0.1, S(τ) = 0.1 × schema_share:
    #   r0: b = 1: (1 − 0.1) + 0.1·(1 − 1.0) = 0.9      r1: b = 1: 0.9 + 0.1·(1 − 0.5) = 0.95
    #   r2: b = 0: S = 0.1·1.0 = 0.1 (its cost is not charged)    r3: b = 0: S = 0.1·0.5 = 0.05
    #   R̄ = 2.0 / 4 = 0.5; deviations 0.4, 0.45, −0.4, −0.45; σ² = (0.16 + 0.2025)·2 / 4 = 0.18125
    group = eq5_group()
    eq5 = config("grpo", reward="eq5")
    assert trajectory_advantages(group, eq5).tolist() != trajectory_advantages(group, config("grpo")).tolist()
    from models.orchestrator.advantages import rewards
    assert rewards(group, eq5).tolist() == pytest.approx([0.9, 0.95, 0.1, 0.05])
    sigma = math.sqrt(0.18125)
    assert trajectory_advantages(group, eq5).tolist() == pytest.approx(
        [0.4 / sigma, 0.45 / sigma, -0.4 / sigma, -0.45 / sigma], abs=1e-4)
    # B.1 on the same group: R = [0.9, 0.95, −0.1, 0.0]: the free wrong rollout beats the dear wrong one
    # by its cost alone; under eq. 5 only the schema term orders them, and never above a correct one.
    assert rewards(group, config("grpo")).tolist() == pytest.approx([0.9, 0.95, -0.1, 0.0])
    # The gate: with the largest S and the dearest correct rollout, correct still wins (0.1 ≤ 0.9).
    assert max(rewards(group, eq5)[2:]) <= min(rewards(group, eq5)[:2])
    # The estimators all compare eq. 5's R: MT-GRPO at ρ = 0 is GRPO on it.
    scored = RolloutGroup(task="q5", rollouts=tuple(
        Rollout(r.verifier, r.cost, tuple(Turn(cost=t.cost, score=0.0) for t in r.turns), r.schema_share)
        for r in group.rollouts))
    assert as_lists(turn_advantages(config("mt_grpo", reward="eq5", rho=0.0), scored)) == approx_rows(
        [[0.4 / sigma] * 2, [0.45 / sigma], [-0.4 / sigma], [-0.45 / sigma] * 2])


def test_eq5_refuses_a_schema_bonus_above_the_papers_cap_and_needs_the_schema_share_of_a_wrong_rollout():
    with pytest.raises(InputError, match="orchestra.rl.schema_bonus'.*S\\(τ\\) ≤ 0.10"):
        advantage_config({"reward": "eq5", "schema_bonus": 0.2}, "params.yaml", "orchestra.rl")
    with pytest.raises(InputError, match="orchestra.rl.reward'.*not one of"):
        advantage_config({"reward": "main_text"}, "params.yaml", "orchestra.rl")
    unshared = RolloutGroup(task="q5", rollouts=(Rollout(1.0, 0.0, (Turn(cost=0.0),)),
                                                 Rollout(0.0, 0.0, (Turn(cost=0.0),))))
    with pytest.raises(ValueError, match="q5: rollout 1: eq5 needs the schema_share"):
        turn_advantages(config("grpo", reward="eq5", group_size=2), unshared)
    # a correct rollout needs none: its S is never used
    from models.orchestrator.advantages import verifier_gated_rewards
    assert verifier_gated_rewards(RolloutGroup(rollouts=unshared.rollouts[:1]), 0.1).tolist() == [1.0]


def eq6_group(reward_cost: float = 0.0) -> RolloutGroup:
    def rollout(verifier, actions, shaping):
        return Rollout(verifier, reward_cost, tuple(Turn(cost=0.0, action=a, shaping=r) for a, r in zip(actions, shaping)))

    two = ("plan", "final_answer")
    return RolloutGroup(task="q6", rollouts=(
        rollout(1.0, two, (0.0, 0.0)), rollout(0.0, two, (0.0, -0.05)), rollout(0.5, two, (0.0, -0.025)),
        rollout(1.0, ("final_answer",), (0.0,))))


def test_eq6_discounts_the_terminal_reward_to_each_turn_and_standardises_over_comparable_turns():
    # §4.2 eq. 6 with γ = 0.5, η = 0.05, R = V (B.1 with every C = 0); turns t = 1, 2:
    #   R̃_t = γ^(T−t)·R + Σ_{s≥t} γ^(s−t)·r_s
    #   r0: t2: 1 + 0 = 1.0                    t1: 0.5·1 + 0 + 0.5·0 = 0.5
    #   r1: t2: 0 − 0.05 = −0.05               t1: 0.5·0 + 0 + 0.5·(−0.05) = −0.025
    #   r2: t2: 0.5 − 0.025 = 0.475            t1: 0.5·0.5 + 0 + 0.5·(−0.025) = 0.2375
    #   r3: t1 (T = 1): 1.0
    # Comparable turns (same turn index and action type):
    #   (1, plan) = [0.5, −0.025, 0.2375] = m + d, m − d, m → [√1.5, −√1.5, 0]
    #   (2, final_answer) = [1.0, −0.05, 0.475] = m + d, m − d, m → [√1.5, −√1.5, 0]
    #   (1, final_answer) = r3 alone → 0: eq. 6 never compares a direct answer with a plan
    from models.orchestrator.advantages import turn_returns

    group = eq6_group()
    eq6 = config("agentic_grpo", turn_return="eq6", discount=0.5, shaping_bound=0.05, alpha=0.0)
    assert as_lists(turn_returns(group, eq6)) == approx_rows([[0.5, 1.0], [-0.025, -0.05], [0.2375, 0.475], [1.0]])
    assert as_lists(turn_advantages(eq6, group)) == approx_rows(
        [[SQRT_3_2, SQRT_3_2], [-SQRT_3_2, -SQRT_3_2], [0.0, 0.0], [0.0]])
    # eq. 5 inside eq. 6 (reward eq5, C = 1 on every rollout, schema_share 0.5 on the wrong ones):
    #   α = 0.1. r0: R = 0.9 + 0.1·(1 − 1) = 0.9 → t2: 0.9, t1: 0.5·0.9 = 0.45
    #   r1: R = S = 0.1·0.5 = 0.05 → t2: 0.05 − 0.05 = 0, t1: 0.5·0.05 + 0 + 0.5·(−0.05) = 0
    costly = RolloutGroup(task="q6", rollouts=tuple(
        Rollout(r.verifier, 1.0, r.turns, schema_share=0.5) for r in group.rollouts))
    with_eq5 = dataclasses.replace(eq6, reward="eq5", alpha=0.1)
    assert as_lists(turn_returns(costly, with_eq5))[:2] == approx_rows([[0.45, 0.9], [0.0, 0.0]])


def test_eq5_eq6_and_gigpo_are_selected_by_orchestra_rl_keys():
    from models.orchestrator.rl import rl_config

    main_text = rl_config({"estimator": "agentic_grpo", "reward": "eq5", "turn_return": "eq6", "discount": 0.95,
                           "shaping_bound": 0.02, "schema_bonus": 0.05}, "params.yaml").advantages
    assert (main_text.reward, main_text.turn_return, main_text.discount, main_text.shaping_bound,
            main_text.schema_bonus) == ("eq5", "eq6", 0.95, 0.02, 0.05)
    assert rl_config({"estimator": "gigpo", "anchor_weight": 0.5}).advantages.anchor_weight == 0.5
    default = rl_config({}).advantages  # App. B's forms unless asked
    assert (default.reward, default.turn_return) == ("app_b", "b10")


def test_eq6_refuses_shaping_beyond_eta_and_other_estimators():
    from models.orchestrator.advantages import turn_returns

    with pytest.raises(ValueError, match="exceeds η = 0.01"):
        turn_returns(eq6_group(), config("agentic_grpo", turn_return="eq6", shaping_bound=0.01))
    with pytest.raises(InputError, match="orchestra.rl.turn_return'.*Agentic-GRPO"):
        advantage_config({"estimator": "grpo", "turn_return": "eq6"}, "params.yaml", "orchestra.rl")
    with pytest.raises(InputError, match="orchestra.rl.discount'"):
        advantage_config({"discount": 0.0}, "params.yaml", "orchestra.rl")
    with pytest.raises(InputError, match="orchestra.rl.shaping_bound'"):
        advantage_config({"shaping_bound": 0.5}, "params.yaml", "orchestra.rl")
    with pytest.raises(ValueError, match="eq6 needs every turn's shaping"):
        turn_advantages(config("agentic_grpo", turn_return="eq6"), example_group(action=[["a", "a"]] * 2 + [["a"]] + [["a", "a"]]))


def test_gigpo_compares_the_discounted_outcome_of_turns_taken_from_the_same_anchor_state():
    # γ = 0.5, α = 0 (R = V), η = 1. Every first turn faces the same state s0 (system prompt + task).
    #   r0: s0 → sA, V = 1: Q = [0.5, 1]     r1: s0 → sA, V = 0: Q = [0, 0]
    #   r2: s0, V = 1 (answers at once): Q = [1]     r3: s0 → sB, V = 0: Q = [0, 0]
    # B.2: R = [1, 0, 1, 0] → A_g = [1, −1, 1, −1]
    # B.8, anchor s0: Q = [0.5, 0, 1, 0], Q̄ = 0.375, deviations 0.125, −0.375, 0.625, −0.375,
    #        σ² = (0.015625 + 0.140625 + 0.390625 + 0.140625) / 4 = 11/64, σ = √11/8
    #        → M = [1/√11, −3/√11, 5/√11, −3/√11]
    #      anchor sA: Q = [1, 0] → M = [1, −1];  anchor sB: r3 alone → M = 0
    # B.9 Ã = A_g + M
    def rollout(verifier, states):
        return Rollout(verifier, 0.0, tuple(Turn(cost=0.0, state=s) for s in states))

    group = RolloutGroup(task="q8", rollouts=(rollout(1.0, ("s0", "sA")), rollout(0.0, ("s0", "sA")),
                                              rollout(1.0, ("s0",)), rollout(0.0, ("s0", "sB"))))
    r11 = math.sqrt(11)
    assert as_lists(turn_advantages(config("gigpo", discount=0.5, alpha=0.0), group)) == approx_rows(
        [[1 + 1 / r11, 2.0], [-1 - 3 / r11, -2.0], [1 + 5 / r11], [-1 - 3 / r11, -1.0]])
    # η = 0 leaves A_g: GiGPO reduces to GRPO; a group without anchor states is refused
    assert as_lists(turn_advantages(config("gigpo", anchor_weight=0.0), group)) == as_lists(
        turn_advantages(config("grpo"), group))
    with pytest.raises(ValueError, match="gigpo needs every turn's state"):
        turn_advantages(config("gigpo"), example_group())
