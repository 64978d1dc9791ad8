"""The advantage estimators of paper 004 App. B, each against an example computed by hand (the arithmetic
is in the comments; equation labels B.n follow models/orchestrator/advantages.py), plus the invariants of
group normalisation, the √c cost normaliser's rolling buffer, token spreading and config validation.

The examples compare with abs=1e-4: the hand arithmetic drops ε = 1e-6 from σ + ε, which moves no
value by more than ~2e-5 here (ε/σ ≤ 1e-5 for every σ below, times |A| ≤ 3)."""

from __future__ import annotations

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
    default = advantage_config({}, "params.yaml")
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
        advantage_config(raw, "params.yaml")


def test_bad_settings_and_groups_built_in_code_are_refused():
    with pytest.raises(InvalidSetting, match="AdvantageConfig.rho"):
        AdvantageConfig(rho=-1.0)
    with pytest.raises(InputError, match="orchestra.rl': expected a mapping"):
        advantage_config([("alpha", 0.1)], "params.yaml")
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
