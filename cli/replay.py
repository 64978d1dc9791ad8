"""`routerops replay`: a router leaderboard on a logged-outcomes table, no live call
(cli/main.py parses its arguments)."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from pathlib import Path

import pandas as pd

from evaluation.replay import run_replay_benchmark, split_table
from models.baselines import PromptedLLMRouter
from models.registry import ROUTER_FACTORIES
from routerops import schema
from routerops.config import TrackConfig
from routerops.envs.replay import load_logged_outcomes
from routerops.errors import InputError
from routerops.files import check_output
from routerops.workers.server import local_llm_server


def replay_tables(args: argparse.Namespace) -> tuple[pd.DataFrame, pd.DataFrame | None, str]:
    """(scored table, training table or None, protocol) from --table, --train-table, --split-column."""
    scored = load_logged_outcomes(args.table)
    train = None if args.train_table is None else load_logged_outcomes(args.train_table)
    if args.split_column:
        source = args.train_table or args.table
        train = split_table(scored if train is None else train, args.split_column, [args.train_split], str(source))
        scored = split_table(scored, args.split_column, args.score_splits, str(args.table))
        return train, scored, (f"fixed split: fit on {args.split_column}={args.train_split}"
                               f"{f' of {args.train_table}' if args.train_table else ''}, "
                               f"scored on {args.split_column} in {args.score_splits}")
    if train is not None:
        return train, scored, f"fit on {args.train_table}, scored on {args.table}"
    return None, scored, f"cross-fit k={args.k}"


def replay_outputs(out: str) -> list[Path]:
    """The four files `routerops replay` writes: the leaderboard, its curves, its metadata and its plot."""
    board = Path(out)
    return [board, board.with_suffix(".curves.csv"), board.with_suffix(".meta.json"), board.with_suffix(".png")]


def check_replay_args(args: argparse.Namespace) -> None:
    """Refuse, before any work, what would crash later or clobber an input: every check names its flag."""
    if args.bootstrap < 0:
        raise InputError("command line", "--bootstrap", f"resamples must be ≥ 0 (0 = no intervals), got {args.bootstrap}")
    if args.k < 2:
        raise InputError("command line", "--k", f"cross-fitting needs ≥ 2 folds, got {args.k}")
    if not args.seeds:
        raise InputError("command line", "--seeds", "give at least one seed")
    if min(args.seeds) < 0:  # numpy's generators refuse a negative seed deep inside the first router
        raise InputError("command line", "--seeds", f"seeds are integers ≥ 0, got {min(args.seeds)}")
    if args.drop_overlap and not (args.train_table or args.split_column):
        raise InputError("command line", "--drop-overlap", "applies to a fit on other rows (--train-table or "
                         "--split-column); cross-fitting never scores a query it trained on")
    known = set(ROUTER_FACTORIES) | {"prompted_llm"}
    unknown = [r for r in args.routers if r not in known and not r.startswith("single:")]
    if unknown:
        raise InputError("command line", "--routers", f"unknown router {unknown[0]!r}; known: {sorted(known)} "
                         "or single:<worker>")
    inputs = {Path(p).resolve() for p in (args.table, args.train_table, args.prices) if p}
    for path in replay_outputs(args.out):
        if path.is_dir():
            raise InputError("command line", "--out", f"{path} is a directory; give a file name such as "
                             f"{path / 'leaderboard.csv'}")
        if path.resolve() in inputs:
            raise InputError("command line", "--out", f"{path} is an input of this run; writing it would "
                             "overwrite the input")
        check_output(path, "--out")  # writable: a bad --out must not cost the whole benchmark


def check_same_workers(args: argparse.Namespace, train: pd.DataFrame, scored: pd.DataFrame) -> None:
    """Before any embedding: training and scored rows log the same workers (in any order)."""
    fitted, judged = set(train["worker"]), set(scored["worker"])
    if fitted != judged:
        raise InputError(args.train_table or args.table, "worker", f"the training rows log workers "
                         f"{sorted(fitted)}, the scored rows {sorted(judged)}: both must log the same workers")


def drop_or_refuse_overlap(args: argparse.Namespace, train: pd.DataFrame,
                           scored: pd.DataFrame) -> tuple[pd.DataFrame, dict | None]:
    """A router is never judged on a query it trained on (same query id or same text). Checked here,
    before any embedding: refused, or with --drop-overlap only the unseen queries are scored. Returns
    the scored rows and what was dropped (for the metadata), or None when nothing was checked away."""
    seen = scored["query_id"].isin(set(train["query_id"])) | scored["query"].isin(set(train["query"]))
    shared = list(dict.fromkeys(scored.loc[seen, "query_id"]))
    total = scored["query_id"].nunique()
    if not shared:
        return scored, None
    if not args.drop_overlap:
        raise InputError(args.table, "query_id", f"{len(shared)} of {total} scored queries are also training "
                         f"queries (same id or text), e.g. {shared[0]!r}: the scores would not be out of sample; "
                         f"pass --drop-overlap to score only the {total - len(shared)} unseen ones")
    if len(shared) == total:
        raise InputError(args.table, "query_id", f"all {total} scored queries are also training queries: "
                         "--drop-overlap leaves nothing to score")
    kept = scored[~scored["query_id"].isin(shared)].reset_index(drop=True)
    print(f"--drop-overlap: dropped {len(shared)} of {total} scored queries that are also training queries; "
          f"scoring the {total - len(shared)} unseen ones")
    return kept, {"dropped_queries": len(shared), "scored_queries_given": total,
                  "scored_queries": total - len(shared), "example": shared[0]}


def check_single_workers(args: argparse.Namespace, scored: pd.DataFrame) -> None:
    """single:<worker> names a worker the table logs (checked before any router is fit)."""
    logged = set(scored["worker"])
    for router in args.routers:
        worker = router.partition(":")[2] if router.startswith("single:") else None
        if worker is not None and worker not in logged:
            raise InputError("command line", "--routers", f"{router!r}: the table logs no worker {worker!r}; "
                             f"it logs {', '.join(sorted(logged))}")


def check_folds_fit(args: argparse.Namespace, scored: pd.DataFrame, train: pd.DataFrame | None) -> None:
    if train is None and args.k > scored["query_id"].nunique():
        raise InputError(args.table, "--k", f"{args.k} folds need at least {args.k} queries; the table has "
                         f"{scored['query_id'].nunique()}")


def replay_command(args: argparse.Namespace) -> None:
    """Leaderboard of every router on a logged-outcomes table (no live call). Arguments and tables are
    checked before any router runs; the outputs are written atomically at the end."""
    check_replay_args(args)
    train, scored, protocol = replay_tables(args)
    check_folds_fit(args, scored, train)
    check_single_workers(args, scored)
    dropped = None
    if train is not None:
        check_same_workers(args, train, scored)
        scored, dropped = drop_or_refuse_overlap(args, train, scored)
        if dropped:
            protocol += f"; {dropped['dropped_queries']} scored queries also in training dropped (--drop-overlap)"
    # SIGTERM (a scheduler stopping us) must unwind the `with` below so the local LLM server stops too.
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        with contextlib.ExitStack() as stack:
            factories = {}
            if "prompted_llm" in args.routers:
                url = args.llm_base_url or stack.enter_context(local_llm_server())
                factories["prompted_llm"] = lambda seed: PromptedLLMRouter(base_url=url)
            board = run_replay_benchmark(scored, args.prices, args.routers, k=args.k, seeds=args.seeds,
                                         factories=factories, n_boot=args.bootstrap, train=train, protocol=protocol)
    finally:
        signal.signal(signal.SIGTERM, previous)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(board.drop(columns=["protocol"]).round(4).to_string(index=False))
    print(f"protocol: {protocol}")
    files = write_replay_outputs(args, board, dropped)
    tables = {"scored": (scored, Path(args.table))}
    if train is not None:
        tables["train"] = (train, Path(args.train_table or args.table))
    run = None if args.no_mlflow else log_replay(args, board, tables, files)
    print_where(files, run)


def write_replay_outputs(args: argparse.Namespace, board: pd.DataFrame, dropped: dict | None) -> list[Path]:
    """The leaderboard, its curves, its metadata and its accuracy–cost plot, each written atomically."""
    from routerops.report import plot_router_curves

    board_path, curves_path, meta_path, plot_path = replay_outputs(args.out)
    board_path.parent.mkdir(parents=True, exist_ok=True)
    schema.write_csv_atomic(board, board_path)
    schema.write_csv_atomic(board.attrs["curves"], curves_path)
    meta = {k: v for k, v in board.attrs.items() if k != "curves"}
    schema.write_json_atomic({**meta, "drop_overlap": dropped, "argv": sys.argv[1:]}, meta_path)
    staging = plot_path.with_name(f".{plot_path.stem}.tmp.png")
    plot_router_curves(board.attrs["curves"], board, staging,
                       title=f"{Path(args.table).name}: {board.attrs['n_queries']} queries, {board.attrs['protocol']}")
    staging.replace(plot_path)
    return [board_path, curves_path, meta_path, plot_path]


def log_replay(args: argparse.Namespace, board: pd.DataFrame, tables: dict, files: list[Path]) -> tuple[str, str, str]:
    """The MLflow run of this replay, in the store params.yaml's `track` names (MLFLOW_TRACKING_URI wins)."""
    import dataclasses

    from evaluation.replay_tracking import log_replay_run
    from routerops.config import load_params

    params = Path(args.params)
    track = load_params(params, sections=("track",)).track if params.is_file() else TrackConfig()
    track = dataclasses.replace(track, experiment=args.experiment)
    return log_replay_run(track, args, board, tables, Path(args.prices), files)


def print_where(files: list[Path], run: tuple[str, str, str] | None) -> None:
    """Where everything went: the files, then the MLflow run and how to open it."""
    board, curves, meta, plot = files
    print(f"\nleaderboard  {board}\ncurves       {curves}\nmetadata     {meta}\nplot         {plot}")
    if run is None:
        print("MLflow       not logged (--no-mlflow)")
        return
    uri, experiment_id, run_id = run
    ui = "make mlflow-ui" if uri == TrackConfig.tracking_uri else f"mlflow ui --backend-store-uri {uri}"
    print(f"MLflow run   {run_id} (experiment {experiment_id}, store {uri})\n"
          f"open it      {ui}, then http://127.0.0.1:5000/#/experiments/{experiment_id}/runs/{run_id}")
