"""The one contract every registered router meets, and the one MLflow pyfunc loader for all of them.

A `Servable` is a fitted router wrapped for serving: it saves itself to a directory and loads back
from it, names its MLflow signature, input example, provenance tags and params, and answers
`predict(DataFrame) -> DataFrame`. evaluation/registry.py logs any Servable the same way (one
`register()`, one `promote()`), whatever the served family: the families and their servable
classes are registered in evaluation/serving/ (single-turn routers, MTRouter, the orchestrator,
critique-and-route).

Every saved directory holds `servable.json` naming the family (and class) that loads it, so
evaluation/serving (the family registry, which `load_servable` reads) is the only pyfunc *loader
module* (mlflow.pyfunc "workflow 2": MLflow imports it and calls `_load_pyfunc(data_path)`), and
models/ never imports mlflow. This module is below every family's servable, and imports none.
"""

from __future__ import annotations

import difflib
import json
import logging
import numbers
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pandas as pd

from routerops import schema
from routerops.errors import InputError

SERVABLE_FILE = "servable.json"
SERVABLE_FORMAT = 1
# Output columns every servable shares: the chosen worker and one estimated score per worker.
WORKER_COLUMN, SCORE_PREFIX, BUDGET_COLUMN = "worker", "score:", "budget_usd"
MODEL_INPUT = "<model input>"  # how input errors name the request
# The most characters of one text a router reads. Far above real prompts the router needs to see:
# the sentence encoder reads only its first 256 tokens (about 1,000 characters) and MTRouter's
# history budget is smaller still, so nothing routing uses is cut; what is cut is the cost of
# tokenising the rest (a 10 MB query took 24 s). Longer texts are routed on their first (a query, a
# task) or last (an MTRouter action or observation) MAX_TEXT_CHARS characters.
MAX_TEXT_CHARS = 100_000

log = logging.getLogger(__name__)


@runtime_checkable
class Servable(Protocol):
    """What evaluation/registry.py needs of a router to log, load, serve and judge it."""

    served_as: str  # its served family (evaluation/serving: SERVED_FAMILIES), e.g. "single-turn"
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


# ---------------------------------------------------------------- checking a request


def reject_unknown_columns(frame: pd.DataFrame, allowed: Sequence[str]) -> None:
    """Every column must be one the servable reads: a misspelt `budget` would otherwise be ignored
    and the request routed with no budget at all."""
    unknown = [str(c) for c in frame.columns if c not in allowed]
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(allowed), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise InputError(MODEL_INPUT, unknown[0], f"unknown input column; {hint}the model reads {', '.join(allowed)}")


def _is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _is_missing(value: Any) -> bool:
    """None, NaN, pd.NA: a cell left empty (pd.isna of a list is an array: not missing)."""
    missing = pd.isna(value)
    return isinstance(missing, (bool, np.bool_)) and bool(missing)


def read_limits(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A per-row limit (USD budget, turns left): a number ≥ 0, or missing (None/NaN, or no column)
    for no limit, which reads as inf. Text, booleans and negative numbers are InputErrors."""
    if column not in frame:
        return np.full(len(frame), np.inf)
    limits = np.full(len(frame), np.inf)
    for i, value in enumerate(frame[column]):
        if _is_missing(value):
            continue
        if not (_is_number(value) and value >= 0):
            raise InputError(MODEL_INPUT, f"{column}[{i}]", f"expected a number ≥ 0 (or null for no limit), "
                                                           f"got {value!r}")
        limits[i] = float(value)
    return limits


def read_texts(frame: pd.DataFrame, column: str) -> list[str]:
    """The column's texts; a missing (None/NaN), non-text or blank cell is an InputError, never
    routed as the text "None"."""
    texts = []
    for i, value in enumerate(frame[column]):
        if not isinstance(value, str) or not value.strip():
            raise InputError(MODEL_INPUT, f"{column}[{i}]", f"expected non-empty text, got {value!r}")
        texts.append(value)
    return texts


def cap_text(text: str, keep: str = "head") -> str:
    """`text` cut to MAX_TEXT_CHARS, keeping its start (`head`) or its end (`tail`)."""
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return text[:MAX_TEXT_CHARS] if keep == "head" else text[-MAX_TEXT_CHARS:]


def warn_if_capped(texts: Sequence[str], column: str) -> None:
    """Say when `cap_text` will cut a request's query or task: the caller should know."""
    long = sum(len(t) > MAX_TEXT_CHARS for t in texts)
    if long:
        log.warning("%d %s text(s) longer than %d characters: routed on their first %d", long, column,
                    MAX_TEXT_CHARS, MAX_TEXT_CHARS)


# ---------------------------------------------------------------- saving and loading


def write_servable_meta(servable: Servable, directory: Path, **extra: Any) -> Path:
    """Record which family (and class) loads `directory` (read by `load_servable` and the pyfunc
    loader); `extra` holds what the class's `load` needs beyond the saved router (e.g. the suite)."""
    cls = type(servable)
    meta = {"format": SERVABLE_FORMAT, "served_as": cls.served_as, "class": f"{cls.__module__}:{cls.__qualname__}",
            "family": servable.family, **extra}
    schema.write_json_atomic(meta, Path(directory) / SERVABLE_FILE)
    return directory


def servable_json(directory: str | Path) -> dict[str, Any]:
    return json.loads((Path(directory) / SERVABLE_FILE).read_text())
