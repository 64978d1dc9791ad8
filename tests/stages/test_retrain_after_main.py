"""The retrain a user runs after `make demo` (issue 40): a new price book re-prices the main run's logged
trajectories with zero LLM calls and the gate decides; a retrain stopped with SIGTERM in the middle of a
collection ends within 10 s, with no traceback, its Prefect flow run Cancelled and its MLflow run KILLED.

The LLM worker is a real OpenAI-compatible HTTP server that counts the calls it answers
(routerops/workers/chaos.py: DelayedEndpoint), so "zero calls" is counted where calls arrive.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from routerops.config import load_params
from routerops.layout import Layout
from routerops.workers.chaos import DelayedEndpoint
from stages.pipeline import collect, materialise
from tests.flows.test_retrain_service import llm_worker, write_book, write_params, write_pool

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]
SYMPY = {"name": "sympy", "kind": "sympy", "primitives": ["sympy"], "attributes": {"params_b": 0}, "concurrency": 2,
         "timeout_s": 10}


def routerops(root: Path, *args: str, env: dict) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "cli", *args], cwd=root, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


def stage_metrics(root: Path, stage: str) -> dict:
    return json.loads((root / "retrain/reports/stages" / f"{stage}.json").read_text())["metrics"]


def test_retrain_after_the_main_run_reprices_without_calls_and_a_sigterm_cancels_it(tmp_path, new_mlflow_db):
    root = tmp_path / "repo"
    root.mkdir()
    new_mlflow_db(root / "mlflow.db")  # the store params.yaml names, migrated once per session (tests/conftest.py)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFECT_HOME": str(tmp_path / "prefect")}
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "ROUTEROPS_ARTIFACT_ROOT"):
        env.pop(name, None)
    endpoint = DelayedEndpoint(delay_s=0.0)
    with endpoint as url:
        pool = write_pool(root, "pool.yaml", [llm_worker("smol-direct", url, 16, "Reply with the answer."), SYMPY])
        write_params(root, pool, write_book(root, "book-2026-11.yaml", "2026-11-01", cot_input=1.0))
        params, layout = load_params(root / "params.yaml"), Layout(root)
        collect(params, layout, materialise(params, layout, layout.replay_table))  # main's collection (suites: no table read)
        main_calls = endpoint.requests
        assert main_calls > 0

        book = write_book(root, "book-2026-12.yaml", "2026-12-01", cot_input=2.0)
        book_doc = yaml.safe_load(book.read_text())
        book_doc["prices"]["smol-direct"]["output_per_1m"] = 0.8  # the change to re-price
        book.write_text(yaml.safe_dump(book_doc))
        published = routerops(root, "prices", "publish", str(book), "--root", str(root), env=env).stdout
        assert "(run `make retrain`)" in published
        out = routerops(root, "run", "retrain", "--root", str(root), env=env)
        assert endpoint.requests == main_calls, "the retrain called the LLM"
        grid = stage_metrics(root, "collect-grid")
        assert grid["episodes_collected"] == 0 and grid["llm_server_started"] == 0
        assert grid["episodes_from_main_run"] == grid["episodes"] > 0
        assert "taken from the main pipeline's logged trajectories" in out.stdout + out.stderr
        priced = pd.read_parquet(root / "retrain/data/priced/episodes.parquet")
        assert set(priced.price_book_version) == {"2026-12-01"}
        main = pd.read_parquet(root / "data/raw/episodes.parquet").set_index(["task_id", "policy"])
        again = priced.set_index(["task_id", "policy"])
        assert (again.score == main.loc[again.index, "score"]).all()  # the main run's outcomes, re-priced
        assert (again.completion_tokens == main.loc[again.index, "completion_tokens"]).all()
        decision = json.loads((root / "retrain/reports/registry.json").read_text())["decision"]
        assert decision["evidence"]["data.price_book_version"] == "2026-12-01"  # the gate decided, on the new prices
        assert isinstance(decision["promote"], bool) and decision["reason"]

        # A pool change collects the new worker's cells; stopped in the middle of that collection:
        endpoint.delay_s = 30.0  # every call now hangs, so the stop lands inside the collection
        slow = llm_worker("smol-brief", url, 8, "Reply in one word.")
        pool_b = write_pool(root, "pool-b.yaml", [llm_worker("smol-direct", url, 16, "Reply with the answer."),
                                                  SYMPY, slow])
        book_doc["prices"]["smol-brief"] = {"input_per_1m": 0.05, "output_per_1m": 0.2}
        book.write_text(yaml.safe_dump({**book_doc, "version": "2026-12-02"}))
        routerops(root, "prices", "publish", str(book), "--root", str(root), env=env)
        routerops(root, "pool", "publish", str(pool_b), "--root", str(root), env=env)
        proc = subprocess.Popen([sys.executable, "-m", "cli", "run", "retrain", "--root", str(root)], cwd=root,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + 600
        while endpoint.requests == main_calls and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[0]
        stopped = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        output = proc.communicate(timeout=120)[0]
        took = time.monotonic() - stopped
    assert proc.returncode == 143, output
    assert took < 10, f"{took:.1f} s to stop"
    assert "Traceback" not in output and "ConnectError" not in output, output
    assert "stopped by SIGTERM" in output and "Cancelled" in output and "KILLED" in output, output
    with sqlite3.connect(tmp_path / "prefect" / "prefect.db") as db:
        states = [s for (s,) in db.execute("SELECT state_type FROM flow_run ORDER BY created")]
    assert states[-1] == "CANCELLED" and states[-2] == "COMPLETED", states
    with sqlite3.connect(root / "mlflow.db") as db:
        last = db.execute("SELECT name, status FROM runs ORDER BY start_time DESC LIMIT 1").fetchone()
    assert last == ("retrain", "KILLED")
