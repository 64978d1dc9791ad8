"""The LM critique-and-route controller (paper 002) and the LM CoRL controller (paper 003) on RouteLLM's
GSM8K logged outcomes, under a fixed split: train / validation / test by query, from one seeded
permutation (protocol.split_seed); controllers and warm-ups see training rows only, the test rows
are never trained or tuned on. Per training seed:

- warm-up (SFT) adapter from training outcomes; its greedy controller is the "before RL" row;
- RL with ξ as Table 9 ("with_multipliers"), with ξ = 0 ("without_multipliers"), and, ours, with
  dual ascent on ξ ("dual_multipliers", when rewards.multiplier_lr > 0);
- CoRL: its own warm-up and RL, one controller evaluated in the three budget modes.

Beside them, fitted on the same training rows: the logistic router and the cascade, read at the
controller's strong-agent call share (paired bootstrap over test queries), with their APGR; the MLP
controllers of models/critique/ stay the ablation rows of `make critique` (evaluation/critique.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from evaluation.critique import load_table
from models.base import RoutingData
from models.critique.lm_config import CritiqueLMConfig
from models.critique.lm_controller import make_controller
from models.critique.lm_env import MODES, OutcomeTable, outcome_table
from models.critique.lm_evaluate import (at_share, corl_greedy, decisions_changed, episode_metrics,
                                         greedy_episodes, paired_bootstrap)
from models.critique.lm_train import train_controller, warmup
from models.orchestrator.lm import base_model_folder, load_controller_model, resolve_device
from routerops import metrics
from routerops.splits import fixed_split  # the arena (evaluation/arena.py) splits with it too
from routerops.errors import InputError

log = logging.getLogger(__name__)
SETTINGS = {"with_multipliers": (True, False), "without_multipliers": (False, False), "dual_multipliers": (True, True)}


def held_out(ep: dict, table: OutcomeTable, rows: np.ndarray) -> dict:
    """Per evaluated test query, what the arena pairs on (evaluation/arena.py): the query's row, whether
    the answer was right, the USD paid, the strongest agent's calls and the worker whose answer stood."""
    return {"rows": [int(r) for r in rows], "correct": np.asarray(ep["correct"], dtype=float).tolist(),
            "usd": np.asarray(ep["cost"], dtype=float).tolist(),
            "strong_calls": np.asarray(ep["calls"])[:, table.strongest].astype(float).tolist(),
            "final": [table.workers[int(j)] for j in ep["final"]]}


def corl_held_out(modes: dict, table: OutcomeTable, rows: np.ndarray) -> dict:
    """held_out for each CoRL budget mode: one call per query, to the agent in `decisions`."""
    out = {}
    for mode in MODES:
        agent = np.asarray(modes[mode]["decisions"])
        calls = np.zeros((len(rows), len(table.agents)), dtype=int)
        calls[np.arange(len(rows)), agent] = 1
        ep = {"correct": table.correct[rows, agent], "cost": table.costs[rows, agent], "calls": calls, "final": agent}
        out[mode] = held_out(ep, table, rows)
    return out


def eval_rows(cfg: CritiqueLMConfig, split: dict[str, np.ndarray]) -> np.ndarray:
    test = split["test"]  # in the permutation's order: "the first N" is a seeded random subset
    return test if cfg.protocol.eval_queries == 0 else test[: cfg.protocol.eval_queries]


def baseline_scores(data: RoutingData, table: OutcomeTable, train: np.ndarray, rows: np.ndarray, seed: int) -> dict:
    """Per-query routing scores (higher = strong) of the logistic router and the cascade fitted on `train`."""
    from evaluation.replay import fit_then_score, strong_call_score
    from models.registry import ROUTER_FACTORIES

    out = {}
    train_data, test_data = data.subset(train), data.subset(rows)
    for name in ("logistic", "cascade"):
        router = ROUTER_FACTORIES[name](seed)
        quality = fit_then_score(train_data, test_data, ROUTER_FACTORIES[name], seed)
        out[name] = strong_call_score(quality, test_data, router)
    return out


def compare(ep: dict, table: OutcomeTable, rows: np.ndarray, scores: dict, n_boot: int, seed: int) -> dict:
    """The baselines at the controller's strong-agent call share, paired with it query by query."""
    share = episode_metrics(ep, table)["strong_call_share"]
    strong, weak = table.correct[rows, table.strongest], table.correct[rows, 0]
    out = {}
    for name, score in scores.items():
        theirs = at_share(score, strong, weak, share, cascade=name == "cascade")
        out[name] = {"accuracy_at_share": float(theirs.mean()),
                     "controller_minus_baseline": paired_bootstrap(ep["correct"], theirs, n_boot, seed)}
    return out


def fitted_verdict(model, tokenizer, cfg: CritiqueLMConfig, table: OutcomeTable, split: dict, rows: np.ndarray,
                   seed: int, scores: dict, kw: dict) -> dict:
    """The controller with its verdict at a threshold fitted on validation rows (ours; module
    models/critique/verdict_threshold.py): τ from the first len(rows) validation queries, then greedy
    on the test rows with False iff p(False) > τ."""
    from models.critique.verdict_threshold import VerdictSteer

    if len(table.agents) != 2:  # fit_threshold counts a rejection as one call to the strongest agent
        return {"skipped": f"the fitted verdict is defined for two agents, the table has {len(table.agents)}"}
    controller = make_controller(model, tokenizer, cfg.generation, temperature=0.0, seed=seed)
    fit_rows = split["val"][: len(rows)]
    threshold, probe, on_val = fit_threshold_on(controller, tokenizer, cfg, table, fit_rows, kw)
    controller.steer = VerdictSteer(tokenizer, threshold)
    ep = greedy_episodes(controller, table, rows, tokenizer=tokenizer, **kw)
    return {**episode_metrics(ep, table), "threshold": threshold, "fitted_on_val_rows": len(fit_rows),
            "val_strong_call_share_at_half": episode_metrics(on_val, table)["strong_call_share"],
            "val_p_false_mean": float(np.mean(probe.p_false)) if probe.p_false else float("nan"),
            "vs": compare(ep, table, rows, scores, cfg.protocol.bootstrap, seed), "held_out": held_out(ep, table, rows)}


def fit_threshold_on(controller, tokenizer, cfg: CritiqueLMConfig, table: OutcomeTable, fit_rows: np.ndarray,
                     kw: dict):
    """τ fitted on `fit_rows` (validation queries) so that the strongest agent's share of calls is its
    ρ (rewards.rho); the controller is left without a steer. Returns τ, the probe and the episodes."""
    from models.critique.verdict_threshold import fit_verdict_threshold

    if not hasattr(controller, "steer"):
        raise InputError(cfg.source, "critique_lm.generation.engine", "a fitted verdict needs the fast sampler")
    episodes = {}

    def run_greedy(steer):
        controller.steer = steer
        episodes.update(greedy_episodes(controller, table, fit_rows, tokenizer=tokenizer, **kw))
        controller.steer = None
        return episodes["decisions"]

    rho = float(table.by_strength(cfg.rewards.rho)[table.strongest])
    threshold, probe = fit_verdict_threshold(run_greedy, tokenizer, len(fit_rows), table.strongest, rho)
    return threshold, probe, episodes


def strip(ep: dict) -> dict:
    return {"decisions": ep["decisions"]}


def run_seed(cfg: CritiqueLMConfig, data: RoutingData, split: dict, seed: int, work: Path,
             model_cache: Path | None, scores: dict, variants: Sequence[str] | None = None, corl: bool = True,
             on_progress: Callable[[dict], None] | None = None) -> dict:
    table = outcome_table(data, split["train"], cfg.prompts.short_names, cfg.prompts.template)
    rows = eval_rows(cfg, split)
    folder = base_model_folder(cfg.model, model_cache)
    xi = table.by_strength(cfg.rewards.xi)
    kw = dict(horizon=cfg.tree.horizon, rewards=cfg.rewards, draft_tail=cfg.prompts.draft_tail_tokens)
    out = {"controllers": {}, "training": {}}
    warm_rows = split["train"][: cfg.tree.warmup_queries]
    if variants is not None and not variants:  # CoRL only
        return _corl(cfg, table, split, seed, work, model_cache, folder, rows, corl_warmup_rows(cfg, split), out,
                     on_progress) if corl else out
    adapter = warmup(cfg, table, warm_rows, work / f"seed{seed}" / "warmup", seed, model_cache) if len(warm_rows) else None
    model, tokenizer = load_controller_model(cfg.model, adapter, resolve_device(cfg.rl.device, cfg.source), model_cache)
    before = greedy_episodes(make_controller(model, tokenizer, cfg.generation, temperature=0.0, seed=seed),
                             table, rows, tokenizer=tokenizer, **kw)
    out["controllers"]["warmup_only"] = {**episode_metrics(before, table), "held_out": held_out(before, table, rows),
                                         "vs": compare(before, table, rows, scores, cfg.protocol.bootstrap, seed)}
    report = on_progress or (lambda _: None)
    report(out)
    if cfg.protocol.fitted_verdict:
        out["controllers"]["warmup_only"]["fitted_verdict"] = fitted_verdict(model, tokenizer, cfg, table, split, rows,
                                                                             seed, scores, kw)
        report(out)
    del model
    runs = {n: s for n, s in SETTINGS.items() if (not s[1] or cfg.rewards.multiplier_lr > 0)
            and (variants is None or n in variants)}
    for name, (constrained, dual) in runs.items():
        steps: list[dict] = []

        def step_done(s: int, r: dict, name: str = name, steps: list = steps) -> None:
            log.info("seed %d %s step %d: %s", seed, name, s, r)
            steps.append(r)
            report({**out, "training_in_progress": {name: steps}})

        trainer, summary = train_controller(cfg, table, split["train"], folder, seed, xi=xi if constrained else None,
                                            dual=dual, sft_adapter=adapter, progress=step_done)
        controller = make_controller(trainer.model, trainer.tokenizer, cfg.generation, temperature=0.0, seed=seed)
        ep = greedy_episodes(controller, table, rows, tokenizer=trainer.tokenizer, **kw)
        rho = table.by_strength(cfg.rewards.rho)
        within = (ep["calls"].sum(axis=0) <= np.floor(rho * len(rows))).all()  # no call would be passed on
        budgeted = ep if within else greedy_episodes(controller, table, rows, tokenizer=trainer.tokenizer, rho=rho, **kw)
        out["controllers"][name] = {**episode_metrics(ep, table), "decisions_changed_by_rl": decisions_changed(before, ep),
                                    "adapter_relative_change": summary["adapter_relative_change"],
                                    "budgeted": episode_metrics(budgeted, table),
                                    "vs": compare(ep, table, rows, scores, cfg.protocol.bootstrap, seed),
                                    "held_out": held_out(ep, table, rows)}
        if cfg.protocol.fitted_verdict:
            out["controllers"][name]["fitted_verdict"] = fitted_verdict(trainer.model, trainer.tokenizer, cfg, table,
                                                                        split, rows, seed, scores, kw)
        out["training"][name] = summary
        out["adapters"] = {**out.get("adapters", {}), name: str(trainer.save(work / f"seed{seed}" / name) / "adapter")}
        report(out)
        del trainer, controller
    if not corl:
        return out
    return _corl(cfg, table, split, seed, work, model_cache, folder, rows, corl_warmup_rows(cfg, split), out, on_progress)


def corl_warmup_rows(cfg: CritiqueLMConfig, split: dict) -> np.ndarray:
    n = cfg.corl.warmup_queries if cfg.corl.warmup_queries >= 0 else cfg.tree.warmup_queries
    return split["train"][:n]


def eval_budgets(cfg: CritiqueLMConfig, table: OutcomeTable, split: dict, rows: np.ndarray, seed: int) -> np.ndarray:
    """(3, len(rows)) budgets of the held-out CoRL reward, drawn as in training (from the training rows'
    cost spread), seeded apart from training's draws; the decisions never see them (the prompt names the mode)."""
    from models.critique.corl_budgets import state_budgets

    modes = np.repeat(np.arange(len(MODES)), len(rows))
    return state_budgets(cfg.corl, table, split["train"], modes, np.random.default_rng(10_000 * seed + 7)).reshape(
        len(MODES), len(rows))


def _corl(cfg: CritiqueLMConfig, table: OutcomeTable, split: dict, seed: int, work: Path, model_cache: Path | None,
          folder: Path, rows: np.ndarray, warm_rows: np.ndarray, out: dict,
          on_progress: Callable[[dict], None] | None = None) -> dict:
    """CoRL: its own warm-up and RL; one controller evaluated greedily in the three budget modes."""
    corl_adapter = warmup(cfg, table, warm_rows, work / f"seed{seed}" / "corl-warmup", seed, model_cache, corl=True) \
        if len(warm_rows) else None
    model, tokenizer = load_controller_model(cfg.model, corl_adapter, resolve_device(cfg.rl.device, cfg.source), model_cache)
    budgets = eval_budgets(cfg, table, split, rows, seed)
    corl_before = corl_greedy(make_controller(model, tokenizer, cfg.generation, temperature=0.0, seed=seed), table, rows,
                              budgets)
    del model
    report = on_progress or (lambda _: None)
    before = {mode: {k: v for k, v in row.items() if k != "decisions"} for mode, row in corl_before.items()}
    before_held_out = corl_held_out(corl_before, table, rows)
    report({**out, "corl_warmup_only": before, "corl_warmup_held_out": before_held_out})
    steps: list[dict] = []

    def step_done(s: int, r: dict) -> None:
        log.info("seed %d corl step %d: %s", seed, s, r)
        steps.append(r)
        report({**out, "corl_warmup_only": before, "corl_warmup_held_out": before_held_out,
                "training_in_progress": {"corl": steps}})

    trainer, summary = train_controller(cfg, table, split["train"], folder, seed, corl=True, sft_adapter=corl_adapter,
                                        progress=step_done)
    corl = corl_greedy(make_controller(trainer.model, trainer.tokenizer, cfg.generation, temperature=0.0, seed=seed),
                       table, rows, budgets)
    changed = np.mean([a != b for mode in corl for a, b in zip(corl[mode]["decisions"], corl_before[mode]["decisions"])])
    out["corl"] = {mode: {k: v for k, v in row.items() if k != "decisions"} for mode, row in corl.items()}
    out["corl_warmup_only"] = {mode: {k: v for k, v in row.items() if k != "decisions"} for mode, row in corl_before.items()}
    high = table.correct[rows, np.asarray(corl["high"]["decisions"])]  # 003's goal: high ≈ the expert alone
    out["corl"]["high_minus_expert_alone"] = paired_bootstrap(high, table.correct[rows, table.strongest],
                                                              cfg.protocol.bootstrap, seed)
    out["corl"]["decisions_changed_by_rl"] = float(changed)
    out["corl_held_out"] = corl_held_out(corl, table, rows)
    out["corl_warmup_held_out"] = corl_held_out(corl_before, table, rows)
    out["corl"]["adapter_relative_change"] = summary["adapter_relative_change"]
    out["training"]["corl"] = summary
    out["adapters"] = {**out.get("adapters", {}), "corl": str(trainer.save(work / f"seed{seed}" / "corl") / "adapter")}
    return out


def run_critique_lm(cfg: CritiqueLMConfig, root: str | Path, work: Path, model_cache: Path | None = None,
                    variants: Sequence[str] | None = None, corl: bool = True,
                    on_progress: Callable[[dict], None] | None = None) -> dict:
    """Every seed's controllers on the fixed split, the baselines beside them, and a summary."""
    resolve_device(cfg.rl.device, cfg.source)  # refuse a missing CUDA before reading anything
    started = time.perf_counter()
    paths = critique_paths(cfg)
    data = load_table(paths, Path(root))
    if data.responses is None:
        raise InputError(cfg.table, "response", "the controller reads drafts: the table needs responses")
    split = fixed_split(len(data), cfg.protocol.split_seed, cfg.protocol.fractions)
    table = outcome_table(data, split["train"], cfg.prompts.short_names, cfg.prompts.template)
    rows = eval_rows(cfg, split)
    scores = baseline_scores(data, table, split["train"], rows, cfg.protocol.split_seed)
    strong, weak = table.correct[rows, table.strongest], table.correct[rows, 0]
    same = strong.mean() == weak.mean()  # APGR is undefined there (a tiny evaluation set)
    apgr = {name: float("nan") if same else float(metrics.apgr(s, strong, weak)) for name, s in scores.items()}
    per_seed = {str(seed): run_seed(cfg, data, split, seed, Path(work), model_cache, scores, variants, corl,
                                  None if on_progress is None else
                                  (lambda part, seed=seed: on_progress({"seed": seed, "partial": part})))
                for seed in cfg.protocol.seeds}
    summary = {}
    for name in next(iter(per_seed.values())).get("controllers", {}):
        runs = [per_seed[s]["controllers"][name] for s in per_seed]
        summary[name] = {k: float(np.mean([r[k] for r in runs])) for k in
                         ("accuracy", "strong_call_share", "calls_per_query", "usd_per_query", "verify:accuracy",
                          "malformed_turns_per_query") if all(k in r for r in runs)}
        for base in scores:
            summary[name][f"{base}_accuracy_at_share"] = float(np.mean([r["vs"][base]["accuracy_at_share"] for r in runs]))
            summary[name][f"minus_{base}"] = float(np.mean([r["vs"][base]["controller_minus_baseline"]["diff"] for r in runs]))
        fitted = [r["fitted_verdict"] for r in runs if "threshold" in r.get("fitted_verdict", {})]
        if fitted:
            summary[name].update({f"fitted_verdict:{k}": float(np.mean([f[k] for f in fitted])) for k in
                                  ("threshold", "accuracy", "strong_call_share", "usd_per_query", "verify:accuracy")})
            summary[name].update({f"fitted_verdict:minus_{base}": float(np.mean(
                [f["vs"][base]["controller_minus_baseline"]["diff"] for f in fitted])) for base in scores})
    if corl:
        summary["corl"] = {mode: {k: float(np.mean([per_seed[s]["corl"][mode][k] for s in per_seed]))
                                  for k in ("expert_call_ratio", "usd_per_query", "accuracy", "reward")}
                           for mode in ("low", "medium", "high")}
    return {"protocol": f"fixed split by query (seed {cfg.protocol.split_seed}, train/val/test "
                        f"{[len(split[k]) for k in ('train', 'val', 'test')]}), {len(rows)} test queries evaluated; "
                        f"training seeds {list(cfg.protocol.seeds)}",
            "agents_weaker_to_stronger": table.agents, "test_rows": rows.tolist(),
            "single_accuracy_on_evaluated": {a: float(table.correct[rows, j].mean()) for j, a in enumerate(table.agents)},
            "single_usd_on_evaluated": {a: float(table.costs[rows, j].mean()) for j, a in enumerate(table.agents)},
            "baseline_apgr": apgr, "summary": summary, "per_seed": per_seed,
            "seconds": time.perf_counter() - started}


def critique_paths(cfg: CritiqueLMConfig):
    from models.critique.config import CritiqueConfig

    return CritiqueConfig(table=cfg.table, contaminated=cfg.contaminated, fewshot=cfg.fewshot, price_book=cfg.price_book)


# ---- registration through the promotion gate -------------------------------------------------------

def judge_on_val(served, table: OutcomeTable, val_rows: np.ndarray, cfg: CritiqueLMConfig) -> "Judged":
    """A served critique controller's greedy episodes on validation queries (never the test ones), as
    the gate's per-query score and USD (one operating point)."""
    from evaluation.registry import Judged
    from routerops.promotion import Outcomes

    with served.deciding() as controller:  # its verdict rule: greedy, or its fitted threshold
        ep = greedy_episodes(controller, table, val_rows, cfg.tree.horizon, cfg.rewards,
                             cfg.prompts.draft_tail_tokens, controller.tokenizer)
    return Judged([str(int(q)) for q in val_rows], Outcomes(ep["correct"][None], ep["cost"][None]))


def register_critique_lm(cfg: CritiqueLMConfig, root: str | Path, adapter: Path, val_queries: int = 40,
                         model_cache: Path | None = None, n_boot: int = 1000, fit_queries: int | None = None):
    """Register the controller whose LoRA adapter is `adapter` as `critique-lm` (gateway family
    `critique`); it takes the champion alias only if the paired bootstrap gate (routerops/promotion.py,
    accuracy, budget none) finds it better than the champion on the same validation queries.

    With protocol.fitted_verdict (two agents), the verdict threshold τ is fitted first, on the
    `fit_queries` validation queries after the gate's `val_queries` (disjoint from them: the gate does
    not judge on the rows τ was fitted on; default protocol.eval_queries, as the evaluation fits it),
    and the registered controller carries τ: the gate and the gateway see the thresholded verdicts."""
    from evaluation.serving.critique import ServedCritique
    from evaluation.registry import register_and_promote
    from routerops.promotion import GateConfig

    data = load_table(critique_paths(cfg), Path(root))
    split = fixed_split(len(data), cfg.protocol.split_seed, cfg.protocol.fractions)
    table = outcome_table(data, split["train"], cfg.prompts.short_names, cfg.prompts.template)
    val = split["val"][:val_queries]
    served = ServedCritique.from_files(cfg.model, cfg.generation, Path(adapter), table.workers, table.agents,
                                       cfg.prompts, model_cache)
    metrics = {}
    if cfg.protocol.fitted_verdict and len(table.agents) == 2:
        n_fit = fit_queries if fit_queries is not None else (cfg.protocol.eval_queries or len(split["test"]))
        fit_rows = split["val"][val_queries:val_queries + n_fit]
        if len(fit_rows) == 0:
            raise InputError(cfg.source, "critique_lm.protocol.fitted_verdict",
                             f"no validation query is left to fit the verdict threshold on after the gate's {val_queries}")
        kw = dict(horizon=cfg.tree.horizon, rewards=cfg.rewards, draft_tail=cfg.prompts.draft_tail_tokens)
        with served.deciding() as controller:
            threshold, _, _ = fit_threshold_on(controller, controller.tokenizer, cfg, table, fit_rows, kw)
        served = served.with_threshold(threshold)
        metrics = {"verdict_threshold": threshold, "verdict_fit_queries": float(len(fit_rows))}
    candidate = judge_on_val(served, table, val, cfg)
    gate = GateConfig(objective="accuracy_at_budget", budget_usd=None, n_boot=n_boot, seed=cfg.protocol.split_seed)
    return register_and_promote(served, candidate, lambda champion, label: judge_on_val(champion, table, val, cfg),
                                gate, metrics={"val_accuracy": float(candidate.outcomes.correct.mean()),
                                               "val_usd_per_query": float(candidate.outcomes.paid.mean()), **metrics},
                                include_code=False)
