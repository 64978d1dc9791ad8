"""Command line: `routerops run PIPELINE [--set KEY=VALUE]` (a whole pipeline; cli/run.py),
`routerops stage NAME` (any stage of any pipeline; what dvc.yaml runs), `routerops dvc-yaml` (stages/dvc_yaml.py),
`routerops replay` (cli/replay.py), `routerops replay serve` (routerops/workers/replay_endpoint.py), `routerops reprice`,
`routerops validate`, `routerops import-qa`, `routerops import-routellm`, `routerops import-llmrouter` (cli/data.py),
`routerops prices|pool publish FILE` (cli/publish.py), `routerops ope` (cli/ope.py), `routerops register`
(cli/register.py), `routerops arena evaluate` (cli/transfer.py), `routerops serve`, `routerops drift check`
(cli/service.py),
`routerops gateway serve|keys create|list|revoke|set-budget|spend` (gateway/cli.py).

The CLI is the top floor (docs/architecture.md): it imports flows, the gateway, the stages and the
services directly, and none of them imports it. This module only parses: each command's work is a
function below that imports its module when it runs, so `routerops stage reprice` (every dvc.yaml
command) and `routerops reprice` start in seconds instead of importing torch, transformers, MLflow
and Prefect for commands they do not run, and `--help`, a mistyped flag or a missing file answer in
well under a second (tests/cli/test_cli_imports.py counts the modules a parse imports).
Errors in user input end with exit code 2 and one line naming the file and the field.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

from pathlib import Path

from routerops.errors import InputError, RouteropsError
from routerops.files import check_output
from cli.db_url import check_db_url
from cli.register import add_register_parser
from cli.run import FLOWS, add_run_parser
from cli.service import add_service_parsers
from stages import run_stage, standalone_stages
from stages.dvc_yaml import add_dvc_yaml_parser


def stage_command(args: argparse.Namespace) -> None:
    check_output(args.root, "--root", folder=True)  # the stage writes data/ and reports/ there
    outputs = run_stage(args.name, args.params, args.root)
    print(json.dumps(outputs, indent=2, default=str))


def gateway_command(args: argparse.Namespace) -> None:
    """`routerops gateway ...`, parsed by gateway/cli.py's own parser: serve's flags come from the
    gateway's settings model (pydantic), so it is built only when asked for, and `keys` goes without."""
    from gateway.cli import add_gateway_parser  # argparse only; serve's flags import pydantic when asked for

    parser = OneLineParser(prog="routerops")
    serve_flags = args.rest[:1] != ["keys"]  # `keys` needs none of serve's flags (nor pydantic)
    add_gateway_parser(parser.add_subparsers(dest="command", required=True), serve_flags)
    gateway_args = parser.parse_args(["gateway", *args.rest])
    if getattr(gateway_args, "db_url", None) is not None:
        check_db_url(gateway_args.db_url)
    if gateway_args.gateway_command == "serve":  # the settings file with the flags over it (pydantic only)
        from gateway.settings import settings_from

        gateway_args.settings = settings_from(gateway_args)
        if gateway_args.db_url is None:
            where = f"database (in {gateway_args.config})" if gateway_args.config else "--db-url"
            check_db_url(gateway_args.settings.database, where)
    gateway_args.func(gateway_args)


# routerops/publishing.py's kinds and event names (it imports pandas: not at parse time; a test holds them equal).
PUBLISHED_KINDS = (("prices", "price book"), ("pool", "worker pool"))


def add_publish_parsers(sub: argparse._SubParsersAction) -> None:
    for kind, what in PUBLISHED_KINDS:
        group = sub.add_parser(kind, help=f"publish a new {what} (starts a retrain)")
        commands = group.add_subparsers(dest=f"{kind}_command", required=True)
        cmd = commands.add_parser("publish", help=f"validate, version and publish a {what}; emits "
                                  f"routerops.{kind}.published to the Prefect server at PREFECT_API_URL")
        cmd.add_argument("file")
        cmd.add_argument("--params", default="params.yaml", help="relative to --root (section ops: publish_dir)")
        cmd.add_argument("--root", default=".")
        cmd.set_defaults(func=run_publish, kind=kind)


# Each command's work, imported when it runs (pandas, the routers, MLflow, Prefect, boto3): `--help`,
# a usage error or a missing input file answers without them (tests/cli/test_cli_imports.py).
def run_reprice(args: argparse.Namespace) -> None:
    from cli.data import reprice_command

    reprice_command(args)


def run_validate(args: argparse.Namespace) -> None:
    from cli.data import validate_command

    validate_command(args)


def run_import_qa(args: argparse.Namespace) -> None:
    from cli.data import import_qa_command

    import_qa_command(args)


def run_import_routellm(args: argparse.Namespace) -> None:
    from cli.data import import_routellm_command

    import_routellm_command(args)


def run_import_llmrouter(args: argparse.Namespace) -> None:
    from cli.data import import_llmrouter_command

    import_llmrouter_command(args)


def run_replay(args: argparse.Namespace) -> None:
    from cli.replay import replay_command

    replay_command(args)


def run_publish(args: argparse.Namespace) -> None:
    from cli.publish import publish_command

    publish_command(args)


class OneLineParser(argparse.ArgumentParser):
    """argparse's refusals in the CLI's one error style: one line naming what is wrong and where the
    usage is, instead of the usage block and the message (subparsers inherit the class)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="routerops", description="cost-aware LLM router pipeline")
    sub = parser.add_subparsers(dest="command", required=True)

    add_run_parser(sub)
    stage = sub.add_parser("stage", help="run one stage of any pipeline (as dvc.yaml does)")
    stage.add_argument("name", choices=standalone_stages())
    stage.add_argument("--params", default="params.yaml", help="relative to --root")
    stage.add_argument("--root", default=".", help="the Layout's root: where data/ and reports/ live")
    stage.set_defaults(func=stage_command)
    add_dvc_yaml_parser(sub)

    reprice = sub.add_parser("reprice", help="re-price trajectories under another price book (no calls)")
    reprice.add_argument("--src", default="data/raw", help="folder with episodes.parquet and turns.parquet")
    reprice.add_argument("--price-book", required=True)
    reprice.add_argument("--out", required=True, help="output folder")
    # (--src is read after --out is checked: a bad --out is named first, as every writer does)
    reprice.set_defaults(func=run_reprice, input_files=("price_book",))

    validate = sub.add_parser("validate", help="run the data checks on a trajectory set")
    validate.add_argument("--src", default="data/priced")
    validate.add_argument("--pool", default="configs/pool.yaml")
    validate.add_argument("--price-book", default="configs/prices/current.yaml")
    validate.set_defaults(func=run_validate, input_files=("pool", "price_book"),
                          input_dirs=("src",))

    import_qa = sub.add_parser("import-qa", help="import a GSM8K / MATH JSONL file as tasks")
    import_qa.add_argument("path")
    import_qa.add_argument("--format", default="auto", choices=("auto", "gsm8k", "math"))
    import_qa.add_argument("--suite", default="")
    import_qa.add_argument("--split", default="test")
    import_qa.add_argument("--limit", type=int, default=None)
    import_qa.add_argument("--out", required=True)
    import_qa.set_defaults(func=run_import_qa, input_files=("path",))

    routellm = sub.add_parser("import-routellm", help="import RouteLLM's gsm8k_responses.csv as logged outcomes")
    routellm.add_argument("--csv", required=True)
    routellm.add_argument("--contaminated", help="gsm8k_contaminated_prompts.jsonl (those prompts are dropped)")
    routellm.add_argument("--train", help="GSM8K train.jsonl: token counts include RouteLLM's 8-shot prefix")
    routellm.add_argument("--out", required=True)
    routellm.set_defaults(func=run_import_routellm,
                          input_files=("csv", "contaminated", "train"))

    llmrouter = sub.add_parser("import-llmrouter", help="import LLMRouter's nine-model table (dcrouter) as "
                               "logged outcomes with a seeded train/val/test split, and its price book")
    llmrouter.add_argument("--json", required=True, help="dcrouter_train.json")
    llmrouter.add_argument("--candidates", required=True, help="llm_candidates.json (prices)")
    llmrouter.add_argument("--out", required=True, help="logged-outcome table (.parquet)")
    llmrouter.add_argument("--prices-out", required=True, help="price book (.yaml) written from the candidates")
    llmrouter.add_argument("--split-seed", type=int, default=0)
    llmrouter.add_argument("--fractions", type=float, nargs=3, default=[0.6, 0.2, 0.2], help="train val test")
    llmrouter.add_argument("--completion-tokens", type=int, default=0,
                           help="assumed completion tokens per call (none were logged)")
    llmrouter.set_defaults(func=run_import_llmrouter, input_files=("json", "candidates"))

    replay = sub.add_parser("replay", help="router leaderboard on a logged-outcomes table (no live call); "
                                           "`routerops replay serve --table T` serves its responses as endpoints")
    replay.add_argument("--table", required=True, help="logged outcomes the routers are scored on")
    replay.add_argument("--train-table", help="fit every router on this table instead (e.g. other data)")
    replay.add_argument("--split-column", help="fit on rows whose column is --train-split, score the rest")
    replay.add_argument("--train-split", default="train")
    replay.add_argument("--score-splits", nargs="+", default=["test"])
    replay.add_argument("--drop-overlap", action="store_true",
                        help="score only the queries the training rows do not hold (same id or text); the "
                             "count dropped is printed and recorded in the metadata")
    replay.add_argument("--llm-base-url", help="OpenAI-compatible endpoint for prompted_llm; default: local server")
    replay.add_argument("--prices", required=True, help="price book the costs are derived under")
    replay.add_argument("--routers", nargs="+",
                        default=["random", "oracle", "cascade", "knn", "logistic", "mf", "mlp", "ensemble", "mtrouter"],
                        help="registry names (models.registry.ROUTER_FACTORIES) or single:<worker>")
    replay.add_argument("--k", type=int, default=5, help="cross-fitting folds (tables without a split)")
    replay.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    replay.add_argument("--bootstrap", type=int, default=1000)
    replay.add_argument("--out", default="reports/replay/leaderboard.csv",
                        help="the leaderboard CSV; its curves, metadata and plot are written beside it")
    replay.add_argument("--experiment", default="routerops-replay", help="MLflow experiment of the run")
    replay.add_argument("--params", default="params.yaml",
                        help="its `track` section names the MLflow store (defaults when the file is absent)")
    replay.add_argument("--no-mlflow", action="store_true", help="write the files only, log no MLflow run")
    replay.set_defaults(func=run_replay, input_files=("table", "train_table", "prices"))

    add_register_parser(sub)
    add_publish_parsers(sub)
    from cli.transfer import add_arena_parser  # the command's work is imported when it runs

    add_arena_parser(sub)
    from cli.ope import add_ope_parser  # numpy only: the command's work is imported when it runs

    add_ope_parser(sub)
    add_service_parsers(sub)
    gateway = sub.add_parser("gateway", add_help=False,
                             help="serve the champion routers behind an OpenAI-compatible API (serve | keys "
                                  "create|list|revoke|set-budget|spend)")
    gateway.add_argument("rest", nargs=argparse.REMAINDER)
    gateway.set_defaults(func=gateway_command)
    return parser


def replay_serve_parser() -> argparse.ArgumentParser:
    """`routerops replay serve`: a logged-outcome table with responses as OpenAI-compatible endpoints
    (routerops/workers/replay_endpoint.py). Its own parser: `routerops replay --table ...` is the
    leaderboard, whose flags it does not share."""
    from routerops.workers.replay_endpoint import add_serve_arguments

    parser = OneLineParser(prog="routerops replay serve",
                           description="serve a logged-outcome table's responses over the OpenAI chat API")
    add_serve_arguments(parser).set_defaults(command="replay-serve", func=replay_serve_command)
    return parser


def replay_serve_command(args: argparse.Namespace) -> None:
    from routerops.workers.replay_endpoint import serve

    serve(args.table, args.host, args.port, args.latency)


# What the Makefile exports for the CLI to work is the CLI's own default (issue 42 item 8): outside
# `make`, on a busy machine, `run main` died at Prefect's 20 s server start-up timeout. Set before
# anything imports Prefect, MLflow or the HF libraries, which read them at import; a value set wins.
ENV_DEFAULTS = {"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180", "HF_HUB_OFFLINE": "1",
                "TRANSFORMERS_OFFLINE": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DVC_NO_ANALYTICS": "1"}


def main(argv: list[str] | None = None) -> int:
    for key, value in ENV_DEFAULTS.items():
        os.environ.setdefault(key, value)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:2] == ["replay", "serve"]:
        parser = replay_serve_parser()
        args, unknown = parser.parse_args(argv[2:]), []
    else:
        parser = build_parser()
        args, unknown = parser.parse_known_args(argv)
    if not (args.command == "run" and args.name in FLOWS):  # a flow logs through Prefect's console
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")  # and run_log
    if args.command == "gateway":  # its options belong to gateway/cli.py's parser
        args.rest = [*args.rest, *unknown]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        check_input_files(args)
        args.func(args)
    except RouteropsError as exc:
        print(f"routerops: error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that vanished or turned unwritable after the checks: still one line
        where = exc.filename or "a file"
        print(f"routerops: error: {where}: {exc.strerror or exc}: check the path and its permissions", file=sys.stderr)
        return 2
    return 0


def check_input_files(args: argparse.Namespace) -> None:
    """A missing input file or folder is refused before its command's module (and pandas, torch,
    MLflow ...) is imported: the same one line the readers give, in a fraction of a second."""
    for dest in getattr(args, "input_files", ()):
        path = getattr(args, dest, None)
        if path is not None and not Path(path).is_file():
            raise InputError(path, "<file>", "file not found")
    for dest in getattr(args, "input_dirs", ()):
        path = getattr(args, dest, None)
        if path is not None and not Path(path).is_dir():
            raise InputError(path, "--" + dest.replace("_", "-"), "no such folder (it holds episodes.parquet and "
                             "turns.parquet)")


def one_line(message: str) -> str:
    """Errors are one line on stderr (a YAML parser's message spans several)."""
    return " ".join(part.strip() for part in message.splitlines() if part.strip())


if __name__ == "__main__":
    sys.exit(main())
