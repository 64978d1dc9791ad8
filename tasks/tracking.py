"""MLflow tracking: one parent run per pipeline run, one nested run per stage.

Each stage leaves a manifest (params, metrics, input/output hashes, artifacts) under
reports/stages/; this module turns those manifests into MLflow runs tagged with the git commit.
It is the only place the pipeline talks to MLflow's tracking API.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from routerops.config import TrackConfig

STAGE_ORDER = ("materialise", "collect", "reprice", "validate", "evaluate", "routers", "register")


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


def use_tracking(cfg: TrackConfig) -> str:
    """Point MLflow at the configured store (env MLFLOW_TRACKING_URI wins) and experiment."""
    import mlflow

    uri = os.environ.get("MLFLOW_TRACKING_URI", cfg.tracking_uri)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    if mlflow.get_experiment_by_name(cfg.experiment) is None:
        artifact_root = Path(cfg.artifact_root).resolve()
        artifact_root.mkdir(parents=True, exist_ok=True)
        # The tag makes MLflow 3 open the experiment on its runs table, not the GenAI overview.
        mlflow.create_experiment(cfg.experiment, artifact_location=artifact_root.as_uri(),
                                 tags={"mlflow.experimentKind": "custom_model_development"})
    mlflow.set_experiment(cfg.experiment)
    return uri


def log_stage(manifest: dict[str, Any], commit: str) -> str:
    """One nested MLflow run for one stage manifest; returns its run id."""
    import mlflow

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


def log_pipeline_runs(cfg: TrackConfig, manifest_dir: Path = Path("reports/stages")) -> dict[str, str]:
    """Log every stage manifest present, in pipeline order, under one parent run."""
    import mlflow

    use_tracking(cfg)
    commit = git_commit()
    manifests = [json.loads((manifest_dir / f"{s}.json").read_text())
                 for s in STAGE_ORDER if (manifest_dir / f"{s}.json").is_file()]
    with mlflow.start_run(run_name="pipeline") as parent:
        mlflow.set_tags({"git_commit": commit, "stages": ",".join(m["stage"] for m in manifests)})
        run_ids = {"pipeline": parent.info.run_id}
        for manifest in manifests:
            run_ids[manifest["stage"]] = log_stage(manifest, commit)
    return run_ids


def main() -> None:
    """DVC's track stage: `python -m tasks.tracking`."""
    from routerops.config import load_params
    from routerops.stages import REPORTS, write_json

    params = load_params()
    run_ids = log_pipeline_runs(params.track)
    write_json(run_ids, REPORTS / "mlflow_runs.json")
    print(json.dumps(run_ids, indent=2))


if __name__ == "__main__":
    main()
