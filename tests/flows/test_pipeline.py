"""End to end: the Prefect flow on a tiny suite with the real local LLM server, then DVC.

Checks the issues' promises: the flow leaves trajectories with real token counts, a passed
validation, the evaluation report with its plot and MLflow runs; `dvc repro` right after is a
no-op; the auditor's path through the team's S3 store (a real SeaweedFS) reproduces the committed
reports from a fresh clone; a price change re-runs only the cost stages, with no LLM call.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

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
    params["materialise"].update(train=1, val=1, test=1, ood=2)
    params["collect"].update(concurrency=2)
    params["replay"].update(routers=["random", "oracle", "logistic"], k=3, bootstrap=0)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    short_reply_pool(root / "configs")  # the copy's configs/pool.yaml, replies capped


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

    turns = pd.read_parquet(project / "data/raw/turns.parquet")
    llm_turns = turns[turns.worker.isin(["smol-direct", "smol-cot"])]
    assert len(llm_turns) > 0 and (llm_turns.prompt_tokens > 0).all() and (llm_turns.completion_tokens > 0).all()
    assert yaml.safe_load((project / "reports/validation.json").read_text())["passed"] is True
    assert (project / "reports/eval/accuracy_cost.png").stat().st_size > 1000
    leaderboard = pd.read_csv(project / "reports/eval/leaderboard.csv")
    assert {"uniform_random", "random_multi_turn", "single/smol-direct/answer"} <= set(leaderboard.policy)

    import mlflow

    runs = mlflow.search_runs(experiment_names=["routerops-pipeline"])
    assert {"pipeline", "collect", "evaluate"} <= set(runs["tags.mlflow.runName"])
    parent = runs[runs["tags.mlflow.runName"] == "pipeline"].iloc[0]
    assert parent["tags.routerops.price_book_version"] == "2026-11-01"
    assert parent["tags.routerops.pool_version"].startswith("embedded-smollm2-")
    assert set(run_ids) >= {"pipeline", "collect", "validate", "evaluate", "grid", "routers", "register", "replay"}
    # The honest protocol: routers fit on train only, test and OOD reported apart; the gate judges on val.
    routers = pd.read_csv(project / "reports/routers/leaderboard.csv")
    assert set(routers.split) == {"test", "ood"} and routers.protocol.str.contains("fit on train").all()
    registry = json.loads((project / "reports/registry.json").read_text())
    assert registry["gate_split"] == "val"
    assert all("/val/" in q for q in registry["decision"]["evidence"]["gate_ids"])
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
    book["prices"]["smol-cot"]["output_per_1m"] *= 2
    book_path.write_text(yaml.safe_dump(book))
    out = dvc(project, "repro")
    assert "Running stage 'reprice'" in out and "Running stage 'evaluate'" in out, out
    assert "Running stage 'collect'" not in out and "Running stage 'materialise'" not in out, out
    after = pd.read_parquet(project / "data/priced/episodes.parquet")
    assert set(after.price_book_version) == {"2026-12-01"}
    assert after.cost_usd.sum() > before
