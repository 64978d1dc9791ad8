"""The work of `routerops register` (cli/register.py parses it): my logged outcomes → a
fitted router → the promotion gate → a registered version, `champion` when it passes → the serve command.

The same path as the main pipeline's register stage (stages/routers.py: register): the router is
fitted on the training rows only, wrapped by `ServedRouter.from_fitted`, judged on the gate rows by
`logged_grid_judge` and registered by `register_and_promote`; only the choice of family differs (the
user names it) and where the rows come from (any table in the logged-outcome format).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from routerops.errors import InputError


def say(message: str) -> None:
    """Progress on stderr, flushed: the imports and the embedding take seconds on two cores."""
    print(f"routerops register: {message}", file=sys.stderr, flush=True)


def check_args(args: argparse.Namespace) -> None:
    """What can be refused before any heavy import: paths that do not exist, values out of range."""
    for flag, path in (("--table", args.table), ("--prices", args.prices), ("--pool", args.pool)):
        if path is not None and not Path(path).is_file():
            raise InputError(path, flag, "file not found")
    if args.trajectories is not None and not Path(args.trajectories).is_dir():
        raise InputError(args.trajectories, "--trajectories", "no such folder (a pipeline root holding data/priced)")
    if (args.table is None) == (args.trajectories is None):
        raise InputError("command line", "--table", "give the logged outcomes: --table FILE, or --trajectories ROOT "
                         "(a pipeline root), not both")
    if not 0 < args.gate_fraction < 1:
        raise InputError("command line", "--gate-fraction", f"expected a share in (0, 1), got {args.gate_fraction}")
    if args.n_boot < 100:
        raise InputError("command line", "--n-boot", f"the gate needs ≥ 100 resamples, got {args.n_boot}")
    if args.objective == "accuracy_at_budget" and args.budget_usd is None:
        raise InputError("command line", "--budget-usd", "accuracy_at_budget judges at a per-query budget: give one")


def read_table(args: argparse.Namespace):
    """The logged-outcome table: --table, or the single-worker episodes under --trajectories."""
    from routerops.envs.replay import load_logged_outcomes

    if args.table is not None:
        return load_logged_outcomes(args.table), args.table
    from routerops import schema
    from routerops.envs.suites import read_tasks
    from routerops.grid import logged_outcomes_from_trajectories
    from routerops.layout import Layout

    layout = Layout(Path(args.trajectories))
    episodes_path = layout.priced.episodes
    for path in (episodes_path, layout.tasks):
        if not path.is_file():
            raise InputError(path, "--trajectories", "missing: run the main pipeline's collect and reprice stages "
                             "under this root first (`routerops run main`)")
    episodes = schema.read_table(episodes_path, "episodes")
    return logged_outcomes_from_trajectories(episodes, read_tasks(layout.tasks)), str(episodes_path)


def split_rows(table, args: argparse.Namespace, source: str):
    """(train rows, gate rows, how): the split column when the table has one, else a seeded split of
    the query ids (whole queries: every worker's row of a query lands on the same side)."""
    import numpy as np

    from evaluation.replay import split_table

    if args.split_column in table.columns:
        train = split_table(table, args.split_column, [args.train_split], source)
        gate = split_table(table, args.split_column, [args.gate_split], source)
        return train, gate, f"{args.split_column}={args.train_split} fitted, {args.split_column}={args.gate_split} gated"
    ids = np.array(sorted(table["query_id"].astype(str).unique()))
    n_gate = int(round(len(ids) * args.gate_fraction))
    if n_gate < 2 or len(ids) - n_gate < 2:
        raise InputError(source, "query_id", f"{len(ids)} queries are too few to hold out {args.gate_fraction:.0%} "
                         "for the gate: give more queries, another --gate-fraction or a split column")
    gate_ids = set(np.random.default_rng(args.seed).permutation(ids)[:n_gate])
    in_gate = table["query_id"].astype(str).isin(gate_ids)
    how = f"seeded split (seed {args.seed}): {len(ids) - n_gate} queries fitted, {n_gate} gated"
    return table[~in_gate].reset_index(drop=True), table[in_gate].reset_index(drop=True), how


def pool_problem(pool_file: str, workers: list[str]) -> str | None:
    """Why `gateway serve` over this pool would refuse the router (gateway/champion.py's rule), or None."""
    from routerops.pricing import load_pool

    pool = load_pool(pool_file)
    llm = {w.name for w in pool.workers if w.kind == "llm"}
    missing = [w for w in workers if w not in llm]
    return None if not missing else (f"pool {pool_file} has no LLM worker {missing[0]!r}: `gateway serve` over it "
                                     "would refuse this router; serve with a pool that has every worker of the table")


def tracking_uri_of(args: argparse.Namespace) -> str:
    from routerops.config import TrackConfig

    return args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or TrackConfig().tracking_uri


def serve_command_for(name: str, args: argparse.Namespace, uri: str) -> str:
    return shlex.join(["routerops", "gateway", "serve", "--router", name, "--pool-file", args.pool,
                       "--price-book", args.prices, "--tracking-uri", uri])


def register_command(args: argparse.Namespace) -> None:
    check_args(args)
    say(f"reading {args.table or args.trajectories}")
    table, source = read_table(args)
    train_rows, gate_rows, how = split_rows(table, args, source)

    say("loading the router registry and the encoder (torch, MLflow)")
    from evaluation.registry import CHAMPION_ALIAS, logged_grid_judge, register_and_promote
    from evaluation.replay import routing_data_from_table
    from evaluation.serving.single_turn import ServedRouter
    from evaluation.tracking import use_tracking
    from models.embeddings import default_encoder
    from models.registry import ROUTER_FACTORIES, make_router
    from routerops import schema
    from routerops.config import TrackConfig
    from routerops.market import resolve_book
    from routerops.promotion import GateConfig
    from routerops.publishing import versions

    if args.router not in ROUTER_FACTORIES:
        raise InputError("command line", "--router", f"unknown router family {args.router!r}; known: "
                         f"{', '.join(sorted(ROUTER_FACTORIES))}")
    book, encoder = resolve_book(args.prices).book, default_encoder()
    say(f"embedding {train_rows.query_id.nunique()} training and {gate_rows.query_id.nunique()} gate queries ({how})")
    train = routing_data_from_table(train_rows, book, encoder)
    gate_data = routing_data_from_table(gate_rows, book, encoder)
    problem = pool_problem(args.pool, list(train.workers))

    say(f"fitting {args.router} on {len(train)} queries × {len(train.workers)} workers")
    router = make_router(args.router, args.seed).fit(train)
    served = ServedRouter.from_fitted(router, train, book.version, family=args.router, encoder=encoder)
    gate = GateConfig(objective=args.objective, budget_usd=args.budget_usd, n_boot=args.n_boot, seed=args.seed)
    judge = logged_grid_judge(gate_data, gate, served)
    uri = use_tracking(TrackConfig(tracking_uri=tracking_uri_of(args)))
    inputs = [Path(p) for p in (args.table, args.prices, args.pool) if p]
    hashes = {"train_queries": str(len(train)), "gate_queries": str(len(gate_data)), "split": how,
              **({"table_sha256": schema.file_sha256(args.table)} if args.table else {}),
              **versions(args.prices, args.pool)}
    say(f"registering {served.registered_name()} and running the promotion gate ({args.objective}, "
        f"{args.n_boot} resamples)")
    registered, decision = register_and_promote(served, judge(served, "candidate"), judge, gate, data_hashes=hashes,
                                                training_inputs=inputs, gate_inputs=inputs)
    verdict = f"promoted: alias {CHAMPION_ALIAS!r}" if decision.promote else "not promoted (the champion stays)"
    print(f"{registered.name} v{registered.version}: {verdict} — {decision.reason}")
    print(f"gate score ({args.objective}, {len(gate_data)} queries): candidate {decision.candidate_score:.4f}"
          + (f", champion {decision.champion_score:.4f}" if decision.champion_score is not None else ""))
    print(f"model: {registered.model_uri} in {uri}")
    if problem:
        print(f"warning: {problem}")
    champion = decision.evidence.get("champion_version")
    print("serve it:" if decision.promote else f"serve the champion (v{champion}, unchanged):")
    print(f"  {serve_command_for(registered.name, args, uri)}")
