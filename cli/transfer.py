"""`routerops arena evaluate --table T --prices P --controller NAME`: a registered router scored on
another logged table with responses, through replay endpoints made from it, with no retraining
(issue 39 item 6; evaluation/transfer.py)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from routerops.errors import InputError


def add_arena_parser(sub: argparse._SubParsersAction) -> None:
    arena = sub.add_parser("arena", help="score registered routers on logged tables (arena evaluate)")
    commands = arena.add_subparsers(dest="arena_command", required=True)
    evaluate = commands.add_parser("evaluate", help="score a registered router on another logged table with "
                                                    "responses (replay endpoints), no retraining")
    evaluate.add_argument("--table", required=True, help="logged-outcome table with a `response` column")
    evaluate.add_argument("--prices", required=True, help="price book pricing the table's workers")
    evaluate.add_argument("--controller", required=True, help="registered router name, e.g. router-logistic")
    evaluate.add_argument("--version", default="", help="registered version (default: the `champion` alias)")
    evaluate.add_argument("--map", nargs="*", default=[], metavar="ROUTER=TABLE",
                          help="router worker = table worker (default: the pool's replay `model`, else the name)")
    evaluate.add_argument("--pool", default="configs/pool.yaml", help="pool whose replay workers name the table's")
    evaluate.add_argument("--out", default="reports/arena/transfer.json")
    evaluate.set_defaults(func=arena_evaluate_command)


def parse_map(pairs: list[str]) -> dict[str, str]:
    mapped = {}
    for pair in pairs:
        router, sep, table = pair.partition("=")
        if not sep or not router or not table:
            raise InputError("command line", "--map", f"expected ROUTER=TABLE, got {pair!r}")
        mapped[router] = table
    return mapped


def arena_evaluate_command(args: argparse.Namespace) -> None:
    from routerops import schema
    from routerops.envs.replay import worker_order
    from routerops.files import check_output
    from routerops.market import resolve_book
    from routerops.pricing import load_pool
    from routerops.workers.endpoints import replay_server
    from routerops.workers.replay_endpoint import load_replay_table

    check_output(args.out, "--out", inputs=(args.table, args.prices, args.pool))
    table = load_replay_table(args.table)
    book = resolve_book(args.prices).book
    unpriced = [w for w in worker_order(table) if w not in book.prices]
    if unpriced:
        raise InputError(args.prices, f"prices.{unpriced[0]}", f"no price for worker {unpriced[0]!r} of {args.table}")
    explicit = parse_map(args.map)
    if Path(args.pool).is_file():
        load_pool(args.pool)  # a broken pool fails here, before the registry is read
    router, version = registered_router(args.controller, args.version)
    from evaluation.transfer import evaluate_transfer, worker_map

    mapped = worker_map(list(router.workers), worker_order(table), args.pool, explicit)
    with replay_server(args.table) as base_url:
        result = evaluate_transfer(router, table, book, base_url, mapped)
    result.update(controller=args.controller, version=version, table=str(args.table), price_book=book.version,
                  protocol="no retraining: the registered router's estimates on every query of the table; "
                           "answers from its replay endpoints, scores as logged")
    schema.write_json_atomic(result, Path(args.out))
    print(f"{args.controller} v{version} on {args.table} ({result['test_queries']} queries): accuracy "
          f"{result['accuracy']:.3f} (95% {result['accuracy_ci95'][0]:.3f}–{result['accuracy_ci95'][1]:.3f}), "
          f"${result['usd_per_query']:.6f}/query, first choice outside the table "
          f"{result['first_choice_outside_table']:.0%}")
    for row in result["baselines"]:
        print(f"  {row['policy']:<40} accuracy {row['accuracy']:.3f}  ${row['usd_per_query']:.6f}/query")
    print(f"-> {args.out}")


def registered_router(name: str, version: str):
    """The registered single-turn router `name` (its champion unless `version`)."""
    import mlflow

    from evaluation.registry import champion_version, load_registered
    from routerops.config import TrackConfig

    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or TrackConfig().tracking_uri)
    version = version or champion_version(name)
    if not version:
        raise InputError("command line", "--controller", f"no registered model {name!r} with a `champion` alias "
                         "in the tracking store (MLFLOW_TRACKING_URI); give --version")
    try:
        router = load_registered(name, version)
    except Exception as exc:  # noqa: BLE001 - MLflow raises several types for a missing model or version
        raise InputError("command line", "--controller", f"cannot load {name} v{version}: {exc}") from None
    if not hasattr(router, "quality"):
        raise InputError("command line", "--controller", f"{name} is a {type(router).__name__}: only single-turn "
                         "routers are scored off the table so far")
    return router, version
