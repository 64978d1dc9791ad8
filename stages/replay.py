"""The replay stage: the routers on real model outcomes, with no live call.

RouteLLM's GSM8K table (bundled under datasets/, Apache-2.0) holds how Mixtral-8x7B and GPT-4-1106
did on each GSM8K test question. It has no split, so every router is cross-fitted (k folds: no
router scores a query it trained on); the leaderboard's `protocol` column says so. This is what the
demo shows a newcomer: learned routers against random, the single models and the oracle.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from evaluation.replay import run_replay_benchmark
from routerops import schema
from routerops.config import Params
from routerops.envs.replay import import_routellm_gsm8k, load_logged_outcomes, write_logged_outcomes
from routerops.layout import Layout
from routerops.market import resolve_book
from routerops.report import plot_router_curves, to_markdown
from stages.manifest import hash_files, write_manifest


def import_outcomes(params: Params, layout: Layout) -> Path:
    """RouteLLM's GSM8K table as a logged-outcome table (data/replay/routellm_gsm8k.parquet): what the
    default pool's replay endpoints serve, the main pipeline's tasks are drawn from, and `replay` ranks
    the routers on."""
    cfg = params.replay
    sources = [layout.resolve(p) for p in (cfg.table, cfg.contaminated, cfg.fewshot)]
    if up_to_date(layout.manifests / "outcomes.json", sources, layout.replay_table):
        return layout.replay_table  # tokenising 2,614 answers again would give the same table (~30 s)
    table = import_routellm_gsm8k(sources[0], contaminated_path=sources[1], train_path=sources[2])
    write_logged_outcomes(table, layout.replay_table)
    write_manifest(layout.manifests, "outcomes", cfg, sources, [layout.replay_table],
                   {"queries": int(table.query_id.nunique()), "workers": int(table.worker.nunique())})
    return layout.replay_table


def up_to_date(manifest: Path, inputs: list[Path], output: Path) -> bool:
    """The output exists as the last run wrote it, from the same input files."""
    try:
        last = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return False
    return (output.is_file() and last.get("inputs") == hash_files(inputs)
            and last.get("outputs") == hash_files([output]))


def replay(params: Params, layout: Layout, outcomes: Path) -> dict[str, Path]:
    cfg = params.replay
    book = resolve_book(layout.resolve(params.prices.replay))
    sources = [outcomes, book.file]
    table = load_logged_outcomes(outcomes)
    board = run_replay_benchmark(table, book.book, list(cfg.routers), k=cfg.k, seeds=list(cfg.seeds),
                                 n_boot=cfg.bootstrap)
    out = layout.replay_dir
    out.mkdir(parents=True, exist_ok=True)
    paths = {"leaderboard": out / "leaderboard.csv", "leaderboard_md": out / "leaderboard.md",
             "curves": out / "curves.csv"}
    board.to_csv(paths["leaderboard"], index=False)
    board.attrs["curves"].to_csv(paths["curves"], index=False)
    paths["leaderboard_md"].write_text(to_markdown(board) + "\n")
    paths["plot"] = plot_router_curves(board.attrs["curves"], board, out / "accuracy_cost.png",
                                       title=f"RouteLLM GSM8K, real model outcomes ({board.attrs['n_queries']} "
                                             f"queries, {board.attrs['protocol']})")
    metrics = {f"{col}/{row.router}": float(getattr(row, col)) for row in board.itertuples()
               for col in ("aiq", "apgr") if col in board.columns and np.isfinite(getattr(row, col))}
    schema.write_json_atomic(metrics, out / "metrics.json")
    write_manifest(layout.manifests, "replay", cfg, sources, list(paths.values()), metrics,
                   artifacts=[paths["plot"], paths["leaderboard_md"]])
    return paths
