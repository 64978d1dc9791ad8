"""Command line: `routerops stage NAME` (any stage of any pipeline; what dvc.yaml runs),
`routerops replay`, `routerops reprice`, `routerops validate`, `routerops import-qa`,
`routerops import-routellm`, `routerops prices|pool publish FILE`, `routerops gateway serve|keys create`
(gateway/cli.py).

Errors in user input end with exit code 2 and one line naming the file and the field.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import signal
import sys
from pathlib import Path

import pandas as pd

from evaluation.replay import run_replay_benchmark, split_table
from gateway.cli import add_gateway_parser
from models.baselines import PromptedLLMRouter
from models.registry import ROUTER_FACTORIES
from routerops import schema
from routerops.config import load_params
from routerops.envs.jsonl_qa import import_jsonl_qa
from routerops.envs.replay import import_routellm_gsm8k, load_logged_outcomes, write_logged_outcomes
from routerops.envs.suites import write_tasks
from routerops.errors import InputError, RouteropsError
from routerops.pricing import load_pool, load_price_book
from routerops.publishing import POOL, PRICES, in_force, pool_changes, publish
from routerops.validation import check_column_types, check_trajectory_rows
from routerops.workers.server import local_llm_server
from services.prefect_server import emit_published, published_event_name
from services.s3 import endpoint_from_env, publish_file
from stages import STAGES, run_stage
from stages.pipeline import reprice_tables


def stage_command(args: argparse.Namespace) -> None:
    outputs = run_stage(args.name, args.params, args.root)
    print(json.dumps(outputs, indent=2, default=str))


def reprice_command(args: argparse.Namespace) -> None:
    """Re-price a trajectory set under another price book, without any call."""
    src, dst = Path(args.src), Path(args.out)
    check_reprice_output(src, dst)  # before any work: a bad --out must not cost a run
    book = load_price_book(args.price_book)
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
    report = check_trajectory_rows(episodes, turns, load_pool(args.pool), load_price_book(args.price_book),
                                   src / "episodes.parquet", src / "turns.parquet")
    print(f"{src}: {len(report.results)} checks passed on {report.n_episodes} episodes / {report.n_turns} turns")


def import_qa_command(args: argparse.Namespace) -> None:
    """GSM8K- or MATH-format JSONL → a tasks file the collect stage can run."""
    tasks = import_jsonl_qa(args.path, fmt=args.format, suite=args.suite, split=args.split, limit=args.limit)
    write_tasks(tasks, Path(args.out))
    print(f"imported {len(tasks)} tasks from {args.path} -> {args.out}")


def import_routellm_command(args: argparse.Namespace) -> None:
    """RouteLLM's gsm8k_responses.csv → a logged-outcomes table (docs/replay_format.md)."""
    table = import_routellm_gsm8k(args.csv, contaminated_path=args.contaminated, train_path=args.train)
    write_logged_outcomes(table, Path(args.out))
    print(f"{table.query_id.nunique()} queries x {table.worker.nunique()} workers -> {args.out}")


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
    """The three files `routerops replay` writes: the leaderboard, its curves and its metadata."""
    board = Path(out)
    return [board, board.with_suffix(".curves.csv"), board.with_suffix(".meta.json")]


def check_replay_args(args: argparse.Namespace) -> None:
    """Refuse, before any work, what would crash later or clobber an input: every check names its flag."""
    if args.bootstrap < 0:
        raise InputError("command line", "--bootstrap", f"resamples must be ≥ 0 (0 = no intervals), got {args.bootstrap}")
    if args.k < 2:
        raise InputError("command line", "--k", f"cross-fitting needs ≥ 2 folds, got {args.k}")
    if not args.seeds:
        raise InputError("command line", "--seeds", "give at least one seed")
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
    board_path, curves_path, meta_path = replay_outputs(args.out)
    board_path.parent.mkdir(parents=True, exist_ok=True)
    schema.write_csv_atomic(board, board_path)
    schema.write_csv_atomic(board.attrs["curves"], curves_path)
    meta = {k: v for k, v in board.attrs.items() if k != "curves"}
    schema.write_json_atomic({**meta, "argv": sys.argv[1:]}, meta_path)


def publish_command(args: argparse.Namespace) -> None:
    """Validate, version and store a price book or pool, then emit the event that starts a retrain."""
    root = Path(args.root)
    params = load_params(root / args.params, sections=("pool", "reprice", "ops"))
    store = root / params.ops.publish_dir
    pool_file = in_force(store, POOL, root / params.pool.file)
    book_file = in_force(store, PRICES, root / params.reprice.price_book)
    old_pool = load_pool(pool_file) if args.kind == POOL else None
    published, changed = publish(args.kind, args.file, store, pool_file=pool_file, book_file=book_file)
    if not changed:
        print(f"{args.kind} version {published.version} is already in force; nothing published, no retrain")
        return
    changes = pool_changes(old_pool, load_pool(published.path)) if args.kind == POOL else None
    print(f"published {args.kind} version {published.version} -> {published.path}")
    if endpoint_from_env():  # a team's store: the same file where every host can fetch it (boto3)
        key = f"published/{args.kind}/{published.version}.yaml"
        publish_file(params.ops.s3_bucket, key, published.path)
        print(f"uploaded to s3://{params.ops.s3_bucket}/{key}")
    if changes is not None:
        print("workers " + "; ".join(f"{k}: {', '.join(v) or '-'}" for k, v in changes.items()))
    event_id = emit_published(published, changes)
    print(f"emitted {published_event_name(args.kind)} (event {event_id}): the retrain deployment's trigger starts "
          "a retrain" if event_id else "PREFECT_API_URL is not set: no event emitted, no retrain triggered "
          "(run `python -m flows.retrain`)")


def add_publish_parsers(sub: argparse._SubParsersAction) -> None:
    for kind, what in ((PRICES, "price book"), (POOL, "worker pool")):
        group = sub.add_parser(kind, help=f"publish a new {what} (starts a retrain)")
        commands = group.add_subparsers(dest=f"{kind}_command", required=True)
        cmd = commands.add_parser("publish", help=f"validate, version and publish a {what}; emits "
                                  f"{published_event_name(kind)} to the Prefect server at PREFECT_API_URL")
        cmd.add_argument("file")
        cmd.add_argument("--params", default="params.yaml", help="relative to --root (section ops: publish_dir)")
        cmd.add_argument("--root", default=".")
        cmd.set_defaults(func=publish_command, kind=kind)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="routerops", description="cost-aware LLM router pipeline")
    sub = parser.add_subparsers(dest="command", required=True)

    stage = sub.add_parser("stage", help="run one stage of any pipeline (as dvc.yaml does)")
    stage.add_argument("name", choices=sorted(STAGES))
    stage.add_argument("--params", default="params.yaml", help="relative to --root")
    stage.add_argument("--root", default=".", help="the Layout's root: where data/ and reports/ live")
    stage.set_defaults(func=stage_command)

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

    replay = sub.add_parser("replay", help="router leaderboard on a logged-outcomes table (no live call)")
    replay.add_argument("--table", required=True, help="logged outcomes the routers are scored on")
    replay.add_argument("--train-table", help="fit every router on this table instead (e.g. other data)")
    replay.add_argument("--split-column", help="fit on rows whose column is --train-split, score the rest")
    replay.add_argument("--train-split", default="train")
    replay.add_argument("--score-splits", nargs="+", default=["test"])
    replay.add_argument("--llm-base-url", help="OpenAI-compatible endpoint for prompted_llm; default: local server")
    replay.add_argument("--prices", required=True, help="price book the costs are derived under")
    replay.add_argument("--routers", nargs="+",
                        default=["random", "oracle", "cascade", "knn", "logistic", "mf", "mlp", "ensemble", "mtrouter"],
                        help="registry names (models.registry.ROUTER_FACTORIES) or single:<worker>")
    replay.add_argument("--k", type=int, default=5, help="cross-fitting folds (tables without a split)")
    replay.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    replay.add_argument("--bootstrap", type=int, default=1000)
    replay.add_argument("--out", default="reports/replay/leaderboard.csv")
    replay.set_defaults(func=replay_command)

    add_publish_parsers(sub)
    add_gateway_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except RouteropsError as exc:
        print(f"routerops: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
