"""Command line: `routerops stage NAME` (what dvc.yaml runs), `routerops reprice`, `routerops validate`.

Errors in user input end with exit code 2 and one line naming the file and the field.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from routerops import schema
from routerops.errors import InputError, RouteropsError

STAGES = ("materialise", "collect", "reprice", "validate", "evaluate")


def run_stage(args: argparse.Namespace) -> None:
    from routerops import stages
    from routerops.config import load_params

    params = load_params(args.params)
    getattr(stages, args.name)(params)


def reprice_command(args: argparse.Namespace) -> None:
    """Re-price a trajectory set under another price book, without any call."""
    from routerops.pricing import load_price_book
    from routerops.stages import reprice_tables

    book = load_price_book(args.price_book)
    src, dst = Path(args.src), Path(args.out)
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


def read_trajectories(src: Path):
    """Both tables, with every row's types and token counts checked before anything is computed."""
    from routerops.validation import check_column_types

    paths = {kind: src / f"{kind}.parquet" for kind in ("episodes", "turns")}
    tables = {kind: schema.read_table(path, kind) for kind, path in paths.items()}
    for kind, table in tables.items():
        check_column_types(table, kind, paths[kind])
        for column in ("prompt_tokens", "completion_tokens", "cached_tokens"):
            bad = table[table[column] < 0]
            if len(bad):
                raise InputError(paths[kind], column, f"{len(bad)} row(s) with negative token counts, "
                                 f"e.g. episode {bad.episode_id.iloc[0]}")
    return tables["episodes"], tables["turns"]


def validate_command(args: argparse.Namespace) -> None:
    from routerops.pricing import load_pool, load_price_book
    from routerops.validation import check_trajectory_rows

    src = Path(args.src)
    episodes, turns = read_trajectories(src)
    report = check_trajectory_rows(episodes, turns, load_pool(args.pool), load_price_book(args.price_book),
                                   src / "episodes.parquet", src / "turns.parquet")
    print(f"{src}: {len(report.results)} checks passed on {report.n_episodes} episodes / {report.n_turns} turns")


def import_qa_command(args: argparse.Namespace) -> None:
    """GSM8K- or MATH-format JSONL → a tasks file the collect stage can run."""
    from routerops.envs.jsonl_qa import import_jsonl_qa
    from routerops.envs.suites import write_tasks

    tasks = import_jsonl_qa(args.path, fmt=args.format, suite=args.suite, split=args.split, limit=args.limit)
    write_tasks(tasks, Path(args.out))
    print(f"imported {len(tasks)} tasks from {args.path} -> {args.out}")


def import_routellm_command(args: argparse.Namespace) -> None:
    """RouteLLM's gsm8k_responses.csv → a logged-outcomes table (docs/replay_format.md)."""
    from routerops.envs.replay import import_routellm_gsm8k, write_logged_outcomes

    table = import_routellm_gsm8k(args.csv, contaminated_path=args.contaminated, train_path=args.train)
    write_logged_outcomes(table, Path(args.out))
    print(f"{table.query_id.nunique()} queries x {table.worker.nunique()} workers -> {args.out}")


def replay_command(args: argparse.Namespace) -> None:
    """Cross-fitted leaderboard of every router on a logged-outcomes table (no live call)."""
    from models.replay_bench import main as replay_main

    argv = ["--table", args.table, "--prices", args.prices, "--k", str(args.k), "--out", args.out,
            "--bootstrap", str(args.bootstrap), "--routers", *args.routers, "--seeds", *map(str, args.seeds)]
    if replay_main(argv):
        raise SystemExit(1)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="routerops", description="cost-aware LLM router pipeline")
    sub = parser.add_subparsers(dest="command", required=True)

    stage = sub.add_parser("stage", help="run one pipeline stage (as dvc.yaml does)")
    stage.add_argument("name", choices=STAGES)
    stage.add_argument("--params", default="params.yaml")
    stage.set_defaults(func=run_stage)

    reprice = sub.add_parser("reprice", help="re-price trajectories under another price book (no calls)")
    reprice.add_argument("--src", default="data/raw", help="folder with episodes.parquet and turns.parquet")
    reprice.add_argument("--price-book", required=True)
    reprice.add_argument("--out", required=True, help="output folder")
    reprice.set_defaults(func=reprice_command)

    validate = sub.add_parser("validate", help="run the data checks on a trajectory set")
    validate.add_argument("--src", default="data/priced")
    validate.add_argument("--pool", default="configs/pool.yaml")
    validate.add_argument("--price-book", default="configs/prices/current.yaml")
    validate.set_defaults(func=validate_command)

    import_qa = sub.add_parser("import-qa", help="import a GSM8K / MATH JSONL file as tasks")
    import_qa.add_argument("path")
    import_qa.add_argument("--format", default="auto", choices=("auto", "gsm8k", "math"))
    import_qa.add_argument("--suite", default="")
    import_qa.add_argument("--split", default="test")
    import_qa.add_argument("--limit", type=int, default=None)
    import_qa.add_argument("--out", required=True)
    import_qa.set_defaults(func=import_qa_command)

    routellm = sub.add_parser("import-routellm", help="import RouteLLM's gsm8k_responses.csv as logged outcomes")
    routellm.add_argument("--csv", required=True)
    routellm.add_argument("--contaminated", help="gsm8k_contaminated_prompts.jsonl (those prompts are dropped)")
    routellm.add_argument("--train", help="GSM8K train.jsonl: token counts include RouteLLM's 8-shot prefix")
    routellm.add_argument("--out", required=True)
    routellm.set_defaults(func=import_routellm_command)

    replay = sub.add_parser("replay", help="cross-fitted router leaderboard on a logged-outcomes table")
    replay.add_argument("--table", required=True)
    replay.add_argument("--prices", required=True, help="price book the costs are derived under")
    replay.add_argument("--routers", nargs="+",
                        default=["random", "oracle", "cascade", "knn", "logistic", "mf", "mlp", "ensemble", "mtrouter"],
                        help="registry names (models.baselines.ROUTER_FACTORIES) or single:<worker>")
    replay.add_argument("--k", type=int, default=5)
    replay.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    replay.add_argument("--bootstrap", type=int, default=1000)
    replay.add_argument("--out", default="reports/replay/leaderboard.csv")
    replay.set_defaults(func=replay_command)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except RouteropsError as exc:
        print(f"routerops: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
