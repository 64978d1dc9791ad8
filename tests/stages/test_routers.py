"""The router stages (stages/routers.py) in a temp Layout: routers fit on the train split only, the
leaderboard reports test and OOD apart, and the register stage fits on train and gates on val."""

from __future__ import annotations

import json

import mlflow
import numpy as np
import pandas as pd
import pytest

from models import registry
from models.baselines import KNNRouter
from routerops.config import (
    EvaluateConfig, Params, PoolConfig, RegisterConfig, PricesConfig, RoutersConfig, TrackConfig,
)
from routerops.envs.replay import write_logged_outcomes
from routerops.layout import Layout
from stages import routers

SPLITS = {"train": 60, "val": 24, "test": 24, "ood": 24}


class LeakCheckingKNN(KNNRouter):
    """kNN that records the query ids it was fitted on (the leak test reads them)."""

    seen: set[str] = set()

    def fit(self, data):
        LeakCheckingKNN.seen |= set(data.query_ids)
        return super().fit(data)


def grid_table() -> pd.DataFrame:
    """Arithmetic favours the cheap worker, capitals the dear one; ids carry their split."""
    rows, i = [], 0
    for split, n in SPLITS.items():
        for _ in range(n):
            arith = i % 2 == 0
            query = f"What is {i} plus {3 * i}?" if arith else f"Name the capital of country number {i}."
            for worker, completion in (("cheap", 10), ("dear", 60)):
                rows.append({"dataset": "toy", "query_id": f"{split}/{i}", "query": query, "worker": worker,
                             "score": float((worker == "cheap") == arith or worker == "dear" and i % 3 == 0),
                             "prompt_tokens": 20, "completion_tokens": completion, "split": split})
            i += 1
    return pd.DataFrame(rows)


@pytest.fixture
def layout(tmp_path, monkeypatch, mlflow_db):
    monkeypatch.setenv("ROUTEROPS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    monkeypatch.setitem(registry.ROUTER_FACTORIES, "leakcheck", lambda seed: LeakCheckingKNN())
    (tmp_path / "prices.yaml").write_text("version: toy-1\neffective_date: 2026-01-01\nprices:\n"
                                          "  cheap: {input_per_1m: 0.1, output_per_1m: 0.1}\n"
                                          "  dear: {input_per_1m: 5.0, output_per_1m: 15.0}\n")
    # The register step records the pool's version on what it registers: a pool of the grid's workers.
    (tmp_path / "pool.yaml").write_text("name: toy\nworkers:\n"
                                        "  - {name: cheap, kind: sympy, primitives: [sympy]}\n"
                                        "  - {name: dear, kind: sympy, primitives: [sympy]}\n")
    yield Layout(tmp_path)
    mlflow.set_tracking_uri(None)


def params(tmp_path) -> Params:
    return Params(pool=PoolConfig(file="pool.yaml"), prices=PricesConfig(evaluation="prices.yaml"), evaluate=EvaluateConfig(splits=["test", "ood"]),
                  routers=RoutersConfig(routers=["random", "oracle", "leakcheck"], seeds=[0], bootstrap=0),
                  register=RegisterConfig(candidates=["leakcheck", "logistic"], k=3, n_boot=200),
                  track=TrackConfig(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}",
                                    artifact_root=str(tmp_path / "artifacts"), experiment="stage-test"))


@pytest.mark.slow
def test_routers_and_register_never_train_on_val_test_or_ood(layout):
    cfg = params(layout.root)
    grid = write_logged_outcomes(grid_table(), layout.grid)
    LeakCheckingKNN.seen = set()
    report = routers.routers(cfg, layout, grid)
    assert LeakCheckingKNN.seen and all(q.startswith("train/") for q in LeakCheckingKNN.seen)

    board = pd.read_csv(report["leaderboard"])
    assert set(board.split) == {"test", "ood"}  # each split reported apart
    assert board.protocol.str.startswith("fixed split: fit on train").all()
    assert json.loads(report["meta"].read_text())["splits"] == {"test": 24, "ood": 24}
    for split in ("test", "ood"):
        rows = board[board.split == split].set_index("router")
        assert rows.loc["oracle", "best_accuracy"] >= rows.loc["leakcheck", "best_accuracy"]
    assert report["plot"].is_file()

    LeakCheckingKNN.seen = set()
    summary = json.loads(routers.register(cfg, layout, grid, report).read_text())
    assert LeakCheckingKNN.seen and all(q.startswith("train/") for q in LeakCheckingKNN.seen)
    assert summary["gate_split"] == "val" and summary["decision"]["promote"]  # the first version
    assert summary["decision"]["evidence"]["data.price_book_version"] == "toy-1"
    assert summary["decision"]["evidence"]["data.pool_version"].startswith("toy-")
    assert {row["router"] for row in summary["selection"]} == {"leakcheck", "logistic"}
    gate_ids = summary["decision"]["evidence"]["gate_ids"]
    assert gate_ids and all(q.startswith("val/") for q in gate_ids)
    assert (layout.manifests / "register.json").is_file() and (layout.manifests / "routers.json").is_file()


def test_grid_split_refuses_a_split_the_table_lacks(layout):
    from routerops.errors import InputError

    table = grid_table()
    with pytest.raises(InputError, match="no row with split"):
        routers.grid_split(table[table.split != "val"], "val", layout.grid, None, None)
    assert np.isfinite(table.score).all()
