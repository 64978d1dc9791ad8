"""What each stage leaves behind for tracking: a manifest of its params, metrics, input and output
hashes and artifacts, which the track stages (stages/track.py) turn into one MLflow run per stage."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterable

from routerops import schema


def hash_files(paths: Iterable[Path]) -> dict[str, str]:
    return {str(p): schema.file_sha256(p) for p in paths if Path(p).is_file()}


def write_manifest(folder: Path, stage: str, params: Any, inputs: Iterable[Path], outputs: Iterable[Path],
                   metrics: dict, artifacts: Iterable[Path] = ()) -> Path:
    """folder/<stage>.json (atomic). `params` is a config dataclass or a dict."""
    manifest = {
        "stage": stage,
        "params": dataclasses.asdict(params) if dataclasses.is_dataclass(params) else params,
        "inputs": hash_files(inputs),
        "outputs": hash_files(outputs),
        "metrics": metrics,
        "artifacts": [str(a) for a in artifacts],
    }
    return schema.write_json_atomic(manifest, Path(folder) / f"{stage.replace(':', '-')}.json")
