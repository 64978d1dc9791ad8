"""`make prefect-ui PREFECT_PORT=N` (issue 40): the UI served on port N tells the browser to call the API
on port N (its /ui-settings), not Prefect's default 4200, where nothing of ours listens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from routerops.workers.server import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_make_prefect_ui_on_another_port_points_its_ui_at_that_port(tmp_path):
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect")}
    env.pop("PREFECT_API_URL", None)
    # -o install: the venv this test runs in is the one to use (BIN), nothing is installed
    proc = subprocess.Popen(["make", "-s", "-o", "install", "prefect-ui", f"PREFECT_PORT={port}",
                             f"BIN={Path(sys.executable).parent}"], cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline, settings = time.monotonic() + 240, None
        while settings is None and time.monotonic() < deadline and proc.poll() is None:
            try:
                reply = httpx.get(f"http://127.0.0.1:{port}/ui-settings", timeout=5)
                settings = reply.json() if reply.status_code == 200 else None
            except httpx.HTTPError:
                time.sleep(1)
        assert settings is not None, f"no UI on port {port} (exit code {proc.poll()})"
        assert settings["api_url"] == f"http://127.0.0.1:{port}/api"
        assert httpx.get(f"{settings['api_url']}/health", timeout=10).status_code == 200
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
