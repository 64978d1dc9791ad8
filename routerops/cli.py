"""Command line: `routerops stage NAME` (what dvc.yaml runs), `routerops reprice`, `routerops validate`.

Errors in user input end with exit code 2 and one line naming the file and the field.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from routerops import schema
from routerops.errors import RouteropsError

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
    episodes = schema.read_table(src / "episodes.parquet", "episodes")
    turns = schema.read_table(src / "turns.parquet", "turns")
    episodes, turns = reprice_tables(episodes, turns, book)
    schema.write_table(episodes, dst / "episodes.parquet", "episodes")
    schema.write_table(turns, dst / "turns.parquet", "turns")
    print(f"re-priced {len(episodes)} episodes / {len(turns)} turns under price book {book.version}: "
          f"total ${episodes.cost_usd.sum():.6f} -> {dst}")


def validate_command(args: argparse.Namespace) -> None:
    from routerops.pricing import load_pool, load_price_book
    from routerops.validation import validate_trajectories

    src = Path(args.src)
    report = validate_trajectories(schema.read_table(src / "episodes.parquet", "episodes"),
                                   schema.read_table(src / "turns.parquet", "turns"),
                                   load_pool(args.pool), load_price_book(args.price_book))
    for result in report.results:
        print(("ok   " if result["success"] else "FAIL ") + result["expectation"])
    if not report.passed:
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
