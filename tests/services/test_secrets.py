"""Secrets stay in the environment: a tracked pipeline stage run with an LLM API key and the S3 key
pair exported, its MLflow artifacts in S3, leaves neither secret in any MLflow param, tag or
artifact, in the tracking store's file, nor in what the stages print."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from services.s3 import download_file, ensure_bucket, list_keys
from tests.flows.test_pipeline import copy_repository, shrink_params

pytestmark = [pytest.mark.slow]

BUCKET = "routerops-mlflow"


def run_stage(root: Path, name: str, env: dict[str, str]) -> str:
    """`routerops stage NAME` on the copy's own code; returns what it printed (stdout + stderr)."""
    out = subprocess.run([sys.executable, "-m", "cli", "stage", name], cwd=root, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def test_no_secret_reaches_mlflow_or_the_logs(s3_env, tmp_path, mlflow_db):
    import mlflow

    root = tmp_path / "repo"
    root.mkdir()
    copy_repository(root)
    shrink_params(root)
    api_key = "sk-test-" + secrets.token_hex(16)
    s3_secret = s3_env.credentials.secret_key
    ensure_bucket(BUCKET)
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    env = {**os.environ, "OPENAI_API_KEY": api_key, "MLFLOW_TRACKING_URI": tracking,
           "ROUTEROPS_ARTIFACT_ROOT": f"s3://{BUCKET}/secrets-test"}
    assert env["AWS_SECRET_ACCESS_KEY"] == s3_secret
    printed = run_stage(root, "outcomes", env) + run_stage(root, "replay", env) + run_stage(root, "track", env)

    # The artifacts are in the bucket, which only signed requests reach: the stage did use the secret.
    keys = list_keys(BUCKET, "secrets-test/")
    assert any(k.endswith("/artifacts/leaderboard.md") for k in keys), keys
    assert any(k.endswith("/artifacts/accuracy_cost.png") for k in keys), keys

    mlflow.set_tracking_uri(tracking)
    try:
        runs = mlflow.search_runs(experiment_names=["routerops-pipeline"], output_format="list")
    finally:
        mlflow.set_tracking_uri(None)
    assert {r.info.run_name for r in runs} >= {"pipeline", "replay"}
    recorded = [printed, (tmp_path / "mlflow.db").read_bytes().decode("latin-1")]
    for run in runs:
        recorded += [f"{k}={v}" for k, v in {**run.data.params, **run.data.tags}.items()]
    for i, key in enumerate(keys):
        recorded.append(download_file(BUCKET, key, tmp_path / "artifacts" / str(i)).read_bytes().decode("latin-1"))
    for secret, name in ((api_key, "OPENAI_API_KEY"), (s3_secret, "AWS_SECRET_ACCESS_KEY")):
        leaks = [text[:80] for text in recorded if secret in text]
        assert not leaks, f"{name} leaked into: {leaks}"
