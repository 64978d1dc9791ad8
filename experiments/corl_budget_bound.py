"""What CoRL's budget modes can earn on RouteLLM's GSM8K table: the bound a controller's modes are read against.

CoRL (paper 003) rewards a mode's choice with r_p · 1(cost ≤ B) (eq. 8's budget-specific reward): the
expert's answer earns its correctness only if its logged cost fits the mode's budget B. Whether the
modes *can* differ is a property of the table and of B, before any controller is trained. This reads,
on each split of the fixed split (train / val / test; no controller, nothing fitted on val or test):

- per budget B: the reward of always calling the expert, of always answering itself (the weak agent's
  logged answer), and of the per-query best of the two (an oracle, calling the expert only where it
  earns more), with the share of queries on which the expert's logged cost is over B;
- how well the question's length ranks "the expert is over B" (ROC AUC), and the reward-optimal rule
  "call the expert iff the question is at most L characters long", L fitted on the training rows only,
  with its expert share on every split: the best a controller that reads only the length can do.

Why: after RL our controller called GPT-4 on 99–100 % of queries in both the medium ($0.02) and the
high mode (docs/critique/lm.md). If even the best length rule calls it on nearly every query at $0.02,
"medium < high" is not a reachable target at that budget on this table, whatever the controller.

    python experiments/corl_budget_bound.py [--params params.yaml] [--budgets 0.001 0.006 0.02 1000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from evaluation.critique import load_table  # noqa: E402
from evaluation.critique_lm import critique_paths, fixed_split  # noqa: E402
from models.critique.lm_config import load_critique_lm_config  # noqa: E402
from models.critique.lm_env import outcome_table  # noqa: E402
from routerops import schema  # noqa: E402


def mode_rewards(correct: np.ndarray, cost: np.ndarray, strong: int, budget: float) -> dict[str, float]:
    """Per-query r_p·1(cost ≤ B) of the expert (column `strong`) and of answering itself (column 0)."""
    expert = correct[:, strong] * (cost[:, strong] <= budget)
    itself = correct[:, 0] * (cost[:, 0] <= budget)
    return {"expert_always": float(expert.mean()), "self_always": float(itself.mean()),
            "oracle": float(np.maximum(expert, itself).mean()),
            "oracle_expert_share": float((expert > itself).mean()),  # the expert only where it earns more
            "expert_over_budget": float((cost[:, strong] > budget).mean())}


def length_rule(lengths: np.ndarray, correct: np.ndarray, cost: np.ndarray, strong: int, budget: float) -> float:
    """The length L maximising the mean reward of "expert iff length ≤ L" on these rows (ties: the
    smallest L; L below every length means "never")."""
    expert = correct[:, strong] * (cost[:, strong] <= budget)
    itself = correct[:, 0] * (cost[:, 0] <= budget)
    candidates = np.concatenate([[lengths.min() - 1], np.unique(lengths)])
    rewards = [np.where(lengths <= cut, expert, itself).mean() for cut in candidates]
    return float(candidates[int(np.argmax(rewards))])


def apply_rule(cut: float, lengths: np.ndarray, correct: np.ndarray, cost: np.ndarray, strong: int,
               budget: float) -> dict[str, float]:
    calls = lengths <= cut
    reward = np.where(calls, correct[:, strong] * (cost[:, strong] <= budget), correct[:, 0] * (cost[:, 0] <= budget))
    return {"reward": float(reward.mean()), "expert_share": float(calls.mean())}


def length_auc(lengths: np.ndarray, over: np.ndarray) -> float | None:
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(over, lengths)) if 0 < over.sum() < len(over) else None


def run(params: Path, budgets: list[float]) -> dict:
    cfg = load_critique_lm_config(params)
    data = load_table(critique_paths(cfg), REPO)
    split = fixed_split(len(data), cfg.protocol.split_seed, cfg.protocol.fractions)
    table = outcome_table(data, split["train"], cfg.prompts.short_names, cfg.prompts.template)
    strong = table.strongest
    lengths = np.array([len(q) for q in table.questions], dtype=float)
    out = {"agents": table.agents, "expert": table.agents[strong], "budgets": budgets, "splits": {}}
    cuts = {b: length_rule(lengths[split["train"]], table.correct[split["train"]], table.costs[split["train"]],
                           strong, b) for b in budgets}
    for name, rows in split.items():
        correct, cost, length = table.correct[rows], table.costs[rows], lengths[rows]
        out["splits"][name] = {
            "queries": int(len(rows)),
            "expert_cost_usd": {"mean": float(cost[:, strong].mean()), "median": float(np.median(cost[:, strong])),
                                "p10": float(np.quantile(cost[:, strong], 0.1)), "p90": float(np.quantile(cost[:, strong], 0.9))},
            "by_budget": {str(b): {**mode_rewards(correct, cost, strong, b),
                                   "length_auc_over_budget": length_auc(length, cost[:, strong] > b),
                                   "length_rule_fitted_on_train": {"max_chars": cuts[b],
                                                                   **apply_rule(cuts[b], length, correct, cost, strong, b)}}
                          for b in budgets}}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--params", type=Path, default=REPO / "params.yaml")
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.001, 0.006, 0.02, 1000.0],
                    help="B (USD per query): ours are 0.001 / 0.02 / 1000; 003's multi-expert medium is 0.006")
    ap.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "corl_budget_bound.json")
    args = ap.parse_args()
    started = time.perf_counter()
    result = {"benchmark": "corl_budget_bound", "command": " ".join(["python experiments/corl_budget_bound.py", *sys.argv[1:]]),
              "protocol": "fixed split of the critique table (protocol.split_seed); the length rule is fitted on "
                          "the training rows only and read on every split; no controller involved",
              **run(args.params, args.budgets)}
    result["seconds"] = round(time.perf_counter() - started, 2)
    schema.write_json_atomic(result, args.out)
    for name, split in result["splits"].items():
        for b, row in split["by_budget"].items():
            rule = row["length_rule_fitted_on_train"]
            print(f"{name:5s} B={float(b):<7g} expert {row['expert_always']:.3f} (over B {row['expert_over_budget']:.2f}) "
                  f"self {row['self_always']:.3f} oracle {row['oracle']:.3f} ({row['oracle_expert_share']:.2f}) | length rule: reward {rule['reward']:.3f}, "
                  f"expert share {rule['expert_share']:.2f}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
