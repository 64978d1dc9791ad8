"""`make serve` (`routerops serve`): routerops as a team's service on this machine.

Starts a real Prefect server (unless PREFECT_API_URL names one already: a team's own server), a real
SeaweedFS S3 store when the team's AWS_* key pair is set (unless ROUTEROPS_S3_ENDPOINT_URL names one), creates
the work pools and every deployment (flows/deployments.py: the retrain on its schedule and on
published price books and pools), starts a worker on the `cpu` pool, and runs until Ctrl-C. Then
`routerops prices publish FILE` in another shell starts a retrain.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from pathlib import Path

from prefect.settings import PREFECT_API_URL, temporary_settings

from flows.deployments import deploy_all
from routerops.config import load_params
from services.prefect_server import prefect_server, prefect_worker
from services.s3 import KEY_VARS, configure_storage, endpoint_from_env
from services.seaweedfs import S3Credentials, seaweedfs_server


def team_storage(stack: contextlib.ExitStack, repo: Path, s3_port: int) -> dict[str, str]:
    """With the team's key pair in the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) and no
    S3 endpoint named, start SeaweedFS under .seaweedfs/, point DVC's remote and MLflow at it, and
    return the environment the worker needs; otherwise nothing (an endpoint named: that store is used)."""
    if endpoint_from_env() or not all(os.environ.get(k) for k in KEY_VARS):
        return {}
    credentials = S3Credentials(os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"])
    server = stack.enter_context(seaweedfs_server(data_dir=repo / ".seaweedfs", credentials=credentials,
                                                  log_path=repo / ".seaweedfs.log", s3_port=s3_port))
    env = {**server.env(), "ROUTEROPS_ARTIFACT_ROOT": "s3://routerops-mlflow/artifacts"}  # new experiments' artifacts
    os.environ.update(env)  # configure_storage reads them
    configure_storage(repo)
    return env


def serve(params: str = "params.yaml", root: str = ".", home: str = ".prefect", port: int = 4200,
          s3_port: int = 8333) -> None:
    """Run until Ctrl-C or SIGTERM (`routerops serve`, cli/service.py, parses the flags)."""
    repo = Path(root).resolve()
    ops = load_params(repo / params).ops
    with contextlib.ExitStack() as stack:
        api_url = os.environ.get("PREFECT_API_URL") or stack.enter_context(
            prefect_server(repo / home, port=port, log_path=repo / home / "server.log"))
        stack.enter_context(temporary_settings(updates={PREFECT_API_URL: api_url}))
        storage = team_storage(stack, repo, s3_port)
        deployments = deploy_all(repo, ops, params)
        stack.enter_context(prefect_worker(ops.work_pool, api_url, name=f"{ops.work_pool}-{os.uname().nodename}",
                                           cwd=repo, log_path=repo / home / "worker.log", env=storage))
        if storage:
            print(f"S3 (SeaweedFS) at {storage['ROUTEROPS_S3_ENDPOINT_URL']}; DVC remote and buckets configured")
        print(f"Prefect API {api_url}; deployments: {', '.join(sorted(deployments))}; "
              f"worker on pool {ops.work_pool!r}. Publish a price book with "
              f"`PREFECT_API_URL={api_url} routerops prices publish FILE`. Ctrl-C stops.", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        with contextlib.suppress(KeyboardInterrupt):
            stop.wait()
    sys.exit(0)

