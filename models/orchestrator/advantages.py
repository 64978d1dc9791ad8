"""Advantage estimators for the orchestrator's RL stage (paper 004, Uno-Orchestra, §4.1 and App. B).

Pure functions over one task's group of G rollouts; the RL trainer calls `turn_advantages` and spreads
the result onto the controller's tokens (`token_advantages`, `masked_token_advantages`).

App. B's displayed equations are unnumbered; we number them in order of appearance and cite them so:

    B.1  R_g  = V_g − α·C_g                       terminal score of rollout g (GRPO)
    B.2  A_g  = (R_g − R̄) / (σ_R + ε)             group-relative advantage over the G rollouts of a task
    B.3, B.4  the clipped ratio and objective (the trainer's, not here)
    B.5  T_b  = (R_b − R̄_B) / (σ_B + ε)           tree-GRPO: branch return against its sibling set B
    B.6  B_t  = (U_t − Ū) / (σ_U + ε)             MT-GRPO: group-normalised turn score
    B.7  Â_t  = A_g + ρ·B_t
    B.8  M_t  = (Q_t − Q̄_C) / (σ_Q + ε)           GiGPO: Q_t against the turns of its anchor group C
    B.9  Ã_t  = A_g + η·M_t
    B.10 S_t  = w_t·R_g + γ·V_t − α·C_t           Agentic-GRPO: shaped per-turn score
    B.11 D_t  = (S_t − S̄) / (σ_S + ε)
    B.12 A*_t = A_g + D_t

Where the paper says two things, both are here and App. B's form is the default:
- The terminal reward R_g (`reward`): App. B's B.1, R = V − α·C (`app_b`), or §4.1 eq. 5's verifier-
  gated R = b·[(1−α) + α(1−ĉ)] + (1−b)·S(τ), S(τ) ∈ [0, 0.10] (`eq5`). Both share α and the normalised
  cost ĉ = C (`CostNormaliser`); every estimator compares whichever R_g is chosen.
- Agentic-GRPO's turn credit (`turn_return`): App. B's B.10–B.12 (`b10`), or §4.2 eq. 6's discounted
  turn-level return R̃_t = γ^(T−t)·R + Σ_{s≥t} γ^(s−t)·r_s, standardised over comparable turns (`eq6`).
  The two γ differ: in B.10 γ weights the per-turn progress V_t (`gamma`); in eq. 6 it is a discount
  (`discount`, also GiGPO's discount of Q_t).
"""

from __future__ import annotations

import math
from collections import defaultdict, deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from routerops.config import section_from_mapping
from routerops.errors import InputError

ESTIMATORS = ("grpo", "tree_grpo", "mt_grpo", "gigpo", "agentic_grpo")
REWARDS = ("app_b", "eq5")  # B.1 or §4.1 eq. 5
TURN_RETURNS = ("b10", "eq6")  # Agentic-GRPO's turn credit: B.10–B.12 or §4.2 eq. 6
SCHEMA_BONUS_CAP = 0.10  # §4.1 eq. 5: S(τ) ∈ [0, 0.10] "keeps the verifier dominant"


class InvalidSetting(ValueError):
    """An AdvantageConfig value out of range; `advantage_config` re-raises it as an InputError naming
    the file and the key."""

    def __init__(self, key: str, problem: str):
        self.key = key
        self.problem = problem
        super().__init__(f"AdvantageConfig.{key}: {problem}")


@dataclass(frozen=True)
class AdvantageConfig:
    """Which estimator turns a group's scores into per-turn advantages, and its coefficients."""

    estimator: str = "agentic_grpo"  # App. B: Agentic-GRPO is the final Uno-Orchestra objective
    alpha: float = 0.1  # cost blend α: §5, App. A.2 and A.8 all give 0.1 (and §3 eq. 2 bounds it in [0, 1])
    # B.10's weight on per-turn verifier-confirmed progress V_t ∈ [0, 1]. The paper gives no value. 0.1
    # follows its rule for every other shaping term: bounded well below the verifier's unit scale so it
    # "cannot overpower the verifier" (§4.1: S(τ) ≤ 0.10; §4.2: |r_t| ≤ η ≪ 1).
    gamma: float = 0.1
    # B.7's mix of turn credit into the trajectory advantage. The paper gives no value. 1.0 weighs the
    # two unit-scale normalised terms equally, as B.12 does (A*_t = A_g + D_t has no coefficient).
    rho: float = 1.0
    group_size: int = 8  # G: §5, App. A.2 and A.8 give 8 rollouts per task
    cost_buffer: int = 1000  # episodes in the √c percentile buffer: App. A.2 and A.8 give 1,000
    # The percentile of √c that scales costs into [0, 1]. The paper names a "running percentile bracket"
    # (§4.1) as the "denominator" (App. A.2) but not which percentile. The 95th: costs vary by orders of
    # magnitude across (model, primitive) pairs (§3), so the maximum would let one outlier squash every
    # other cost towards 0, while the 95th still maps most rollouts below the clip at 1.
    cost_percentile: float = 95.0
    # The ε of B.2, B.5, B.6, B.11. The paper gives no value; 1e-6 keeps it negligible beside any σ that
    # unit-scale rewards produce, while bounding |A| when σ is tiny but not zero.
    epsilon: float = 1e-6
    # The terminal reward R_g every estimator compares: "app_b" (B.1, V − α·C) or "eq5" (§4.1 eq. 5).
    reward: str = "app_b"
    # eq5's S(τ) = schema_bonus × the share of the rollout's controller turns that were schema-valid
    # plan-and-route emissions (`Rollout.schema_share`), paid only when the verifier is unsatisfied
    # (b = 0). §4.1 caps S at 0.10; a larger value is refused. The paper gives S's form only as
    # "rewards schema-valid plan-and-route emissions"; the cap itself is the natural value.
    schema_bonus: float = 0.10
    # Agentic-GRPO's turn credit: "b10" (B.10–B.12, A*_t = A_g + D_t) or "eq6" (§4.2 eq. 6, Â_{i,t}).
    turn_return: str = "b10"
    # γ of eq. 6, discounting the terminal reward back to earlier turns, and GiGPO's discount of Q_t.
    # The paper gives none. 0.9: at Tmax = 8 the first turn of a full-length episode keeps 0.9^7 ≈ 0.48
    # of R, so early decisions are credited less than late ones but not silenced.
    discount: float = 0.9
    # η of eq. 6: the per-turn shaping r_t ∈ [−η, η] ("e.g. schema validity, repair indicator", bounded
    # by η ≪ 1 "so it cannot overpower the verifier"). The stage gives a malformed turn −η and every
    # other turn 0. The paper gives no value; 0.05 is half of eq. 5's cap on S, and more than 0.10 is
    # refused (the same bound §4.1 puts on every shaping term).
    shaping_bound: float = 0.05
    # B.9's η: how much of GiGPO's anchor-state advantage M_t joins A_g. The paper gives no value; 1.0
    # weighs the two unit-scale normalised terms equally, as B.12 does.
    anchor_weight: float = 1.0

    def __post_init__(self) -> None:
        problem = setting_problem(self)
        if problem is not None:
            raise InvalidSetting(*problem)


def setting_problem(config: AdvantageConfig) -> tuple[str, str] | None:
    """The first out-of-range setting as (key, problem), or None. Written as `not (ok)` so NaN fails."""
    if config.estimator not in ESTIMATORS:
        return "estimator", f"{config.estimator!r} is not one of {ESTIMATORS}"
    if not 0 <= config.alpha <= 1:
        return "alpha", f"{config.alpha} is not in [0, 1] (§3 eq. 2)"
    for name in ("gamma", "rho"):
        if not 0 <= getattr(config, name) < math.inf:
            return name, f"{getattr(config, name)} must be finite and ≥ 0"
    if not config.group_size >= 2:
        return "group_size", f"{config.group_size} must be ≥ 2 (one rollout has nothing to be compared with)"
    if not config.cost_buffer >= 1:
        return "cost_buffer", f"{config.cost_buffer} must be ≥ 1"
    if not 0 < config.cost_percentile <= 100:
        return "cost_percentile", f"{config.cost_percentile} is not in (0, 100]"
    if not 0 < config.epsilon < math.inf:
        return "epsilon", f"{config.epsilon} must be finite and > 0"
    if config.reward not in REWARDS:
        return "reward", f"{config.reward!r} is not one of {REWARDS}"
    if not 0 <= config.schema_bonus <= SCHEMA_BONUS_CAP:
        return "schema_bonus", f"{config.schema_bonus} is not in [0, {SCHEMA_BONUS_CAP}] (§4.1 eq. 5: S(τ) ≤ 0.10)"
    if config.turn_return not in TURN_RETURNS:
        return "turn_return", f"{config.turn_return!r} is not one of {TURN_RETURNS}"
    if config.turn_return == "eq6" and config.estimator != "agentic_grpo":
        return "turn_return", (f"eq6 is Agentic-GRPO's turn-level return (§4.2); estimator {config.estimator!r} "
                               "has no turn return to replace")
    if not 0 < config.discount <= 1:
        return "discount", f"{config.discount} is not in (0, 1]"
    if not 0 <= config.shaping_bound <= SCHEMA_BONUS_CAP:
        return "shaping_bound", (f"{config.shaping_bound} is not in [0, {SCHEMA_BONUS_CAP}] (§4.2: η ≪ 1; held to "
                                 "§4.1's cap on shaping)")
    if not 0 <= config.anchor_weight < math.inf:
        return "anchor_weight", f"{config.anchor_weight} must be finite and ≥ 0"
    return None


def advantage_config(raw: Mapping[str, Any] | None, source: str, where: str = "rl") -> AdvantageConfig:
    """AdvantageConfig from the RL mapping at `where` (the caller's section, e.g. "orchestra.rl") of file
    `source`: unknown keys, values of the wrong type and values out of range raise InputError naming
    `<where>.<key>`."""
    try:
        return section_from_mapping(AdvantageConfig, raw, source, where)
    except InvalidSetting as exc:
        raise InputError(source, f"{where}.{exc.key}", exc.problem) from exc


# ---------------------------------------------------------------------------------------------------
# The group: G rollouts of one task


@dataclass(frozen=True)
class Turn:
    """One controller turn a_t with its observation o_t (§3). Fields an estimator does not use may stay
    None; an estimator that needs one refuses a group that lacks it."""

    cost: float  # C_t ∈ [0, 1]: this turn's dispatch cost, normalised like C_g (`CostNormaliser`); B.10
    progress: float | None = None  # V_t ∈ [0, 1]: verifier-confirmed progress of this turn; B.10 (agentic_grpo)
    score: float | None = None  # U_t: turn score from the decision's downstream outcome; B.6 (mt_grpo)
    # w_t ∈ [0, 1]: the share of R_g allocated to this turn (B.10). The paper does not say how to
    # allocate; None on every turn of a rollout spreads R_g evenly, w_t = 1/T. A rollout's shares sum ≤ 1.
    credit: float | None = None
    # Action type, e.g. "plan", "route", "repair", "final_answer" (App. E modes). §4.2 standardises
    # Agentic-GRPO's turn scores over "comparable turns (same query, matched turn index and action type)".
    action: str = "turn"
    # tree_grpo: this turn's node in the rollout tree. Rollouts that share a prefix share its node ids
    # (and hence every earlier node); a branch is a node whose next turns differ across rollouts.
    node: str | None = None
    # r_t ∈ [−η, η] of eq. 6 (turn_return eq6): this turn's bounded shaping reward.
    shaping: float | None = None
    # gigpo: the anchor state the turn's action was taken from (B.8's "semantically equivalent anchor
    # states"): turns with equal keys faced the same state and are compared with each other.
    state: str | None = None


@dataclass(frozen=True)
class Rollout:
    """One trajectory τ of the task (§3 eq. 1)."""

    verifier: float  # V_g ∈ [0, 1]: the verifier or task-success score (B.1; §3: b ∈ {0, 1} or F1)
    cost: float  # C_g ∈ [0, 1]: the normalised resource term ĉ(τ) (B.1, §4.1), from `CostNormaliser`
    turns: tuple[Turn, ...]  # T ≥ 1 turns, in order
    # eq5: the share of the controller's turns that were schema-valid plan-and-route emissions, ∈ [0, 1]
    # (S(τ) = schema_bonus × this; needed only when the verifier is unsatisfied).
    schema_share: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", tuple(self.turns))


@dataclass(frozen=True)
class RolloutGroup:
    """The G rollouts of one task that the advantages compare (B.2: "only within the G rollouts of the
    same task"). Values are checked on construction; errors name the rollout and turn (0-based)."""

    rollouts: tuple[Rollout, ...]
    task: str = ""  # the task's id, for error messages

    def __post_init__(self) -> None:
        object.__setattr__(self, "rollouts", tuple(self.rollouts))
        for i, rollout in enumerate(self.rollouts):
            if not isinstance(rollout, Rollout):
                raise ValueError(f"{self.task or 'group'}: rollout {i} is a {type(rollout).__name__}, not a Rollout")
            check_rollout(rollout, f"{self.task or 'group'}: rollout {i}")


def check_unit(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ValueError(f"{where}: {value!r} is not a number in [0, 1]")


def check_rollout(rollout: Rollout, where: str) -> None:
    check_unit(rollout.verifier, f"{where} verifier V_g")
    check_unit(rollout.cost, f"{where} cost C_g (normalise raw costs with CostNormaliser)")
    if rollout.schema_share is not None:
        check_unit(rollout.schema_share, f"{where} schema_share")
    if not rollout.turns:
        raise ValueError(f"{where}: has no turns (a direct answer is one turn)")
    for t, turn in enumerate(rollout.turns):
        at = f"{where} turn {t}"
        check_unit(turn.cost, f"{at} cost C_t (normalise raw costs with CostNormaliser)")
        if turn.progress is not None:
            check_unit(turn.progress, f"{at} progress V_t")
        if turn.credit is not None:
            check_unit(turn.credit, f"{at} credit w_t")
        if turn.score is not None and (isinstance(turn.score, bool) or not isinstance(turn.score, (int, float))
                                       or not math.isfinite(turn.score)):
            raise ValueError(f"{at} score U_t: {turn.score!r} is not a finite number")
        for name in ("node", "state"):
            value = getattr(turn, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise ValueError(f"{at} {name}: {value!r} is not a non-empty string")
        if turn.shaping is not None and (isinstance(turn.shaping, bool) or not isinstance(turn.shaping, (int, float))
                                         or not math.isfinite(turn.shaping)):
            raise ValueError(f"{at} shaping r_t: {turn.shaping!r} is not a finite number")
    credits = [turn.credit for turn in rollout.turns]
    if any(c is None for c in credits) and any(c is not None for c in credits):
        raise ValueError(f"{where}: give credit w_t on every turn or on none (none = 1/T each)")
    if credits[0] is not None and sum(credits) > 1 + 1e-9:
        raise ValueError(f"{where}: credits w_t sum to {sum(credits):.6g} > 1; they share out part of R_g (B.10)")


def require_turn_field(group: RolloutGroup, name: str, symbol: str, estimator: str) -> None:
    for i, rollout in enumerate(group.rollouts):
        for t, turn in enumerate(rollout.turns):
            if getattr(turn, name) is None:
                raise ValueError(f"{group.task or 'group'}: rollout {i} turn {t}: {estimator} needs every "
                                 f"turn's {name} ({symbol}); this one has none")


# ---------------------------------------------------------------------------------------------------
# Normalisation, the one operation every estimator shares


def group_normalised(values: Sequence[float] | np.ndarray, epsilon: float) -> np.ndarray:
    """(x − x̄) / (σ + ε) over one comparison set: the shape of B.2, B.5, B.6 and B.11.

    σ is the population standard deviation (ddof = 0; the paper does not say which). When σ = 0 every
    member scored alike and the paper's formula gives 0 / ε = 0: no member is better than another. We
    return exact zeros there, so that rounding in x̄ (a mean of equal floats need not equal them) is
    not blown up by 1/ε. A set of one member is such a set."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"a comparison set must be a non-empty list of numbers, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError(f"a comparison set holds a non-finite value: {x.tolist()}")
    if np.ptp(x) == 0:
        return np.zeros_like(x)
    return (x - x.mean()) / (x.std() + epsilon)


def cohort_normalised(values: Sequence[np.ndarray], cohorts: Sequence[Sequence[Hashable]],
                      epsilon: float) -> tuple[np.ndarray, ...]:
    """Per-turn values normalised within cohorts: turn t of rollout i is compared with the turns that
    share its key cohorts[i][t] (e.g. the same turn index). Rollouts of different lengths simply leave
    later cohorts smaller; a cohort of one gets 0."""
    members: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for i, keys in enumerate(cohorts):
        for t, key in enumerate(keys):
            members[key].append((i, t))
    out = tuple(np.zeros(len(v)) for v in values)
    for cells in members.values():
        normalised = group_normalised([values[i][t] for i, t in cells], epsilon)
        for (i, t), a in zip(cells, normalised):
            out[i][t] = a
    return out


# ---------------------------------------------------------------------------------------------------
# The estimators: each maps a group to one array of per-turn advantages per rollout


def terminal_rewards(group: RolloutGroup, alpha: float) -> np.ndarray:
    """B.1: R_g = V_g − α·C_g for each rollout."""
    return np.array([r.verifier - alpha * r.cost for r in group.rollouts], dtype=np.float64)


def verifier_gated_rewards(group: RolloutGroup, alpha: float, schema_bonus: float = SCHEMA_BONUS_CAP) -> np.ndarray:
    """§4.1 eq. 5: R(τ) = b·[(1−α) + α(1−ĉ(τ))] + (1−b)·S(τ), S(τ) = schema_bonus × schema_share ∈ [0, 0.10].

    b = V(q, y) "thresholded into a binary correctness signal" (§3): b = 1 when V_g = 1 (our verifiers
    score exact match, and an episode succeeds at score 1, ExecutorConfig.success_threshold), else 0.
    The gate: a correct rollout earns between 1 − α and 1, less the more it spent; an incorrect one
    earns only S, never more than 0.10, whatever it spent — so a cheap wrong answer can never beat a
    correct one and the cost term never pays for being wrong."""
    if not 0 <= schema_bonus <= SCHEMA_BONUS_CAP:
        raise ValueError(f"schema_bonus {schema_bonus} is not in [0, {SCHEMA_BONUS_CAP}] (§4.1 eq. 5)")
    out = []
    for i, r in enumerate(group.rollouts):
        if r.verifier >= 1:
            out.append((1 - alpha) + alpha * (1 - r.cost))
            continue
        if r.schema_share is None:
            raise ValueError(f"{group.task or 'group'}: rollout {i}: eq5 needs the schema_share of a rollout the "
                             "verifier rejects (S(τ) of §4.1); this one has none")
        out.append(schema_bonus * r.schema_share)
    return np.array(out, dtype=np.float64)


def rewards(group: RolloutGroup, config: AdvantageConfig) -> np.ndarray:
    """R_g of `config.reward` for each rollout: B.1 (app_b) or §4.1 eq. 5 (eq5)."""
    if config.reward == "eq5":
        return verifier_gated_rewards(group, config.alpha, config.schema_bonus)
    return terminal_rewards(group, config.alpha)


def trajectory_advantages(group: RolloutGroup, config: AdvantageConfig) -> np.ndarray:
    """B.2: A_g, each rollout's terminal reward against the other rollouts of the same task."""
    return group_normalised(rewards(group, config), config.epsilon)


def grpo(group: RolloutGroup, config: AdvantageConfig) -> tuple[np.ndarray, ...]:
    """Uno-GRPO: "every turn in the same trajectory receives the same advantage" (App. B), A_g."""
    a_g = trajectory_advantages(group, config)
    return tuple(np.full(len(r.turns), a) for r, a in zip(group.rollouts, a_g))


def mt_grpo(group: RolloutGroup, config: AdvantageConfig) -> tuple[np.ndarray, ...]:
    """MT-GRPO: B.7, Â_t = A_g + ρ·B_t, with B.6's B_t normalising U_t over the group's turns at the same
    turn index (App. B, GiGPO paragraph: MT-GRPO's comparison set is "same task and same turn")."""
    require_turn_field(group, "score", "U_t", "mt_grpo")
    a_g = trajectory_advantages(group, config)
    scores = [np.array([turn.score for turn in r.turns], dtype=np.float64) for r in group.rollouts]
    b_t = cohort_normalised(scores, [range(len(r.turns)) for r in group.rollouts], config.epsilon)
    return tuple(a + config.rho * b for a, b in zip(a_g, b_t))


def discounted_outcomes(group: RolloutGroup, config: AdvantageConfig) -> tuple[np.ndarray, ...]:
    """γ^(T−t)·R_g for turn t = 1 … T of each rollout (γ = config.discount): the terminal reward seen
    from each turn, the first term of eq. 6 and GiGPO's local outcome Q_t (B.8: the return from the
    anchor state on, which with a terminal-only reward is the discounted terminal reward)."""
    return tuple(r_g * config.discount ** np.arange(len(r.turns) - 1, -1, -1, dtype=np.float64)
                 for r, r_g in zip(group.rollouts, rewards(group, config)))


def gigpo(group: RolloutGroup, config: AdvantageConfig) -> tuple[np.ndarray, ...]:
    """GiGPO: B.9, Ã_t = A_g + η·M_t, with B.8's M_t normalising Q_t = γ^(T−t)·R_g over the anchor group:
    every turn of the group, in any rollout and at any depth, taken from the same state (`Turn.state`).
    A turn whose state no other turn shares gets M_t = 0 and keeps A_g alone."""
    require_turn_field(group, "state", "its anchor state", "gigpo")
    a_g = trajectory_advantages(group, config)
    m_t = cohort_normalised(discounted_outcomes(group, config),
                            [[turn.state for turn in r.turns] for r in group.rollouts], config.epsilon)
    return tuple(a + config.anchor_weight * m for a, m in zip(a_g, m_t))


def turn_credits(rollout: Rollout) -> np.ndarray:
    """w_t of B.10: the rollout's own credits, or 1/T on each turn when it gives none."""
    if rollout.turns[0].credit is None:
        return np.full(len(rollout.turns), 1.0 / len(rollout.turns))
    return np.array([turn.credit for turn in rollout.turns], dtype=np.float64)


def shaped_turn_scores(group: RolloutGroup, config: AdvantageConfig) -> tuple[np.ndarray, ...]:
    """B.10: S_t = w_t·R_g + γ·V_t − α·C_t for every turn of every rollout."""
    return tuple(turn_credits(r) * r_g
                 + config.gamma * np.array([turn.progress for turn in r.turns], dtype=np.float64)
                 - config.alpha * np.array([turn.cost for turn in r.turns], dtype=np.float64)
                 for r, r_g in zip(group.rollouts, rewards(group, config)))


def turn_returns(group: RolloutGroup, config: AdvantageConfig) -> tuple[np.ndarray, ...]:
    """§4.2 eq. 6: R̃_{i,t} = γ^(T_i−t)·R(τ_i) + Σ_{s=t}^{T_i} γ^(s−t)·r_{i,s} for turn t = 1 … T_i, with
    r_{i,s} the turn's bounded shaping (`Turn.shaping`, |r| ≤ η = config.shaping_bound)."""
    require_turn_field(group, "shaping", "r_t", "eq6")
    out = []
    for (i, r), outcome in zip(enumerate(group.rollouts), discounted_outcomes(group, config)):
        shaping = np.array([turn.shaping for turn in r.turns], dtype=np.float64)
        if np.any(np.abs(shaping) > config.shaping_bound + 1e-12):
            raise ValueError(f"{group.task or 'group'}: rollout {i}: shaping r_t {shaping.tolist()} exceeds "
                             f"η = {config.shaping_bound} (§4.2 eq. 6: r_t ∈ [−η, η])")
        to_go = np.zeros(len(shaping))  # Σ_{s≥t} γ^(s−t) r_s, accumulated from the last turn back
        running = 0.0
        for t in range(len(shaping) - 1, -1, -1):
            running = shaping[t] + config.discount * running
            to_go[t] = running
        out.append(outcome + to_go)
    return tuple(out)


def agentic_grpo(group: RolloutGroup, config: AdvantageConfig) -> tuple[np.ndarray, ...]:
    """Agentic-GRPO / Uno-RL over comparable turns: same task, turn index and action type (§4.2, under
    eq. 6; App. A.2's "(query, turn) cohort" when all turns share one action type).

    turn_return "b10": B.12, A*_t = A_g + D_t, with B.11's D_t normalising B.10's S_t in the cohort.
    turn_return "eq6": §4.2 eq. 6, Â_{i,t} = (R̃_{i,t} − μ_{q,t}) / (σ_{q,t} + ε), the advantage eq. 7
    uses as it is (no A_g). A cohort of one gets 0, so with eq6 a turn is only ever compared with turns
    of its own kind: a direct answer with direct answers, a plan with plans."""
    cohorts = [[(t, turn.action) for t, turn in enumerate(r.turns)] for r in group.rollouts]
    if config.turn_return == "eq6":
        return cohort_normalised(turn_returns(group, config), cohorts, config.epsilon)
    require_turn_field(group, "progress", "V_t", "agentic_grpo")
    a_g = trajectory_advantages(group, config)
    d_t = cohort_normalised(shaped_turn_scores(group, config), cohorts, config.epsilon)
    return tuple(a + d for a, d in zip(a_g, d_t))


def tree_paths(group: RolloutGroup) -> list[tuple[str, ...]]:
    """Each rollout's node ids, root first, checked to form a tree whose leaves are the rollouts."""
    require_turn_field(group, "node", "its tree node id", "tree_grpo")
    paths = [tuple(turn.node for turn in r.turns) for r in group.rollouts]
    prefix_of: dict[str, tuple[tuple[str, ...], int]] = {}
    for i, path in enumerate(paths):
        for depth, node in enumerate(path):
            seen = prefix_of.setdefault(node, (path[:depth], i))
            if seen[0] != path[:depth]:
                # Sharing a turn means sharing the context it was sampled under: every earlier turn.
                raise ValueError(f"{group.task or 'group'}: node {node!r} follows {list(seen[0])} in rollout "
                                 f"{seen[1]} but {list(path[:depth])} in rollout {i}; a shared node needs a "
                                 "shared prefix")
    for i, path in enumerate(paths):
        for j, other in enumerate(paths):
            if i != j and path[-1] in other:
                # Two rollouts ending on one node would be one trajectory; a rollout cannot continue
                # past another's final answer.
                raise ValueError(f"{group.task or 'group'}: rollout {i} ends at node {path[-1]!r}, which "
                                 f"rollout {j} also passes through; each rollout must end at its own leaf")
    return paths


def branch_signals(paths: Sequence[tuple[str, ...]], rewards: np.ndarray, epsilon: float) -> dict[str, float]:
    """The advantage of every node of the rollout tree (App. B, tree-GRPO).

    A node's return R_b is the mean terminal reward of the rollouts through it (the paper does not say
    how a branch's return aggregates its leaves; the mean is the Monte-Carlo estimate of its return).
    Where a parent branches, each child gets B.5's T_b against its siblings. A child with no sibling
    lies on its parent's unbranched prefix and keeps the parent's signal: "tokens before the branch
    receive the prefix-level signal, while tokens after the branch receive the sibling advantage T_b".
    The task itself is the root's parent, so several independently sampled first turns are siblings
    (independent rollouts reduce to GRPO's A_g), and one shared first turn gets 0: within its task
    nothing was sampled to compare it with."""
    through: dict[str, list[float]] = defaultdict(list)
    children: dict[str | None, list[str]] = defaultdict(list)
    for path, reward in zip(paths, rewards):
        for depth, node in enumerate(path):
            through[node].append(float(reward))
            parent = path[depth - 1] if depth else None
            if node not in children[parent]:
                children[parent].append(node)
    signal: dict[str, float] = {}
    pending: list[tuple[str | None, float]] = [(None, 0.0)]
    while pending:
        parent, inherited = pending.pop()
        kids = children.get(parent, [])
        if parent is None or len(kids) >= 2:
            values = group_normalised([np.mean(through[kid]) for kid in kids], epsilon)
        else:
            values = np.full(len(kids), inherited)
        for kid, value in zip(kids, values):
            signal[kid] = float(value)
            pending.append((kid, float(value)))
    return signal


def tree_grpo(group: RolloutGroup, config: AdvantageConfig) -> tuple[np.ndarray, ...]:
    """Uno-tree-GRPO: each turn gets the signal of the tree node it is (`branch_signals`). A node shared
    by several rollouts appears in each with the same value; the trainer decides whether its tokens
    enter the loss once or once per rollout."""
    paths = tree_paths(group)
    signal = branch_signals(paths, rewards(group, config), config.epsilon)
    return tuple(np.array([signal[node] for node in path], dtype=np.float64) for path in paths)


ESTIMATOR_FUNCTIONS: dict[str, Callable[[RolloutGroup, AdvantageConfig], tuple[np.ndarray, ...]]] = {
    "grpo": grpo, "tree_grpo": tree_grpo, "mt_grpo": mt_grpo, "gigpo": gigpo, "agentic_grpo": agentic_grpo}


def turn_advantages(config: AdvantageConfig, group: RolloutGroup) -> tuple[np.ndarray, ...]:
    """Per rollout, per turn, the advantage of `config.estimator`: out[i][t] is A for turn t of rollout
    i of the group. The group must hold exactly G = config.group_size rollouts; a tree (tree_grpo) at
    most G leaves, since a root that ends before its branch point is one leaf (Executor.run_tree)."""
    n = len(group.rollouts)
    if n != config.group_size and not (config.estimator == "tree_grpo" and 1 <= n <= config.group_size):
        raise ValueError(f"{group.task or 'group'}: {n} rollouts, but the config's group size G is {config.group_size}")
    return ESTIMATOR_FUNCTIONS[config.estimator](group, config)


# ---------------------------------------------------------------------------------------------------
# The cost term (§4.1, App. A.2, A.8)


class CostNormaliser:
    """ĉ(τ) ∈ [0, 1] of §4.1: √c(τ) divided by a percentile of √c over the most recent `buffer_size`
    completed episodes, clipped at 1 (App. A.2: "whose denominator tracks rolling percentiles of √c(τ)
    over the most recent 1,000 completed RL episodes"). The square root compresses costs that span
    orders of magnitude across (model, primitive) pairs (§3); the rolling percentile keeps the scale
    current as the policy learns to spend less.

    Feed each step's finished episodes with `update` (raw costs, e.g. USD), then `normalise` them and
    their turns' costs. Percentiles interpolate linearly between buffered values (numpy's default)."""

    def __init__(self, buffer_size: int = 1000, percentile: float = 95.0):
        if isinstance(buffer_size, bool) or not isinstance(buffer_size, int) or buffer_size < 1:
            raise ValueError(f"CostNormaliser buffer_size: {buffer_size!r} must be an int ≥ 1")
        if not 0 < percentile <= 100:
            raise ValueError(f"CostNormaliser percentile: {percentile!r} is not in (0, 100]")
        self.percentile = float(percentile)
        self.root_costs: deque[float] = deque(maxlen=buffer_size)  # √c of recent episodes, oldest first

    @classmethod
    def for_config(cls, config: AdvantageConfig) -> CostNormaliser:
        return cls(config.cost_buffer, config.cost_percentile)

    def __len__(self) -> int:
        return len(self.root_costs)

    def update(self, costs: Iterable[float]) -> None:
        """Add completed episodes' raw costs; beyond `buffer_size` the oldest fall out."""
        roots = [math.sqrt(checked_cost(c)) for c in np.atleast_1d(np.asarray(costs, dtype=np.float64))]
        self.root_costs.extend(roots)

    def scale(self) -> float:
        """The denominator: the configured percentile of the buffered √c."""
        if not self.root_costs:
            raise ValueError("CostNormaliser has no episodes yet: update() it with completed episodes' costs "
                             "before normalise()")
        return float(np.percentile(np.fromiter(self.root_costs, dtype=np.float64), self.percentile))

    def normalise(self, cost: float) -> float:
        """min(1, √cost / scale). With a zero scale (every buffered episode was free), a free cost is 0
        and any other is clipped to 1."""
        root, scale = math.sqrt(checked_cost(cost)), self.scale()
        if scale == 0:
            return 0.0 if root == 0 else 1.0
        return min(1.0, root / scale)


def checked_cost(cost: Any) -> float:
    if isinstance(cost, bool) or not isinstance(cost, (int, float, np.floating, np.integer)) \
            or not 0 <= cost < math.inf:
        raise ValueError(f"a cost must be a finite number ≥ 0, got {cost!r}")
    return float(cost)


# ---------------------------------------------------------------------------------------------------
# From turns to tokens (§4.2 eq. 7; 003 eq. 2; 004 App. A.8 / E)


def token_advantages(advantages: Sequence[float], controller_tokens: Sequence[int]) -> np.ndarray:
    """One rollout's advantages on its controller tokens, in order: token ℓ of turn t carries A_t (eq. 7
    writes Â_{i,t(ℓ)}). The value is repeated, not divided by the turn's length: eq. 7 sums the clipped
    term over tokens, and any length normalisation is the loss's business. Observation tokens are not in
    this array (they carry no advantage); `masked_token_advantages` lays them out too."""
    adv = np.asarray(advantages, dtype=np.float64)
    if adv.ndim != 1 or len(adv) != len(controller_tokens):
        raise ValueError(f"{len(controller_tokens)} turn token counts for {adv.size} turn advantages")
    for t, n in enumerate(controller_tokens):
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ValueError(f"turn {t}: controller token count {n!r} is not an int ≥ 0")
    return np.repeat(adv, np.asarray(controller_tokens, dtype=np.int64))


def masked_token_advantages(advantages: Sequence[float], assistant_masks: Sequence[int]) -> np.ndarray:
    """Advantages over a whole tokenised conversation, given its assistant mask (1 on the controller's
    tokens, as sft_data.tokenize_conversation builds it: SFT and RL train the same positions, §4.2).
    The k-th run of 1s is the controller's k-th turn and carries A_k; every masked token (system, task,
    observations, template) carries 0."""
    mask = np.asarray(assistant_masks)
    if mask.ndim != 1 or not np.isin(mask, (0, 1)).all():
        raise ValueError("the assistant mask must be a list of 0s and 1s")
    starts = np.flatnonzero(np.diff(np.concatenate(([0], mask))) == 1)
    ends = np.flatnonzero(np.diff(np.concatenate((mask, [0]))) == -1) + 1
    if len(starts) != len(advantages):
        raise ValueError(f"the mask has {len(starts)} controller turns but there are {len(advantages)} turn "
                         "advantages (a truncated conversation needs its advantages truncated too)")
    out = np.zeros(mask.size, dtype=np.float64)
    for start, end, a in zip(starts, ends, np.asarray(advantages, dtype=np.float64)):
        out[start:end] = a
    return out
