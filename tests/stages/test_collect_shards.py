"""The collect stage with collect.shards > 1 (what `routerops stage collect` runs under DVC: the shards
one after another in its own process) writes the same raw tables as one shard, under the same run id."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from routerops import schema
from routerops.config import load_params
from routerops.envs.suites import write_tasks
from routerops.errors import InputError
from routerops.layout import Layout
from routerops.rollout import JOURNAL_NAME
from routerops.types import Task
from routerops.workers.chaos import DelayedEndpoint
from stages.pipeline import collect, collection_run_id

REPO = Path(__file__).resolve().parents[2]
PRICES = {"version": "shards-test", "effective_date": "2026-11-01", "currency": "USD", "prices": {
    "echo": {"input_per_1m": 0.1, "output_per_1m": 0.4, "cached_input_per_1m": 0.05, "per_call": 0.0},
    "sympy": {"input_per_1m": 0.0, "output_per_1m": 0.0, "per_call": 0.00001}}}


def write_project(root: Path, url: str, shards: int, scheduler: str = "", concurrency: int = 1) -> tuple[Layout, Path]:
    """params.yaml, a pool (an OpenAI-compatible endpoint and a sympy tool), a price book and a tasks
    file under `root`: the collect stage's inputs, at a scale of seconds."""
    pool = {"name": "shards-test", "workers": [
        {"name": "echo", "kind": "llm", "endpoint": url, "model": "echo", "primitives": ["answer"],
         "generation": {"max_tokens": 8}, "concurrency": 4, "timeout_s": 30, "max_retries": 0},
        {"name": "sympy", "kind": "sympy", "primitives": ["sympy"], "timeout_s": 10}]}
    (root / "configs").mkdir(parents=True)
    (root / "configs/pool.yaml").write_text(yaml.safe_dump(pool))
    (root / "configs/prices.yaml").write_text(yaml.safe_dump(PRICES))
    params = {"pool": {"file": "configs/pool.yaml"}, "evaluate": {"splits": ["test"]},
              "prices": {"collection": "configs/prices.yaml"},
              "collect": {"budget_usd": 0.01, "turn_limit": 2,
                          "concurrency": concurrency, "shards": shards, "dask_address": scheduler}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    splits = ["train"] * 8 + ["val"] * 2 + ["test"] * 2
    tasks = [Task(f"add/{i}", "unit/add", split, f"{i} + 30", str(i + 30)) for i, split in enumerate(splits)]
    return Layout(root), write_tasks(tasks, root / "data/suites/tasks.jsonl")


@pytest.mark.slow
def test_sharded_stage_writes_the_tables_one_shard_writes(tmp_path):
    with DelayedEndpoint(delay_s=0.01) as url:
        runs = {}
        for shards in (1, 3):
            layout, tasks = write_project(tmp_path / f"s{shards}", url, shards)
            params = load_params(layout.root / "params.yaml")
            if shards == 1:
                collect(params, layout, tasks)
            else:  # as dvc.yaml runs it
                out = subprocess.run([sys.executable, "-m", "cli", "stage", "collect", "--root", str(layout.root)],
                                     cwd=REPO, capture_output=True, text=True, timeout=300)
                assert out.returncode == 0, out.stderr[-2000:]
            runs[shards] = (layout, collection_run_id(params, layout, tasks))
    assert runs[1][1] == runs[3][1]  # where episodes run is not part of what they are
    kept = ["episode_id", "policy", "split", "final_answer", "score", "turns", "cost_usd", "ended_by"]
    one, three = (schema.read_table(runs[n][0].raw.episodes, "episodes")[kept] for n in (1, 3))
    assert one.equals(three) and one["episode_id"].is_unique
    layout, run_id = runs[3]
    journals = sorted(p.relative_to(layout.journals / run_id) for p in (layout.journals / run_id).rglob(JOURNAL_NAME))
    assert [str(p) for p in journals] == [f"{part}/shard-{k}-of-3/{JOURNAL_NAME}" for part in ("eval", "train", "val")
                                          for k in range(3)]
    layout, run_id = runs[1]
    assert (layout.journals / run_id / "train" / JOURNAL_NAME).exists()  # one shard: where it always was


@pytest.mark.parametrize("shards", [0, -2, "two"])
def test_a_bad_shard_count_names_the_field_before_anything_runs(tmp_path, shards):
    layout, tasks = write_project(tmp_path, "http://127.0.0.1:9/v1", 1)
    params = load_params(layout.root / "params.yaml")
    params = dataclasses.replace(params, collect=dataclasses.replace(params.collect, shards=shards))
    with pytest.raises(InputError, match="shards"):
        collect(params, layout, tasks)
    assert not layout.journals.exists() and not layout.raw.episodes.exists()
