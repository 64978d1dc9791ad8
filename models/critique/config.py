"""params.yaml's `critique` section: the critique-and-route controller (paper 002) and CoRL's budget
modes (paper 003), trained and evaluated on logged outcomes.

Paper values are the defaults where they carry over to a small policy over frozen embeddings (T, G,
γ, ξ, ρ, the reward weights, CoRL's clip ratio, KL coefficient and budgets' roles); where the paper's
value belongs to its LLM (learning rate 1e-6, 400 iterations of 128 queries on 4 H100s) ours is
stated beside it. configs/paper/critique.yaml holds the paper's own numbers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routerops.config import load_prices, reject_shared_keys, section_from_mapping
from routerops.errors import InputError
from routerops.files import read_yaml_mapping

SECTION = "critique"
MODES = ("low", "medium", "high")  # CoRL §3.3 eq. 8: the budget level named in the controller's input


@dataclass(frozen=True)
class PolicySettings:
    """The controller: an MLP over frozen features of (question, current draft, its author, turn)."""

    hidden: int = 64  # hidden units of the one-hidden-layer MLP (ours; the paper's controller is a 4-7B LLM)
    lr: float = 3e-3  # Adam step (paper 002 Table 9: 1e-6, for full fine-tuning of an LLM)
    value_lr: float = 1e-2  # CoRL's value head (paper 003 §4.2: 10× the policy's, 1e-5 vs 1e-6)
    weight_decay: float = 1e-4

    def validate(self, source: str, where: str) -> None:
        _positive(self.hidden, source, f"{where}.hidden")
        for name in ("lr", "value_lr"):
            _positive(getattr(self, name), source, f"{where}.{name}")
        if self.weight_decay < 0:
            raise InputError(source, f"{where}.weight_decay", "must be ≥ 0")


@dataclass(frozen=True)
class GRPOSettings:
    """Tree GRPO of paper 002 Algorithm 1 (App. E.2) with the modified reward of eq. 3."""

    horizon: int = 3  # T, maximum turns (002 Table 9)
    group: int = 4  # G, actions sampled per tree node (002 Table 9)
    gamma: float = 1.0  # discount γ (002 Table 9; Prop. 3.1 assumes γ = 1)
    batch: int = 128  # |D_b| queries per iteration (002 Table 9)
    iterations: int = 300  # S (002 Table 9: 400 / 600 for the LLM controllers)
    routing_weight: float = 0.5  # eq. 1: r = 0.5 R_r + 0.5 R_v
    xi: tuple = (0.25, 0.125, 0.0)  # Lagrange multipliers ξ_k by strength rank, strongest first (Table 9)
    rho: tuple = (0.25, 0.5, 1.0)  # usage budgets ρ_k, strongest first (§4 "Resource Constraints")
    # Beyond the paper (it keeps ξ fixed, Prop. 3.1): η of a third controller trained with dual ascent
    # ξ_k ← [ξ_k + η(u_k − ρ_k)]₊ on the sampled usage share u_k, from the paper's ξ; 0 leaves it out.
    multiplier_lr: float = 0.2

    def validate(self, source: str, where: str) -> None:
        for name in ("horizon", "group", "batch", "iterations"):
            _positive(getattr(self, name), source, f"{where}.{name}")
        if self.horizon < 2:
            raise InputError(source, f"{where}.horizon", "needs ≥ 2 turns: route, then verify")
        if self.group < 2:
            raise InputError(source, f"{where}.group", "GRPO needs a group of ≥ 2 actions per node")
        if not 0 < self.gamma <= 1:
            raise InputError(source, f"{where}.gamma", "must be in (0, 1]")
        if not 0 <= self.routing_weight <= 1:
            raise InputError(source, f"{where}.routing_weight", "must be in [0, 1]")
        for name in ("xi", "rho"):
            values = getattr(self, name)
            if not values or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values):
                raise InputError(source, f"{where}.{name}", "expected a non-empty list of numbers ≥ 0")
        if len(self.xi) != len(self.rho):
            raise InputError(source, f"{where}.rho", f"has {len(self.rho)} entries, xi has {len(self.xi)}")
        if any(r > 1 for r in self.rho):
            raise InputError(source, f"{where}.rho", "usage budgets are shares of calls, at most 1")
        if self.multiplier_lr < 0:
            raise InputError(source, f"{where}.multiplier_lr", "must be ≥ 0")


@dataclass(frozen=True)
class CorlSettings:
    """CoRL (paper 003 §3): one controller, the budget mode in its input, reward r_p × r_c against B."""

    budgets: tuple = (0.001, 0.02, 1000.0)  # cost budget B (USD per query) of low / medium / high
    iterations: int = 300  # PPO iterations (003 App. A: 500 steps of batch 512 for the LLM)
    batch: int = 256  # queries per iteration, each with a uniformly drawn mode (003 §3.3)
    epochs: int = 4  # PPO epochs over each batch
    clip: float = 0.2  # ε of eq. 4 (003 App. A)
    kl: float = 0.001  # KL coefficient to the reference policy (003 App. A)
    gamma: float = 1.0  # GAE γ (the values are lost from our copy of 003 §4.2; Search-R1's, which it follows)
    lam: float = 1.0  # GAE λ (same)
    value_coef: float = 0.5  # weight of the value head's squared error

    def validate(self, source: str, where: str) -> None:
        if len(self.budgets) != len(MODES) or not all(isinstance(b, (int, float)) and b > 0 for b in self.budgets):
            raise InputError(source, f"{where}.budgets", f"expected {len(MODES)} positive numbers (low, medium, high)")
        if list(self.budgets) != sorted(self.budgets):
            raise InputError(source, f"{where}.budgets", "must be ordered low ≤ medium ≤ high")
        for name in ("iterations", "batch", "epochs"):
            _positive(getattr(self, name), source, f"{where}.{name}")
        if not 0 < self.clip < 1:
            raise InputError(source, f"{where}.clip", "must be in (0, 1)")
        for name in ("kl", "value_coef"):
            if getattr(self, name) < 0:
                raise InputError(source, f"{where}.{name}", "must be ≥ 0")
        for name in ("gamma", "lam"):
            if not 0 < getattr(self, name) <= 1:
                raise InputError(source, f"{where}.{name}", "must be in (0, 1]")


@dataclass(frozen=True)
class CritiqueConfig:
    """The whole `critique` section."""

    table: str = "datasets/routellm/gsm8k_responses.csv"  # RouteLLM's logged outcomes (Apache-2.0)
    contaminated: str = "datasets/routellm/gsm8k_contaminated_prompts.jsonl"
    fewshot: str = "datasets/gsm8k/train_first8.jsonl"  # RouteLLM's 8-shot prompt, for token estimates
    price_book: str = "configs/prices/routellm-2024.yaml"  # the top-level prices.replay (not a key here)
    k: int = 5  # cross-fit folds: every reported query is scored by a controller that never trained on it
    seeds: tuple = (0,)  # one controller per (seed, fold); the folds are evaluation.replay's for the seed
    baselines: tuple = ("random", "logistic", "cascade")  # single-turn routers on the same folds
    bootstrap: int = 200  # resamples for the APGR interval
    policy: PolicySettings = field(default_factory=PolicySettings)
    grpo: GRPOSettings = field(default_factory=GRPOSettings)
    corl: CorlSettings = field(default_factory=CorlSettings)

    def validate(self, source: str, where: str) -> None:
        if self.k < 2:
            raise InputError(source, f"{where}.k", "cross-fit needs k ≥ 2 folds")
        if not self.seeds or not all(isinstance(s, int) for s in self.seeds):
            raise InputError(source, f"{where}.seeds", "expected a non-empty list of integers")
        if self.bootstrap < 0:
            raise InputError(source, f"{where}.bootstrap", "must be ≥ 0")


def _positive(value: Any, source: str, where: str) -> None:
    if not value > 0:
        raise InputError(source, where, f"must be > 0, got {value!r}")


NESTED = {"policy": PolicySettings, "grpo": GRPOSettings, "corl": CorlSettings}


def critique_config(raw: Mapping[str, Any] | None, source: str = "params.yaml") -> CritiqueConfig:
    """CritiqueConfig from the `critique` mapping: unknown keys and wrong types raise InputError."""
    raw = {} if raw is None else raw
    if not isinstance(raw, Mapping):
        raise InputError(source, SECTION, "expected a mapping")
    top = section_from_mapping(CritiqueConfig, {k: v for k, v in raw.items() if k not in NESTED}, source, SECTION)
    nested = {name: section_from_mapping(cls, raw.get(name), source, f"{SECTION}.{name}") for name, cls in NESTED.items()}
    return dataclasses.replace(top, **nested)


def load_critique_config(path: str | Path = "params.yaml") -> CritiqueConfig:
    """The `critique` section, priced by the top-level `prices.replay` book."""
    raw = read_yaml_mapping(path).get(SECTION)
    reject_shared_keys(raw, path, SECTION)
    return dataclasses.replace(critique_config(raw, source=str(path)), price_book=load_prices(path).replay)


def with_overrides(config: CritiqueConfig, **sections: Mapping[str, Any]) -> CritiqueConfig:
    """A copy with some nested settings replaced, e.g. with_overrides(cfg, grpo={"iterations": 5})."""
    changes = {name: dataclasses.replace(getattr(config, name), **values) for name, values in sections.items()}
    return dataclasses.replace(config, **changes)
