"""Postgres as the team backend, against a real PostgreSQL server (services/postgres.py): MLflow's
backend store and registry, a real Prefect server and a flow run stored in it, and the gateway's
atomic budget reservation with several gateway replicas racing on one key.

Skips, saying why, where no PostgreSQL server binaries are installed (CI installs Debian's package)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from services.postgres import PostgresUnavailable, find_bindir, free_port, start_postgres

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres():
    try:
        find_bindir()
    except PostgresUnavailable as missing:
        pytest.skip(f"no PostgreSQL server to test against: {missing}")
    # fsync off: a throw-away cluster on a shared machine; durability is not what these tests check.
    with start_postgres(settings={"fsync": "off", "synchronous_commit": "off"}) as server:
        yield server


def test_the_handle_and_a_failed_start_never_show_the_password(postgres, tmp_path):
    assert postgres.password not in repr(postgres) and postgres.password in postgres.url("mlflow")
    with pytest.raises(PostgresUnavailable, match="existing cluster; pass the password"):
        with start_postgres(data_dir=postgres.data_dir.parent):
            pass


# ---------------------------------------------------------------- MLflow


def test_mlflow_runs_and_registry_live_in_postgres_when_the_config_says_so(postgres, tmp_path, monkeypatch, caplog):
    import mlflow
    import psycopg

    from evaluation.tracking import log_pipeline_runs
    from routerops.config import TrackConfig

    caplog.set_level(logging.DEBUG)  # every log line MLflow and SQLAlchemy write, checked for the password below
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "evaluate.json").write_text(json.dumps({
        "stage": "evaluate", "params": {"budget_usd": 0.01}, "metrics": {"accuracy": 0.75},
        "inputs": {}, "outputs": {}, "artifacts": []}))
    uri = postgres.url("mlflow")
    track = TrackConfig(tracking_uri=uri, artifact_root=str(tmp_path / "artifacts"), experiment="team-pg")
    try:
        run_ids = log_pipeline_runs(track, manifests, ["evaluate"])  # the config's URL is the only switch
        client = mlflow.MlflowClient(tracking_uri=uri)
        client.create_registered_model("pg-router")
        version = client.create_model_version("pg-router", f"runs:/{run_ids['evaluate']}/model",
                                              run_id=run_ids["evaluate"])
        client.set_registered_model_alias("pg-router", "champion", version.version)
    finally:
        mlflow.set_tracking_uri(None)

    fresh = mlflow.MlflowClient(tracking_uri=uri)  # a new client: what a teammate's process would see
    run = fresh.get_run(run_ids["evaluate"])
    assert run.data.params["budget_usd"] == "0.01" and run.data.metrics["accuracy"] == 0.75
    assert fresh.get_experiment_by_name("team-pg").experiment_id == run.info.experiment_id
    assert fresh.get_model_version_by_alias("pg-router", "champion").run_id == run_ids["evaluate"]
    with psycopg.connect(uri.replace("postgresql+psycopg", "postgresql")) as conn:  # stored in Postgres, not elsewhere
        stored = conn.execute("SELECT value FROM metrics WHERE run_uuid = %s AND key = 'accuracy'",
                              (run_ids["evaluate"],)).fetchall()
    assert stored == [(0.75,)]
    assert caplog.records and postgres.password not in caplog.text


# ---------------------------------------------------------------- Prefect

FLOW = """
from prefect import flow

@flow(name="pg-smoke")
def pg_smoke(x: int) -> int:
    return x + 1

assert pg_smoke(41) == 42
"""


def prefect_env(tmp_path: Path, api_url: str, database_url: str | None = None) -> dict[str, str]:
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api_url,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "PREFECT_UI_ENABLED": "false"}
    if database_url is not None:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    return env


def wait_healthy(api_url: str, server: subprocess.Popen, log: Path, timeout_s: float = 150) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"prefect server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"prefect server not healthy after {timeout_s}s:\n{log.read_text()[-3000:]}")


def test_a_prefect_server_on_postgres_stores_the_flow_runs_it_is_sent(postgres, tmp_path):
    import psycopg

    port = free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    log = tmp_path / "prefect-server.log"
    env = prefect_env(tmp_path, api_url, postgres.url("prefect", "asyncpg"))
    with open(log, "w") as out:
        server = subprocess.Popen([sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1",
                                   "--port", str(port), "--no-ui"], env=env, stdout=out, stderr=subprocess.STDOUT,
                                  cwd=tmp_path)
    try:
        wait_healthy(api_url, server, log)
        # The flow runs in its own process, as a teammate's would: only PREFECT_API_URL points it here.
        flow = subprocess.run([sys.executable, "-c", FLOW], env=prefect_env(tmp_path, api_url), cwd=tmp_path,
                              capture_output=True, text=True, timeout=120)
        assert flow.returncode == 0, flow.stderr[-3000:]
        api_runs = httpx.post(f"{api_url}/flow_runs/filter", json={"limit": 10}, timeout=30).json()
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert postgres.password not in log.read_text()
    with psycopg.connect(postgres.url("prefect").replace("postgresql+psycopg", "postgresql")) as conn:
        rows = conn.execute("SELECT f.name, r.state_type FROM flow_run r JOIN flow f ON f.id = r.flow_id").fetchall()
    assert ("pg-smoke", "COMPLETED") in rows
    assert [r["state_type"] for r in api_runs] == ["COMPLETED"]


# ---------------------------------------------------------------- gateway


def test_gateway_replicas_racing_for_a_budget_on_postgres_never_reserve_more_than_it(postgres):
    from gateway.store import BudgetRefused, Store, period_start

    # Four stores = four gateway processes: each has its own lock and connection pool, so only the
    # database's conditional UPDATE stands between them and an overspent key.
    replicas = [Store(postgres.url("gateway")) for _ in range(4)]
    _, key = replicas[0].create_key(10 * 3e-6, "day")

    def grab(i):
        try:
            held = replicas[i % len(replicas)].reserve(key, 3e-6)
        except BudgetRefused:
            return False
        replicas[i % len(replicas)].settle(held, 2e-6)  # the real cost is below the worst case
        return True

    with ThreadPoolExecutor(8) as pool:
        granted = sum(pool.map(grab, range(40)))
    spent, reserved = replicas[1].spend(key.key_id, period_start("day"))
    for store in replicas:
        store.engine.dispose()
    assert reserved == 0 and spent == pytest.approx(2e-6 * granted) and spent <= 10 * 3e-6
    assert granted >= 10  # settled calls free what they did not use, so more than ten fit


def test_gateway_replicas_sweeping_a_dead_replicas_holds_on_postgres_release_each_once(postgres):
    import time

    from gateway.store import Store

    replicas = [Store(postgres.url("gateway")) for _ in range(4)]
    _, key = replicas[0].create_key(1e-3, "total")
    for _ in range(5):
        replicas[0].reserve(key, 1e-4)  # in flight when replica 0 dies: never settled
    assert replicas[1].spend(key.key_id, "total") == (0.0, pytest.approx(5e-4))
    expired = time.time() + replicas[0].hold_lease_s + 1
    with ThreadPoolExecutor(4) as pool:
        released = list(pool.map(lambda store: store.release_expired_holds(now=expired), replicas))
    spend = replicas[2].spend(key.key_id, "total")
    for store in replicas:
        store.engine.dispose()
    assert sum(released) == 5 and spend == (0.0, 0.0)
