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
    """Uno-Orchestra (004) on this pool (evaluation/arena_orchestra.py, stage `arena-orchestra`): tasks are
    the arena's GSM8K questions (train for the teacher, SFT and RL; the first `eval_queries` test queries
    read once), math-verify against GSM8K's answers is the verifier, the pool's workers are called over
    HTTP (replay endpoints for Mixtral and GPT-4, SmolLM2 live, the tools). One record per (variant, seed)
    under data/arena/orchestrator/, each with its SFT start. With run: false the family is listed as not
    run, with `reason`. Defaults: the CPU scale of docs/arena.md ("The orchestrator rows")."""

    run: bool = False
    reason: str = "arena.orchestrator.run is false"
    seeds: tuple[int, ...] = (0,)  # RL sampling seeds (the SFT start is shared by the variants of a seed)
    variants: tuple[str, ...] = ("grpo", "tree_grpo", "mt_grpo", "agentic_grpo")  # App. B's ladder
    pool: str = "configs/pool.yaml"  # the arena's pool: its LLM workers are called over HTTP
    price_book: str = "configs/prices/current.yaml"  # the pool's workers at routellm-2024's prices + SmolLM2, controller
    answers: str = "datasets/gsm8k/test_answers.jsonl"  # GSM8K's reference answers: math-verify's gold
    # Subtask primitives taken off the pool's workers for this run. CPU cut: SmolLM2-135M's reason and
    # execute_python cost ~10 s a call on the shared 2-core machine (the search teacher tries each on every
    # task) and solve almost no GSM8K question; () keeps the pool as configs/pool.yaml has it.
    drop_primitives: tuple[str, ...] = ("reason", "verify", "execute_python")
    train_queries: int = 24  # a seeded subset of the arena's train queries: the teacher's tasks, D_SFT, D_RL
    eval_queries: int = 24  # the first N test queries (the split's order, as arena.lm.eval_queries); 0 = all
    anonymize_workers: bool = True  # 004 §5: blind workers (Worker1..K, redrawn per episode) in every rollout
    probe: bool = True  # eq. 3's b⁽⁰⁾: π(0) on the teacher's tasks (a task π(0) solves is dropped)
    budget_usd: float = 0.25  # per episode (GPT-4's worst case on the 8-shot prompt ≈ $0.06)
    turn_limit: int = 4  # Tmax (004 uses 8; a route, its <obs>, a verify and the answer need 2)
    max_new_tokens: int = 320  # per controller turn: a route copies the question (GSM8K ≤ ~200 tokens)
    max_seq_len: int = 1536  # SFT and RL tokens per conversation (GPT-4's logged answers run to 612 tokens)
    sft_steps: int = 12
    rl_steps: int = 2  # per variant, from the same SFT adapter
    group_size: int = 2  # G (004: 8)
    temperature: float = 0.7  # RL sampling temperature
    alpha: float = 0.1  # eq. 5's cost weight α (004 §5)
    server_threads: int = 2  # llama.cpp threads of the live SmolLM2 worker

    def validate(self, source: str) -> None:
        from models.orchestrator.advantages import ESTIMATORS

        where = f"{SECTION}.orchestrator"
        unknown = [v for v in self.variants if v not in ESTIMATORS]
        if unknown or not self.variants or not self.seeds:
            raise InputError(source, f"{where}.variants", f"name at least one seed and variants of {ESTIMATORS}")
        if min(self.train_queries, self.sft_steps, self.rl_steps, self.group_size, self.turn_limit) < 1 \
                or self.eval_queries < 0:
            raise InputError(source, where, "train_queries, sft_steps, rl_steps, group_size, turn_limit ≥ 1; "
                                            "eval_queries ≥ 0")
        if "tree_grpo" in self.variants and self.group_size % 2:
            raise InputError(source, f"{where}.group_size", "tree_grpo splits G into 2 branches: G must be even")


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
        self.orchestrator.validate(source)


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
