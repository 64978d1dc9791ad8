"""`routerops register`'s inputs (cli/register_table.py), without fitting: a pipeline root's priced
single-worker episodes read as a logged-outcome table, and the two splits (the table's column, or a
seeded split that keeps every query's rows on one side). The whole command runs in
tests/e2e/test_journey_serve.py."""

from __future__ import annotations

import argparse

import pandas as pd
import pytest

from routerops import schema
from routerops.envs.suites import write_tasks
from routerops.errors import InputError
from routerops.layout import Layout
from routerops.types import Task
from cli.register_table import check_args, read_table, split_rows

WORKERS = ("smol-direct", "smol-cot")


def args(**changes) -> argparse.Namespace:
    base = {"table": None, "trajectories": None, "prices": None, "pool": None, "split_column": "split",
            "train_split": "train", "gate_split": "val", "gate_fraction": 0.25, "seed": 0, "n_boot": 2000,
            "objective": "aiq", "budget_usd": None}
    return argparse.Namespace(**{**base, **changes})


def pipeline_root(root) -> Layout:
    """data/priced/episodes.parquet with one single-worker episode per (task, worker), and the tasks."""
    layout = Layout(root)
    tasks = [Task(f"t{i}", "s", "train" if i < 6 else "val", f"What is {i} plus {i}?", str(2 * i)) for i in range(8)]
    rows = []
    for task in tasks:
        for j, worker in enumerate(WORKERS):
            rows.append({"episode_id": f"{task.task_id}-{worker}", "run_id": "r", "task_id": task.task_id, "suite": "s",
                         "split": task.split, "policy": f"single/{worker}/answer", "policy_version": "1", "seed": 0,
                         "budget_usd": 1.0, "turn_limit": 3, "price_book_version": "b", "final_answer": "x",
                         "score": float(j == 0), "success": j == 0, "turns": 1, "prompt_tokens": 20,
                         "completion_tokens": 5 + 50 * j, "cached_tokens": 0, "cost_usd": 0.0, "ended_by": "done",
                         "error": ""})
    layout.priced.episodes.parent.mkdir(parents=True)
    schema.write_table(pd.DataFrame(rows), layout.priced.episodes, "episodes")
    layout.tasks.parent.mkdir(parents=True)
    write_tasks(tasks, layout.tasks)
    return layout


def test_a_pipeline_root_is_read_as_a_table_with_its_splits(tmp_path):
    pipeline_root(tmp_path)
    table, source = read_table(args(trajectories=str(tmp_path)))
    assert source.endswith("data/priced/episodes.parquet")
    assert set(table.worker) == set(WORKERS) and table.query_id.nunique() == 8
    train, gate, how = split_rows(table, args(), source)
    assert set(train.split) == {"train"} and set(gate.split) == {"val"} and gate.query_id.nunique() == 2
    assert "split=train fitted" in how


def test_a_root_without_priced_episodes_says_what_to_run(tmp_path):
    with pytest.raises(InputError, match="routerops run main"):
        read_table(args(trajectories=str(tmp_path)))


def test_without_a_split_column_queries_are_split_whole_and_by_seed():
    table = pd.DataFrame([{"query_id": f"q{i}", "worker": w} for i in range(20) for w in WORKERS])
    train, gate, how = split_rows(table, args(), "t.csv")
    assert gate.query_id.nunique() == 5 and train.query_id.nunique() == 15
    assert not set(train.query_id) & set(gate.query_id)  # a query's rows never straddle the split
    assert gate.groupby("query_id").worker.count().eq(2).all()
    again = split_rows(table, args(), "t.csv")[1]
    other = split_rows(table, args(seed=1), "t.csv")[1]
    assert set(again.query_id) == set(gate.query_id) and set(other.query_id) != set(gate.query_id)
    assert "seeded split (seed 0)" in how
    with pytest.raises(InputError, match="too few"):
        split_rows(table.head(6), args(), "t.csv")


def test_bad_arguments_are_refused_before_any_work(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text("x\n")
    with pytest.raises(InputError, match="not both"):
        check_args(args())
    with pytest.raises(InputError, match="--gate-fraction"):
        check_args(args(table=str(table), gate_fraction=1.5))
    with pytest.raises(InputError, match="--budget-usd"):
        check_args(args(table=str(table), objective="accuracy_at_budget"))
    with pytest.raises(InputError, match="file not found"):
        check_args(args(table=str(tmp_path / "missing.csv")))
