"""`routerops gateway serve` as a process: SIGTERM (what a supervisor or `docker stop` sends) shuts it
down and stops the llama.cpp server it started with --local-server. (It serves a registered champion:
`serve` refuses to start for a name with none, tests/gateway/test_operations.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from routerops.workers.server import free_port

ROOT = Path(__file__).resolve().parents[2]


def wait_for(check, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code in (200, 401)
    except httpx.HTTPError:
        return False


@pytest.fixture(scope="module")
def champion(mlflow_registry) -> str:
    """A registered champion (tests/gateway/test_gateway.py's surface router: no encoder to load)."""
    import importlib.util

    import mlflow

    from evaluation.registry import CHAMPION_ALIAS

    spec = importlib.util.spec_from_file_location("gw_test", Path(__file__).with_name("test_gateway.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registered = module.register_surface_router()
    mlflow.MlflowClient().set_registered_model_alias(registered.name, CHAMPION_ALIAS, registered.version)
    return registered.name


@pytest.mark.slow
def test_sigterm_stops_the_gateway_and_the_local_llm_server_it_started(champion, mlflow_registry, tmp_path):
    port = free_port()
    cmd = [sys.executable, "-m", "cli", "gateway", "serve", "--router", champion, "--local-server",
           "--pool-file", "configs/pools/embedded-smollm2.yaml",  # llama.cpp only: no replay table needed
           "--port", str(port), "--tracking-uri", mlflow_registry,
           "--db-url", f"sqlite:///{tmp_path / 'gateway.db'}"]
    log = open(tmp_path / "gateway.log", "wb")
    gateway = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=log,
                               stderr=subprocess.STDOUT)
    servers: list[psutil.Process] = []
    try:
        wait_for(lambda: gateway.poll() is not None or answers(f"http://127.0.0.1:{port}/v1/models"), 300,
                 "the gateway to answer")
        assert gateway.poll() is None, (tmp_path / "gateway.log").read_text()[-3000:]
        servers += [p for p in psutil.Process(gateway.pid).children(recursive=True)
                    if "llama_cpp.server" in " ".join(p.cmdline())]
        assert len(servers) == 1
        gateway.send_signal(signal.SIGTERM)
        assert gateway.wait(timeout=60) != 0
        wait_for(lambda: not servers[0].is_running() or servers[0].status() == psutil.STATUS_ZOMBIE, 30,
                 "the llama.cpp server to stop")
    finally:  # an orphaned server (the failure this test catches) must not outlive the test
        for server in servers:
            if server.is_running():
                server.kill()
        if gateway.poll() is None:
            gateway.kill()
