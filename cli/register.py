"""`routerops register`: fit a router family on my logged outcomes, gate it, register it, serve it.

    routerops register --table outcomes.csv --prices configs/prices/current.yaml --router knn

fits the named family (models/registry.py) on the table's training rows, scores it on the gate rows,
runs the promotion gate (routerops/promotion.py, evaluation/registry.py: the first version of a name
is promoted; a later one only when it beats the champion beyond the paired bootstrap interval),
registers it as `router-<family>` in the MLflow registry, gives it the `champion` alias when it passes,
and prints the `gateway serve` command that serves it. The split: the table's `split` column (train
rows fitted, `val` rows gated; --split-column, --train-split, --gate-split) or, without one, a
seeded split of the queries (--gate-fraction, --seed). `--trajectories ROOT` reads a main pipeline's
priced single-worker episodes under ROOT (data/priced, data/suites/tasks.jsonl) as the table.

This module only parses (argparse and the path checks); the work is cli/register_table.py,
imported when the command runs.
"""

from __future__ import annotations

import argparse


def add_register_parser(sub: argparse._SubParsersAction) -> None:
    cmd = sub.add_parser("register", help="fit a router family on logged outcomes, gate it, register it as "
                                          "champion and print the serve command",
                         description="Fit --router on the training rows of --table, judge it on the gate rows, "
                                     "register it as router-FAMILY (the champion alias when the gate passes) and "
                                     "print the `routerops gateway serve` command that serves it.")
    cmd.add_argument("--table", help="logged outcomes (docs/replay_format.md): .csv or .parquet")
    cmd.add_argument("--trajectories", metavar="ROOT",
                     help="instead of --table: a pipeline root whose priced single-worker episodes form the table "
                          "(data/priced, data/suites/tasks.jsonl)")
    cmd.add_argument("--prices", required=True, help="price book the workers' costs are derived under")
    cmd.add_argument("--router", required=True, metavar="FAMILY",
                     help="router family to fit: a name of models.registry.ROUTER_FACTORIES, e.g. knn, logistic, mlp")
    cmd.add_argument("--split-column", default="split",
                     help="the table's split column, used when the table has it (default: split)")
    cmd.add_argument("--train-split", default="train", help="rows of the split column the router is fitted on")
    cmd.add_argument("--gate-split", default="val", help="rows of the split column the gate judges it on")
    cmd.add_argument("--gate-fraction", type=float, default=0.25,
                     help="without a split column: the share of queries held out for the gate (seeded split)")
    cmd.add_argument("--seed", type=int, default=0, help="the router's seed, the split's and the bootstrap's")
    cmd.add_argument("--objective", choices=("aiq", "accuracy_at_budget"), default="aiq",
                     help="what the gate compares: area under the accuracy-cost curve, or accuracy at --budget-usd")
    cmd.add_argument("--budget-usd", type=float, default=None, help="accuracy_at_budget: the per-query budget")
    cmd.add_argument("--n-boot", type=int, default=2000, help="paired bootstrap resamples of the gate's queries")
    cmd.add_argument("--pool", default="configs/pool.yaml",
                     help="the pool the router will be served over (checked: each worker must be an LLM there)")
    cmd.add_argument("--tracking-uri", default=None,
                     help="MLflow store holding the registry (default: MLFLOW_TRACKING_URI, else params.yaml's track)")
    cmd.set_defaults(func=register)


def register(args: argparse.Namespace) -> None:
    from cli.register_table import register_command  # pandas, the routers, MLflow: when the command runs

    register_command(args)
