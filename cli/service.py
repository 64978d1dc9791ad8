"""`routerops serve` (flows/serve.py: the team's Prefect server, S3 store, deployments and a worker on
this machine; `make serve`) and `routerops drift check` (flows/ope_loop.py: the drift check on the
gateway's own traffic, e.g. from cron). The flows carry no command line of their own: this top floor
parses, and imports the flow (Prefect, MLflow) only when the command runs."""

from __future__ import annotations

import argparse


def add_service_parsers(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="routerops as a team's service here: Prefect server, deployments, a "
                                         "worker (and SeaweedFS S3 with AWS_* keys set); Ctrl-C stops")
    serve.add_argument("--params", default="params.yaml")
    serve.add_argument("--root", default=".", help="the repository root the deployments run in")
    serve.add_argument("--home", default=".prefect", help="PREFECT_HOME of the server started here")
    serve.add_argument("--port", type=int, default=4200)
    serve.add_argument("--s3-port", type=int, default=8333, help="SeaweedFS's S3 port (with AWS_* keys set)")
    serve.set_defaults(func=serve_command)

    drift = sub.add_parser("drift", help="the drift check on the gateway's traffic (emits routerops.champion.drift)")
    commands = drift.add_subparsers(dest="drift_command", required=True)
    check = commands.add_parser("check", help="compare the served champion's graded traffic with its "
                                              "registered quality; emit the event once per breach")
    check.add_argument("--log", required=True, help="the gateway's database URL (sqlite:///gateway.db)")
    check.add_argument("--router", required=True, help="the served router, e.g. router-knn")
    check.add_argument("--params", default="params.yaml")
    check.add_argument("--bound", type=float, default=0.1)
    check.set_defaults(func=drift_check_command)


def serve_command(args: argparse.Namespace) -> None:
    from pathlib import Path

    from routerops.config import load_params
    from routerops.files import check_output

    root = Path(args.root)
    check_output(root, "--root", folder=True)  # the deployments' workspace and the server's home live there
    check_output(root / args.home, "--home", folder=True)
    load_params(root / args.params)  # a bad params file is one line here, before any server starts
    from flows.serve import serve

    serve(args.params, args.root, args.home, args.port, args.s3_port)


def drift_check_command(args: argparse.Namespace) -> None:
    from cli.db_url import check_db_url
    from routerops.config import load_params

    check_db_url(args.log, "--log")  # the gateway's database, refused in one line before the store opens it
    load_params(args.params)
    from flows.ope_loop import drift_check

    drift_check(args.log, args.router, args.params, bound=args.bound)
