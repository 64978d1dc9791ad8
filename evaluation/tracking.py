"""MLflow tracking: one parent run per pipeline run, one nested run per stage.

Each stage leaves a manifest (params, metrics, input/output hashes, artifacts) in its pipeline's
manifest folder (stages/manifest.py); this module turns those manifests into MLflow runs tagged
with the git commit. The registry (evaluation/registry.py) is the only other MLflow user.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import mlflow

from routerops.config import TrackConfig


def git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def artifact_location(cfg: TrackConfig) -> str:
    """Where a new experiment keeps its artifacts: env ROUTEROPS_ARTIFACT_ROOT, else track.artifact_root.

    A URI (`s3://bucket/prefix`: a team's shared store; MLflow's S3 client reads
    MLFLOW_S3_ENDPOINT_URL and the AWS_* keys from the environment) is used as it is; a plain path is
    made absolute and created. MLflow fixes the location when it creates the experiment, so changing
    it later moves only new experiments.
    """
    root = os.environ.get("ROUTEROPS_ARTIFACT_ROOT") or cfg.artifact_root
    if "://" in root:
        return root.rstrip("/")
    path = Path(root).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


def use_tracking(cfg: TrackConfig) -> str:
    """Point MLflow at the configured store (env MLFLOW_TRACKING_URI wins) and experiment."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", cfg.tracking_uri)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    if mlflow.get_experiment_by_name(cfg.experiment) is None:
        # The tag makes MLflow 3 open the experiment on its runs table, not the GenAI overview.
        mlflow.create_experiment(cfg.experiment, artifact_location=artifact_location(cfg),
                                 tags={"mlflow.experimentKind": "custom_model_development"})
    mlflow.set_experiment(cfg.experiment)
    return uri


def log_stage(manifest: dict[str, Any], commit: str) -> str:
    """One nested MLflow run for one stage manifest; returns its run id."""
    with mlflow.start_run(run_name=manifest["stage"], nested=True) as run:
        params = {k: str(v)[:500] for k, v in flatten(manifest["params"]).items()}
        if params:
            mlflow.log_params(params)
        numeric = {k: float(v) for k, v in flatten(manifest["metrics"]).items() if isinstance(v, (int, float))}
        if numeric:
            mlflow.log_metrics(numeric)
        tags = {"git_commit": commit, "stage": manifest["stage"]}
        tags.update({f"input_sha256.{k}": v for k, v in manifest["inputs"].items()})
        tags.update({f"output_sha256.{k}": v for k, v in manifest["outputs"].items()})
        mlflow.set_tags(tags)
        for artifact in manifest.get("artifacts", []):
            if Path(artifact).is_file():
                mlflow.log_artifact(artifact)
        return run.info.run_id


def log_pipeline_runs(cfg: TrackConfig, manifest_dir: Path, stage_order: list[str],
                      run_name: str = "pipeline") -> dict[str, str]:
    """Log the manifests of `stage_order` present in `manifest_dir`, in that order, under one parent
    run; a stage that left several manifests (e.g. one per ablation, `mt-ablation-full.json`) logs each."""
    use_tracking(cfg)
    commit = git_commit()
    manifests = [json.loads(path.read_text()) for stage in stage_order
                 for path in sorted(manifest_dir.glob(f"{stage}*.json"))]
    with mlflow.start_run(run_name=run_name) as parent:
        mlflow.set_tags({"git_commit": commit, "stages": ",".join(m["stage"] for m in manifests)})
        run_ids = {"pipeline": parent.info.run_id}
        for manifest in manifests:
            run_ids[manifest["stage"]] = log_stage(manifest, commit)
    return run_ids
