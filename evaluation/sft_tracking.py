"""The controller's SFT run in MLflow: its settings as params, the loss curve live (one point per
logging step, so a six-hour paper-scale run can be watched in the UI), the token counts, and the
adapter as artifacts. models/ never imports mlflow (evaluation/servable.py); training reaches this
module through train_sft's `callbacks`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import mlflow
from transformers import TrainerCallback

from evaluation.tracking import flatten, git_commit, log_dataset_inputs, use_tracking
from models.orchestrator.config import OrchestraConfig
from models.orchestrator.sft import RESULT_FILE, SFTResult, train_sft
from routerops.config import TrackConfig


def numeric(entry: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in entry.items() if isinstance(v, (int, float)) and k not in ("step", "epoch")}


class MLflowCurveCallback(TrainerCallback):
    """Logs every logging step's metrics (loss, learning rate, grad norm ...) to the active MLflow run
    at its global step. On a resumed run it first logs the history the checkpoint carries, so the
    run holds the whole curve."""

    def on_train_begin(self, args, state, control, **kwargs):
        for entry in state.log_history:
            if "loss" in entry:
                mlflow.log_metrics(numeric(entry), step=int(entry["step"]))

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            mlflow.log_metrics(numeric(logs), step=state.global_step)


def tracking_requested(track: TrackConfig | None) -> bool:
    return track is not None or bool(os.environ.get("MLFLOW_TRACKING_URI"))


def train_sft_tracked(config: OrchestraConfig, conversations_jsonl: str | Path, out_dir: str | Path,
                      track: TrackConfig | None = None, resume: bool = True, model_cache: Path | None = None,
                      run_name: str = "orchestra-sft") -> tuple[SFTResult, str | None]:
    """train_sft, logged to MLflow when a tracking store is set (`track`, or MLFLOW_TRACKING_URI with
    params.yaml's defaults); else plain train_sft. Returns (result, MLflow run id or None)."""
    if not tracking_requested(track):
        return train_sft(config, conversations_jsonl, out_dir, resume, model_cache), None
    use_tracking(track or TrackConfig())
    with mlflow.start_run(run_name=run_name, nested=mlflow.active_run() is not None) as run:
        settings = {"model": dataclasses.asdict(config.model), "sft": dataclasses.asdict(config.sft)}
        mlflow.log_params({k: str(v)[:500] for k, v in flatten(settings).items()})
        mlflow.set_tags({"git_commit": git_commit(), "stage": "orchestra-sft", "config": config.source})
        log_dataset_inputs([conversations_jsonl], context="train")  # the conversations SFT learns from
        result = train_sft(config, conversations_jsonl, out_dir, resume, model_cache, callbacks=[MLflowCurveCallback()])
        mlflow.log_metrics({f"data.{k}": float(v) for k, v in result.data.items()})
        mlflow.log_metrics({"train_seconds": result.train_seconds, "global_step": float(result.global_step)})
        mlflow.log_artifacts(str(result.adapter_dir), artifact_path="adapter")
        mlflow.log_artifact(str(Path(out_dir) / RESULT_FILE))
        return result, run.info.run_id
