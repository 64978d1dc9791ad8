"""`routerops gateway serve` and `routerops gateway keys create|list|revoke|set-budget|spend` (added to
the CLI's parser, cli/main.py).

A key is printed once, on stdout, when it is created; only its sha256 is stored, and it is never logged.

Building this parser imports only argparse, pydantic and the settings model (gateway/settings.py):
`--help` and a mistyped flag answer before FastAPI, MLflow or torch are imported; each command imports
what it runs when it runs (tests/cli/test_cli_imports.py counts the modules).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
from collections.abc import Callable

from routerops.errors import RouteropsError

DEFAULT_DB = "sqlite:///gateway.db"  # gateway/settings.py's `database` default (a test holds them equal)
PERIODS = ("hour", "day", "month", "total")  # gateway/store.py's (a test holds them equal)
QUIET_LOGGERS = ("httpx", "httpx2", "httpcore", "httpcore2")  # the worker calls' HTTP clients
SERVE_ENV = "ROUTEROPS_GATEWAY_SERVE"  # --workers N: the configuration each process reads (app_from_env)


def add_gateway_parser(sub: argparse._SubParsersAction, serve_flags: bool = True) -> None:
    """The gateway's commands; `serve_flags=False` leaves out serve's flags (built from the pydantic
    settings model), for a command line that runs `keys`: they answer without importing pydantic."""
    gateway = sub.add_parser("gateway", help="serve the champion routers behind an OpenAI-compatible API")
    commands = gateway.add_subparsers(dest="gateway_command", required=True)

    serve = commands.add_parser(
        "serve", help="run the gateway (uvicorn)",
        description="Serve each router's registered `champion` behind an OpenAI-compatible API. Settings come "
                    "from --config (configs/gateway.yaml documents every key) and the flags, which override "
                    "it; it refuses to start, naming the router and why, when a router has no champion or "
                    "its champion cannot serve the pool.")
    if serve_flags:
        from gateway.settings import add_settings_flags

        add_settings_flags(serve)
    serve.set_defaults(func=serve_command)
    add_keys_parser(commands)


def add_keys_parser(commands: argparse._SubParsersAction) -> None:
    keys = commands.add_parser("keys", help="API keys, their budgets and spend")
    key_commands = keys.add_subparsers(dest="keys_command", required=True)

    def command(name: str, help_text: str, func: Callable[[argparse.Namespace], None]) -> argparse.ArgumentParser:
        cmd = key_commands.add_parser(name, help=help_text)
        cmd.add_argument("--db-url", default=DEFAULT_DB, help="the gateway's database (its --db-url / `database:`)")
        cmd.set_defaults(func=func)
        return cmd

    create = command("create", "create a key with a USD budget per period (the key is printed once)",
                     create_key_command)
    create.add_argument("--budget-usd", type=float, required=True, help="USD the key may spend per period")
    create.add_argument("--period", choices=PERIODS, default="day", help="the budget's period (UTC)")
    create.add_argument("--name", default="", help="a label shown by `keys list`")

    command("list", "every key: id, name, budget, period, revoked, this period's spend",
            list_keys_command)
    revoke = command("revoke", "revoke a key (a running gateway refuses it within 5 s)",
                     revoke_key_command)
    revoke.add_argument("key_id", help="the key's id: the part after `rk-` (shown by `keys list`)")
    budget = command("set-budget", "change a key's USD budget (and period)", set_budget_command)
    budget.add_argument("key_id", help="the key's id (shown by `keys list`)")
    budget.add_argument("--budget-usd", type=float, required=True, help="the new USD budget per period")
    budget.add_argument("--period", choices=PERIODS, default=None, help="a new period (default: unchanged)")
    spend = command("spend", "USD spent (and held by requests in flight) per key and period, from the database",
                    spend_command)
    spend.add_argument("--key", dest="key_id", default=None, help="one key's id (default: every key)")
    spend.add_argument("--period", default=None,
                       help="one period, as its start: 2026-12-07 (day), 2026-12-07T14 (hour), 2026-12 (month) or "
                            "total (default: every period)")


def create_key_command(args: argparse.Namespace) -> None:
    from gateway.store import Store

    key, info = Store(args.db_url).create_key(args.budget_usd, args.period, args.name)
    print(json.dumps({"api_key": key, "key_id": info.key_id, "budget_usd": info.budget_usd, "period": info.period}))


# The key commands' work (gateway/keys.py: SQLAlchemy), imported when one runs.
def list_keys_command(args: argparse.Namespace) -> None:
    from gateway import keys

    keys.list_keys_command(args)


def revoke_key_command(args: argparse.Namespace) -> None:
    from gateway import keys

    keys.revoke_key_command(args)


def set_budget_command(args: argparse.Namespace) -> None:
    from gateway import keys

    keys.set_budget_command(args)


def spend_command(args: argparse.Namespace) -> None:
    from gateway import keys

    keys.spend_command(args)


def serve_command(args: argparse.Namespace) -> None:
    from gateway.settings import settings_from

    settings = args.settings if getattr(args, "settings", None) is not None else settings_from(args)
    print(f"routerops gateway: serving {', '.join(settings.routers)} on http://{settings.server.host}:"
          f"{settings.server.port}/v1 (loading)", flush=True)  # before the imports: they take seconds
    import contextlib

    from routerops.config import TrackConfig
    from routerops.pricing import load_pool
    from routerops.workers.endpoints import ServedEndpoints, pool_endpoints

    tracking_uri = settings.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", TrackConfig().tracking_uri)
    # uvicorn shuts down on SIGTERM, then raises the signal again; with SIGTERM's default action that
    # ends the process before the block below unwinds, and the llama.cpp server of --local-server (its
    # own process group) was left running. As an exception, the block unwinds and stops it.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with contextlib.ExitStack() as stack:
        check_champions_registered(settings, tracking_uri)  # before a llama.cpp server starts for nothing
        if settings.server.local_server:  # the pool's servers that run here: llama.cpp ("local"), replay endpoints
            given = ServedEndpoints.from_settings(settings.server.local_base_url, settings.server.replay_urls)
            served = stack.enter_context(pool_endpoints(load_pool(settings.pool), given=given))
            settings = settings.model_copy(update={"server": settings.server.model_copy(
                update={"local_base_url": served.local or "", "replay_urls": served.replay_json()})})
        run_server(settings, tracking_uri, stack)


def run_server(settings, tracking_uri: str, stack) -> None:
    """uvicorn, in this process or in `server.workers` processes (settings: gateway/settings.py)."""
    import dataclasses

    import uvicorn

    from gateway.app import GatewayConfig, create_app
    from gateway.serving import StampedHttpToolsProtocol
    from gateway.store import Store

    cfg = GatewayConfig(**settings.gateway_fields())
    s = settings.server
    # httptools (a dependency) with each request's arrival in the kernel stamped (gateway/serving.py):
    # admission measures waits from it. h11 has no such stamp: waits count from the app's first sight.
    http = StampedHttpToolsProtocol if s.http in ("auto", "httptools") else s.http
    server = {"host": s.host, "port": s.port, "loop": s.loop, "http": http, "log_level": "warning", "access_log": False}
    if s.workers == 1:
        gw = serving_gateway(cfg, tracking_uri, settings)
        stack.callback(gw.champions.stop)
        print(f"routerops gateway: ready on http://{s.host}:{s.port}/v1 (GET /health, /ready, /metrics)", flush=True)
        uvicorn.run(create_app(gw), **server)
        return
    # Several processes: uvicorn's supervisor starts each (spawn) with the app factory below, which
    # reads the configuration from the environment. The tables are made here, once, before they race;
    # the champions are checked here once, so a refused one stops the command, not N processes.
    Store(cfg.db_url).engine.dispose()
    serving_gateway(cfg, tracking_uri, settings).champions.stop()
    os.environ[SERVE_ENV] = json.dumps({"config": dataclasses.asdict(cfg), "tracking_uri": tracking_uri,
                                        "settings": settings.model_dump(mode="json")})
    # (uvicorn's supervisor takes the factory as an "module:function" string: its own API, the one left.)
    uvicorn.run("gateway.cli:app_from_env", factory=True, workers=s.workers, **server)


def check_champions_registered(settings, tracking_uri: str) -> None:
    """Refuse to start (one line, exit 2) when a router has no `champion` alias in the registry: a
    gateway serving nothing answered every request 503."""
    import mlflow

    from evaluation.registry import champion_version

    mlflow.set_tracking_uri(tracking_uri)
    missing = [name for name in settings.routers if champion_version(name) is None]
    if missing:
        raise RouteropsError(f"router {missing[0]!r} has no registered champion in the MLflow registry at "
                             f"{tracking_uri}: register one with `routerops register --table TABLE --prices BOOK "
                             f"--router FAMILY` (docs/operations/serve.md), or serve another name")


def serving_gateway(cfg, tracking_uri: str, settings=None):
    """A gateway with its champions loaded and watched, in this process; refuses (RouteropsError) when a
    router's champion is missing or cannot serve the pool, naming the router, the worker and why."""
    import gc
    import logging

    import mlflow

    from gateway.settings import GatewaySettings
    from gateway.telemetry import ObservedGateway, Telemetry

    mlflow.set_tracking_uri(tracking_uri)
    for name in QUIET_LOGGERS:  # one INFO line per proxied request costs the event loop, and says nothing new
        logging.getLogger(name).setLevel(logging.WARNING)
    observability = (settings or GatewaySettings()).observability
    gw = ObservedGateway(cfg, telemetry=Telemetry(cfg.routers, observability))
    gw.champions.start(cfg.watch_interval_s)
    problem = champion_problem(gw)
    if problem:
        gw.champions.stop()
        raise RouteropsError(problem)
    # Everything loaded so far (torch, MLflow, the champion: ~10^6 objects) lives as long as the
    # process; frozen, the collector stops walking it: a full collection took 0.2-0.8 s here, a
    # pause of every request in flight (benchmarks/gateway_overhead.py). A champion swapped in later
    # is collected as usual.
    gc.freeze()
    return gw


def champion_problem(gw) -> str | None:
    """Why a served name has no champion after the first load, or None when every one has."""
    for name in gw.cfg.routers:
        if gw.champions.current(name) is not None:
            continue
        refused = gw.champions.refusals.get(name) or []
        if refused:
            last = refused[-1]
            return (f"router {name!r}: its champion v{last['version']} cannot serve pool {gw.pool.name!r}: "
                    f"{last['reason']}; register a router trained on this pool's workers or serve another pool")
        return (f"router {name!r}: its champion could not be loaded from the registry (the log above says why)")
    return None


def app_from_env():
    """The app of one process of `gateway serve --workers N` (uvicorn calls it in each)."""
    from gateway.app import GatewayConfig, create_app
    from gateway.settings import GatewaySettings

    spec = json.loads(os.environ[SERVE_ENV])
    config = spec["config"]
    cfg = GatewayConfig(**{**config, "routers": tuple(config["routers"])})
    settings = GatewaySettings.model_validate(spec["settings"]) if "settings" in spec else None
    return create_app(serving_gateway(cfg, spec["tracking_uri"], settings))


def _exit_on_sigterm(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)

