"""params.yaml's `arena` section (issue 39, items 3–4): every method on one pool — the RouteLLM GSM8K
table's GPT-4-1106 and Mixtral-8x7B, priced by configs/prices/routellm-2024.yaml — under one protocol:
one seeded split by query (routerops/splits.py), every fit on train, every choice (a router's λ, the
cascade's threshold, a verdict threshold) on val, the test queries read once.

`load_arena_run` also reads the `critique_lm` section (the LM controllers run with its settings, on the
arena's split) and `track` (where MLflow lives)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from routerops.config import TrackConfig, load_prices, load_section, reject_shared_keys
from routerops.errors import InputError
from routerops.files import read_yaml_mapping

SECTION = "arena"
DEFAULT_ROUTERS = ("logistic", "knn", "mf", "mlp", "knn_smollm2", "mtrouter")


@dataclass(frozen=True)
class SplitSettings:
    seed: int = 0  # the permutation's seed; 0 and (0.6, 0.2, 0.2) are critique_lm.protocol's, so its
    fractions: tuple[float, float, float] = (0.6, 0.2, 0.2)  # test queries are the arena's
    min_test_queries: int = 260  # refuse a split whose test part is smaller (issue 39: test ≥ 260)


@dataclass(frozen=True)
class LMSettings:
    """The LM controllers of 002 / 003 (evaluation/critique_lm.py, the `critique_lm` section's training
    settings) re-run on the arena's split, one cached output per (controller, seed)."""

    critique: bool = True  # critique-and-route (002): warm-up (SFT start), RL with ξ, greedy + fitted τ
    corl: bool = True  # CoRL (003): one controller, three budget modes
    seeds: tuple[int, ...] = (0,)
    # The first N test queries (the split's permutation order: a seeded random subset), 0 = all. The LM
    # rows are paired with every reference on those same queries. CPU cut: 24.
    eval_queries: int = 24


@dataclass(frozen=True)
class OrchestratorSettings:
    """The hook for Uno-Orchestra (004) on this pool: it needs the pool's replay endpoints (issue 39,
    items 1–2). With run: false the arena lists the family as not run, with `reason`."""

    run: bool = False
    reason: str = "needs the replay endpoints of issue 39 items 1-2 (the pool over HTTP); not built on this branch"


@dataclass(frozen=True)
class ArenaConfig:
    table: str = "datasets/routellm/gsm8k_responses.csv"
    contaminated: str = "datasets/routellm/gsm8k_contaminated_prompts.jsonl"
    fewshot: str = "datasets/gsm8k/train_first8.jsonl"
    price_book: str = "configs/prices/routellm-2024.yaml"  # the top-level prices.replay (not a key here)
    split: SplitSettings = field(default_factory=SplitSettings)
    seeds: tuple[int, ...] = (0,)  # routers' and random policies' seeds (a row is the mean over them)
    random_mixes: tuple[float, ...] = (0.1, 0.25, 0.5, 0.75)  # the strong worker's share of random routing
    routers: tuple[str, ...] = DEFAULT_ROUTERS  # models/registry.py names
    # A router's λ (the cascade's threshold) is chosen on val: the cheapest knob whose val accuracy
    # reaches this fraction of the strong worker's val accuracy (RouteLLM's CPT / the replay's cost95).
    strong_fraction: float = 0.95
    knob_points: int = 101  # points of each router's knob sweep
    bootstrap: int = 1000  # paired bootstrap resamples of the test queries
    constant_share: float = 0.9  # a row taking one action on more than this share of test queries is constant
    lm: LMSettings = field(default_factory=LMSettings)
    orchestrator: OrchestratorSettings = field(default_factory=OrchestratorSettings)

    def validate(self, source: str) -> None:
        f = self.split.fractions
        if any(x <= 0 for x in f) or abs(sum(f) - 1) > 1e-6:
            raise InputError(source, f"{SECTION}.split.fractions", "expected 3 positive shares summing to 1")
        if not self.seeds or not self.lm.seeds:
            raise InputError(source, f"{SECTION}.seeds", "name at least one seed")
        if any(not 0 < m < 1 for m in self.random_mixes):
            raise InputError(source, f"{SECTION}.random_mixes", "each share must lie strictly between 0 and 1")
        if not 0 < self.strong_fraction <= 1 or not 0.5 <= self.constant_share < 1:
            raise InputError(source, f"{SECTION}.strong_fraction", "must be in (0, 1] (constant_share in [0.5, 1))")
        if self.bootstrap < 10 or self.knob_points < 3 or self.lm.eval_queries < 0:
            raise InputError(source, f"{SECTION}.bootstrap",
                             "bootstrap ≥ 10, knob_points ≥ 3, lm.eval_queries ≥ 0")


@dataclass(frozen=True)
class ArenaRun:
    """What the arena pipeline reads: its section, the LM controllers' and tracking's."""

    arena: ArenaConfig
    critique_lm: object  # models.critique.lm_config.CritiqueLMConfig (with the arena's split)
    track: TrackConfig
    source: str = "params.yaml"


def arena_config(raw, source: str = "params.yaml") -> ArenaConfig:
    cfg = load_section(ArenaConfig, raw, source, SECTION)
    cfg.validate(source)
    return cfg


def load_arena_run(path: str | Path = "params.yaml") -> ArenaRun:
    """The arena's config; the `critique_lm` section with its split set to the arena's (a warning-free
    override: the LM rows must be judged on the arena's test queries)."""
    from models.critique.lm_config import critique_lm_config

    raw = read_yaml_mapping(path)
    reject_shared_keys(raw.get(SECTION), path, SECTION)
    reject_shared_keys(raw.get("critique_lm"), path, "critique_lm")
    cfg = dataclasses.replace(arena_config(raw.get(SECTION), str(path)), price_book=load_prices(path).replay)
    lm = critique_lm_config(raw.get("critique_lm"), source=str(path))
    protocol = dataclasses.replace(lm.protocol, split_seed=cfg.split.seed, fractions=tuple(cfg.split.fractions),
                                   eval_queries=cfg.lm.eval_queries)
    lm = dataclasses.replace(lm, table=cfg.table, contaminated=cfg.contaminated, fewshot=cfg.fewshot,
                             price_book=cfg.price_book, protocol=protocol)
    track = load_section(TrackConfig, raw.get("track"), str(path), "track")
    return ArenaRun(cfg, lm, track, str(path))
