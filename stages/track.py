"""The track stages: every stage manifest of a pipeline run → one MLflow parent run, one nested run
per stage (params, metrics, input and output hashes, artifacts, git commit)."""

from __future__ import annotations

from pathlib import Path

from evaluation.tracking import log_pipeline_runs
from routerops import schema
from routerops.config import Params
from routerops.layout import Layout
from stages.order import MAIN_ORDER, MTROUTER_ORDER
from stages.routers import inputs_in_force

# The stages whose manifests a track stage logs: every stage its pipeline declares before it.
PIPELINE_STAGES = [s for s in MAIN_ORDER if s != "track"]
MTROUTER_STAGES = [s for s in MTROUTER_ORDER if s != "mtrouter-track"]


def track(params: Params, layout: Layout, *upstream: Path) -> Path:
    """Log the main pipeline's manifests, the parent run tagged with the price book and pool versions;
    `upstream` are the last stages' outputs (ordering only)."""
    tags = {f"routerops.{k}": v for k, v in inputs_in_force(params, layout).items()}
    run_ids = log_pipeline_runs(params.track, layout.manifests, PIPELINE_STAGES, tags=tags)
    return schema.write_json_atomic(run_ids, layout.mlflow_runs)


def mtrouter_track(run, layout: Layout, registry: Path) -> Path:
    """Log the MTRouter pipeline's manifests under one `mtrouter` parent run (one nested run per
    ablation); `registry` is the register stage's report (ordering only)."""
    run_ids = log_pipeline_runs(run.track, layout.mtrouter_manifests, MTROUTER_STAGES, run_name="mtrouter")
    return schema.write_json_atomic(run_ids, layout.mtrouter_reports / "mlflow_runs.json")
