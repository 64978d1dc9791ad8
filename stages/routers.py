"""The main pipeline's router stages: grid → routers → register.

grid: the single-worker episodes of every split form a complete (task × worker) table of logged
outcomes, its `split` column kept. routers: every router is fitted on the train split alone and
scored on test and on OOD separately (the OOD family is never in any router's training data); the
leaderboard says so in its `protocol` column. register: the learned family chosen by a cross-fit
on the train split is fitted on train, registered, and judged by the promotion gate on val.
Neither stage ever lets a val, test or OOD task into a router's training data.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd

from evaluation.registry import logged_grid_judge, register_and_promote
from evaluation.replay import routing_data_from_table, run_replay_benchmark, split_table
from evaluation.serving.single_turn import ServedRouter
from evaluation.tracking import use_tracking
from models.base import RoutingData
from models.embeddings import default_encoder
from models.registry import make_router
from routerops import schema
from routerops.config import Params
from routerops.envs.replay import load_logged_outcomes, write_logged_outcomes
from routerops.envs.suites import read_tasks
from routerops.grid import logged_outcomes_from_trajectories
from routerops.layout import Layout, Trajectories
from routerops.promotion import GateConfig
from routerops.report import plot_router_curves, to_markdown
from stages.manifest import write_manifest

log = logging.getLogger(__name__)
TRAIN, GATE = "train", "val"


def grid(params: Params, layout: Layout, priced: Trajectories, tasks: Path) -> Path:
    """Logged outcomes of the single-worker episodes of every split (`split` column kept)."""
    episodes = schema.read_table(priced.episodes, "episodes")
    table = logged_outcomes_from_trajectories(episodes, read_tasks(tasks))
    write_logged_outcomes(table, layout.grid)
    counts = table.drop_duplicates("query_id").split.value_counts().to_dict()
    write_manifest(layout.manifests, "grid", {}, [priced.episodes, tasks], [layout.grid],
                   {f"queries_{k}": int(v) for k, v in counts.items()})
    return layout.grid


def grid_split(table: pd.DataFrame, split: str | list[str], source: Path, book, encoder) -> RoutingData:
    values = [split] if isinstance(split, str) else list(split)
    return routing_data_from_table(split_table(table, "split", values, str(source)), book, encoder)


def routers(params: Params, layout: Layout, grid_path: Path) -> dict[str, Path]:
    """Leaderboards of every configured router, fitted on train, on each evaluation split apart."""
    cfg, evaluation = params.routers, params.market(layout).evaluation
    book_file, book, encoder = evaluation.file, evaluation.book, default_encoder()
    table = load_logged_outcomes(grid_path)
    train = grid_split(table, TRAIN, grid_path, book, encoder)
    boards = []
    for split in params.evaluate.splits:
        scored = grid_split(table, split, grid_path, book, encoder)
        board = run_replay_benchmark(scored, book, list(cfg.routers), seeds=list(cfg.seeds), n_boot=cfg.bootstrap,
                                     train=train, protocol=f"fixed split: fit on {TRAIN}, scored on {split}")
        board.insert(0, "split", split)
        board.attrs["curves"] = board.attrs["curves"].assign(split=split)
        boards.append(board)
    paths = write_router_report(boards, layout.routers_dir, len(train))
    metrics = {f"{col}/{row.split}/{row.router}": float(getattr(row, col)) for board in boards
               for row in board.itertuples() for col in ("aiq", "best_accuracy")
               if np.isfinite(getattr(row, col))}
    write_manifest(layout.manifests, "routers", cfg, [grid_path, book_file], list(paths.values()), metrics,
                   artifacts=[paths["plot"], paths["leaderboard_md"]])
    return paths


def write_router_report(boards: list[pd.DataFrame], out_dir: Path, n_train: int) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    board = pd.concat([without_attrs(b) for b in boards], ignore_index=True)
    curves = pd.concat([b.attrs["curves"] for b in boards], ignore_index=True)
    paths = {"leaderboard": out_dir / "leaderboard.csv", "leaderboard_md": out_dir / "leaderboard.md",
             "curves": out_dir / "curves.csv", "meta": out_dir / "meta.json"}
    board.to_csv(paths["leaderboard"], index=False)
    curves.to_csv(paths["curves"], index=False)
    paths["leaderboard_md"].write_text(to_markdown(board) + "\n")
    meta = {"n_train_queries": n_train, "splits": {b.split.iloc[0]: b.attrs["n_queries"] for b in boards},
            "workers": boards[0].attrs["workers"], "price_book": boards[0].attrs["price_book"],
            "seeds": boards[0].attrs["seeds"], "protocol": "fit on train; each split scored apart"}
    schema.write_json_atomic(meta, paths["meta"])
    first = boards[0]
    paths["plot"] = plot_router_curves(first.attrs["curves"], first, out_dir / "accuracy_cost.png",
                                       title=f"Routers fit on train, scored on {first.split.iloc[0]} "
                                             f"({first.attrs['n_queries']} queries)")
    return paths


def without_attrs(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy without .attrs (pandas compares attrs on concat, and ours hold DataFrames)."""
    plain = frame.copy()
    plain.attrs = {}
    return plain


def inputs_in_force(params: Params, layout: Layout) -> dict[str, str]:
    """The price book and pool versions a register step judged under: recorded on the registered
    version and in the promotion decision, so every champion says which prices and pool chose it."""
    return params.market(layout).versions()


def choose_family(train: RoutingData, candidates: list[str], k: int, seed: int) -> tuple[str, pd.DataFrame]:
    """The candidate family with the highest AIQ cross-fitted on the train split alone (the gate's val
    split and the reported test / OOD splits play no part in the choice)."""
    k = max(2, min(k, len(train)))
    board = run_replay_benchmark(train, None, candidates, k=k, seeds=[seed], n_boot=0, include_singles=False,
                                 progress=False)
    return str(board.sort_values("aiq", ascending=False).router.iloc[0]), board


def register(params: Params, layout: Layout, grid_path: Path, router_report: dict[str, Path]) -> Path:
    """Fit the chosen family on train, register it, and let the promotion gate judge it on val.
    `router_report` orders this stage after the leaderboards it is shown beside."""
    cfg, market = params.register, params.market(layout)
    book_file, book, encoder = market.evaluation.file, market.evaluation.book, default_encoder()
    table = load_logged_outcomes(grid_path)
    train = grid_split(table, TRAIN, grid_path, book, encoder)
    gate_data = grid_split(table, GATE, grid_path, book, encoder)
    family, selection = choose_family(train, list(cfg.candidates), cfg.k, cfg.seed)
    router = make_router(family, cfg.seed).fit(train)
    served = ServedRouter.from_fitted(router, train, book.version, family=family, encoder=encoder)
    gate = GateConfig(objective=cfg.objective, budget_usd=cfg.budget_usd, n_boot=cfg.n_boot, seed=cfg.seed)
    judge = logged_grid_judge(gate_data, gate, served)
    use_tracking(params.track)
    hashes = {"grid_sha256": schema.file_sha256(grid_path), "train_queries": str(len(train)),
              **inputs_in_force(params, layout)}
    in_force = [book_file, market.pool_file]
    registered, decision = register_and_promote(served, judge(served, "candidate"), judge, gate, data_hashes=hashes,
                                                training_inputs=[grid_path, *in_force],
                                                gate_inputs=[grid_path, *in_force])
    summary = {"family": family, "chosen_by": f"AIQ cross-fitted on the {TRAIN} split (k={cfg.k})",
               "selection": selection[["router", "aiq"]].to_dict("records"), "gate_split": GATE,
               "name": registered.name, "version": registered.version, "model_uri": registered.model_uri,
               "decision": decision.to_dict()}
    schema.write_json_atomic(summary, layout.registry_report)
    write_manifest(layout.manifests, "register", cfg, [grid_path], [layout.registry_report],
                   {"promoted": float(decision.promote), "candidate_score": float(decision.candidate_score)})
    log.info("%s v%s: %s — %s", registered.name, registered.version,
             "promoted" if decision.promote else "refused", decision.reason)
    return layout.registry_report
