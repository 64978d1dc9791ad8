"""The one contract every registered router meets, and the one MLflow pyfunc loader for all of them.

A `Servable` is a fitted router wrapped for serving: it saves itself to a directory and loads back
from it, names its MLflow signature, input example, provenance tags and params, and answers
`predict(DataFrame) -> DataFrame`. evaluation/registry.py logs any Servable the same way (one
`register()`, one `promote()`), whatever the router family: single-turn routers
(evaluation/serving.py: `ServedRouter`) and the multi-turn MTRouter (evaluation/mtrouter_serving.py:
`ServedMTRouter`).

Every saved directory holds `servable.json` naming the class that loads it, so this module is the
only pyfunc *loader module* (mlflow.pyfunc "workflow 2": MLflow imports it and calls
`_load_pyfunc(data_path)`), and models/ never imports mlflow.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import pandas as pd

from routerops import schema
from routerops.errors import InputError

SERVABLE_FILE = "servable.json"
SERVABLE_FORMAT = 1
# Output columns every servable shares: the chosen worker and one estimated score per worker.
WORKER_COLUMN, SCORE_PREFIX, BUDGET_COLUMN = "worker", "score:", "budget_usd"


@runtime_checkable
class Servable(Protocol):
    """What evaluation/registry.py needs of a router to log, load, serve and judge it."""

    family: str  # registry family, e.g. "knn" or "mtrouter"
    workers: list[str]

    def registered_name(self) -> str: ...  # the MLflow registered-model name, e.g. router-knn

    def save(self, directory: Path) -> Path: ...

    @classmethod
    def load(cls, directory: Path) -> "Servable": ...

    def signature(self): ...  # mlflow.models.ModelSignature

    def input_example(self) -> pd.DataFrame | None: ...

    def tags(self) -> dict[str, str]: ...  # provenance: price book, workers, encoder ...

    def params(self) -> dict[str, Any]: ...  # logged on the registration run

    def needs_encoder(self) -> bool: ...  # whether serving needs the sentence-encoder packages

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame: ...


def write_servable_meta(servable: Servable, directory: Path, **extra: Any) -> Path:
    """Record which class loads `directory` (read by `load_servable` and the pyfunc loader); `extra`
    holds what the class's `load` needs beyond the saved router (e.g. the suite it serves)."""
    cls = type(servable)
    meta = {"format": SERVABLE_FORMAT, "class": f"{cls.__module__}:{cls.__qualname__}", "family": servable.family,
            **extra}
    schema.write_json_atomic(meta, Path(directory) / SERVABLE_FILE)
    return directory


def load_servable(directory: str | Path) -> Servable:
    """The servable saved in `directory`, loaded by the class its servable.json names."""
    directory = Path(directory)
    meta = schema.read_format_meta(directory / SERVABLE_FILE, SERVABLE_FORMAT, "saved router")
    module_name, _, qualname = meta["class"].partition(":")
    if not module_name.startswith("evaluation."):
        raise InputError(directory / SERVABLE_FILE, "class", f"{meta['class']!r} is not a routerops servable")
    cls = getattr(importlib.import_module(module_name), qualname)
    return cls.load(directory)


def servable_json(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / SERVABLE_FILE).read_text())


def _load_pyfunc(data_path: str) -> Servable:
    """MLflow's loader-module entry point: `data_path` is the directory the servable saved."""
    return load_servable(data_path)
