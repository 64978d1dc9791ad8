"""MLflow tracking: one parent run per pipeline run, one nested run per stage.

Each stage leaves a manifest (params, metrics, input/output hashes, artifacts) in its pipeline's
manifest folder (stages/manifest.py); this module turns those manifests into MLflow runs tagged
with the git commit. The registry (evaluation/registry.py) is the only other MLflow user.

Every input a run read is also logged as an MLflow dataset input (`log_dataset_inputs`), so the UI's
Dataset column and the run comparison show which data and which price book each run used: named by
its repo-relative path, with DVC's hash as the digest, the split as the context and the row count in
the profile.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable

import mlflow
import mlflow.data
import pandas as pd
import yaml

from evaluation.mlflow_store import follow_moved_store
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


def artifact_location(cfg: TrackConfig, create: bool = True) -> str:
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
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path.as_uri()


def use_tracking(cfg: TrackConfig) -> str:
    """Point MLflow at the configured store (env MLFLOW_TRACKING_URI wins) and experiment; a store that
    moved with its project has its artifact locations rewritten first (evaluation/mlflow_store.py)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", cfg.tracking_uri)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    follow_moved_store(uri, artifact_location(cfg, create=False))  # a store copied or moved with its project
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
        log_dataset_inputs(manifest["inputs"], recorded_sha256=manifest["inputs"])
        for artifact in manifest.get("artifacts", []):
            if Path(artifact).is_file():
                mlflow.log_artifact(artifact)
        return run.info.run_id


def log_pipeline_runs(cfg: TrackConfig, manifest_dir: Path, stage_order: list[str],
                      run_name: str = "pipeline", tags: dict[str, str] | None = None) -> dict[str, str]:
    """Log the manifests of `stage_order` present in `manifest_dir`, in that order, under one parent
    run (tagged with `tags`); a stage that left several manifests (e.g. one per ablation,
    `mtrouter-ablations-full.json`) logs each. The parent also lists every stage's inputs as its datasets:
    the runs table shows parents by default, and comparing two pipelines starts there."""
    use_tracking(cfg)
    commit = git_commit()
    manifests = [json.loads(path.read_text()) for stage in stage_order
                 for path in sorted(manifest_dir.glob(f"{stage}*.json"))]
    with mlflow.start_run(run_name=run_name) as parent:
        mlflow.set_tags({"git_commit": commit, "stages": ",".join(m["stage"] for m in manifests), **(tags or {})})
        run_ids = {"pipeline": parent.info.run_id}
        for manifest in manifests:
            run_ids[manifest["stage"]] = log_stage(manifest, commit)
        log_dataset_inputs(*all_inputs(manifests))
    return run_ids


def all_inputs(manifests: list[dict]) -> tuple[list[str], dict[str, str]]:
    """(paths, recorded sha256 by path) of the inputs of every manifest, each path once; a path two
    stages read with different contents keeps the first record, so the later one shows as changed."""
    recorded: dict[str, str] = {}
    for manifest in manifests:
        for path, sha in manifest["inputs"].items():
            recorded.setdefault(path, sha)
    return list(recorded), recorded


# ---------------------------------------------------------------- dataset inputs

TABLE_READERS: dict[str, Callable[[Path], pd.DataFrame]] = {
    ".parquet": pd.read_parquet,
    ".jsonl": lambda path: pd.read_json(path, lines=True),
    ".csv": pd.read_csv,
}
SPLITS = ("train", "val", "validation", "test", "ood", "eval", "sft", "rl")  # file stems that name a split


def file_digests(path: Path) -> tuple[str, str]:
    """(md5, sha256) of a file in one read: md5 is DVC's hash, sha256 is what manifests record."""
    md5, sha = hashlib.md5(), hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            md5.update(chunk)
            sha.update(chunk)
    return md5.hexdigest(), sha.hexdigest()


def dvc_md5(path: str | Path) -> str:
    """The hash dvc.lock records for `path`, so a run's digest can be looked up in dvc.lock and the DVC
    cache. DVC 3 hashes a file as the md5 of its bytes; a directory as the md5 of the JSON list of its
    files ({"md5", "relpath"} sorted by relpath, json.dumps with sorted keys: dvc_data's Tree.as_bytes)
    with ".dir" appended, which names the directory's listing object in the cache."""
    path = Path(path)
    if path.is_file():
        return file_digests(path)[0]
    entries = sorted(({"md5": file_digests(f)[0], "relpath": f.relative_to(path).as_posix()}
                      for f in path.rglob("*") if f.is_file()), key=lambda e: e["relpath"])
    return hashlib.md5(json.dumps(entries, sort_keys=True).encode("utf-8")).hexdigest() + ".dir"


def dataset_name(path: Path) -> str:
    """The repo-relative path: DVC runs every stage from the repository root, so a path under the
    working directory is named as dvc.yaml and dvc.lock name it; any other path keeps its recorded form."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def _local_source(name: str):
    from mlflow.data.dataset_source_registry import resolve_dataset_source

    with warnings.catch_warnings():
        # MLflow registers two local-file source classes and warns that a path matches both.
        warnings.simplefilter("ignore", UserWarning)
        return resolve_dataset_source(name)


def _split_context(frame: pd.DataFrame, path: Path) -> tuple[str, dict[str, str]]:
    """The run's context for a table: its split when it holds one (a `split` column or a file stem
    such as train.jsonl); "input" when it holds several, with the rows per split as a tag."""
    if "split" in frame.columns:
        counts = frame["split"].astype(str).value_counts(sort=False)
        if len(counts) == 1:
            return str(counts.index[0]), {}
        return "input", {"splits": ",".join(f"{k}={v}" for k, v in counts.items())}
    return (path.stem if path.stem in SPLITS else "input"), {}


def pandas_dataset(frame: pd.DataFrame, name: str, digest: str):
    """An MLflow dataset of `frame` with its schema read now. MLflow infers a dataset's schema with its
    model-signature code, which hints at every integer column that "integer columns cannot represent
    missing values at inference time": advice for a model's input, not for a logged table whose token
    counts are integers by schema (routerops/schema.py). Read here, the schema is cached on the dataset
    and the hint (once per table, dozens per run) is not shown."""
    dataset = mlflow.data.from_pandas(frame, source=_local_source(name), name=name, digest=digest)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Hint: Inferred schema contains integer column", category=UserWarning)
        dataset.schema  # noqa: B018 - a cached property: computed once, here
    return dataset


def table_dataset(path: Path, name: str, digest: str):
    """(dataset, context, tags) for a Parquet, JSON-lines or CSV table: schema and row count from the data."""
    frame = TABLE_READERS[path.suffix](path)
    context, tags = _split_context(frame, path)
    dataset = pandas_dataset(frame, name, digest)
    return dataset, context, {"rows": str(len(frame)), **tags}


def yaml_dataset(path: Path, name: str, digest: str):
    """(dataset, context, tags) for a YAML config. A price book (a `prices` mapping) becomes its price
    table, one row per worker, so a run's prices can be read and compared in the UI."""
    from mlflow.data.meta_dataset import MetaDataset

    doc = yaml.safe_load(path.read_text()) or {}
    version = {k: str(doc[k]) for k in ("version", "effective_date", "name") if isinstance(doc, dict) and k in doc}
    if isinstance(doc, dict) and isinstance(doc.get("prices"), dict):
        prices = pd.DataFrame([{"worker": w, **(p or {})} for w, p in doc["prices"].items()])
        dataset = pandas_dataset(prices, name, digest)
        return dataset, "price_book", {"rows": str(len(prices)), **version}
    return MetaDataset(source=_local_source(name), name=name, digest=digest), "input", version


def file_dataset(path: str | Path, digest: str | None = None):
    """(dataset, context, tags) for one input file or directory; `digest` is its dvc_md5 (computed if None)."""
    from mlflow.data.meta_dataset import MetaDataset

    path = Path(path)
    name, digest = dataset_name(path), digest or dvc_md5(path)
    if path.is_file() and path.suffix in TABLE_READERS:
        return table_dataset(path, name, digest)
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        return yaml_dataset(path, name, digest)
    return MetaDataset(source=_local_source(name), name=name, digest=digest), "input", {}


def log_dataset_inputs(paths: Iterable[str | Path], recorded_sha256: dict[str, str] | None = None,
                       context: str | None = None) -> list[str]:
    """Log each existing input as a dataset input of the active run; returns the names logged.
    `context` overrides the one read from the data (e.g. "train" for the conversations SFT learns from).

    `recorded_sha256` (a manifest's inputs) guards the digest: a file rewritten since the stage read it
    is not what the run used, so it is left out and named in the `datasets.changed` tag instead."""
    logged, changed = [], []
    for path in map(Path, paths):
        if not path.exists():
            continue
        md5, sha256 = file_digests(path) if path.is_file() else (dvc_md5(path), None)
        if recorded_sha256 and sha256 is not None and sha256 != recorded_sha256.get(str(path)):
            changed.append(dataset_name(path))
            continue
        dataset, found_context, tags = file_dataset(path, md5)
        mlflow.log_input(dataset, context=context or found_context, tags=tags)
        logged.append(dataset.name)
    if changed:
        mlflow.set_tag("datasets.changed", ",".join(changed)[:5000])
    return logged


def main() -> int:
    """`python -m evaluation.tracking`: open the project's store as the pipeline does (following a
    move), before `make mlflow-ui` serves it."""
    import logging
    import sys

    from routerops.config import load_params

    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    use_tracking(load_params(Path("params.yaml"), sections=("track",)).track)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
