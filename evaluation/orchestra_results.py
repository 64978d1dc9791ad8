"""The orchestrator's results table (004 §6 Tab. 1 at our scale): the language-model controller before
and after SFT, beside the baseline rows (evaluation/baselines.py), on the held-out test and OOD tasks.

A controller row reports what the issue asks of it and what Tab. 1 and App. E report: accuracy, USD per
episode, the rate of grammatically valid controller turns (a turn the strict parser of
routerops/orchestra/grammar.py accepted), and the share of each behaviour mode (004 App. E, Tab. 14).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from evaluation.baselines import TABLE_COLUMNS
from routerops import schema
from routerops.orchestra.modes import CONTROLLER_ACTOR, KIND_MALFORMED, MODES
from routerops.report import to_markdown

CONTROLLER_KIND = "orchestrator"
MODE_COLUMNS = [f"mode_{m}" for m in MODES]
CONTROLLER_COLUMNS = ["valid_turn_rate", "controller_turns", *MODE_COLUMNS]
RESULT_COLUMNS = [c for c in TABLE_COLUMNS if c != "operating_point"] + CONTROLLER_COLUMNS
# The row order of the table within a split: the controller first, then the baselines' kinds.
KIND_ORDER = (CONTROLLER_KIND, "single", "random", "router", "mtrouter")


def policy_label(episodes: pd.DataFrame) -> pd.Series:
    """`orchestrator-base`, `orchestrator-sft`: the controller and its weights' version."""
    return episodes.policy + "-" + episodes.policy_version.astype(str)


def valid_turn_rates(turns: pd.DataFrame) -> pd.DataFrame:
    """Per episode: controller turns and how many the strict parser accepted."""
    controller = turns[turns.actor == CONTROLLER_ACTOR]
    valid = controller.primitive != KIND_MALFORMED
    return (pd.DataFrame({"episode_id": controller.episode_id, "valid": valid.astype(int)})
            .groupby("episode_id").valid.agg(controller_turns="size", valid_turns="sum"))


def controller_rows(episodes: pd.DataFrame, turns: pd.DataFrame, splits: list[str]) -> pd.DataFrame:
    """One row per (split, controller version): accuracy, USD/episode, valid-turn rate, mode shares."""
    per_episode = episodes.join(valid_turn_rates(turns), on="episode_id")
    per_episode[["controller_turns", "valid_turns"]] = per_episode[["controller_turns", "valid_turns"]].fillna(0)
    per_episode["label"] = policy_label(per_episode)
    rows = []
    for (split, label), group in per_episode.groupby(["split", "label"], sort=True):
        if split not in splits:
            continue
        turns_taken = int(group.controller_turns.sum())
        shares = group["mode"].value_counts(normalize=True)
        rows.append({"split": split, "policy": label, "kind": CONTROLLER_KIND,
                     "accuracy": float(group.success.astype(float).mean()),
                     "usd_per_episode": float(group.cost_usd.mean()), "episodes": int(len(group)),
                     "protocol": f"rolled out on {split} through the executor (greedy, Tmax {int(group.turn_limit.iloc[0])})",
                     "valid_turn_rate": float(group.valid_turns.sum() / turns_taken) if turns_taken else float("nan"),
                     "controller_turns": turns_taken,
                     **{f"mode_{m}": float(shares.get(m, 0.0)) for m in MODES}})
    return pd.DataFrame(rows, columns=RESULT_COLUMNS)


def results_table(controllers: pd.DataFrame, baselines: pd.DataFrame, splits: list[str]) -> pd.DataFrame:
    """The controller rows and the baseline rows of `splits`, one table, each split's rows together."""
    base = baselines[baselines.split.isin(splits)].drop(columns=["operating_point"], errors="ignore")
    table = pd.concat([controllers, base.reindex(columns=RESULT_COLUMNS)], ignore_index=True)
    order = {s: i for i, s in enumerate(splits)}
    kind = {k: i for i, k in enumerate(KIND_ORDER)}
    key = table.split.map(order) * 100 + table.kind.map(kind).fillna(len(KIND_ORDER))
    return table.assign(_key=key).sort_values(["_key", "policy"], kind="stable").drop(columns="_key").reset_index(drop=True)


def write_results_report(table: pd.DataFrame, csv_path: Path, markdown_path: Path, price_book: str,
                         notes: list[str]) -> list[Path]:
    schema.write_csv_atomic(table, csv_path)
    shown = table.drop(columns=["protocol", "accuracy_seed_std", "val_accuracy", "val_usd_per_episode"])
    text = (f"# Orchestrator results (price book {price_book})\n\n{to_markdown(shown)}\n"
            + "".join(f"- {n}\n" for n in notes))
    schema.write_text_atomic(text, markdown_path)
    return [csv_path, markdown_path]


# The training curves of RL runs (the stage's reports/orchestra/rl_curves.png, the variants benchmark's
# PNG): what each step's group did, one line per run or variant.
CURVE_PANELS = (("reward/return_mean", "train return V − α·ĉ"), ("success_rate", "train success rate"),
                ("success_gain_over_sft_probe", "success − SFT's probed rate, same task"),
                ("kl", "KL to the SFT reference (k3)"), ("reward/usd_mean", "USD per episode"))


def success_by_pass(steps: list[dict]) -> dict | None:
    """Tasks met more than once: the mean G-sample success at each task's first and second visit (the
    same tasks, so the difference is the policy's, not the pool's order of families); None when no
    task was met twice."""
    visits: dict[str, list[float]] = {}
    for step in steps:
        visits.setdefault(step["task_id"], []).append(float(step["success_rate"]))
    twice = [v for v in visits.values() if len(v) >= 2]
    if not twice:
        return None
    return {"first": sum(v[0] for v in twice) / len(twice), "second": sum(v[1] for v in twice) / len(twice),
            "tasks": len(twice)}



def plot_rl_curves(curves: dict[str, list[list[dict]]], path: Path, title: str, window: int = 5) -> Path:
    """One panel per CURVE_PANELS key: for each label, the mean over its runs (lists of step records)
    of the key per step, as a `window`-step moving mean (a group of G = 4 is a noisy point). When some
    run met a task twice (orchestra.rl.pool_size), one more panel: the success at the first and the
    second visit of those tasks (success_by_pass, the mean over the runs that have one). Atomic."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    by_pass = {label: [p for p in (success_by_pass(r) for r in runs if r) if p] for label, runs in curves.items()}
    panels = len(CURVE_PANELS) + int(any(by_pass.values()))
    fig, axes = plt.subplots(1, panels, figsize=(4 * panels, 3.6))
    for label, runs in curves.items():
        runs = [r for r in runs if r]
        if not runs:
            continue
        length = min(len(r) for r in runs)
        for ax, (key, name) in zip(axes, CURVE_PANELS):
            values = np.array([[float(s.get(key, np.nan)) for s in r[:length]] for r in runs]).mean(axis=0)
            ax.plot(np.arange(1, length + 1), pd.Series(values).rolling(window, min_periods=1).mean(),
                    label=f"{label} ({len(runs)} run{'s' * (len(runs) > 1)})")
            ax.set_title(name, fontsize=10)
            ax.set_xlabel("RL step")
        if by_pass[label]:
            passes = [np.mean([p["first"] for p in by_pass[label]]), np.mean([p["second"] for p in by_pass[label]])]
            axes[-1].plot([1, 2], passes, marker="o", label=label)
            axes[-1].set_xticks([1, 2])
            axes[-1].set_title(f"success, 1st vs 2nd visit ({by_pass[label][0]['tasks']} tasks)", fontsize=10)
            axes[-1].set_xlabel("visit of the same task")
    axes[0].legend(fontsize=8)
    fig.suptitle(f"{title} ({window}-step moving mean)")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path
