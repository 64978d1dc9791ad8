"""`routerops gateway serve` and `routerops gateway keys create` (added to stages/cli.py's parser).

A key is printed once, on stdout, when it is created; only its sha256 is stored, and it is never logged.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import os
import signal

from gateway.app import Gateway, GatewayConfig, create_app
from gateway.store import PERIODS, Store
from routerops.config import TrackConfig
from routerops.errors import InputError
from routerops.workers.server import tcp_port

DEFAULT_DB = GatewayConfig.__dataclass_fields__["db_url"].default
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")  # the worker calls' HTTP clients
# The server adapts how many requests it serves at once to its overhead (gateway/admission.py;
# benchmarks/gateway_overhead.py --sweep); a Gateway made in code (tests, notebooks) does not unless told.
# A request may wait 20 ms from its arrival in the kernel (in the kernel, for a slot) before it is refused.
SERVE_DEFAULTS = {"max_overhead_ms": 5.0, "max_queue_wait_s": 0.02}
STAMPED_HTTP = "gateway.serving:StampedHttpToolsProtocol"  # uvicorn --http
SERVE_ENV = "ROUTEROPS_GATEWAY_SERVE"  # --workers N: the configuration each process reads (app_from_env)


def add_gateway_parser(sub: argparse._SubParsersAction) -> None:
    gateway = sub.add_parser("gateway", help="serve the champion routers behind an OpenAI-compatible API")
    commands = gateway.add_subparsers(dest="gateway_command", required=True)

    serve = commands.add_parser("serve", help="run the gateway (uvicorn)")
    serve.add_argument("--router", action="append", required=True, dest="routers",
                       help="registered name to serve: a single-turn router, an MTRouter or the orchestrator "
                            "(repeatable; the first is model 'auto')")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=tcp_port, default=8000)
    serve.add_argument("--tracking-uri", default=None,
                       help="MLflow store holding the registry (default: MLFLOW_TRACKING_URI, else params' track)")
    serve.add_argument("--local-server", action="store_true",
                       help="start the embedded llama.cpp server for workers with endpoint 'local'")
    # uvicorn's "auto" takes uvloop (libuv) and httptools (the C llhttp parser), both dependencies, over
    # asyncio's selector loop and the pure-Python h11 parser, which was most of the added latency that
    # remained (py-spy; benchmarks/gateway_overhead.py times both stacks in one run).
    serve.add_argument("--loop", choices=("auto", "uvloop", "asyncio"), default="auto", help="event loop (uvicorn)")
    serve.add_argument("--http", choices=("auto", "httptools", "h11"), default="auto", help="HTTP parser (uvicorn)")
    serve.add_argument("--workers", type=int, default=1,
                       help="gateway processes on one port, sharing the store (--db-url: SQLite in WAL mode, or "
                            "Postgres): budgets stay exact, each reservation is one conditional UPDATE (store.py)")
    for name, spec in GatewayConfig.__dataclass_fields__.items():
        if name == "routers":
            continue
        flag = "--" + name.replace("_", "-")
        default = SERVE_DEFAULTS.get(name, spec.default)
        if spec.type == "bool":
            serve.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        else:
            kind = {"float": float, "int": int}.get(spec.type, str)
            serve.add_argument(flag, type=kind, default=default)
    serve.set_defaults(func=serve_command)

    keys = commands.add_parser("keys", help="API keys and their budgets")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = key_commands.add_parser("create", help="create a key with a USD budget per period (printed once)")
    create.add_argument("--budget-usd", type=float, required=True)
    create.add_argument("--period", choices=PERIODS, default="day")
    create.add_argument("--name", default="")
    create.add_argument("--db-url", default=DEFAULT_DB)
    create.set_defaults(func=create_key_command)


def create_key_command(args: argparse.Namespace) -> None:
    key, info = Store(args.db_url).create_key(args.budget_usd, args.period, args.name)
    print(json.dumps({"api_key": key, "key_id": info.key_id, "budget_usd": info.budget_usd, "period": info.period}))


def serve_command(args: argparse.Namespace) -> None:
    import uvicorn

    from routerops.workers.server import local_llm_server

    if args.workers < 1:
        raise InputError("command line", "--workers", f"expected a number of processes ≥ 1, got {args.workers}")
    tracking_uri = args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", TrackConfig().tracking_uri)
    fields = {k: getattr(args, k) for k in GatewayConfig.__dataclass_fields__ if k != "routers"}
    # uvicorn shuts down on SIGTERM, then raises the signal again; with SIGTERM's default action that
    # ends the process before the block below unwinds, and the llama.cpp server of --local-server (its
    # own process group) was left running. As an exception, the block unwinds and stops it.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with contextlib.ExitStack() as stack:
        if args.local_server and not fields["local_base_url"]:
            fields["local_base_url"] = stack.enter_context(local_llm_server())
        cfg = GatewayConfig(routers=tuple(args.routers), **fields)
        # httptools (a dependency) with each request's arrival in the kernel stamped (gateway/serving.py):
        # admission measures waits from it. h11 has no such stamp: waits count from the app's first sight.
        http = STAMPED_HTTP if args.http in ("auto", "httptools") else args.http
        server = {"host": args.host, "port": args.port, "loop": args.loop, "http": http, "log_level": "warning",
                  "access_log": False}
        if args.workers == 1:
            gw = serving_gateway(cfg, tracking_uri)
            stack.callback(gw.champions.stop)
            uvicorn.run(create_app(gw), **server)
            return
        # Several processes: uvicorn's supervisor starts each (spawn) with the app factory below, which
        # reads the configuration from the environment. The tables are made here, once, before they race.
        Store(cfg.db_url).engine.dispose()
        os.environ[SERVE_ENV] = json.dumps({"config": dataclasses.asdict(cfg), "tracking_uri": tracking_uri})
        uvicorn.run("gateway.cli:app_from_env", factory=True, workers=args.workers, **server)


def serving_gateway(cfg: GatewayConfig, tracking_uri: str) -> Gateway:
    """A gateway with its champions loaded and watched, in this process."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    for name in QUIET_LOGGERS:  # one INFO line per proxied request costs the event loop, and says nothing new
        logging.getLogger(name).setLevel(logging.WARNING)
    gw = Gateway(cfg)
    gw.champions.start(cfg.watch_interval_s)
    # Everything loaded so far (torch, MLflow, the champion: ~10^6 objects) lives as long as the
    # process; frozen, the collector stops walking it: a full collection took 0.2-0.8 s here, a
    # pause of every request in flight (benchmarks/gateway_overhead.py). A champion swapped in later
    # is collected as usual.
    gc.freeze()
    return gw


def app_from_env():
    """The app of one process of `gateway serve --workers N` (uvicorn calls it in each)."""
    spec = json.loads(os.environ[SERVE_ENV])
    config = spec["config"]
    cfg = GatewayConfig(**{**config, "routers": tuple(config["routers"])})
    return create_app(serving_gateway(cfg, spec["tracking_uri"]))


def _exit_on_sigterm(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)
