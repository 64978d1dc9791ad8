"""The auditor's path through the team's S3 store, with real DVC and a real SeaweedFS.

A team member runs the pipeline up to the evaluation report (tiny scale, real local LLM), commits
code, dvc.lock and the report, and `dvc push`es the data to S3. An auditor clones the repository,
`dvc pull`s from S3 (no LLM call), finds `dvc repro` has nothing to do, and re-runs the cost-dependent
stages by force: the committed report comes back byte for byte.

Only the stages up to `evaluate` run: the rest of the pipeline adds minutes, not a different path.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from services.s3 import configure_storage, list_keys
from tests.flows.test_pipeline import copy_repository, dvc, shrink_params

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
# reprice onward, as far as this test runs the pipeline: what a new price book re-runs (dvc.yaml).
COST_STAGES = ["reprice", "validate", "evaluate"]
REPORTS = ["reports/validation.json", "reports/eval/metrics.json", "reports/eval/leaderboard.csv",
           "reports/eval/leaderboard.md", "reports/eval/breakdown.csv", "reports/eval/accuracy_cost.png"]


def git(root: Path, *args: str) -> str:
    return subprocess.run(GIT + list(args), cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def team_repo(tmp_path, s3_env, monkeypatch):
    """The team's repository at tiny scale, its DVC remote pointed at the SeaweedFS under test."""
    root = tmp_path / "team"
    root.mkdir()
    copy_repository(root)
    shrink_params(root)
    git(root, "commit", "-qam", "tiny scale")
    monkeypatch.chdir(root)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / "prefect"))
    configure_storage(root)
    return root


def test_clone_pull_repro_reproduces_the_committed_report(team_repo, tmp_path, s3_env):
    dvc(team_repo, "repro", "evaluate")
    git(team_repo, "add", "-A")
    git(team_repo, "add", "-f", *REPORTS)  # reports/ is git-ignored; a team commits the ones it publishes
    git(team_repo, "commit", "-qm", "results")
    dvc(team_repo, "push")
    assert any(key.startswith("store/files/md5/") for key in list_keys("routerops-dvc", "store/"))

    auditor = tmp_path / "auditor"
    subprocess.run(["git", "clone", "-q", str(team_repo), str(auditor)], check=True)
    assert not (auditor / ".dvc/config.local").exists()  # the endpoint is per machine, not committed
    configure_storage(auditor)
    # What this commit's evaluation stands on; the lock also lists pipelines this test never ran.
    dvc(auditor, "pull", "--with-deps", "evaluate")
    assert (auditor / "data/raw/turns.parquet").is_file()

    out = dvc(auditor, "repro", "evaluate")
    assert "Running stage" not in out, out  # pulled data + committed lock: nothing to do

    committed = {name: (auditor / name).read_bytes() for name in REPORTS}
    out = dvc(auditor, "repro", "--force", "--single-item", *COST_STAGES)
    for stage in COST_STAGES:
        assert f"Running stage '{stage}'" in out, out
    assert "Running stage 'collect'" not in out
    changed = {name for name in REPORTS if (auditor / name).read_bytes() != committed[name]}
    assert not changed, f"re-running {COST_STAGES} changed {changed}"
    assert git(auditor, "status", "--porcelain", "--untracked-files=no") == ""  # dvc.lock too
