"""Evaluation report: the policy leaderboard, the per-split breakdown, the accuracy-cost plot, and the
files a pipeline stage writes (CSV, Markdown, metrics JSON for DVC / MLflow, PNG).

design.md "Evaluation protocol": per policy accuracy (95% bootstrap interval), USD per query and in
total, tokens, turns, switches, latency; the accuracy-cost plane with its Pareto frontier; the
LLMRouterBench gains over the best single worker when the single-worker baselines are named.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from routerops import metrics
from routerops.plot_labels import annotate_points

LEADERBOARD_COLUMNS = [
    "policy", "n", "accuracy", "accuracy_lo", "accuracy_hi", "score_mean", "usd_per_query", "usd_total",
    "tokens_per_query", "turns_per_query", "switches_per_query", "latency_s_per_query", "on_frontier",
]


def evaluate_policies(episodes: pd.DataFrame, turns: pd.DataFrame | None = None,
                      single_workers: Sequence[str] = (), n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Leaderboard: one row per policy (best accuracy first). `turns` adds switches and latency
    (NaN without it). `single_workers` names the policies that always call one worker; with them
    the LLMRouterBench columns are filled: gain over the best single worker (at any cost and at no
    more than its cost), the cost it saves at matched accuracy, and the distance to the frontier."""
    if episodes.empty:
        raise ValueError("no episodes to evaluate")
    table = metrics.episode_table(episodes, turns)
    board = metrics.summarise_policies(table, n_boot=n_boot, seed=seed)
    front = metrics.pareto_frontier(board["usd_per_query"], board["accuracy"])
    board["on_frontier"] = board.index.isin(front)
    board = add_best_single_columns(board, single_workers)
    board = board.sort_values(["accuracy", "usd_per_query"], ascending=[False, True], kind="mergesort")
    return board.reset_index(drop=True)


def add_best_single_columns(board: pd.DataFrame, single_workers: Sequence[str]) -> pd.DataFrame:
    board = board.copy()
    board["pareto_dist"] = metrics.pareto_distance(board["usd_per_query"], board["accuracy"],
                                                   board["usd_per_query"], board["accuracy"])
    singles = board[board["policy"].isin(list(single_workers))]
    for col in ("gain_any_cost", "gain_matched_cost", "cost_saved"):
        board[col] = np.nan
    if singles.empty:
        return board
    best = singles.iloc[metrics.best_single(singles["usd_per_query"], singles["accuracy"])]
    for i, row in board.iterrows():
        gain = metrics.gain_over_best_single([row["usd_per_query"]], [row["accuracy"]],
                                             best["usd_per_query"], best["accuracy"])
        board.loc[i, "gain_any_cost"] = gain["any_cost"]
        board.loc[i, "gain_matched_cost"] = gain["matched_cost"]
        board.loc[i, "cost_saved"] = metrics.cost_saved_at_matched_accuracy(
            [row["usd_per_query"]], [row["accuracy"]], best["usd_per_query"], best["accuracy"])
    board.attrs["best_single"] = str(best["policy"])
    return board


def breakdown_by_split(episodes: pd.DataFrame, turns: pd.DataFrame | None = None, by: str = "split",
                       n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per policy and split (ID vs OOD) summary, the leaderboard's columns minus the frontier."""
    return metrics.split_breakdown(metrics.episode_table(episodes, turns), by=by, n_boot=n_boot, seed=seed)


# ---------------------------------------------------------------- plot


def wants_log_x(costs: np.ndarray) -> bool:
    """Log scale when every cost is positive and they span more than two decades."""
    costs = np.asarray(costs, dtype=float)
    return bool(len(costs) and (costs > 0).all() and costs.max() / costs.min() > 100)


def plot_accuracy_cost(leaderboard: pd.DataFrame, path: str | Path, title: str = "Accuracy vs cost") -> Path:
    """PNG of every policy on the accuracy-cost plane (95% interval as error bar, name beside it)
    with the Pareto frontier as a step line; log-x when the costs span more than two decades."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; safe to repeat
    import matplotlib.pyplot as plt

    board = leaderboard.sort_values("usd_per_query", kind="mergesort")
    x, y = board["usd_per_query"].to_numpy(float), board["accuracy"].to_numpy(float)
    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    try:
        errors = np.vstack([y - board["accuracy_lo"].to_numpy(float), board["accuracy_hi"].to_numpy(float) - y])
        on = board["on_frontier"].to_numpy(bool)
        ax.errorbar(x, y, yerr=np.nan_to_num(errors), fmt="none", ecolor="0.6", elinewidth=1, capsize=3, zorder=1)
        ax.scatter(x[~on], y[~on], s=40, color="tab:blue", label="policy", zorder=2)
        ax.scatter(x[on], y[on], s=60, color="tab:red", marker="D", label="on Pareto frontier", zorder=3)
        front = np.flatnonzero(on)
        if len(set(zip(x[front], y[front]))) > 1:  # one point is not a frontier line: its marker says it all
            ax.step(x[front], y[front], where="post", color="tab:red", alpha=0.6, label="Pareto frontier", zorder=1)
        if wants_log_x(x):
            ax.set_xscale("log")  # before the labels are placed: they are spaced on screen
        annotate_points(ax, x, y, board["policy"])
        return save_cost_axes(fig, ax, x, "accuracy (bars: 95% bootstrap interval)", title, path)
    finally:
        plt.close(fig)


def plot_router_curves(curves: pd.DataFrame, leaderboard: pd.DataFrame, path: str | Path,
                       title: str = "Routers: accuracy vs cost") -> Path:
    """Each router's accuracy–cost curve over its knob (columns router, usd_per_query, accuracy);
    single workers (one operating point each) as labelled dots."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5), dpi=120)
    try:
        singles: list[tuple[float, float, str]] = []
        for name, curve in curves.groupby("router", sort=False):
            curve = curve.sort_values("usd_per_query", kind="mergesort")
            if str(name).startswith("single:"):
                ax.scatter(curve.usd_per_query, curve.accuracy, s=50, marker="s", zorder=3)
                singles.append((curve.usd_per_query.iloc[0], curve.accuracy.iloc[0], str(name)))
                continue
            aiq = leaderboard.set_index("router").aiq.get(name, float("nan"))
            label = f"{name} (AIQ {aiq:.3f})"
            if len(curve[["usd_per_query", "accuracy"]].drop_duplicates()) == 1:
                # A router whose knob never moves it (one operating point) is a point, not a line.
                ax.scatter(curve.usd_per_query.iloc[:1], curve.accuracy.iloc[:1], s=30, marker="o", zorder=2, label=label)
            else:
                ax.plot(curve.usd_per_query, curve.accuracy, marker=".", markersize=3, linewidth=1.2, label=label)
        costs = curves.usd_per_query.to_numpy(float)
        if wants_log_x(costs):
            ax.set_xscale("log")  # before the labels are placed: they are spaced on screen
        if singles:
            annotate_points(ax, *zip(*singles))
        return save_cost_axes(fig, ax, costs, "accuracy", title, path)
    finally:
        plt.close(fig)


def save_cost_axes(fig, ax, costs: np.ndarray, ylabel: str, title: str, path: str | Path) -> Path:
    """Shared finish of the accuracy–cost plots: log-x when costs span decades, labels, PNG."""
    if wants_log_x(costs):
        ax.set_xscale("log")
    ax.set_xlabel("USD per query")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


# ---------------------------------------------------------------- files


def to_markdown(frame: pd.DataFrame, floatfmt: str = ".4g") -> str:
    """A GitHub-flavoured Markdown table (no `tabulate` dependency)."""
    def cell(v: object) -> str:
        if isinstance(v, (float, np.floating)):
            return "" if math.isnan(v) else format(float(v), floatfmt)
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def metric_key(*parts: str) -> str:
    """MLflow accepts letters, digits, '_', '-', '.', ' ', '/' in metric names; replace the rest."""
    return "/".join(re.sub(r"[^A-Za-z0-9_.\- ]", "_", str(p)) for p in parts)


def flat_metrics(leaderboard: pd.DataFrame, breakdown: pd.DataFrame | None = None, by: str = "split"
                 ) -> dict[str, float]:
    """{"<metric>/<policy>": value, "<metric>/<policy>/<split>": value}: finite numbers only, for
    `dvc metrics` and `mlflow.log_metrics`."""
    out: dict[str, float] = {}
    numeric = list(leaderboard.select_dtypes(include=["number", "bool"]).columns)
    for _, row in leaderboard.iterrows():
        for col in numeric:
            value = float(row[col])
            if math.isfinite(value):
                out[metric_key(col, row["policy"])] = value
    if breakdown is not None and not breakdown.empty:
        for _, row in breakdown.iterrows():
            for col in ("n", "accuracy", "usd_per_query"):
                value = float(row[col])
                if math.isfinite(value):
                    out[metric_key(col, row["policy"], row[by])] = value
    return out


REPORT_FILES = {"leaderboard": "leaderboard.csv", "leaderboard_md": "leaderboard.md", "breakdown": "breakdown.csv",
                "metrics": "metrics.json", "plot": "accuracy_cost.png"}


def write_report(leaderboard: pd.DataFrame, breakdown: pd.DataFrame, out_dir: str | Path,
                 title: str = "Accuracy vs cost") -> dict[str, Path]:
    """Write leaderboard.csv, leaderboard.md, breakdown.csv, metrics.json and accuracy_cost.png into
    `out_dir`. All five are written to a temporary folder first and only then renamed into place,
    so a failure while producing them leaves the previous report (or nothing), never a half-written
    file or a partial set."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir, prefix=".report."))
    try:
        leaderboard.to_csv(staging / "leaderboard.csv", index=False)
        (staging / "leaderboard.md").write_text(to_markdown(leaderboard))
        breakdown.to_csv(staging / "breakdown.csv", index=False)
        (staging / "metrics.json").write_text(json.dumps(flat_metrics(leaderboard, breakdown), indent=2,
                                                         sort_keys=True))
        plot_accuracy_cost(leaderboard, staging / "accuracy_cost.png", title)
        paths = {}
        for key, name in REPORT_FILES.items():
            os.replace(staging / name, out_dir / name)
            paths[key] = out_dir / name
        return paths
    finally:
        shutil.rmtree(staging, ignore_errors=True)
