"""Router stages of the pipeline (they need models/, so they live here, not in routerops/).

routers: the single-worker episodes of the evaluation splits form a complete (task × worker) grid
of logged outcomes; every baseline router is cross-fitted on it and ranked (AIQ, APGR …).
The register stage (tasks/registry.py) fits the winner and gates its promotion.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from routerops import schema
from routerops.config import Params, load_params
from routerops.envs.replay import load_logged_outcomes, write_logged_outcomes
from routerops.envs.suites import read_tasks
from routerops.grid import logged_outcomes_from_trajectories
from routerops.pricing import load_price_book
from routerops.report import to_markdown
from routerops.stages import PRICED, REPORTS, TASKS, write_json, write_manifest

GRID = Path("data/grid/outcomes.parquet")
ROUTER_REPORTS = REPORTS / "routers"


def build_grid(params: Params) -> Path:
    episodes = schema.read_table(PRICED / "episodes.parquet", "episodes")
    scored = episodes[episodes.split.isin(params.evaluate.splits)]
    table = logged_outcomes_from_trajectories(scored, read_tasks(TASKS))
    write_logged_outcomes(table, GRID)
    return GRID


def benchmark_routers(params: Params) -> dict[str, Path]:
    """Cross-fitted leaderboard of every configured router on the collected grid."""
    from models.replay_bench import run_replay_benchmark
    from routerops.report import plot_router_curves

    cfg = params.routers
    grid = build_grid(params)
    book = load_price_book(params.reprice.price_book)
    board = run_replay_benchmark(load_logged_outcomes(grid), book, routers=list(cfg.routers), k=cfg.k,
                                 seeds=list(cfg.seeds), n_boot=cfg.bootstrap)
    paths = write_router_report(board, ROUTER_REPORTS)
    paths["plot"] = plot_router_curves(board.attrs["curves"], board, ROUTER_REPORTS / "accuracy_cost.png",
                                       title=f"Routers on the collected grid ({board.attrs['n_queries']} queries)")
    metrics = {f"{col}/{row.router}": float(getattr(row, col)) for row in board.itertuples()
               for col in ("aiq", "best_accuracy") if col in board.columns and np.isfinite(getattr(row, col))}
    write_manifest("routers", cfg, [grid, Path(params.reprice.price_book)], list(paths.values()), metrics,
                   artifacts=[paths["plot"], paths["leaderboard_md"]])
    return paths


def write_router_report(board: pd.DataFrame, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    csv, md, curves = out_dir / "leaderboard.csv", out_dir / "leaderboard.md", out_dir / "curves.csv"
    board.to_csv(csv, index=False)
    board.attrs["curves"].to_csv(curves, index=False)
    md.write_text(to_markdown(board) + "\n")
    meta = {k: v for k, v in board.attrs.items() if k != "curves"}
    write_json(meta, out_dir / "meta.json")
    return {"leaderboard": csv, "leaderboard_md": md, "curves": curves}


def best_learned_router(board_csv: Path, candidates: list[str]) -> str:
    """The eligible family with the highest cross-fitted AIQ."""
    board = pd.read_csv(board_csv)
    eligible = board[board.router.isin(candidates)].sort_values("aiq", ascending=False)
    if eligible.empty:
        raise ValueError(f"none of {candidates} is on the leaderboard {board_csv}")
    return str(eligible.router.iloc[0])


def split_for_gate(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    order = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(n * test_fraction)))
    return np.sort(order[n_test:]), np.sort(order[:n_test])


def main(argv: list[str] | None = None) -> int:
    """DVC's routers stage: `python -m models.stages routers`."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["routers"]:
        print("usage: python -m models.stages routers", file=sys.stderr)
        return 2
    paths = benchmark_routers(load_params())
    print(json.dumps({k: str(v) for k, v in paths.items()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
