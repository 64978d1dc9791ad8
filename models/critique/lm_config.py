"""params.yaml's `critique_lm` section: the critique-and-route controller (paper 002) and CoRL's budget
modes (paper 003) with a *language model* as the controller, trained by the orchestrator's RL core
(models/orchestrator/rl.py) on RouteLLM's GSM8K logged outcomes.

The defaults are the CPU cut (SmolLM2-135M-Instruct, two shared cores): what is cut is a value here,
never a code path, and the README says which. configs/paper/critique.yaml holds the paper's scale
(full templates, a 7B controller on CUDA, 002 Table 9), which refuses to run without CUDA.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from models.critique.lm_prompts import TEMPLATES
from models.orchestrator.config import GenerationSettings, ModelSpec, SFTSettings
from models.orchestrator.rl import RLSettings
from routerops.config import load_prices, reject_shared_keys, section_from_mapping
from routerops.errors import InputError
from routerops.files import read_yaml_mapping

SECTION = "critique_lm"
STOP_READINGS = ("zero", "kept_draft")  # R_r of a stop (verdict True): see PromptSettings / rewards


@dataclass(frozen=True)
class PromptSettings:
    """What the controller reads and may write (002 App. B Table 8; 003 §3.3 eq. 8)."""

    # "full": Table 8's Templates I/II word for word (the paper). "short": the same rules and output
    # format in about a third of the tokens (lm_prompts.TEMPLATE_*_SHORT). CPU cut.
    template: str = "short"

    # The draft in Template II's state is cut to its last N tokens (0 = whole draft, the paper). The end
    # of a GSM8K draft holds its final answer and last steps; CPU cut.
    draft_tail_tokens: int = 32
    # The <checking> text of the warm-up targets is at most this many words (0 = no cap). CPU cut.
    max_checking_words: int = 6
    # Agents' names as the prompt shows them: the worker name after its last "/" (the paper shows
    # model names such as Qwen2.5-7B-Instruct).
    short_names: bool = True

    def validate(self, source: str, where: str) -> None:
        if self.template not in TEMPLATES:
            raise InputError(source, f"{where}.template", f"{self.template!r} is not one of {TEMPLATES}")
        for name in ("draft_tail_tokens", "max_checking_words"):
            if getattr(self, name) < 0:
                raise InputError(source, f"{where}.{name}", "must be ≥ 0 (0 = no cut)")


@dataclass(frozen=True)
class RewardSettings:
    """Eq. 1 / eq. 3 of 002, the readings the paper leaves open as switches, and the multipliers."""

    routing_weight: float = 0.5  # eq. 1: r = 0.5·R_r + 0.5·R_v
    xi: tuple = (0.25, 0.125, 0.0)  # ξ_k by strength rank, strongest first (Table 9); 2 agents: (0.25, 0)
    rho: tuple = (0.25, 0.5, 1.0)  # ρ_k, strongest first (§4 "Resource Constraints")
    # R_r of a stop (verdict True). "zero": §3.2 sets a component that does not apply to zero, and a
    # stop routes nowhere (the paper's reading). "kept_draft": a stop "routes" to the draft it keeps,
    # R_r = 1(that draft is correct).
    stop_routing: str = "zero"
    # A verdict turn on the strongest agent's draft. False (default): the strongest agent's draft ends
    # the episode, as Template II can only route to a stronger agent and App. A.4 does not verify the
    # strongest agent's drafts. True: the controller writes a verdict on it too and earns R_v.
    verify_strongest: bool = False
    # Subtracted from a malformed turn's reward (ours: the paper trains from a base model without a
    # format term). A malformed turn then acts as the fallback (turn 1: the weakest agent; later: stop).
    malformed_penalty: float = 0.5
    # Ours, beyond the paper (it keeps ξ fixed, Prop. 3.1): dual ascent ξ_k ← [ξ_k + η(u_k − ρ_k)]₊ on
    # the sampled call share u_k after each RL step; 0 = fixed ξ as Table 9.
    multiplier_lr: float = 0.0

    def validate(self, source: str, where: str) -> None:
        if not 0 <= self.routing_weight <= 1:
            raise InputError(source, f"{where}.routing_weight", "must be in [0, 1]")
        for name in ("xi", "rho"):
            values = getattr(self, name)
            if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values):
                raise InputError(source, f"{where}.{name}", "expected a non-empty list of numbers ≥ 0")
        if len(self.xi) != len(self.rho):
            raise InputError(source, f"{where}.rho", f"has {len(self.rho)} entries, xi has {len(self.xi)}")
        if self.stop_routing not in STOP_READINGS:
            raise InputError(source, f"{where}.stop_routing", f"{self.stop_routing!r} is not one of {STOP_READINGS}")
        for name in ("malformed_penalty", "multiplier_lr"):
            if getattr(self, name) < 0:
                raise InputError(source, f"{where}.{name}", "must be ≥ 0")


@dataclass(frozen=True)
class TreeSettings:
    """Algorithm 1's rollout tree and the training schedule (002 Table 9 beside each CPU value)."""

    horizon: int = 3  # T (Table 9)
    group: int = 4  # G actions sampled per tree node (Table 9)
    gamma: float = 1.0  # γ (Table 9)
    queries_per_step: int = 2  # |D_b| (Table 9: 128). CPU cut
    steps: int = 4  # S (Table 9: 400 / 600). CPU cut
    # Controller conversations per RLTrainer.step: one rollout batch is cut into minibatches, each
    # prepared (old and reference log-probs) before the first update, PPO-style. Bounds the memory:
    # 16 conversations of ~300 tokens held ~13 GB on SmolLM2 (killed by the OOM killer, measured).
    minibatch: int = 4
    # Ours: the minibatches of one RL step accumulate into one AdamW update (RLTrainer.step_accumulated).
    # false = one update per minibatch (PPO-style epochs): a minibatch of 4 whose advantages all point one
    # way then takes a full Adam step; with 32 CoRL nodes that was 8 such steps, and the first RL step
    # moved every budget mode from 0.5–0.7 expert calls to 0 (measured, issue 24).
    accumulate: bool = True
    warmup_queries: int = 24  # train queries whose outcomes build the SFT format warm-up (0 = none)

    def validate(self, source: str, where: str) -> None:
        for name in ("horizon", "group", "queries_per_step", "steps", "minibatch"):
            if getattr(self, name) < 1:
                raise InputError(source, f"{where}.{name}", "must be ≥ 1")
        if self.horizon < 2:
            raise InputError(source, f"{where}.horizon", "needs ≥ 2 turns: route, then verify")
        if self.group < 2:
            raise InputError(source, f"{where}.group", "a group needs ≥ 2 actions per node")
        if not 0 < self.gamma <= 1:
            raise InputError(source, f"{where}.gamma", "must be in (0, 1]")
        if self.warmup_queries < 0:
            raise InputError(source, f"{where}.warmup_queries", "must be ≥ 0")


@dataclass(frozen=True)
class CorlLMSettings:
    """CoRL (003 §3.3): the budget mode in the prompt, self (the weak agent's logged answer) or the
    expert, r = r_p·1(cost ≤ B)."""

    # How B is set (models/critique/corl_budgets.py). "per_query" (default, issue 39 item 3): per (query,
    # mode) state drawn from the strong agent's training-cost spread so that mode m's budget binds on
    # `bind_shares[m]` of the queries. "fixed": `budgets` per mode (on this table a fixed B admits GPT-4
    # on almost every query or none: benchmarks/corl_budget_bound.py).
    budget_draw: str = "per_query"
    bind_shares: tuple = (0.9, 0.5, 0.1)  # low / medium / high: share of queries the expert's cost breaks B
    budgets: tuple = (0.001, 0.02, 1000.0)  # B (USD per query), low / medium / high, with budget_draw: fixed
    steps: int = 8  # RL steps (003 App. A: 500). CPU cut
    queries_per_step: int = 4  # each with a mode drawn uniformly (§3.3), or in every mode (paired_modes)
    # Ours: each drawn query in all three modes in the same step, so one update sees the same question
    # pushed towards "self" under low and towards the expert under high; with one mode per query (003
    # §3.3) the mode word only separates the decisions across steps, and a step whose signal is all
    # low-mode (expert over budget) moved every mode to "self" (issue 24's first CoRL run).
    paired_modes: bool = True
    # The warm-up's choice per (query, mode): "outcome" = the one that earns r_p·1(cost ≤ B) on that
    # training row (self on a tie: mostly self in every mode, so RL starts from a greedy "self" policy);
    # "balanced" = every (row, mode) prompt twice, once with each choice: the SFT loss is least at an even
    # prior in every mode, so the warm-up teaches the format and any ordering of the modes is RL's doing.
    # (Alternating choices by row instead left a greedy "expert" in every mode and 96 % expert samples at
    # T = 0.7 after 12 warm-up steps: no group had both actions, and RL never updated.)
    warmup_choice: str = "balanced"
    # RL learning rate of the CoRL controller (0: critique_lm.rl.learning_rate). Its decision is one
    # token after an even warm-up prior: at 2e-4 a single accumulated AdamW step took every budget mode
    # from 0.5–0.7 expert calls to 0 (low mode's "self" push is the larger shared direction), no group
    # had both actions afterwards and RL stopped (measured, issue 24). 003 App. A: 1e-6 (7B, full FT).
    learning_rate: float = 0.0
    # Ours: each mode's share of a step's advantage mass made equal (lm_train.mode_balance), so the mode
    # with the most disagreeing groups (low) does not set the direction the three prompts share.
    balance_modes: bool = True
    # G sampled decisions per (query, mode) (0: tree.group). Ours: CoRL's per-step signal comes from the
    # queries where the two agents' outcomes differ (~38 % of training rows): more queries at a smaller G
    # for the same rollouts cut how much one step's draw of queries decides its direction (issue 24: a
    # 6-query step with Mixtral right on 5 and GPT-4 wrong on 2 sent every mode towards "self").
    group: int = 0
    # Ours: per query, each choice's advantages centred across the three modes (lm_train.mode_contrast),
    # so RL learns how the modes differ and the shared level stays the warm-up's. Needs paired_modes.
    mode_contrast: bool = False
    # CoRL's own format warm-up: its training queries (-1: tree.warmup_queries) and SFT steps (0:
    # sft.max_steps). Its own because the critique warm-up grew to teach the verdict (200 queries, 100
    # steps) while CoRL's warm-up teaches only the format at an even prior (24 queries, 12 steps, measured).
    warmup_queries: int = -1
    warmup_steps: int = 0

    def validate(self, source: str, where: str) -> None:
        if self.warmup_queries < -1 or self.warmup_steps < 0:
            raise InputError(source, f"{where}.warmup_queries", "warmup_queries ≥ -1 and warmup_steps ≥ 0")
        if self.mode_contrast and not self.paired_modes:
            raise InputError(source, f"{where}.mode_contrast", "contrasts a query's modes: needs paired_modes: true")
        if self.group != 0 and self.group < 2:
            raise InputError(source, f"{where}.group", "a group needs ≥ 2 decisions per (query, mode); 0 = tree.group")
        if self.learning_rate < 0:
            raise InputError(source, f"{where}.learning_rate", "must be ≥ 0 (0: rl.learning_rate)")
        if self.warmup_choice not in ("outcome", "balanced"):
            raise InputError(source, f"{where}.warmup_choice", "expected outcome or balanced")
        if self.budget_draw not in ("per_query", "fixed"):
            raise InputError(source, f"{where}.budget_draw", f"{self.budget_draw!r} is not per_query or fixed")
        shares = self.bind_shares
        if len(shares) != 3 or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b <= 1
                                       for b in shares):
            raise InputError(source, f"{where}.bind_shares", "expected 3 shares in [0, 1] (low, medium, high)")
        if list(shares) != sorted(shares, reverse=True):
            raise InputError(source, f"{where}.bind_shares", "must bind least in high: low ≥ medium ≥ high")
        if len(self.budgets) != 3 or not all(isinstance(b, (int, float)) and b > 0 for b in self.budgets):
            raise InputError(source, f"{where}.budgets", "expected 3 positive numbers (low, medium, high)")
        if list(self.budgets) != sorted(self.budgets):
            raise InputError(source, f"{where}.budgets", "must be ordered low ≤ medium ≤ high")
        for name in ("steps", "queries_per_step"):
            if getattr(self, name) < 1:
                raise InputError(source, f"{where}.{name}", "must be ≥ 1")


@dataclass(frozen=True)
class ProtocolSettings:
    """A fixed, seeded split of the table by query; the test split is never trained or tuned on."""

    split_seed: int = 0
    fractions: tuple = (0.6, 0.2, 0.2)  # train / validation / test
    seeds: tuple = (0, 1, 2)  # training seeds (LoRA init, sampling, query order)
    eval_queries: int = 24  # test queries evaluated (the first of the split's fixed order; 0 = all). CPU cut
    bootstrap: int = 200
    # Ours: each critique controller is also evaluated with its verdict at a threshold on p(False) fitted
    # on as many validation rows as test rows evaluated, so that the strongest agent's share of calls
    # there is rewards.rho's (models/critique/verdict_threshold.py). Reported beside greedy, not instead.
    fitted_verdict: bool = True

    def validate(self, source: str, where: str) -> None:
        if len(self.fractions) != 3 or any(f <= 0 for f in self.fractions) or abs(sum(self.fractions) - 1) > 1e-6:
            raise InputError(source, f"{where}.fractions", "expected 3 positive shares summing to 1")
        if not self.seeds:
            raise InputError(source, f"{where}.seeds", "name at least one seed")
        if self.eval_queries < 0 or self.bootstrap < 0:
            raise InputError(source, f"{where}.eval_queries", "must be ≥ 0")


@dataclass(frozen=True)
class CritiqueLMConfig:
    """The whole `critique_lm` section."""

    table: str = "datasets/routellm/gsm8k_responses.csv"
    contaminated: str = "datasets/routellm/gsm8k_contaminated_prompts.jsonl"
    fewshot: str = "datasets/gsm8k/train_first8.jsonl"
    price_book: str = "configs/prices/routellm-2024.yaml"  # the top-level prices.replay (not a key here)
    model: ModelSpec = field(default_factory=ModelSpec)
    # How the controller decodes (orchestra.controller's keys). max_new_tokens caps a whole turn, the
    # <thinking>/<checking> text and the tags: a turn cut there is malformed (no closing tag). CPU cut:
    # 64; the paper: 2,048 (Table 9). 48 cut one warm-up rejection in ten (lm_train.fitted_verification).
    # temperature is set per use: rl.temperature for rollouts, 0 to evaluate.
    # params.yaml's critique_lm.generation holds the CPU cut (64 tokens, batch 8): one default per key, in code.
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    prompts: PromptSettings = field(default_factory=PromptSettings)
    rewards: RewardSettings = field(default_factory=RewardSettings)
    tree: TreeSettings = field(default_factory=TreeSettings)
    # The shared RL core's settings (orchestra.rl's keys): LoRA, clip ε, KL β, learning rate, device.
    # The CPU values (learning rate 2e-4, temperature 0.7, ...) are params.yaml's critique_lm.rl / .sft, the
    # paper's configs/paper/critique.yaml's: each default lives once, in RLSettings / SFTSettings.
    rl: RLSettings = field(default_factory=RLSettings)
    sft: SFTSettings = field(default_factory=SFTSettings)
    corl: CorlLMSettings = field(default_factory=CorlLMSettings)
    protocol: ProtocolSettings = field(default_factory=ProtocolSettings)
    source: str = SECTION  # the file it came from (not a params key)


NESTED = {"model": ModelSpec, "generation": GenerationSettings, "prompts": PromptSettings,
          "rewards": RewardSettings, "tree": TreeSettings, "rl": RLSettings, "sft": SFTSettings,
          "corl": CorlLMSettings, "protocol": ProtocolSettings}


def critique_lm_config(raw: Mapping[str, Any] | None, source: str = "params.yaml") -> CritiqueLMConfig:
    """CritiqueLMConfig from the `critique_lm` mapping: unknown keys and wrong types raise InputError.
    A nested section given in part keeps its class's defaults for the keys it leaves out (params.yaml holds the CPU values)."""
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise InputError(source, SECTION, "expected a mapping")
    defaults = CritiqueLMConfig()
    top = section_from_mapping(CritiqueLMConfig, {k: v for k, v in raw.items() if k not in NESTED and k != "source"},
                               source, SECTION)
    nested = {}
    for name, cls in NESTED.items():
        given = raw.get(name) or {}
        merged = {**{f.name: getattr(getattr(defaults, name), f.name) for f in dataclasses.fields(cls)}, **given}
        unknown = sorted(set(given) - set(merged) | (set(given) - {f.name for f in dataclasses.fields(cls)}))
        if unknown:
            raise InputError(source, f"{SECTION}.{name}.{unknown[0]}", "unknown key")
        nested[name] = section_from_mapping(cls, merged, source, f"{SECTION}.{name}")
    return dataclasses.replace(top, **nested, source=source)


def load_critique_lm_config(path: str | Path = "params.yaml") -> CritiqueLMConfig:
    """The `critique_lm` section, priced by the top-level `prices.replay` book."""
    raw = read_yaml_mapping(path).get(SECTION)
    reject_shared_keys(raw, path, SECTION)
    return dataclasses.replace(critique_lm_config(raw, source=str(path)), price_book=load_prices(path).replay)
