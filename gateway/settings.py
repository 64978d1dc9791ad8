"""`routerops gateway serve --config gateway.yaml`: the gateway's one typed settings file.

Sections: `routers` (the registered names served; the first is model `auto`), `pool`, `price_book`,
`database`, `defaults` (how a request is routed when it says nothing: λ, max_tokens, exploration),
`limits` (what a request and the server may take), `server` (uvicorn), `decision_log` (what is kept)
and `observability` (Prometheus labels, OpenTelemetry export). Every key is declared below with its
meaning; an unknown key is refused with its name (extra="forbid"). A command-line flag overrides the
file's value of the same name (`FLAGS` maps each flag to its key); `configs/gateway.yaml` is the
documented example. Paths in the file are read relative to the folder `serve` runs in, like the flags.

This module imports pydantic and yaml only: `gateway serve --help` builds its flags from it without
importing the server (FastAPI, MLflow, torch).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from routerops.errors import InputError

# λ of q̂ − λ·cost when neither the request (`cost_weight`) nor the settings give one. Units: quality
# per USD. λ = 10 reads "a correct answer is worth $0.10": a worker whose worst case costs $0.01 more
# must be ≥ 0.1 likelier to be right to be chosen. λ = 0 (the library's GatewayConfig default) picks
# the best affordable worker whatever it costs, which for most routers is the dearest one on every
# request: a gateway served to save money would then save none. At API prices (GPT-4-class ≈ $0.01
# per call against a small model's $0.0002) λ = 10 asks the dear model for a gain of ~0.1 in
# estimated quality, the size of the gaps routers separate on RouteLLM's GSM8K (0.86 against 0.64);
# at the embedded pool's simulated tiers (≈ $0.001 per call) it barely moves the choice. Set it per
# deployment (or per request) from the accuracy–cost curve of your champion (docs/operations/serve.md).
DEFAULT_COST_WEIGHT = 10.0


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Defaults(Section):
    """How a request is routed when it does not say."""

    cost_weight: float = Field(DEFAULT_COST_WEIGHT, ge=0, description=(
        "λ of argmax q̂ − λ·cost (quality per USD) when a request sends no `cost_weight`; 10 = a correct "
        "answer is worth $0.10 (gateway/settings.py says why not 0)"))
    max_tokens: int = Field(256, ge=1, description="max_tokens when neither the request nor the worker sets it")
    epsilon: float = Field(0.0, ge=0, le=1, description=(
        "exploration: probability of a uniformly drawn affordable worker, logged as the propensity"))


class Limits(Section):
    """What one request, and the server as a whole, may take (gateway/admission.py)."""

    max_tokens_cap: int = Field(4096, ge=1, description="the most max_tokens a request may ask (bounds the worst case)")
    max_body_bytes: int = Field(8 * 2**20, ge=1, description="a larger request body is refused (413)")
    max_in_flight: int = Field(256, ge=1, description="requests served at once per process (at most)")
    max_queue: int = Field(256, ge=0, description="requests waiting for a slot per process")
    max_queue_wait_s: float = Field(0.02, ge=0, description=(
        "the longest a request may wait for a slot, from its arrival in the kernel (then 503)"))
    max_loop_lag_ms: float = Field(0.0, ge=0, description="event-loop lag above which new requests get 503 (0: off)")
    max_overhead_ms: float = Field(5.0, ge=0, description=(
        "the adaptive in-flight limit's target: median overhead this far above the unloaded one (0: fixed limit)"))
    hold_lease_s: float = Field(3600.0, gt=0, description=(
        "a budget hold not settled by then is a dead process's and is released"))
    body_timeout_s: float = Field(10.0, ge=0.001, description=(
        "a request body must arrive within this many seconds of its headers (408; docs/gateway/hardening.md)"))
    header_timeout_s: float = Field(10.0, ge=0.001, description=(
        "a request head must arrive within this many seconds of its first byte (408)"))
    max_headers: int = Field(100, ge=1, description="the most header fields a request may send (431)")
    max_header_bytes: int = Field(32 * 2**10, ge=64, description="the most bytes a request head may take (431)")
    key_requests_per_s: float = Field(1000.0, ge=0, description=(
        "requests per second one key may send, a burst of one second's worth (429 with Retry-After; 0: no limit)"))
    max_connections: int = Field(1000, ge=1, description="open connections per process (beyond: 503, closed)")


class Server(Section):
    """uvicorn."""

    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")
    workers: int = Field(1, ge=1, description=(
        "gateway processes on one port, sharing the database (SQLite in WAL mode, or Postgres)"))
    loop: Literal["auto", "uvloop", "asyncio"] = Field("auto", description="event loop")
    http: Literal["auto", "httptools", "h11"] = Field("auto", description="HTTP parser")
    watch_interval_s: float = Field(10.0, ge=0.01, description="how often the registry's champion alias is polled")
    local_server: bool = Field(False, description=(
        "start the pool's servers that run on this machine: the embedded llama.cpp server (endpoint 'local') "
        "and a replay endpoint per 'replay:<table>' (routerops/workers/endpoints.py)"))
    local_base_url: str = Field("", description="where workers with endpoint 'local' are served, if already running")
    replay_urls: str = Field("", description=(
        "where the pool's replay endpoints are served, if already running: a JSON object "
        "{\"replay:<table>\": \"http://host:port/v1\"}"))


class DecisionLog(Section):
    """What the decision log keeps (gateway/store.py)."""

    texts: bool = Field(False, description="keep the query and response texts in the decision log")
    embeddings: bool = Field(True, description="without texts, keep the query's embedding (off-policy evaluation)")


class Observability(Section):
    """GET /metrics (Prometheus) and OpenTelemetry traces (gateway/telemetry.py)."""

    key_labels: bool = Field(False, description=(
        "add a `key` label (the key id) to the per-request metrics; off: one series per router and worker"))
    otlp_endpoint: str = Field("", description=(
        "send each request's trace (a span per worker call) to this OTLP/HTTP endpoint, e.g. "
        "http://127.0.0.1:4318/v1/traces; empty: traces are not exported"))
    service_name: str = Field("routerops-gateway", description="the traces' service.name")


class GatewaySettings(Section):
    """The whole file (configs/gateway.yaml)."""

    routers: list[str] = Field(default_factory=list, description=(
        "registered names served (router-<family>, mtrouter-<suite>, orchestrator); the first is model 'auto'"))
    pool: str = Field("configs/pool.yaml", description="the workers and their endpoints")
    price_book: str = Field("configs/prices/current.yaml", description="costs, budgets and cost headers use it")
    database: str = Field("sqlite:///gateway.db", description=(
        "keys, budgets and decisions: sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"))
    tracking_uri: str | None = Field(None, description=(
        "MLflow store holding the registry (default: MLFLOW_TRACKING_URI, else params.yaml's track)"))
    defaults: Defaults = Field(default_factory=Defaults)
    limits: Limits = Field(default_factory=Limits)
    server: Server = Field(default_factory=Server)
    decision_log: DecisionLog = Field(default_factory=DecisionLog)
    observability: Observability = Field(default_factory=Observability)

    def gateway_fields(self) -> dict[str, Any]:
        """The library's GatewayConfig fields (gateway/proxy.py) these settings give."""
        d, lim = self.defaults, self.limits
        return {"routers": tuple(self.routers), "pool_file": self.pool, "price_book": self.price_book,
                "db_url": self.database, "local_base_url": self.server.local_base_url,
                "replay_urls": self.server.replay_urls,
                "watch_interval_s": self.server.watch_interval_s, "default_max_tokens": d.max_tokens,
                "max_tokens_cap": lim.max_tokens_cap, "cost_weight": d.cost_weight, "epsilon": d.epsilon,
                "log_texts": self.decision_log.texts, "log_embeddings": self.decision_log.embeddings,
                "hold_lease_s": lim.hold_lease_s, "max_body_bytes": lim.max_body_bytes,
                "max_in_flight": lim.max_in_flight, "max_queue": lim.max_queue,
                "max_queue_wait_s": lim.max_queue_wait_s, "max_loop_lag_ms": lim.max_loop_lag_ms,
                "max_overhead_ms": lim.max_overhead_ms, "body_timeout_s": lim.body_timeout_s,
                "header_timeout_s": lim.header_timeout_s, "max_headers": lim.max_headers,
                "max_header_bytes": lim.max_header_bytes, "key_requests_per_s": lim.key_requests_per_s,
                "max_connections": lim.max_connections}


# Flag → the settings key it overrides, grouped as `gateway serve --help` shows them. The names are
# the flags `gateway serve` always had (each was a GatewayConfig field), so scripts keep working.
FLAGS: dict[str, dict[str, str]] = {
    "what is served": {"router": "routers", "pool-file": "pool", "price-book": "price_book", "db-url": "database",
                       "tracking-uri": "tracking_uri"},
    "routing defaults (a request's own fields win)": {
        "cost-weight": "defaults.cost_weight", "default-max-tokens": "defaults.max_tokens",
        "epsilon": "defaults.epsilon"},
    "limits": {"max-tokens-cap": "limits.max_tokens_cap", "max-body-bytes": "limits.max_body_bytes",
               "max-in-flight": "limits.max_in_flight", "max-queue": "limits.max_queue",
               "max-queue-wait-s": "limits.max_queue_wait_s", "max-loop-lag-ms": "limits.max_loop_lag_ms",
               "max-overhead-ms": "limits.max_overhead_ms", "hold-lease-s": "limits.hold_lease_s",
               "body-timeout-s": "limits.body_timeout_s", "header-timeout-s": "limits.header_timeout_s",
               "max-headers": "limits.max_headers", "max-header-bytes": "limits.max_header_bytes",
               "key-requests-per-s": "limits.key_requests_per_s", "max-connections": "limits.max_connections"},
    "server": {"host": "server.host", "port": "server.port", "workers": "server.workers", "loop": "server.loop",
               "http": "server.http", "watch-interval-s": "server.watch_interval_s",
               "local-server": "server.local_server", "local-base-url": "server.local_base_url",
               "replay-urls": "server.replay_urls"},
    "decision log and observability": {
        "log-texts": "decision_log.texts", "log-embeddings": "decision_log.embeddings",
        "metrics-key-labels": "observability.key_labels", "otlp-endpoint": "observability.otlp_endpoint"},
}


METAVARS = {"router": "NAME", "pool-file": "FILE", "price-book": "FILE", "db-url": "URL", "tracking-uri": "URI",
            "host": "HOST", "local-base-url": "URL", "replay-urls": "JSON", "otlp-endpoint": "URL"}


def field_of(path: str) -> Any:
    """The pydantic FieldInfo of a dotted settings key."""
    model: type[BaseModel] = GatewaySettings
    *sections, name = path.split(".")
    for section in sections:
        model = model.model_fields[section].annotation
    return model.model_fields[name]


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    """Every settings flag, its help the field's description and its default the field's (shown, not
    set: an unset flag leaves the file's value)."""
    parser.add_argument("--config", help="settings file (configs/gateway.yaml is the documented example); "
                                         "a flag overrides its value")
    for title, flags in FLAGS.items():
        group = parser.add_argument_group(title)
        for flag, path in flags.items():
            info = field_of(path)
            default = info.get_default(call_default_factory=True)
            shown = f"default: {default!r}; " if default not in (None, []) else ""
            help_text = f"{info.description} ({shown}file: {path})"
            metavar = METAVARS.get(flag, "N" if info.annotation in (int, float) else None)
            dest = flag_dest(flag)
            if flag == "router":
                group.add_argument("--router", action="append", dest=dest, default=None, metavar=metavar,
                                   help=help_text + "; repeatable")
            elif info.annotation is bool:
                group.add_argument(f"--{flag}", dest=dest, action=argparse.BooleanOptionalAction, default=None,
                                   help=help_text)
            else:
                kind = tcp_port if flag == "port" else {float: float, int: int}.get(info.annotation, str)
                choices = getattr(info.annotation, "__args__", None) if flag in ("loop", "http") else None
                group.add_argument(f"--{flag}", dest=dest, type=kind, choices=choices, default=None, metavar=metavar,
                                   help=help_text)


def tcp_port(text: str) -> int:
    """--port's argparse type (1-65535, routerops/workers/server.py), imported only when a port is given."""
    from routerops.workers.server import tcp_port as checked

    return checked(text)


def flag_dest(flag: str) -> str:
    """argparse's attribute for a flag (`--router` is repeatable: `routers`)."""
    return "routers" if flag == "router" else flag.replace("-", "_")


def read_settings_file(path: str | Path) -> dict[str, Any]:
    from routerops.files import read_yaml_mapping

    return read_yaml_mapping(Path(path))


def settings_from(args: argparse.Namespace) -> GatewaySettings:
    """The file named by --config (if any) with every given flag applied over it, validated."""
    data = read_settings_file(args.config) if getattr(args, "config", None) else {}
    source = args.config or "command line"
    for flags in FLAGS.values():
        for flag, path in flags.items():
            value = getattr(args, flag_dest(flag), None)
            if value is None:
                continue
            *sections, name = path.split(".")
            node = data
            for section in sections:
                node = node.setdefault(section, {}) if isinstance(node.get(section, {}), dict) else {}
            node[name] = value
    try:
        settings = GatewaySettings.model_validate(data)
    except pydantic.ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise InputError(source, where, error["msg"]) from None
    if not settings.routers:
        raise InputError(source, "routers", "name at least one registered router (`routers:` in the file or --router)")
    return settings
