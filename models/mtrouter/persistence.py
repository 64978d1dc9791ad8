"""Saving and loading a fitted MTRouter (behind `MTRouter.save` / `MTRouter.load`).

The directory holds no pickle:

  mtrouter.json   config (MTRouterConfig), pool, price book, ĉ(a) per worker, the expected episode
                  lengths of eq. 6, the estimator's scalars (target mean/std, input width, fit reports)
                  and the history encoder's id — readable without Python;
  estimator.pt    the OutcomeNets' state_dicts (torch.load(weights_only=True) reads them back);
  arrays.npz      the attribute table, the featurizer's surface-statistics mean/std, and the linear
                  coefficients of the linear head or of the Ridge ablation.

The frozen history encoder φ is *referenced* (cfg.encoder_kind / encoder_path / hashing_dim) and
rebuilt on load, so no encoder weights enter the directory. Serving it (task and history in, next
worker out) is evaluation/serving/mtrouter.py.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch

from models.mtrouter.config import MTRouterConfig
from models.mtrouter.estimator import FitReport, OutcomeEstimator, OutcomeNet, RidgeOutcomeEstimator
from models.mtrouter.history import build_history_encoder
from models.mtrouter.linear_head import LinearHead
from models.mtrouter.model_encoder import AttributeTable
from routerops import schema
from routerops.errors import InputError
from routerops.pricing import Pool, Price, PriceBook, WorkerSpec

# models/mtrouter/router.py's MTRouter, which imports this module to save and load itself: named by a
# type variable, not imported, so the two modules form no import circle.
Router = TypeVar("Router")

ROUTER_FORMAT = 1
META_FILE, WEIGHTS_FILE, ARRAYS_FILE = "mtrouter.json", "estimator.pt", "arrays.npz"


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


def save_router(router: Any, directory: str | Path) -> Path:
    """Write a fitted router to `directory`, replacing what is there only once the new one is complete."""
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
    return schema.read_format_meta(Path(directory) / META_FILE, ROUTER_FORMAT, "saved MTRouter")


def _pool(raw: dict) -> Pool:
    return Pool(raw["name"], tuple(WorkerSpec(**{**w, "primitives": tuple(w["primitives"])}) for w in raw["workers"]))


def _book(raw: dict | None) -> PriceBook | None:
    if raw is None:
        return None
    return PriceBook(raw["version"], dt.date.fromisoformat(raw["effective_date"]),
                     {w: Price(**p) for w, p in raw["prices"].items()}, raw["currency"])


def _estimator(meta: dict, arrays, states: list[dict], table, cfg: MTRouterConfig):
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


def load_router(router_class: type[Router], directory: str | Path, history_encoder=None) -> Router:
    """A router saved by `save_router`. φ is rebuilt from the config (no disk cache: a served model
    writes nothing) unless `history_encoder` is given; it must have the width the router was fit on."""
    directory = Path(directory)
    meta = read_meta(directory)
    # Routers saved before encoder backends existed embedded with plain torch.
    cfg = MTRouterConfig.from_dict({"encoder_backend": "torch", **meta["config"]}, str(directory / META_FILE))
    encoder = history_encoder or build_history_encoder(cfg.replace(disk_cache=False))
    if encoder.text_encoder.encoder_id != meta.get("encoder_id", encoder.text_encoder.encoder_id):
        # e.g. bf16 autocast on one CPU and not on another: close vectors, not identical scores.
        warnings.warn(f"{directory}: trained with history encoder {meta['encoder_id']}, serving with "
                      f"{encoder.text_encoder.encoder_id}; scores may differ slightly", stacklevel=2)
    router = router_class(_pool(meta["pool"]), _book(meta["price_book"]), cfg, encoder)
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
