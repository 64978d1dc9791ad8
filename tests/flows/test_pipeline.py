"""End to end: the Prefect flow on a tiny suite with the real local LLM server, then DVC.

Checks the issues' promises: the flow leaves trajectories with real token counts, a passed
validation, the evaluation report with its plot and MLflow runs; `dvc repro` right after is a
no-op; the auditor's path through the team's S3 store (a real SeaweedFS) reproduces the committed
reports from a fresh clone; a price change re-runs only the cost stages, with no LLM call.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from routerops.workers.server import free_port
from tests.flows.conftest import short_reply_pool

REPO = Path(__file__).resolve().parents[2]
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
# What a new price book re-runs (dvc.yaml) and what they write; `register` and `track` are left out:
# they write to the auditor's own MLflow, whose run ids and versions differ by construction.
COST_STAGES = ["reprice", "validate", "evaluate", "grid", "routers"]
COST_REPORTS = ["reports/validation.json", "reports/eval/metrics.json", "reports/eval/leaderboard.csv",
                "reports/eval/leaderboard.md", "reports/eval/breakdown.csv", "reports/eval/accuracy_cost.png",
                "reports/routers/leaderboard.csv", "reports/routers/curves.csv", "reports/routers/meta.json",
                "reports/routers/accuracy_cost.png"]

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def copy_repository(dst: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, dst / name)
    git(dst, "init", "-q")
    git(dst, "add", "-A")
    git(dst, "commit", "-qm", "copy")


def git(root: Path, *args: str) -> str:
    return subprocess.run(GIT + list(args), cwd=root, check=True, capture_output=True, text=True).stdout


def shrink_params(root: Path) -> None:
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["materialise"].update(train=6, val=4, test=4)  # queries of the replay table, one split by query
    params["collect"].update(concurrency=2)
    params["replay"].update(routers=["random", "oracle", "logistic"], k=3, bootstrap=0)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    short_reply_pool(root / "configs", source="configs/pool.yaml")  # the copy's pool, SmolLM2's replies capped


def dvc(root: Path, *args: str) -> str:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, env=env, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    root.mkdir()
    copy_repository(root)
    shrink_params(root)
    git(root, "commit", "-qam", "tiny scale")
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    return root


def the_printed_gateway_command_and_sdk_snippet_answer_with_cost_headers(summary: str, root: Path) -> None:
    """Issue 39: the run ends with the commands that serve its champion. Run as printed (another port):
    a key, the gateway (it starts the replay endpoints and llama.cpp), the five SDK lines."""
    lines = summary.splitlines()
    serve = next(line.strip() for line in lines if line.strip().startswith("routerops gateway serve "))
    snippet = "\n".join(line[2:] for line in lines[lines.index(next(x for x in lines if x.strip() == "import os, openai")):]
                        [:5])
    port = str(free_port())
    key = json.loads(subprocess.run(["routerops", "gateway", "keys", "create", "--budget-usd", "1"], cwd=root,
                                    capture_output=True, text=True, check=True).stdout)["api_key"]
    log = root.parent / "gateway.log"  # outside the repository the team commits
    with open(log, "w") as sink:
        gateway = subprocess.Popen(serve.replace("--port 8000", f"--port {port}").split(), cwd=root,
                                   stdout=sink, stderr=subprocess.STDOUT)
    try:
        wait_for_champion(f"http://127.0.0.1:{port}/v1", key, gateway, log)
        code = snippet.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "ROUTEROPS_API_KEY": key},
                             capture_output=True, text=True, timeout=120)
    finally:
        gateway.terminate()
        gateway.wait(timeout=60)
    assert out.returncode == 0, out.stderr
    answer, headers = out.stdout.rstrip("\n").rsplit("\n", 1)
    headers = ast.literal_eval(headers)
    assert answer.strip() and headers["x-routerops-worker"] in {"gpt-4-1106", "mixtral-8x7b", "smollm2-135m"}
    assert float(headers["x-routerops-cost-usd"]) > 0


def wait_for_champion(base_url: str, key: str, process: subprocess.Popen, log: Path, timeout_s: float = 300) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            models = httpx.get(f"{base_url}/models", headers={"Authorization": f"Bearer {key}"}, timeout=5).json()
            if any(m["id"] == "auto" and not m["routerops"].get("refused") for m in models.get("data", [])):
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError("the gateway served no champion in time")


def the_auditor_reproduces_the_committed_reports(team: Path, auditor: Path, seaweedfs, monkeypatch) -> None:
    """The team commits code, dvc.lock and the reports it publishes and `dvc push`es the data to
    S3; an auditor clones, `dvc pull`s (no LLM call), finds `dvc repro` has nothing to do, and
    re-runs the cost-dependent stages by force: the committed reports come back byte for byte."""
    from services.s3 import configure_storage, list_keys

    for name, value in seaweedfs.env().items():  # the team member's keys, exported; nothing in a file
        monkeypatch.setenv(name, value)
    git(team, "add", "-A")
    git(team, "add", "-f", "reports")  # reports/ is git-ignored; a team commits the ones it publishes
    git(team, "commit", "-qm", "results")
    configure_storage(team)
    dvc(team, "push")
    assert any(key.startswith("store/files/md5/") for key in list_keys("routerops-dvc", "store/"))

    subprocess.run(["git", "clone", "-q", str(team), str(auditor)], check=True)
    assert not (auditor / ".dvc/config.local").exists()  # the endpoint is per machine, not committed
    configure_storage(auditor)
    # The main pipeline, as its committed lock describes it. A bare `dvc pull` also visits
    # pipelines/*/dvc.yaml, whose stages never ran here and have no lock: DVC calls that an error.
    dvc(auditor, "pull", "dvc.yaml")
    assert (auditor / "data/raw/turns.parquet").is_file() and (auditor / "data/grid/outcomes.parquet").is_file()
    out = dvc(auditor, "repro")
    assert "Running stage" not in out, out  # pulled data + committed lock: nothing to do

    committed = {name: (auditor / name).read_bytes() for name in COST_REPORTS}
    out = dvc(auditor, "repro", "--force", "--single-item", *COST_STAGES)
    assert all(f"Running stage '{stage}'" in out for stage in COST_STAGES), out
    assert "Running stage 'collect'" not in out
    changed = {name for name in COST_REPORTS if (auditor / name).read_bytes() != committed[name]}
    assert not changed, f"re-running {COST_STAGES} changed {changed}"
    assert git(auditor, "status", "--porcelain", "--untracked-files=no") == ""  # dvc.lock too


def test_flow_then_dvc_repro_then_audit_then_price_change(project, seaweedfs, prefect_api, tmp_path, monkeypatch, caplog,
                                                          capsys):
    from flows.pipeline import run_with_summary
    from routerops.layout import Layout
    from routerops.run_summary import pipeline_summary

    with caplog.at_level(logging.INFO):
        run_ids = json.loads(run_with_summary().read_text())  # what `routerops run main` (make demo) runs
    assert "Routers on real model outcomes" in capsys.readouterr().out  # the closing summary is printed
    # A run that speaks (issue 26): nothing logged as an error, no traceback (the collection's HTTP
    # clients used to be closed on a dead event loop), and a summary read from what it wrote.
    loud = [r.getMessage() for r in caplog.records
            if r.levelno >= logging.ERROR or r.exc_info or "Traceback" in r.getMessage()]
    assert not loud, loud
    summary = pipeline_summary(Layout(project))
    assert "Routers on real model outcomes" in summary and "  logistic" in summary
    assert "Registered router:" in summary and "reports/replay/accuracy_cost.png" in summary

    the_printed_gateway_command_and_sdk_snippet_answer_with_cost_headers(summary, project)

    turns = pd.read_parquet(project / "data/raw/turns.parquet")
    llm_turns = turns[turns.worker.isin(["smollm2-135m", "mixtral-8x7b", "gpt-4-1106"])]
    assert set(llm_turns.worker) == {"smollm2-135m", "mixtral-8x7b", "gpt-4-1106"}  # live and replayed alike
    assert (llm_turns.prompt_tokens > 0).all() and (llm_turns.completion_tokens > 0).all()
    assert (turns[turns.worker == "gpt-4-1106"].prompt_tokens > 1000).all()  # the logged 8-shot prompts
    assert yaml.safe_load((project / "reports/validation.json").read_text())["passed"] is True
    assert (project / "reports/eval/accuracy_cost.png").stat().st_size > 1000
    leaderboard = pd.read_csv(project / "reports/eval/leaderboard.csv")
    assert {"uniform_random", "random_multi_turn", "single/smollm2-135m/answer", "single/gpt-4-1106/answer"} <= set(
        leaderboard.policy)

    import mlflow

    runs = mlflow.search_runs(experiment_names=["routerops-pipeline"])
    assert {"pipeline", "collect", "evaluate"} <= set(runs["tags.mlflow.runName"])
    parent = runs[runs["tags.mlflow.runName"] == "pipeline"].iloc[0]
    assert parent["tags.routerops.price_book_version"] == "2026-12-07"
    assert parent["tags.routerops.pool_version"].startswith("gsm8k-replay-")
    assert set(run_ids) >= {"pipeline", "collect", "validate", "evaluate", "grid", "routers", "register", "replay"}
    # The honest protocol: routers fit on train only, test and OOD reported apart; the gate judges on val.
    routers = pd.read_csv(project / "reports/routers/leaderboard.csv")
    assert set(routers.split) == {"test"} and routers.protocol.str.contains("fit on train").all()
    registry = json.loads((project / "reports/registry.json").read_text())
    assert registry["gate_split"] == "val"
    tasks = [json.loads(line) for line in (project / "data/suites/tasks.jsonl").read_text().splitlines()]
    assert set(registry["decision"]["evidence"]["gate_ids"]) == {t["task_id"] for t in tasks if t["split"] == "val"}
    replay = pd.read_csv(project / "reports/replay/leaderboard.csv").set_index("router")
    assert replay.loc["oracle", "best_accuracy"] > replay.loc["single:gpt-4-1106-preview", "best_accuracy"]

    # `dvc status dvc.yaml`: the main pipeline (the MTRouter pipeline has its own file and never ran here).
    assert "Data and pipelines are up to date" in dvc(project, "status", "dvc.yaml")
    out = dvc(project, "repro")
    assert "Running stage" not in out, out

    with monkeypatch.context() as auditor_env:  # the auditor's own MLflow store
        auditor_env.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'auditor-mlflow.db'}")
        the_auditor_reproduces_the_committed_reports(project, tmp_path / "auditor", seaweedfs, auditor_env)

    before = pd.read_parquet(project / "data/priced/episodes.parquet").cost_usd.sum()
    book_path = project / "configs/prices/current.yaml"
    book = yaml.safe_load(book_path.read_text())
    book["version"] = "2026-12-01"
    book["effective_date"] = "2026-12-01"
    book["prices"]["gpt-4-1106"]["output_per_1m"] *= 2
    book_path.write_text(yaml.safe_dump(book))
    out = dvc(project, "repro")
    assert "Running stage 'reprice'" in out and "Running stage 'evaluate'" in out, out
    assert "Running stage 'collect'" not in out and "Running stage 'materialise'" not in out, out
    after = pd.read_parquet(project / "data/priced/episodes.parquet")
    assert set(after.price_book_version) == {"2026-12-01"}
    assert after.cost_usd.sum() > before
