"""Why a multi-turn router works: the routing-behaviour analyses of MTRouter §4.3.

Every analysis is a pure function of the episodes and turns tables (routerops.schema) returning a
DataFrame with one block of rows per policy, and has a plot function that draws that frame to a
PNG (matplotlib's Agg canvas through `Figure`, so nothing touches pyplot's global state).

Definitions (all counted on consecutive turns of one episode, in turn order):
- switch at turn t: the worker of turn t differs from the worker of turn t-1 (t >= 1);
- error turn: a turn whose `errors` list is not empty (Table 7 rules, any severity);
- recovery after an error at turn t: turn t+1 exists and has no error — "the probability that the
  next turn recovers (no error) conditioned on an error" (Figure 4); error turns that end their
  episode have no next turn and are left out of both numerator and denominator;
- phase of turn t in an episode of T turns: floor(n_phases * t / T), so thirds by default
  (early / mid / late, as §4.3 reads Figure 5);
- lift of a worker for an action type: P(worker | action) / P(worker) within a policy (Figure 6).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from routerops.errors import InputError

EPISODE_COLUMNS = ("episode_id", "policy", "success")
TURN_COLUMNS = ("episode_id", "turn_index", "worker", "primitive", "response", "cost_usd", "errors")
PHASE_NAMES = {3: ("early", "mid", "late")}
_SWITCH_SUMMARY_COLUMNS = [
    "policy", "episodes", "successful", "mean_switches_success", "mean_turns_success", "mean_cost_usd_success",
]
_RECOVERY_COLUMNS = [
    "policy", "error_turns", "p_switch_given_error", "p_stay_given_error", "p_recovery_given_error",
    "p_recovery_after_switch", "p_recovery_after_stay",
]
_LIFT_COLUMNS = [
    "policy", "action", "worker", "turns", "p_worker_given_action", "p_worker", "lift",
    "success_rate", "action_success_rate", "success_lift",
]


# ----------------------------------------------------------------------------------------------
# Shared preparation
# ----------------------------------------------------------------------------------------------


def _require(frame: pd.DataFrame, columns: tuple[str, ...], table: str) -> None:
    for column in columns:
        if column not in frame.columns:
            raise InputError(f"<{table} table>", column, "column missing")


def _error_list(value: object, row: int) -> list:
    if isinstance(value, list):
        return value
    if value is None or (isinstance(value, float) and np.isnan(value)) or value == "":
        return []
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError) as exc:
        raise InputError("<turns table>", "errors", f"row {row}: not a JSON list ({exc})") from exc
    if not isinstance(parsed, list):
        raise InputError("<turns table>", "errors", f"row {row}: not a JSON list")
    return parsed


def annotate_turns(episodes: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """Turns joined to their episode's policy and success, in turn order, with the derived columns
    every analysis uses: has_error, switched, cum_switches, cum_cost_usd, episode_turns,
    next_has_error / next_worker (None on an episode's last turn)."""
    _require(episodes, EPISODE_COLUMNS, "episodes")
    _require(turns, TURN_COLUMNS, "turns")
    meta = episodes[list(EPISODE_COLUMNS)].drop_duplicates("episode_id")
    frame = turns[list(TURN_COLUMNS)].merge(meta, on="episode_id", how="left", validate="many_to_one")
    orphans = int(frame["policy"].isna().sum())
    if orphans:
        raise InputError("<turns table>", "episode_id", f"{orphans} turns belong to no episode")
    frame = frame.sort_values(["episode_id", "turn_index"], kind="stable").reset_index(drop=True)
    frame["errors"] = [_error_list(v, i) for i, v in enumerate(frame["errors"])]
    frame["has_error"] = frame["errors"].map(bool)
    frame["success"] = frame["success"].astype(bool)
    by_episode = frame.groupby("episode_id", sort=False)
    previous_worker = by_episode["worker"].shift(1)
    frame["switched"] = previous_worker.notna() & (frame["worker"] != previous_worker)
    frame["cum_switches"] = frame.groupby("episode_id", sort=False)["switched"].cumsum().astype(int)
    frame["cum_cost_usd"] = by_episode["cost_usd"].cumsum()
    frame["episode_turns"] = by_episode["turn_index"].transform("size").astype(int)
    frame["position"] = by_episode.cumcount()  # 0..T-1 even if turn_index has gaps
    frame["next_worker"] = by_episode["worker"].shift(-1)
    frame["next_has_error"] = by_episode["has_error"].shift(-1)
    return frame


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator) / float(denominator) if denominator else float("nan")


# ----------------------------------------------------------------------------------------------
# 1. Switching vs cost (Figure 3)
# ----------------------------------------------------------------------------------------------


def cost_vs_switches(episodes: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """Cumulative cost against cumulative switches over successful episodes (Figure 3).

    For each successful episode and each k = 0..(its switches), the cost spent while the episode
    had made k switches, i.e. up to the turn before its (k+1)-th switch (the last point of an
    episode is its total cost). Rows: policy, switches (k), episodes (how many successful episodes
    reach k switches), mean_cum_cost_usd (mean over those episodes).
    """
    frame = annotate_turns(episodes, turns)
    frame = frame[frame["success"]]
    per_segment = frame.groupby(["policy", "episode_id", "cum_switches"], sort=True)["cum_cost_usd"].max()
    per_segment = per_segment.reset_index().rename(columns={"cum_switches": "switches"})
    curve = per_segment.groupby(["policy", "switches"]).agg(
        episodes=("episode_id", "nunique"), mean_cum_cost_usd=("cum_cost_usd", "mean")
    )
    return curve.reset_index()[["policy", "switches", "episodes", "mean_cum_cost_usd"]]


def switch_summary(episodes: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """Per policy: episodes, successful episodes, and over the successful ones the mean number of
    switches, turns and cost (the end points of the Figure 3 curves)."""
    frame = annotate_turns(episodes, turns)
    per_episode = frame.groupby(["policy", "episode_id"]).agg(
        success=("success", "first"),
        switches=("switched", "sum"),
        turns=("turn_index", "size"),
        cost_usd=("cost_usd", "sum"),
    )
    per_episode = per_episode.reset_index()
    rows = []
    for policy, group in per_episode.groupby("policy", sort=True):
        won = group[group["success"]]
        rows.append(
            {
                "policy": policy,
                "episodes": len(group),
                "successful": len(won),
                "mean_switches_success": won["switches"].mean() if len(won) else float("nan"),
                "mean_turns_success": won["turns"].mean() if len(won) else float("nan"),
                "mean_cost_usd_success": won["cost_usd"].mean() if len(won) else float("nan"),
            }
        )
    return pd.DataFrame(rows, columns=_SWITCH_SUMMARY_COLUMNS)


def plot_cost_vs_switches(curve: pd.DataFrame, path: str | Path) -> Path:
    fig = Figure(figsize=(5.5, 4))
    ax = fig.add_subplot()
    for policy, group in curve.groupby("policy", sort=True):
        ax.plot(group["switches"], group["mean_cum_cost_usd"], marker="o", label=str(policy))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("cumulative model switches")
    ax.set_ylabel("mean cumulative cost (USD)")
    ax.set_title("Cost vs switches, successful episodes")
    _finish(fig, ax, bool(len(curve)))
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------
# 2. Error-triggered switching and recovery (Figure 4)
# ----------------------------------------------------------------------------------------------


def error_switch_recovery(episodes: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """Per policy, over error turns that have a next turn: P(switch | error), P(stay | error),
    P(recovery | error), and recovery split by whether the router switched or stayed."""
    frame = annotate_turns(episodes, turns)
    rows = []
    for policy in sorted(frame["policy"].unique()):
        errors = frame[(frame["policy"] == policy) & frame["has_error"] & frame["next_worker"].notna()]
        switched = errors["next_worker"] != errors["worker"]
        recovered = ~errors["next_has_error"].astype(bool)
        rows.append(
            {
                "policy": policy,
                "error_turns": len(errors),
                "p_switch_given_error": _ratio(switched.sum(), len(errors)),
                "p_stay_given_error": _ratio((~switched).sum(), len(errors)),
                "p_recovery_given_error": _ratio(recovered.sum(), len(errors)),
                "p_recovery_after_switch": _ratio((recovered & switched).sum(), switched.sum()),
                "p_recovery_after_stay": _ratio((recovered & ~switched).sum(), (~switched).sum()),
            }
        )
    return pd.DataFrame(rows, columns=_RECOVERY_COLUMNS)


def plot_error_switch_recovery(table: pd.DataFrame, path: str | Path) -> Path:
    fig = Figure(figsize=(8, 3.6))
    panels = [("p_switch_given_error", "P(switch | error)"), ("p_recovery_given_error", "P(recovery | error)")]
    for i, (column, title) in enumerate(panels):
        ax = fig.add_subplot(1, 2, i + 1)
        values = table[column].fillna(0.0).to_numpy()
        bars = ax.bar(table["policy"].astype(str), values, color=f"C{i}")
        for bar, n in zip(bars, table["error_turns"]):
            ax.annotate(f"n={n}", (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
        ax.set_ylim(0, 1.1)
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=20)
    fig.suptitle("Error-triggered switching and recovery")
    fig.tight_layout()
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------
# 3. Model usage by turn phase (Figure 5)
# ----------------------------------------------------------------------------------------------


def phase_names(n_phases: int) -> tuple[str, ...]:
    return PHASE_NAMES.get(n_phases, tuple(f"phase {i + 1}" for i in range(n_phases)))


def usage_by_phase(episodes: pd.DataFrame, turns: pd.DataFrame, n_phases: int = 3) -> pd.DataFrame:
    """Per policy and phase of the episode, each worker's share of the turns in that phase."""
    if n_phases < 1:
        raise ValueError("n_phases must be at least 1")
    frame = annotate_turns(episodes, turns)
    index = (n_phases * frame["position"] // frame["episode_turns"]).astype(int)
    frame["phase"] = pd.Categorical.from_codes(index, categories=list(phase_names(n_phases)), ordered=True)
    return _shares(frame, "phase")


def usage_by_turn(episodes: pd.DataFrame, turns: pd.DataFrame) -> pd.DataFrame:
    """Per policy and turn position (0, 1, ...), each worker's share of the turns there."""
    frame = annotate_turns(episodes, turns).rename(columns={"position": "turn"})
    return _shares(frame, "turn")


def _shares(frame: pd.DataFrame, by: str) -> pd.DataFrame:
    counts = frame.groupby(["policy", by, "worker"], observed=True).size().rename("turns").reset_index()
    totals = counts.groupby(["policy", by], observed=True)["turns"].transform("sum")
    counts["share"] = counts["turns"] / totals
    return counts.sort_values(["policy", by, "worker"]).reset_index(drop=True)


def plot_usage(usage: pd.DataFrame, path: str | Path) -> Path:
    """Stacked worker shares per phase (or per turn), one panel per policy."""
    by = "phase" if "phase" in usage.columns else "turn"
    policies = sorted(usage["policy"].unique()) or ["(no data)"]
    workers = sorted(usage["worker"].unique())
    fig = Figure(figsize=(4.2 * len(policies), 3.8))
    for i, policy in enumerate(policies):
        ax = fig.add_subplot(1, len(policies), i + 1)
        table = usage[usage["policy"] == policy].pivot_table(
            index=by, columns="worker", values="share", observed=True, fill_value=0.0
        )
        bottom = np.zeros(len(table))
        labels = [str(x) for x in table.index]
        for j, worker in enumerate(workers):
            share = table[worker].to_numpy() if worker in table.columns else np.zeros(len(table))
            ax.bar(labels, share, bottom=bottom, color=f"C{j}", label=worker if i == 0 else None)
            bottom += share
        ax.set_ylim(0, 1)
        ax.set_title(str(policy))
        ax.set_xlabel(by)
        ax.set_ylabel("share of turns")
    fig.suptitle(f"Worker usage by {by}")
    if workers:
        fig.legend(loc="lower center", ncol=min(len(workers), 6), fontsize=8)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------
# 4. Specialisation: lift per action type or tool (Figure 6)
# ----------------------------------------------------------------------------------------------


def action_lift(
    episodes: pd.DataFrame, turns: pd.DataFrame, action_of: Callable[[str], str] | None = None
) -> pd.DataFrame:
    """Lift = P(worker | action) / P(worker), per policy (Figure 6); > 1 means over-represented.

    The action of a turn is `action_of(response)` — e.g. the ScienceWorld action category or the
    tool a tool-use reply called (see routerops.envs) — or the turn's primitive when not given.
    Beside it, success_lift = P(episode success | worker, action) / P(episode success | action):
    whether the turns a worker takes of that action belong to episodes that succeed more often.
    """
    frame = annotate_turns(episodes, turns)
    frame["action"] = frame["response"].map(action_of) if action_of else frame["primitive"]
    rows = []
    for policy, group in frame.groupby("policy", sort=True):
        p_worker = group["worker"].value_counts(normalize=True)
        for action, in_action in group.groupby("action", sort=True):
            p_in_action = in_action["worker"].value_counts(normalize=True)
            action_success = in_action["success"].mean()
            for worker, n in in_action["worker"].value_counts().sort_index().items():
                success = in_action.loc[in_action["worker"] == worker, "success"].mean()
                rows.append(
                    {
                        "policy": policy, "action": action, "worker": worker, "turns": int(n),
                        "p_worker_given_action": p_in_action[worker], "p_worker": p_worker[worker],
                        "lift": p_in_action[worker] / p_worker[worker],
                        "success_rate": success, "action_success_rate": action_success,
                        "success_lift": _ratio(success, action_success),
                    }
                )
    return pd.DataFrame(rows, columns=_LIFT_COLUMNS)


def plot_action_lift(lift: pd.DataFrame, path: str | Path) -> Path:
    """Heat map of lift (workers × actions), one panel per policy, centred on 1."""
    policies = sorted(lift["policy"].unique()) or ["(no data)"]
    fig = Figure(figsize=(4.8 * len(policies), 3.8))
    for i, policy in enumerate(policies):
        ax = fig.add_subplot(1, len(policies), i + 1)
        table = lift[lift["policy"] == policy].pivot_table(index="worker", columns="action", values="lift")
        values = table.to_numpy(dtype=float)
        image = ax.imshow(np.log2(values), cmap="RdBu_r", vmin=-2, vmax=2, aspect="auto")
        ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns], rotation=30, ha="right")
        ax.set_yticks(range(table.shape[0]), [str(r) for r in table.index])
        for (r, c), v in np.ndenumerate(values):
            if not np.isnan(v):
                ax.text(c, r, f"{v:.2f}", ha="center", va="center", fontsize=8)
        ax.set_title(str(policy))
        if i == len(policies) - 1:
            fig.colorbar(image, ax=ax, label="log2 lift")
    fig.suptitle("Lift = P(worker | action) / P(worker)")
    fig.tight_layout()
    return _save(fig, path)


# ----------------------------------------------------------------------------------------------


def _finish(fig: Figure, ax, has_data: bool) -> None:
    if has_data:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no successful episodes", ha="center", va="center", transform=ax.transAxes)
    fig.tight_layout()


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
