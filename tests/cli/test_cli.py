"""The CLI's edges: bad input exits non-zero naming the file and the field, and leaves nothing behind."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from routerops import schema
from routerops.pricing import load_price_book
from tests.cli.conftest import run_cli_in_process

REPO = Path(__file__).resolve().parents[2]
POOL = REPO / "configs/pools/embedded-smollm2.yaml"
BOOK = REPO / "configs/prices/current.yaml"


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return run_cli_in_process(list(args), cwd)  # exit code, stdout, stderr; no new interpreter's imports


def trajectories(book_path: Path = BOOK) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two episodes (one LLM turn each, one with a tool turn too), priced under `book_path`."""
    book = load_price_book(book_path)
    turns = pd.DataFrame({
        "episode_id": ["e1", "e2", "e2"], "turn_index": [0, 0, 1], "actor": ["p"] * 3,
        "worker": ["smol-cot", "smol-direct", "sympy"], "primitive": ["answer", "answer", "sympy"],
        "subtask_id": [""] * 3, "depends_on": ["[]"] * 3, "message": ["q"] * 3, "response": ["a"] * 3,
        "observation": [""] * 3,
        "prompt_tokens": [100, 50, 0], "completion_tokens": [40, 5, 0], "cached_tokens": [0, 10, 0],
        "latency_s": [0.5, 0.1, 0.01], "errors": ["[]"] * 3, "propensity": [1.0, 0.5, 0.5],
    })
    turns["cost_usd"] = [book.cost(w, p, c, k) for w, p, c, k in
                         zip(turns.worker, turns.prompt_tokens, turns.completion_tokens, turns.cached_tokens)]
    episodes = pd.DataFrame({
        "episode_id": ["e1", "e2"], "run_id": ["r", "r"], "task_id": ["t1", "t2"], "suite": ["s", "s"],
        "split": ["test", "test"], "policy": ["p", "p"], "policy_version": ["1", "1"], "seed": [0, 0],
        "budget_usd": [1.0, 1.0], "turn_limit": [3, 3], "price_book_version": [book.version] * 2,
        "final_answer": ["1", "2"], "score": [1.0, 0.0], "success": [True, False], "turns": [1, 2],
        "prompt_tokens": [100, 50], "completion_tokens": [40, 5], "cached_tokens": [0, 10],
        "cost_usd": [turns.cost_usd[0], turns.cost_usd[1] + turns.cost_usd[2]],
        "ended_by": ["done", "done"], "error": ["", ""],
    })
    return episodes, turns


def write_set(folder: Path, episodes: pd.DataFrame, turns: pd.DataFrame) -> Path:
    schema.write_table(episodes, folder / "episodes.parquet", "episodes")
    schema.write_table(turns, folder / "turns.parquet", "turns")
    return folder


@pytest.mark.slow
def test_reprice_recomputes_costs_from_tokens_under_the_new_book(tmp_path):
    src = write_set(tmp_path / "src", *trajectories())
    book = yaml.safe_load(BOOK.read_text())
    book["version"], book["prices"]["smol-cot"]["output_per_1m"] = "v2", 20.0
    (tmp_path / "v2.yaml").write_text(yaml.safe_dump(book))
    out = run_cli("reprice", "--src", str(src), "--price-book", str(tmp_path / "v2.yaml"), "--out", str(tmp_path / "out"))
    assert out.returncode == 0, out.stderr
    episodes = schema.read_table(tmp_path / "out/episodes.parquet", "episodes")
    turns = schema.read_table(tmp_path / "out/turns.parquet", "turns")
    # smol-cot turn: 100 input at $2.50/M + 40 output at $20/M
    assert turns.cost_usd[0] == pytest.approx((100 * 2.5 + 40 * 20.0) / 1e6)
    assert set(episodes.price_book_version) == {"v2"}
    assert episodes.cost_usd.sum() == pytest.approx(turns.cost_usd.sum())


@pytest.mark.slow
@pytest.mark.parametrize("problem, field", [
    ("negative", "prices.smol-cot.output_per_1m"),
    ("text", "prices.smol-cot.output_per_1m"),
    ("missing_version", "version"),
    ("not_yaml", "<file>"),
])
def test_bad_price_book_exits_naming_file_and_field(tmp_path, problem, field):
    src = write_set(tmp_path / "src", *trajectories())
    book = yaml.safe_load(BOOK.read_text())
    bad = tmp_path / "bad.yaml"
    if problem == "negative":
        book["prices"]["smol-cot"]["output_per_1m"] = -1.0
    elif problem == "text":
        book["prices"]["smol-cot"]["output_per_1m"] = "ten"
    elif problem == "missing_version":
        del book["version"]
    bad.write_text("prices: [unclosed" if problem == "not_yaml" else yaml.safe_dump(book))
    out = run_cli("reprice", "--src", str(src), "--price-book", str(bad), "--out", str(tmp_path / "out"))
    assert out.returncode == 2
    assert str(bad) in out.stderr and field in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_unknown_worker_exits_naming_the_worker(tmp_path):
    episodes, turns = trajectories()
    turns.loc[0, "worker"] = "gpt-9"
    src = write_set(tmp_path / "src", episodes, turns)
    out = run_cli("reprice", "--src", str(src), "--price-book", str(BOOK), "--out", str(tmp_path / "out"))
    assert out.returncode == 2
    assert "prices.gpt-9" in out.stderr and str(BOOK) in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_broken_trajectory_row_exits_naming_file_and_column(tmp_path):
    episodes, turns = trajectories()
    turns.loc[1, "prompt_tokens"] = -5
    src = write_set(tmp_path / "src", episodes, turns)
    out = run_cli("reprice", "--src", str(src), "--price-book", str(BOOK), "--out", str(tmp_path / "out"))
    assert out.returncode == 2
    assert str(src / "turns.parquet") in out.stderr and "prompt_tokens" in out.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_validate_names_a_typed_in_cost(tmp_path):
    episodes, turns = trajectories()
    turns.loc[0, "cost_usd"] = 0.5  # typed in, not derived from tokens
    src = write_set(tmp_path / "src", episodes, turns)
    out = run_cli("validate", "--src", str(src), "--pool", str(POOL), "--price-book", str(BOOK))
    assert out.returncode == 2
    assert "cost_usd" in out.stderr and str(src) in out.stderr


@pytest.mark.slow
def test_validate_passes_a_clean_set(tmp_path):
    src = write_set(tmp_path / "src", *trajectories())
    out = run_cli("validate", "--src", str(src), "--pool", str(POOL), "--price-book", str(BOOK))
    assert out.returncode == 0, out.stderr
    assert "checks passed" in out.stdout


@pytest.mark.slow
def test_missing_dataset_file_exits_naming_it(tmp_path):
    missing = tmp_path / "nope.jsonl"
    out = run_cli("import-qa", str(missing), "--out", str(tmp_path / "tasks.jsonl"))
    assert out.returncode == 2 and str(missing) in out.stderr
    assert not (tmp_path / "tasks.jsonl").exists()


@pytest.mark.slow
def test_dataset_line_without_its_field_is_named(tmp_path):
    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n" + json.dumps({"question": "x"}) + "\n")
    out = run_cli("import-qa", str(data), "--format", "gsm8k", "--out", str(tmp_path / "tasks.jsonl"))
    assert out.returncode == 2 and str(data) in out.stderr and "answer" in out.stderr
    assert not (tmp_path / "tasks.jsonl").exists()


@pytest.mark.slow
def test_unknown_worker_in_pool_params_is_rejected(tmp_path):
    pool = yaml.safe_load(POOL.read_text())
    pool["workers"][0]["colour"] = "blue"
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump(pool))
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["pool"]["file"] = str(tmp_path / "pool.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    out = run_cli("stage", "collect", "--params", str(tmp_path / "params.yaml"), cwd=tmp_path)
    assert out.returncode == 2
    assert "pool.yaml" in out.stderr and "workers[0].colour" in out.stderr
