from __future__ import annotations

import pandas as pd
import pytest

from routerops.errors import InputError
from routerops.grid import logged_outcomes_from_trajectories
from routerops.types import Task


def episodes(rows):
    return pd.DataFrame(rows, columns=["task_id", "policy", "score", "prompt_tokens", "completion_tokens",
                                       "final_answer", "split"])


TASKS = [Task("t1", "s", "test", "1+1?", "2"), Task("t2", "s", "ood", "2+2?", "4")]


def test_single_worker_episodes_become_a_complete_grid():
    table = logged_outcomes_from_trajectories(episodes([
        ("t1", "single/a/answer", 1.0, 10, 2, "2", "test"),
        ("t1", "single/b/sympy", 0.0, 0, 0, "3", "test"),
        ("t2", "single/a/answer", 0.0, 12, 3, "5", "ood"),
        ("t2", "single/b/sympy", 1.0, 0, 0, "4", "ood"),
        ("t2", "uniform_random", 1.0, 12, 3, "4", "ood"),  # not a single worker: left out
    ]), TASKS)
    assert len(table) == 4 and set(table.worker) == {"a", "b"}
    assert table.set_index(["query_id", "worker"]).loc[("t2", "b"), "score"] == 1.0
    assert table.set_index("query_id").loc["t1", "query"].iloc[0] == "1+1?"


def test_a_query_missing_a_worker_is_dropped():
    table = logged_outcomes_from_trajectories(episodes([
        ("t1", "single/a/answer", 1.0, 10, 2, "2", "test"),
        ("t1", "single/b/sympy", 0.0, 0, 0, "3", "test"),
        ("t2", "single/a/answer", 0.0, 12, 3, "5", "ood"),
    ]), TASKS)
    assert set(table.query_id) == {"t1"}


def test_no_single_worker_episodes_is_an_error():
    with pytest.raises(InputError, match="single-worker"):
        logged_outcomes_from_trajectories(episodes([("t1", "uniform_random", 1.0, 1, 1, "2", "test")]), TASKS)
