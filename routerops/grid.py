"""Collected trajectories → a logged-outcomes table (docs/replay_format.md).

Every single-worker behaviour policy ran on every evaluation task, so their episodes form the
complete (query × worker) grid that routers train and are cross-fitted on, the same way published
router benchmarks work — with no further call.
"""

from __future__ import annotations

import pandas as pd

from routerops.errors import InputError
from routerops.types import Task

SINGLE_PREFIX = "single/"


def logged_outcomes_from_trajectories(episodes: pd.DataFrame, tasks: list[Task], dataset: str = "embedded",
                                      primitive: str | None = None) -> pd.DataFrame:
    """One row per (task, worker) from the single-worker episodes; tokens summed over the episode."""
    single = episodes[episodes.policy.str.startswith(SINGLE_PREFIX)].copy()
    if single.empty:
        raise InputError("episodes", "policy", "no single-worker episodes to build logged outcomes from")
    parts = single.policy.str.split("/", expand=True)
    single["worker"], single["primitive"] = parts[1], parts[2]
    if primitive is not None:
        single = single[single.primitive == primitive]
    prompts = {t.task_id: t.prompt for t in tasks}
    missing = sorted(set(single.task_id) - set(prompts))
    if missing:
        raise InputError("tasks", "task_id", f"episodes reference unknown task {missing[0]!r}")
    table = pd.DataFrame({
        "dataset": dataset,
        "query_id": single.task_id.to_numpy(),
        "query": single.task_id.map(prompts).to_numpy(),
        "worker": single.worker.to_numpy(),
        "score": single.score.clip(0.0, 1.0).to_numpy(),
        "prompt_tokens": single.prompt_tokens.astype(int).to_numpy(),
        "completion_tokens": single.completion_tokens.astype(int).to_numpy(),
        "response": single.final_answer.fillna("").to_numpy(),
        "split": single.split.to_numpy(),
    })
    return complete_grid(table)


def complete_grid(table: pd.DataFrame) -> pd.DataFrame:
    """Keep the queries every worker answered (an errored or missing episode drops its query)."""
    workers = table.worker.nunique()
    counts = table.groupby("query_id").worker.nunique()
    keep = counts[counts == workers].index
    return table[table.query_id.isin(keep)].sort_values(["query_id", "worker"]).reset_index(drop=True)
