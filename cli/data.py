"""`routerops reprice`, `routerops validate`, `routerops import-qa`, `routerops import-routellm`:
the commands that move and check data (cli/main.py parses their arguments)."""

from __future__ import annotations

import argparse
from pathlib import Path

from routerops import schema
from routerops.envs.jsonl_qa import import_jsonl_qa
from routerops.envs.llmrouter import import_llmrouter, price_book_from_candidates, write_price_book
from routerops.envs.replay import import_routellm_gsm8k, write_logged_outcomes
from routerops.envs.suites import write_tasks
from routerops.errors import InputError
from routerops.files import check_output
from routerops.market import resolve_book, resolve_pool
from routerops.validation import check_column_types, check_trajectory_rows
from stages.pipeline import reprice_tables


def reprice_command(args: argparse.Namespace) -> None:
    """Re-price a trajectory set under another price book, without any call."""
    src, dst = Path(args.src), Path(args.out)
    check_reprice_output(src, dst)  # before any work: a bad --out must not cost a run
    check_output(dst, "--out", folder=True, inputs=(args.price_book,))
    book = resolve_book(args.price_book).book
    episodes, turns = read_trajectories(src)
    unpriced = sorted(set(turns.worker) - set(book.prices))
    if unpriced:
        raise InputError(args.price_book, f"prices.{unpriced[0]}", f"no price for worker {unpriced[0]!r} "
                         f"used in {src / 'turns.parquet'}")
    episodes, turns = reprice_tables(episodes, turns, book)
    schema.write_table(episodes, dst / "episodes.parquet", "episodes")
    schema.write_table(turns, dst / "turns.parquet", "turns")
    print(f"re-priced {len(episodes)} episodes / {len(turns)} turns under price book {book.version}: "
          f"total ${episodes.cost_usd.sum():.6f} -> {dst}")


def check_reprice_output(src: Path, dst: Path) -> None:
    """--out must be a folder (or not exist yet) other than --src: writing into --src would replace
    the logged costs with the re-priced ones, and the old ones could not be recovered."""
    if dst.exists() and not dst.is_dir():
        raise InputError(dst, "--out", "exists and is not a folder")
    if dst.resolve() == src.resolve():
        raise InputError(dst, "--out", "is the --src folder; re-pricing would overwrite its tables")


def read_trajectories(src: Path):
    """Both tables, with every row's types and token counts checked before anything is computed
    (schema.read_table checks the token counts, naming the file, the row and the episode)."""
    paths = {kind: src / f"{kind}.parquet" for kind in ("episodes", "turns")}
    tables = {kind: schema.read_table(path, kind) for kind, path in paths.items()}
    for kind, table in tables.items():
        check_column_types(table, kind, paths[kind])
    return tables["episodes"], tables["turns"]


def validate_command(args: argparse.Namespace) -> None:
    src = Path(args.src)
    episodes, turns = read_trajectories(src)
    report = check_trajectory_rows(episodes, turns, resolve_pool(args.pool), resolve_book(args.price_book).book,
                                   src / "episodes.parquet", src / "turns.parquet")
    print(f"{src}: {len(report.results)} checks passed on {report.n_episodes} episodes / {report.n_turns} turns")


def import_qa_command(args: argparse.Namespace) -> None:
    """GSM8K- or MATH-format JSONL → a tasks file the collect stage can run."""
    check_output(args.out, "--out", inputs=(args.path,))
    tasks = import_jsonl_qa(args.path, fmt=args.format, suite=args.suite, split=args.split, limit=args.limit)
    write_tasks(tasks, Path(args.out))
    print(f"imported {len(tasks)} tasks from {args.path} -> {args.out}")


def import_routellm_command(args: argparse.Namespace) -> None:
    """RouteLLM's gsm8k_responses.csv → a logged-outcomes table (docs/replay_format.md)."""
    check_output(args.out, "--out", inputs=(args.csv, args.contaminated, args.train))
    table = import_routellm_gsm8k(args.csv, contaminated_path=args.contaminated, train_path=args.train)
    write_logged_outcomes(table, Path(args.out))
    print(f"{table.query_id.nunique()} queries x {table.worker.nunique()} workers -> {args.out}")


def import_llmrouter_command(args: argparse.Namespace) -> None:
    """LLMRouter's dcrouter JSON → a logged-outcomes table with a seeded split, and its price book."""
    inputs = (args.json, args.candidates)
    check_output(args.out, "--out", inputs=inputs)
    check_output(args.prices_out, "--prices-out", inputs=inputs)
    book = price_book_from_candidates(args.candidates)  # read first: a bad price file costs no tokenising
    table = import_llmrouter(args.json, split_seed=args.split_seed, fractions=args.fractions,
                             completion_tokens=args.completion_tokens)
    missing = sorted(set(table.worker) - set(book["prices"]))
    if missing:
        raise InputError(args.candidates, missing[0], "a model of the table has no price")
    write_logged_outcomes(table, Path(args.out))
    write_price_book(book, args.prices_out)
    counts = table.drop_duplicates("query_id")["split"].value_counts().to_dict()
    print(f"{table.query_id.nunique()} queries x {table.worker.nunique()} workers ({counts}) -> {args.out}; "
          f"prices -> {args.prices_out}")
