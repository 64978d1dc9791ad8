"""The endpoints a pool's LLM workers are reached at, and the servers that run them on this machine.

A worker's `endpoint` in the pool file is one of:
- `local`: the embedded llama.cpp server (routerops/workers/server.py), started for the run;
- `replay:<table>`: a replay endpoint serving a logged-outcome table with responses
  (routerops/workers/replay_endpoint.py), started for the run; a relative path is read from the
  project root (the folder holding params.yaml; the current folder for the CLI); `model` is the
  table's worker name;
- a base URL (`http://host:port/v1`): a server someone else runs (vLLM, an API provider).

`pool_endpoints(pool)` starts what the pool needs (the llama.cpp server once, one replay server per
table) and stops them all when the block exits; every place that runs a pool's workers (collection,
baselines, the orchestrator's and critique's stages, retraining, MTRouter, the gateway) goes through
it, and `build_workers` / the gateway look each worker's URL up in the `ServedEndpoints` it yields.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from routerops.errors import RouteropsError
from routerops.pricing import Pool, WorkerSpec
from routerops.workers.server import (
    LocalServerError,
    die_with,
    free_port,
    local_llm_server,
    stop_process_group,
    wait_until_ready,
)

LOCAL = "local"
REPLAY_SCHEME = "replay:"


class EndpointError(RouteropsError):
    """A worker's endpoint is not served: no URL for it."""


@dataclass(frozen=True)
class ServedEndpoints:
    """Where each endpoint of a pool is served: the llama.cpp server's URL (`local`), and the URL of
    each `replay:<table>` endpoint, keyed by the endpoint text as the pool file writes it. Plain
    strings, so it travels to shard processes (pickle) and through the gateway's config (JSON)."""

    local: str | None = None
    replay: tuple[tuple[str, str], ...] = ()

    def url_for(self, spec: WorkerSpec) -> str:
        """The base URL of LLM worker `spec`; EndpointError when its server is not running."""
        if spec.endpoint == LOCAL:
            if not self.local:
                raise EndpointError(f"worker {spec.name!r} uses the local LLM server, but no local server URL "
                                    "was given")
            return self.local
        if is_replay(spec.endpoint):
            served = dict(self.replay)
            if spec.endpoint not in served:
                raise EndpointError(f"worker {spec.name!r} is a replay endpoint ({spec.endpoint}) whose server is "
                                    "not running; start it with the run (pool_endpoints) or `routerops replay serve`")
            return served[spec.endpoint]
        return spec.endpoint


    def replay_json(self) -> str:
        """The replay URLs as the gateway's `replay_urls` setting (a JSON object endpoint -> URL)."""
        return json.dumps(dict(self.replay)) if self.replay else ""

    @classmethod
    def from_settings(cls, local: str = "", replay_json: str = "") -> "ServedEndpoints":
        """From the gateway's `local_base_url` and `replay_urls`; EndpointError if the JSON is not an
        object of `replay:` endpoints to URLs."""
        try:
            replay = json.loads(replay_json) if replay_json.strip() else {}
        except ValueError:
            replay = None
        if not isinstance(replay, dict) or not all(isinstance(k, str) and is_replay(k) and isinstance(v, str)
                                                   for k, v in replay.items()):
            raise EndpointError(f"replay_urls: expected a JSON object {{\"replay:<table>\": \"http://host:port/v1\"}}, "
                                f"got {replay_json[:80]!r}")
        return cls(local=local or None, replay=tuple(replay.items()))


def is_replay(endpoint: str) -> bool:
    return endpoint.startswith(REPLAY_SCHEME)


def replay_table_path(endpoint: str, root: str | Path | None = None) -> Path:
    """The table file of a `replay:<table>` endpoint; a relative path is under `root` (default: cwd)."""
    path = Path(endpoint[len(REPLAY_SCHEME):].strip())
    if not str(path) or str(path) == ".":
        raise EndpointError(f"endpoint {endpoint!r} names no table: write replay:<path to a logged-outcome table>")
    return path if path.is_absolute() or root is None else Path(root) / path


def replay_tables(pool: Pool, root: str | Path | None = None) -> dict[str, Path]:
    """Each distinct `replay:` endpoint of the pool's LLM workers and its table file."""
    return {w.endpoint: replay_table_path(w.endpoint, root) for w in pool.workers
            if w.kind == "llm" and is_replay(w.endpoint)}


def uses_local(pool: Pool) -> bool:
    return any(w.kind == "llm" and w.endpoint == LOCAL for w in pool.workers)


def check_replay_models(pool: Pool, root: str | Path | None = None) -> None:
    """Every replay worker's `model` (its name when empty) is a worker of its table, and each table can
    be served: checked before any server starts, so a typo fails in a second with the names to use."""
    from routerops.envs.replay import worker_order
    from routerops.workers.replay_endpoint import load_replay_table

    for endpoint, path in replay_tables(pool, root).items():
        workers = worker_order(load_replay_table(path))
        for spec in pool.workers:
            if spec.endpoint == endpoint and (spec.model or spec.name) not in workers:
                raise EndpointError(f"worker {spec.name!r}: model {(spec.model or spec.name)!r} is not a worker of "
                                    f"replay table {path}; its workers: {', '.join(workers)}")


@contextlib.contextmanager
def pool_endpoints(pool: Pool, root: str | Path | None = None, n_ctx: int = 2048, n_threads: int = 1,
                   given: ServedEndpoints = ServedEndpoints()) -> Iterator[ServedEndpoints]:
    """Start the servers the pool's LLM workers need (the llama.cpp server when a worker is `local`;
    one replay server per `replay:` table), except those `given` says are served already, and stop
    them all when the block exits, also on errors. Yields where each is served."""
    served = dict(given.replay)
    tables = {e: path for e, path in replay_tables(pool, root).items() if e not in served}
    if tables:
        check_replay_models(pool, root)
    with contextlib.ExitStack() as stack:
        local = given.local
        if not local and uses_local(pool):
            local = stack.enter_context(local_llm_server(n_ctx=n_ctx, n_threads=n_threads))
        for endpoint, path in tables.items():
            served[endpoint] = stack.enter_context(replay_server(path))
        yield ServedEndpoints(local=local, replay=tuple(served.items()))


class ReplayServerError(LocalServerError):
    """The replay endpoint server could not be started."""


def replay_server_command(table: Path, port: int, latency: bool) -> list[str]:
    return [sys.executable, "-m", "routerops.workers.replay_endpoint", "--table", str(table),
            "--host", "127.0.0.1", "--port", str(port), *(["--latency"] if latency else [])]


@contextlib.contextmanager
def replay_server(table: str | Path, port: int | None = None, latency: bool = False,
                  log_path: str | Path | None = None, startup_timeout_s: float = 120.0) -> Iterator[str]:
    """Serve logged-outcome `table` on 127.0.0.1 (a free port unless given) and yield its base URL
    ("http://127.0.0.1:PORT/v1"); the server is stopped when the block exits.

    The table is checked here first (InputError naming the file and the column, e.g. no `response`),
    so a bad table fails before a process starts. As with local_llm_server, the server runs in its own
    process group, is stopped with its group, and dies with the thread that started it (die_with)."""
    from routerops.workers.replay_endpoint import load_replay_table

    table = Path(table)
    load_replay_table(table, latency)
    port = port or free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log_file = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix="replay-server-", suffix=".log")[1])
    log_file.parent.mkdir(parents=True, exist_ok=True)
    proc = None
    try:
        with open(log_file, "wb") as log:
            proc = subprocess.Popen(replay_server_command(table.resolve(), port, latency), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=die_with(os.getpid()))
        try:
            wait_until_ready(proc, base_url, startup_timeout_s, log_file)
        except LocalServerError as exc:
            raise ReplayServerError(str(exc).replace("llama.cpp server", f"replay server of {table}")) from None
        yield base_url
    finally:
        if proc is not None:
            stop_process_group(proc)
        if not log_path:
            log_file.unlink(missing_ok=True)
