"""Saving a fitted MTRouter and serving it: a task and its history in, the next worker (or STOP) out.

`save_router` / `load_router` (behind `MTRouter.save` / `MTRouter.load`) write a directory that holds
no pickle:

  mtrouter.json   config (MTRouterConfig), pool, price book, ĉ(a) per worker, the expected episode
                  lengths of eq. 6, the estimator's scalars (target mean/std, input width, fit reports)
                  and the history encoder's id — readable without Python;
  estimator.pt    the OutcomeNets' state_dicts (torch.load(weights_only=True) reads them back);
  arrays.npz      the attribute table, the featurizer's surface-statistics mean/std, and the linear
                  coefficients of the linear head or of the Ridge ablation.

The frozen history encoder φ is *referenced* (cfg.encoder_kind / encoder_path / hashing_dim) and
rebuilt on load, so no encoder weights enter the directory.

This module is also an MLflow pyfunc *loader module* (`_load_pyfunc`), so models/ never imports
mlflow; tasks/registry.py logs the directory. Input: a DataFrame with `task` (text), `history` (JSON
list of {"action", "observation"}, possibly empty), optional `candidates` (JSON list of worker
names; default the whole pool), `budget_usd` (remaining; missing = no limit) and `turns_left`
(missing = no limit). Output: `worker` — eq. 8 (minus λ·ĉ) over the affordable candidates, or
"STOP" when no turn is left or none is affordable — and `score:<worker>` = ŝ(h_t, a) for every pool
worker (NaN for workers not among the row's candidates).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.history import Interaction
from models.serving import BUDGET_COLUMN, SCORE_PREFIX, WORKER_COLUMN
from routerops.errors import InputError
from routerops.pricing import Pool, Price, PriceBook, WorkerSpec

if TYPE_CHECKING:
    from models.mtrouter.router import MTRouter

ROUTER_FORMAT = 1
META_FILE, WEIGHTS_FILE, ARRAYS_FILE = "mtrouter.json", "estimator.pt", "arrays.npz"
TASK_COLUMN, HISTORY_COLUMN, CANDIDATES_COLUMN, TURNS_LEFT_COLUMN = "task", "history", "candidates", "turns_left"
STOP_CHOICE = "STOP"
SOURCE = "<model input>"


# ---------------------------------------------------------------- saving


@dataclasses.dataclass
class LinearPredictor:
    """x @ coefᵀ + intercept: what a fitted sklearn Ridge/RidgeCV predicts, rebuilt from its arrays."""

    coef: np.ndarray
    intercept: np.ndarray

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x) @ self.coef.T + self.intercept


def _pool_dict(pool: Pool) -> dict:
    return {"name": pool.name, "workers": [dataclasses.asdict(w) for w in pool.workers]}


def _book_dict(book: PriceBook | None) -> dict | None:
    if book is None:
        return None
    return {"version": book.version, "effective_date": book.effective_date.isoformat(), "currency": book.currency,
            "prices": {w: dataclasses.asdict(p) for w, p in book.prices.items()}}


def _estimator_state(estimator) -> tuple[dict, dict[str, np.ndarray], list[dict]]:
    """(scalars for the JSON, arrays for the npz, torch state_dicts) of a fitted estimator."""
    from models.mtrouter.estimator import RidgeOutcomeEstimator

    if isinstance(estimator, RidgeOutcomeEstimator):
        model = estimator.model
        return {"kind": "ridge"}, {"ridge.coef": model.coef_, "ridge.intercept": np.asarray(model.intercept_)}, []
    scalars = {"kind": "mlp", "y_mean": estimator.y_mean, "y_std": estimator.y_std,
               "reports": [dataclasses.asdict(r) for r in estimator.reports], "head": None}
    arrays: dict[str, np.ndarray] = {}
    head = estimator.head
    if head is not None:
        scalars["head"] = "joint" if head.by_attributes else "per_model"
        if head.by_attributes:
            arrays.update({"head.coef": head.joint.coef_, "head.intercept": np.asarray(head.joint.intercept_)})
        else:
            arrays.update({"head.coef": head.coef, "head.intercept": head.intercept})
    states = [{k: v.detach().cpu() for k, v in net.state_dict().items()} for net in estimator.nets]
    return scalars, arrays, states


def save_router(router: "MTRouter", directory: str | Path) -> Path:
    """Write a fitted router to `directory`, replacing what is there only once the new one is complete."""
    import torch

    if router.estimator is None:
        raise RuntimeError("MTRouter.save before fit()")
    directory = Path(directory)
    scalars, arrays, states = _estimator_state(router.estimator)
    featurizer = router.featurizer
    arrays.update({"table.values": router.table.values})
    if featurizer.mean is not None:
        arrays.update({"featurizer.mean": featurizer.mean, "featurizer.std": featurizer.std})
    meta = {
        "format": ROUTER_FORMAT, "config": dataclasses.asdict(router.cfg), "pool": _pool_dict(router.pool),
        "price_book": _book_dict(router.price_book), "expected_cost_usd": router.expected_cost,
        "expected_lengths": router.lengths, "estimator": scalars,
        "table": {"models": list(router.table.models), "features": list(router.table.features)},
        "encoder_id": router.encoder.text_encoder.encoder_id, "x_dim": int(router.input_dim),
    }
    tmp = directory.with_name(f".{directory.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True, default=float))
    np.savez(tmp / ARRAYS_FILE, **arrays)
    torch.save(states, tmp / WEIGHTS_FILE)
    old = directory.with_name(f".{directory.name}.old-{os.getpid()}")
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


# ---------------------------------------------------------------- loading


def read_meta(directory: str | Path) -> dict[str, Any]:
    from models.serving import read_format_meta

    return read_format_meta(Path(directory) / META_FILE, ROUTER_FORMAT, "saved MTRouter")


def _pool(raw: dict) -> Pool:
    return Pool(raw["name"], tuple(WorkerSpec(**{**w, "primitives": tuple(w["primitives"])}) for w in raw["workers"]))


def _book(raw: dict | None) -> PriceBook | None:
    if raw is None:
        return None
    return PriceBook(raw["version"], dt.date.fromisoformat(raw["effective_date"]),
                     {w: Price(**p) for w, p in raw["prices"].items()}, raw["currency"])


def _estimator(meta: dict, arrays, states: list[dict], table, cfg: MTRouterConfig):
    from models.mtrouter.estimator import FitReport, OutcomeEstimator, OutcomeNet, RidgeOutcomeEstimator
    from models.mtrouter.linear_head import LinearHead

    scalars = meta["estimator"]
    if scalars["kind"] == "ridge":
        estimator = RidgeOutcomeEstimator(table, cfg)
        estimator.model = LinearPredictor(arrays["ridge.coef"], arrays["ridge.intercept"])
        return estimator
    estimator = OutcomeEstimator(table, cfg)
    estimator.y_mean, estimator.y_std = float(scalars["y_mean"]), float(scalars["y_std"])
    estimator.reports = [FitReport(**r) for r in scalars["reports"]]
    if scalars["head"] is not None:
        head = LinearHead(table, cfg)
        if scalars["head"] == "joint":
            head.joint = LinearPredictor(arrays["head.coef"], arrays["head.intercept"])
        else:
            head.coef, head.intercept = arrays["head.coef"], arrays["head.intercept"]
        estimator.head = head
    for state in states:
        net = OutcomeNet(int(meta["x_dim"]), table, cfg)
        net.load_state_dict(state)
        estimator.nets.append(net.to(estimator.device).eval())
    return estimator


def load_router(directory: str | Path, history_encoder=None) -> "MTRouter":
    """A router saved by `save_router`. φ is rebuilt from the config (no disk cache: a served model
    writes nothing) unless `history_encoder` is given; it must have the width the router was fit on."""
    import torch

    from models.mtrouter.history import build_history_encoder
    from models.mtrouter.model_encoder import AttributeTable
    from models.mtrouter.router import MTRouter

    directory = Path(directory)
    meta = read_meta(directory)
    # Routers saved before encoder backends existed embedded with plain torch.
    cfg = MTRouterConfig.from_dict({"encoder_backend": "torch", **meta["config"]}, str(directory / META_FILE))
    encoder = history_encoder or build_history_encoder(cfg.replace(disk_cache=False))
    if encoder.text_encoder.encoder_id != meta.get("encoder_id", encoder.text_encoder.encoder_id):
        # e.g. bf16 autocast on one CPU and not on another: close vectors, not identical scores.
        warnings.warn(f"{directory}: trained with history encoder {meta['encoder_id']}, serving with "
                      f"{encoder.text_encoder.encoder_id}; scores may differ slightly", stacklevel=2)
    router = MTRouter(_pool(meta["pool"]), _book(meta["price_book"]), cfg, encoder)
    with np.load(directory / ARRAYS_FILE) as npz:
        arrays = {k: npz[k] for k in npz.files}
    router.table = AttributeTable(tuple(meta["table"]["models"]), tuple(meta["table"]["features"]),
                                  arrays["table.values"])
    if "featurizer.mean" in arrays:
        router.featurizer.mean, router.featurizer.std = arrays["featurizer.mean"], arrays["featurizer.std"]
    states = torch.load(directory / WEIGHTS_FILE, map_location="cpu", weights_only=True)
    router.estimator = _estimator(meta, arrays, states, router.table, cfg)
    router.expected_cost = {w: float(c) for w, c in meta["expected_cost_usd"].items()}
    router.lengths = {k: float(v) for k, v in meta["expected_lengths"].items()}
    if router.input_dim != int(meta["x_dim"]):
        raise InputError(directory / META_FILE, "x_dim", f"the router was fit on {meta['x_dim']}-d histories, "
                         f"the history encoder {encoder.text_encoder.encoder_id} gives {router.input_dim}-d")
    return router


# ---------------------------------------------------------------- serving


def _json_list(value: Any, row: int, column: str) -> list | None:
    """A JSON list cell (or an already-parsed list); None for a missing cell."""
    if isinstance(value, (list, tuple, np.ndarray)):
        return list(value)
    if value is None or (isinstance(value, float) and math.isnan(value)) or value == "":
        return None
    try:
        parsed = json.loads(value)
    except (TypeError, json.JSONDecodeError) as exc:
        raise InputError(SOURCE, f"{column}[{row}]", f"not valid JSON: {exc}") from None
    if not isinstance(parsed, list):
        raise InputError(SOURCE, f"{column}[{row}]", f"expected a JSON list, got {type(parsed).__name__}")
    return parsed


def parse_history(value: Any, row: int = 0) -> list[Interaction]:
    """⟨u_i, o_{i+1}⟩ pairs from a JSON list of {"action": str, "observation": str} (eq. 2)."""
    pairs = []
    for i, item in enumerate(_json_list(value, row, HISTORY_COLUMN) or []):
        where = f"{HISTORY_COLUMN}[{row}][{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("action"), str):
            raise InputError(SOURCE, where, 'expected {"action": str, "observation": str}')
        if not isinstance(item.get("observation", ""), str):
            raise InputError(SOURCE, f"{where}.observation", "expected a string")
        pairs.append(Interaction(item["action"], item.get("observation", "")))
    return pairs


def parse_candidates(value: Any, pool: Sequence[str], row: int = 0) -> list[str]:
    names = _json_list(value, row, CANDIDATES_COLUMN)
    if names is None:
        return list(pool)
    unknown = [n for n in names if n not in pool]
    if unknown or not names:
        problem = f"unknown worker {unknown[0]!r}" if unknown else "empty list"
        raise InputError(SOURCE, f"{CANDIDATES_COLUMN}[{row}]", f"{problem}; the router serves {list(pool)}")
    return list(dict.fromkeys(names))


def _limit(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A numeric, non-negative column; a missing column or cell means no limit (inf)."""
    if column not in frame:
        return np.full(len(frame), np.inf)
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    bad = np.flatnonzero(frame[column].notna().to_numpy() & np.isnan(values) | (values < 0))
    if len(bad):
        raise InputError(SOURCE, f"{column}[{bad[0]}]", f"expected a number ≥ 0, got {frame[column].iloc[bad[0]]!r}")
    return np.where(np.isnan(values), np.inf, values)


class ServedMTRouter:
    """What `mlflow.pyfunc.load_model` returns the predictions of: one routing decision per row."""

    def __init__(self, router: "MTRouter"):
        self.router = router
        self.workers = list(router.pool.names)

    def decide(self, task: str, history: Sequence[Interaction], candidates: Sequence[str], budget_usd: float,
               turns_left: float) -> tuple[str, np.ndarray]:
        """(worker or STOP, ŝ of every candidate) for one history."""
        router = self.router
        scores = router.score(router.features_of(task, history), candidates)
        affordable = [i for i, w in enumerate(candidates) if router.expected_cost.get(w, 0.0) <= budget_usd]
        if turns_left <= 0 or not affordable:
            return STOP_CHOICE, scores
        best = router.best_index([candidates[i] for i in affordable], scores[affordable])
        return candidates[affordable[best]], scores

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        frame = self._frame(model_input)
        budgets, turns_left = _limit(frame, BUDGET_COLUMN), _limit(frame, TURNS_LEFT_COLUMN)
        choices, table = [], np.full((len(frame), len(self.workers)), np.nan)
        for i in range(len(frame)):
            task = frame[TASK_COLUMN].iloc[i]
            if not isinstance(task, str) or not task.strip():
                raise InputError(SOURCE, f"{TASK_COLUMN}[{i}]", "expected non-empty task text")
            candidates = parse_candidates(frame[CANDIDATES_COLUMN].iloc[i] if CANDIDATES_COLUMN in frame else None,
                                          self.workers, i)
            choice, scores = self.decide(task, parse_history(frame[HISTORY_COLUMN].iloc[i], i), candidates,
                                         budgets[i], turns_left[i])
            choices.append(choice)
            table[i, [self.workers.index(w) for w in candidates]] = scores
        out = pd.DataFrame({WORKER_COLUMN: pd.Series(choices, dtype=object)})
        for j, worker in enumerate(self.workers):
            out[f"{SCORE_PREFIX}{worker}"] = table[:, j]
        return out

    @staticmethod
    def _frame(model_input: Any) -> pd.DataFrame:
        if isinstance(model_input, dict):
            model_input = pd.DataFrame(model_input)
        if not isinstance(model_input, pd.DataFrame):
            raise InputError(SOURCE, TASK_COLUMN, f"expected a DataFrame, got {type(model_input).__name__}")
        for column in (TASK_COLUMN, HISTORY_COLUMN):
            if column not in model_input.columns:
                raise InputError(SOURCE, column, f"missing column; expected {TASK_COLUMN}, {HISTORY_COLUMN} and "
                                 f"optionally {CANDIDATES_COLUMN}, {BUDGET_COLUMN}, {TURNS_LEFT_COLUMN}")
        return model_input.reset_index(drop=True)

    def get_raw_model(self) -> "MTRouter":
        return self.router


def _load_pyfunc(data_path: str) -> ServedMTRouter:
    """MLflow's loader-module entry point: `data_path` is the directory written by `save_router`."""
    return ServedMTRouter(load_router(data_path))
