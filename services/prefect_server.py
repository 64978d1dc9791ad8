"""A real Prefect server and its workers on loopback, and the events routerops emits to it.

`prefect_server()` runs `prefect server start` (its own PREFECT_HOME and SQLite, or Postgres via
PREFECT_API_DATABASE_CONNECTION_URL) and yields its API URL; `prefect_worker()` runs
`prefect worker start --pool NAME` against it. `make serve` (`routerops serve`) and the tests use both.

`routerops prices publish FILE` / `routerops pool publish FILE` emit `routerops.prices.published` /
`routerops.pool.published` to the Prefect server at PREFECT_API_URL; the retrain deployment's
triggers (flows/deployments.py) start a retrain on either. Without a server the file is still
published (and the command says that no retrain was triggered).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from prefect.events import Event
from prefect.events.clients import PrefectEventsClient
from prefect.settings import PREFECT_API_URL

from routerops.errors import RouteropsError
from routerops.publishing import EVENT_PREFIX, Published, published_event_name
from routerops.workers.server import die_with, free_port, log_tail, stop_process_group

# Both off in every process we start: no phone-home.
QUIET = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}


class ServiceError(RouteropsError):
    """A server we start did not come up; the message carries its log tail."""


def prefect_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "prefect", *args]


@contextlib.contextmanager
def prefect_server(home: str | Path, port: int | None = None, log_path: str | Path | None = None,
                   startup_timeout_s: float = 180.0, env: dict[str, str] | None = None,
                   services: bool = True, stop_grace_s: float = 10.0) -> Iterator[str]:
    """`prefect server start` on 127.0.0.1 with PREFECT_HOME=`home`; yields the API URL
    (http://127.0.0.1:PORT/api) once /api/health answers, stops the server on exit. services=False:
    the API alone (no scheduler, no automations), for a flow run from the command line."""
    port = port or free_port()
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    log_file = Path(log_path) if log_path else home / "server.log"
    child_env = {**os.environ, **QUIET, "PREFECT_HOME": str(home), **(env or {})}
    child_env.pop("PREFECT_API_URL", None)  # the server must not think it is a client of another one
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(prefect_command("server", "start", "--host", "127.0.0.1", "--port", str(port),
                                                "--analytics-off", "--no-ui", *([] if services else ["--no-services"])),
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=child_env,
                                start_new_session=True, preexec_fn=die_with(os.getpid()))
    api_url = f"http://127.0.0.1:{port}/api"
    try:
        wait_for_health(proc, f"{api_url}/health", startup_timeout_s, log_file, "prefect server")
        yield api_url
    finally:
        stop_process_group(proc, grace_s=stop_grace_s)


# Prefect's own temporary server runs this command with these settings (prefect/server/api/server.py,
# SubprocessASGIServer._run_uvicorn_command, Prefect 3.9) and stops it only in an atexit hook: a
# `kill -9` of `routerops run main` left it running, reparented to pid 1 (issue 42 item 9).
TEMPORARY_SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
STARTUP_TIMEOUT_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"


@contextlib.contextmanager
def temporary_prefect_server() -> Iterator[str]:
    """Prefect's temporary server for one run, started by us instead of by Prefect, so that it dies
    with the run however the run ends: a parent-death signal (SIGKILL) besides the stop on exit.
    Yields its API URL; the caller points PREFECT_API_URL at it for the run."""
    import prefect
    from prefect.settings import get_current_settings

    port = free_port()
    env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True), **QUIET,
           **TEMPORARY_SERVER_ENV}
    env.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-m", "uvicorn", "--app-dir", str(prefect.__module_path__.parent), "--factory",
               "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "error", "--lifespan", "on"]
    log_file = Path(tempfile.mkstemp(prefix="prefect-server-", suffix=".log")[1])
    try:
        with open(log_file, "ab") as log:
            proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True, preexec_fn=die_with(os.getpid(), signal.SIGKILL))
        api_url = f"http://127.0.0.1:{port}/api"
        try:
            wait_for_health(proc, f"{api_url}/health", float(os.environ.get(STARTUP_TIMEOUT_ENV, "180")), log_file,
                            "Prefect's temporary server")
            yield api_url
        finally:
            stop_process_group(proc, grace_s=5.0)
    finally:
        log_file.unlink(missing_ok=True)


def wait_for_health(proc: subprocess.Popen, url: str, timeout_s: float, log_file: Path, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"{what} exited with code {proc.returncode} while starting:\n{log_tail(log_file)}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    stop_process_group(proc)
    raise ServiceError(f"{what} not ready after {timeout_s:g}s at {url}:\n{log_tail(log_file)}")


@contextlib.contextmanager
def prefect_worker(pool: str, api_url: str, *, name: str | None = None, cwd: str | Path | None = None,
                   log_path: str | Path | None = None, env: dict[str, str] | None = None,
                   limit: int | None = None) -> Iterator[subprocess.Popen]:
    """`prefect worker start --pool POOL` against `api_url`, stopped on exit. Flow runs execute in
    subprocesses of the worker, with `cwd` as their working directory unless a deployment says otherwise."""
    log_file = Path(log_path) if log_path else Path(tempfile.mkstemp(prefix=f"prefect-worker-{pool}-", suffix=".log")[1])
    args = ["worker", "start", "--pool", pool, "--name", name or f"{pool}-worker-{os.getpid()}"]
    if limit:
        args += ["--limit", str(limit)]
    child_env = {**os.environ, **QUIET, "PREFECT_API_URL": api_url, **(env or {})}
    with open(log_file, "ab") as log:
        proc = subprocess.Popen(prefect_command(*args), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                env=child_env, cwd=cwd, start_new_session=True, preexec_fn=die_with(os.getpid()))
    try:
        time.sleep(1.0)
        if proc.poll() is not None:
            raise ServiceError(f"prefect worker for pool {pool!r} exited with code {proc.returncode}:\n{log_tail(log_file)}")
        yield proc
    finally:
        stop_process_group(proc)


# ---------------------------------------------------------------- events


def published_event(published: Published, changes: dict[str, list[str]] | None = None) -> Event:
    """The event for one publish: the resource is the kind (`routerops.prices`), its version a label."""
    payload = {"version": published.version, "sha256": published.sha256, "path": str(published.path),
               "source": published.source}
    if changes is not None:
        payload["changes"] = changes
    return Event(event=published_event_name(published.kind),
                 resource={"prefect.resource.id": f"{EVENT_PREFIX}.{published.kind}",
                           "prefect.resource.name": published.kind, f"{EVENT_PREFIX}.version": published.version},
                 payload=payload)


def emit_published(published: Published, changes: dict[str, list[str]] | None = None) -> str | None:
    """Send the publish event to the server at PREFECT_API_URL; None when no server is configured."""
    api_url = PREFECT_API_URL.value()
    if not api_url:
        return None
    event = published_event(published, changes)
    asyncio.run(_send(event, api_url))
    return str(event.id)


async def _send(event: Event, api_url: str) -> None:
    async with PrefectEventsClient(api_url=api_url) as client:
        await client.emit(event)
