"""The arena's report (issue 39, item 4): every row with its paired comparisons → arena.json, the
accuracy–cost plot with the Pareto frontier, one MLflow run per method, and the goals of the issue's
"Show" section read off the rows (met / not met / not run)."""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from pathlib import Path

import numpy as np

from evaluation.arena import Outcome, References, arena_row
from evaluation.arena_config import ArenaRun
from evaluation.arena_policies import load_outcomes
from routerops import schema
from routerops.layout import Layout

log = logging.getLogger(__name__)
CRITIQUE_ROWS = {  # controller key in critique-lm's per-seed result → (row name, its SFT start's key)
    "warmup_only": ("critique-and-route LM: SFT start, greedy", None),
    "with_multipliers": ("critique-and-route LM: RL, greedy", "warmup_only"),
}


def protocol_text(run: ArenaRun, index: dict) -> str:
    s = run.arena.split
    sizes = [len(index["split"][p]) for p in ("train", "val", "test")]
    return (f"RouteLLM GSM8K ({index['workers']}), prices {run.arena.price_book}; one split by query "
            f"(routerops.splits.fixed_split, seed {s.seed}, fractions {list(s.fractions)}: train/val/test {sizes}); "
            f"every fit and every RL/SFT step on train only, every knob/threshold chosen on val, the test "
            f"queries read once; paired bootstrap ({run.arena.bootstrap} resamples of the row's test queries), "
            "95 % percentile intervals")


def held_out_outcome(record: dict, policy: str, family: str, seed: int, meta: dict | None = None) -> Outcome:
    """An Outcome from evaluation/critique_lm.py's `held_out` record."""
    return Outcome(policy, family, seed, np.asarray(record["rows"]), np.asarray(record["correct"], dtype=float),
                   np.asarray(record["usd"], dtype=float), np.asarray(record["strong_calls"], dtype=float),
                   list(record["final"]), None, meta or {})


def lm_outcomes(lm_dir: Path, run: ArenaRun) -> tuple[dict[str, list[Outcome]], dict[str, str], list[dict]]:
    """The LM controllers' held-out decisions ({row: outcomes per seed}, {row: its SFT start's row}) and
    what was not run, with why."""
    outcomes: dict[str, list[Outcome]] = defaultdict(list)
    starts: dict[str, str] = {}
    missing = []
    settings = run.arena.lm
    for name, wanted in (("critique", settings.critique), ("corl", settings.corl)):
        if not wanted:
            missing.append({"family": f"{name}_lm", "reason": f"arena.lm.{name} is false"})
            continue
        for seed in settings.seeds:
            path = Path(lm_dir) / f"{name}_seed{seed}.json"
            if not path.is_file():
                missing.append({"family": f"{name}_lm", "seed": seed, "reason": f"{path} not made (run arena-lm)"})
                continue
            result = json.loads(path.read_text())["per_seed"][str(seed)]
            add = _critique_rows if name == "critique" else _corl_rows
            add(result, seed, outcomes, starts)
    return outcomes, starts, missing


def orchestrator_outcomes(folder: Path, settings, by_policy: dict, starts: dict) -> list[dict]:
    """The hook for Uno-Orchestra (004) on this pool: with arena.orchestrator.run, every
    data/arena/orchestrator/<name>_seed<s>.json holding {"policy", "seed", "held_out", optional
    "sft_start"} (critique-lm's per-query record format, evaluation/critique_lm.py: held_out) becomes a
    row of family `orchestrator`, paired with its SFT start. Returns the not-run entries."""
    if not settings.run:
        return [{"family": "orchestrator", "reason": settings.reason}]
    files = sorted(Path(folder).glob("*_seed*.json"))
    if not files:
        return [{"family": "orchestrator", "reason": f"arena.orchestrator.run is true but {folder} holds no record"}]
    for path in files:
        record = json.loads(path.read_text())
        policy, seed = record["policy"], int(record["seed"])
        meta = {"evidence": record["evidence"]} if "evidence" in record else None
        by_policy[policy].append(held_out_outcome(record["held_out"], policy, "orchestrator", seed, meta))
        if "sft_start" in record:
            # Variants trained from one SFT adapter share its row (`sft_start_policy`, stages/arena_orchestra.py).
            start = record.get("sft_start_policy") or f"{policy}: SFT start"
            if all(o.seed != seed for o in by_policy[start]):
                by_policy[start].append(held_out_outcome(record["sft_start"], start, "orchestrator", seed))
            starts[policy] = start
    return []


def training_evidence(training: dict | None) -> dict:
    """What shows whether the RL budget was enough: the run's scalars and its train reward by step."""
    if not training:
        return {}
    out = {k: v for k, v in training.items() if isinstance(v, (int, float, str))}
    history = training.get("history") or []
    for key in ("reward_root_mean", "reward_mean", "reward"):
        if history and all(key in h for h in history):
            out["train_reward_by_step"] = [h[key] for h in history]
            break
    return out


def _evidence(controller: dict, training: dict | None) -> dict:
    keys = ("decisions_changed_by_rl", "adapter_relative_change", "malformed_turns_per_query", "verify:accuracy")
    out = {k: controller[k] for k in keys if k in controller}
    if training:
        out["training"] = training_evidence(training)
    return out


def _critique_rows(result: dict, seed: int, outcomes: dict, starts: dict) -> None:
    for key, (row, start) in CRITIQUE_ROWS.items():
        c = result["controllers"].get(key)
        if c is None or "held_out" not in c:
            continue
        meta = {"evidence": _evidence(c, result.get("training", {}).get(key))}
        outcomes[row].append(held_out_outcome(c["held_out"], row, "critique_lm", seed, meta))
        fitted = c.get("fitted_verdict", {})
        if "held_out" in fitted:
            name = row.replace("greedy", "fitted verdict threshold on val")
            outcomes[name].append(held_out_outcome(fitted["held_out"], name, "critique_lm", seed,
                                                   {"threshold": fitted.get("threshold")}))
            if start:
                starts[name] = CRITIQUE_ROWS[start][0].replace("greedy", "fitted verdict threshold on val")
        if start:
            starts[row] = CRITIQUE_ROWS[start][0]


def _corl_rows(result: dict, seed: int, outcomes: dict, starts: dict) -> None:
    evidence = {k: result.get("corl", {}).get(k) for k in ("decisions_changed_by_rl", "adapter_relative_change")}
    evidence["training"] = training_evidence(result.get("training", {}).get("corl"))
    for mode, record in result.get("corl_held_out", {}).items():
        row, start = f"CoRL LM: RL, {mode} budget", f"CoRL LM: SFT start, {mode} budget"
        budget = {k: result.get("corl", {}).get(mode, {}).get(k) for k in ("budget_usd", "budget_binds_expert_share")}
        outcomes[row].append(held_out_outcome(record, row, "corl_lm", seed, {"evidence": {**evidence, "budget": budget}}))
        outcomes[start].append(held_out_outcome(result["corl_warmup_held_out"][mode], start, "corl_lm", seed))
        starts[row] = start


def references(by_policy: dict[str, list[Outcome]], index: dict) -> References:
    strong = index["strong"]
    weak = next(w for w in index["workers"] if w != strong)
    return References(np.asarray(index["split"]["test"]), [o.curve for o in by_policy["logistic"]],
                      [o.curve for o in by_policy["cascade"]], by_policy[f"always {weak}"][0],
                      by_policy[f"always {strong}"][0])


def build_rows(run: ArenaRun, policies_dir: Path, lm_dir: Path) -> dict:
    """Every row of arena.json (policies first, then the LM controllers), with the not-run families."""
    found, index = load_outcomes(policies_dir)
    by_policy: dict[str, list[Outcome]] = defaultdict(list)
    for o in found:
        by_policy[o.policy].append(o)
    lm, starts, not_run = lm_outcomes(lm_dir, run)
    by_policy.update(lm)
    cfg = run.arena
    not_run += orchestrator_outcomes(Path(lm_dir).parent / "orchestrator", cfg.orchestrator, by_policy, starts)
    refs = references(by_policy, index)
    rows = [arena_row(outs, refs, cfg.bootstrap, cfg.split.seed, cfg.constant_share,
                      by_policy.get(starts[name]) if name in starts else None)
            for name, outs in by_policy.items()]
    curves = {name: _curve_points(outs[0]) for name, outs in by_policy.items() if outs[0].curve is not None}
    return {"protocol": protocol_text(run, index), "pool": {"workers": index["workers"], "strong": index["strong"],
                                                          "price_book": cfg.price_book},
            "references": {"vs_logistic_at_usd": "logistic router's sweep over λ on the test queries, read at the "
                                                 "row's USD/query (two neighbouring λs mixed)",
                           "vs_cascade_at_gpt4_calls": "cascade's sweep over its threshold on the test queries, read "
                                                       "at the row's GPT-4 calls/query",
                           "vs_random_mix_at_usd": "best trivial policy at equal USD: random mix of always-weak and "
                                                   "always-strong (oracle excluded: it reads the outcome)",
                           "vs_sft_start": "the RL row's SFT start, same queries"},
            "rows": rows, "not_run": not_run, "curves": curves, "goals": goals(rows, not_run)}


def _curve_points(o: Outcome) -> dict:
    c = o.curve
    return {"usd_per_query": c.usd.mean(axis=1).tolist(), "accuracy": c.correct.mean(axis=1).tolist(),
            "gpt4_calls_per_query": c.strong.mean(axis=1).tolist(), "seed": o.seed}


def goals(rows: list[dict], not_run: list[dict]) -> dict:
    """The issue's "Show" goals read off the rows. "Above" = the paired interval's lower end > 0; "not
    below" = its upper end ≥ 0 (no significant deficit)."""
    by = {r["policy"]: r for r in rows}
    out = {"agentic_grpo": agentic_grpo_goal(by.get(AGENTIC_GRPO_ROW), not_run)}
    critique = by.get("critique-and-route LM: RL, greedy")
    if critique is None:
        out["critique_and_route"] = {"status": "not run"}
    else:
        c = critique["comparisons"]
        checks = {"gpt4_calls_per_query <= 0.25": critique["gpt4_calls_per_query"] <= 0.25,
                  "above the cascade at equal GPT-4 calls": c["vs_cascade_at_gpt4_calls"]["lo"] > 0,
                  "not below the logistic router at equal USD": c["vs_logistic_at_usd"]["hi"] >= 0}
        out["critique_and_route"] = {"status": "met" if all(checks.values()) else "not met", "checks": checks}
    modes = [by.get(f"CoRL LM: RL, {m} budget") for m in ("low", "medium", "high")]
    if any(m is None for m in modes):
        out["corl"] = {"status": "not run"}
    else:
        ordered = lambda key: modes[0][key] < modes[1][key] < modes[2][key]  # noqa: E731
        checks = {"GPT-4 share low < medium < high": ordered("gpt4_calls_per_query"),
                  "USD low < medium < high": ordered("usd_per_query"),
                  **{f"{m} mode not dominated by the random mix at equal USD":
                     r["comparisons"]["vs_random_mix_at_usd"]["diff"] >= 0 for m, r in zip(("low", "medium", "high"), modes)}}
        out["corl"] = {"status": "met" if all(checks.values()) else "not met", "checks": checks}
    return out


AGENTIC_GRPO_ROW = "orchestrator (004): Agentic-GRPO"  # evaluation/arena_orchestra.py: row_name


def agentic_grpo_goal(row: dict | None, not_run: list[dict]) -> dict:
    """Issue 39's goal for Agentic-GRPO: above its SFT start, not constant, not below the logistic router
    at its own USD, and above the best trivial policy (the random mix) at equal USD."""
    if row is None:
        return {"status": "not run", "evidence": next((n["reason"] for n in not_run if n["family"] == "orchestrator"), "")}
    c = row["comparisons"]
    checks = {"above its SFT start": bool(c.get("vs_sft_start") and c["vs_sft_start"]["lo"] > 0),
              "not constant": not row["constant"],
              "not below the logistic router at equal USD": c["vs_logistic_at_usd"]["hi"] >= 0,
              "above the random mix at equal USD": c["vs_random_mix_at_usd"]["lo"] > 0}
    return {"status": "met" if all(checks.values()) else "not met", "checks": checks}


def log_to_mlflow(run: ArenaRun, result: dict, artifacts: list[Path]) -> list[str]:
    """One parent run `arena`, one nested run per row (its numbers and paired differences)."""
    import mlflow

    from evaluation.tracking import flatten, use_tracking

    use_tracking(run.track)
    ids = []
    with mlflow.start_run(run_name="arena"):
        mlflow.set_tags({"routerops.pipeline": "arena", "protocol": result["protocol"][:500]})
        for path in artifacts:
            mlflow.log_artifact(str(path))
        for row in result["rows"]:
            with mlflow.start_run(run_name=row["policy"], nested=True) as child:
                mlflow.log_params({"policy": row["policy"], "family": row["family"], "seeds": str(row["seeds"]),
                                   "test_queries": row["test_queries"]})
                numbers = {k: row[k] for k in ("accuracy", "usd_per_query", "gpt4_calls_per_query")}
                numbers["constant"] = float(row["constant"])
                numbers |= {k.replace(":", "_"): v for k, v in flatten(row["comparisons"]).items()
                            if isinstance(v, (int, float)) and v == v}
                mlflow.log_metrics({k.replace(" ", "_"): float(v) for k, v in numbers.items()})
                ids.append(child.info.run_id)
    return ids


def markdown_table(result: dict) -> str:
    """arena.json's rows as a Markdown table: numbers, `constant`, and each paired difference with its
    95 % interval (docs/arena.md quotes it; reports/arena/arena.md holds it)."""
    def cell(d: dict | None) -> str:
        return "—" if d is None else f"{d['diff']:+.3f} [{d['lo']:+.3f}, {d['hi']:+.3f}]"

    head = ("| policy | family | test q | accuracy | USD/query | GPT-4 calls/q | constant | vs logistic @USD "
            "| vs cascade @GPT-4 calls | vs random mix @USD | vs SFT start |\n|" + "---|" * 11)
    lines = [head]
    for r in result["rows"]:
        c = r["comparisons"]
        lines.append(f"| {r['policy']} | {r['family']} | {r['test_queries']} | {r['accuracy']:.3f} | "
                     f"{r['usd_per_query']:.5f} | {r['gpt4_calls_per_query']:.3f} | {'yes' if r['constant'] else 'no'} | "
                     f"{cell(c['vs_logistic_at_usd'])} | {cell(c['vs_cascade_at_gpt4_calls'])} | "
                     f"{cell(c['vs_random_mix_at_usd'])} | {cell(c.get('vs_sft_start'))} |")
    return "\n".join(lines) + "\n"


def write_arena(run: ArenaRun, layout: Layout, policies_dir: Path, lm_dir: Path) -> dict[str, Path]:
    from evaluation.arena_plot import plot_arena

    result = build_rows(run, policies_dir, lm_dir)
    plot = plot_arena(result, layout.arena_reports / "accuracy_cost.png")
    out = schema.write_json_atomic(result, layout.arena_results)
    table = schema.write_text_atomic(markdown_table(result), layout.arena_reports / "arena.md")
    result["mlflow_runs"] = log_to_mlflow(run, result, [out, plot])
    out = schema.write_json_atomic(result, out)  # its manifest: the stage's (stages/arena.py: report)
    return {"results": out, "plot": plot, "table": table}
