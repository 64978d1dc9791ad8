"""`routerops replay` as an MLflow run, beside the pipeline's: what was replayed (params and the
dataset inputs), how each router did (metrics), the leaderboard as a table the UI shows and as a
CSV, and the accuracy–cost plot.

Metrics are named `<metric>/<router>` (`aiq/logistic`, `apgr/knn`), the names the main pipeline's
replay stage gives its own (stages/replay.py), so a user's replay and the demo's compare in one chart.
The scored table is logged as the table the routers read (after delimiter sniffing and validation),
so its schema in the UI is the logged-outcome format whatever file it came from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pandas as pd

from evaluation.tracking import dataset_name, file_dataset, file_digests, git_commit, pandas_dataset, use_tracking
from routerops.config import TrackConfig
from routerops.report import metric_key

EXPERIMENT = "routerops-replay"  # `routerops replay --experiment` changes it


def replay_metrics(board: pd.DataFrame) -> dict[str, float]:
    """`<metric>/<router>` for every finite numeric leaderboard cell (APGR is undefined on some
    tables, a router's interval on others: those are left out, not logged as NaN)."""
    numeric = [c for c in board.columns if c != "router" and pd.api.types.is_numeric_dtype(board[c])]
    out = {}
    for row in board.itertuples(index=False):
        for column in numeric:
            value = getattr(row, column)
            if value is not None and np.isfinite(float(value)):
                out[metric_key(column, str(row.router))] = float(value)
    return out


def replay_params(args: Any, board: pd.DataFrame) -> dict[str, str]:
    """What a rerun needs: the command's arguments and what the benchmark read off the table."""
    given = {k: v for k, v in vars(args).items() if k not in ("func", "command") and not callable(v)}
    given.update({"protocol": board.attrs.get("protocol"), "n_queries": board.attrs.get("n_queries"),
                  "n_train_queries": board.attrs.get("n_train_queries"),
                  "workers": ",".join(board.attrs.get("workers", [])),
                  "price_book_version": board.attrs.get("price_book")})
    return {key: str(value)[:500] for key, value in given.items() if value is not None}


def log_table_input(frame: pd.DataFrame, path: Path, context: str) -> None:
    md5 = file_digests(path)[0]
    mlflow.log_input(pandas_dataset(frame, dataset_name(path), md5), context=context,
                     tags={"rows": str(len(frame)), "queries": str(frame["query_id"].nunique())})


def log_replay_run(cfg: TrackConfig, args: Any, board: pd.DataFrame, tables: dict[str, tuple[pd.DataFrame, Path]],
                   price_book: Path, files: list[Path]) -> tuple[str, str, str]:
    """One MLflow run `replay`; returns (tracking URI, experiment id, run id). `tables` maps a
    context ("scored", "train") to the validated table and the file it came from."""
    uri = use_tracking(cfg)
    with mlflow.start_run(run_name="replay") as run:
        mlflow.set_tags({"git_commit": git_commit(), "routerops.command": "replay",
                         "protocol": str(board.attrs.get("protocol"))})
        mlflow.log_params(replay_params(args, board))
        mlflow.log_metrics(replay_metrics(board))
        mlflow.log_table(board.drop(columns=["protocol"], errors="ignore"), artifact_file="leaderboard.json")
        for context, (frame, path) in tables.items():
            log_table_input(frame, path, context)
        dataset, context, tags = file_dataset(price_book)
        mlflow.log_input(dataset, context=context, tags=tags)
        for path in files:
            mlflow.log_artifact(str(path))
        return uri, run.info.experiment_id, run.info.run_id
