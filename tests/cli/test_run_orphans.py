"""Issue 42 item 9: every server a run starts dies with it, even when the run is killed with SIGKILL.

On main, `kill -9` of `routerops run main` during collection left the run's temporary Prefect server
(uvicorn, started by Prefect itself and stopped only in an atexit hook) running, reparented to pid 1
(seen again on main at fb83603). The caller below starts the server the way `routerops run` does
(run_command.prefect_api) and is killed while it serves. The llama.cpp server's part is
tests/routerops/workers/test_local_server.py (killed while generating)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
CALLER = """
import os, time
from cli.run import prefect_api
with prefect_api():
    print(os.environ["PREFECT_API_URL"], flush=True)
    time.sleep(600)
"""


def started_servers(caller: subprocess.Popen, within_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        children = psutil.Process(caller.pid).children(recursive=True)
        if any("uvicorn" in " ".join(child.cmdline()) for child in children):
            time.sleep(0.5)  # past the fork: the server's own interpreter runs
            return psutil.Process(caller.pid).children(recursive=True)
        time.sleep(0.1)
    raise AssertionError("the caller started no server")


@pytest.mark.slow
def test_the_servers_of_a_killed_run_die_with_it():
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}  # the run starts its own server
    caller = subprocess.Popen([sys.executable, "-c", CALLER], stdout=subprocess.PIPE, text=True, cwd=REPO, env=env)
    servers: list[psutil.Process] = []
    try:
        servers += started_servers(caller, within_s=60)  # killed as soon as it exists: no need to wait
        caller.send_signal(signal.SIGKILL)
        caller.wait(timeout=30)
        gone, alive = psutil.wait_procs(servers, timeout=10)
        assert alive == [], f"outlived the run's SIGKILL: {[' '.join(p.cmdline()[:4]) for p in alive]}"
    finally:
        caller.kill()
        for server in servers:  # never leave one behind, even when the test fails
            with contextlib.suppress(psutil.NoSuchProcess):
                server.kill()
