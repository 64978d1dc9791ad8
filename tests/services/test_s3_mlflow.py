"""MLflow artifacts in the team's S3 bucket: an `s3://` artifact root makes runs' artifacts land in
SeaweedFS (MLflow's own S3 client, MLFLOW_S3_ENDPOINT_URL + AWS_* keys from the environment)."""

from __future__ import annotations

import pytest

from evaluation.tracking import artifact_location, use_tracking
from routerops.config import TrackConfig
from services.s3 import download_file, ensure_bucket, list_keys


def test_artifact_location_keeps_uris_and_resolves_paths(tmp_path, monkeypatch):
    monkeypatch.delenv("ROUTEROPS_ARTIFACT_ROOT", raising=False)
    assert artifact_location(TrackConfig(artifact_root="s3://team-mlflow/artifacts/")) == "s3://team-mlflow/artifacts"
    local = artifact_location(TrackConfig(artifact_root=str(tmp_path / "art")))
    assert local == (tmp_path / "art").as_uri() and (tmp_path / "art").is_dir()
    monkeypatch.setenv("ROUTEROPS_ARTIFACT_ROOT", "s3://other/root")
    assert artifact_location(TrackConfig(artifact_root=str(tmp_path / "art"))) == "s3://other/root"


@pytest.mark.slow
def test_run_artifacts_land_in_the_bucket(s3_env, tmp_path, monkeypatch, mlflow_db):
    import mlflow

    ensure_bucket("routerops-mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("ROUTEROPS_ARTIFACT_ROOT", "s3://routerops-mlflow/artifacts")
    use_tracking(TrackConfig(tracking_uri="unused", artifact_root="mlflow/artifacts", experiment="s3-artifacts"))
    assert mlflow.get_experiment_by_name("s3-artifacts").artifact_location == "s3://routerops-mlflow/artifacts"

    report = tmp_path / "leaderboard.md"
    report.write_text("| policy | accuracy |\n| oracle | 1.0 |\n")
    with mlflow.start_run() as run:
        mlflow.log_artifact(str(report), artifact_path="eval")

    keys = list_keys("routerops-mlflow", "artifacts/")
    expected = f"artifacts/{run.info.run_id}/artifacts/eval/leaderboard.md"
    assert expected in keys, keys
    back = download_file("routerops-mlflow", expected, tmp_path / "back.md")
    assert back.read_text() == report.read_text()
    # MLflow reads it back through the same store.
    fetched = mlflow.artifacts.download_artifacts(run_id=run.info.run_id, artifact_path="eval/leaderboard.md",
                                                  dst_path=str(tmp_path / "via-mlflow"))
    assert open(fetched).read() == report.read_text()
    mlflow.set_tracking_uri(None)
