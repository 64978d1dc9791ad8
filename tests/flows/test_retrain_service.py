"""Retraining as a service, end to end on real servers: a Prefect server, a process worker on the
`cpu` work pool, the retrain deployment with its event triggers, and a llama.cpp server whose access
log counts every LLM call.

Publishing a price book starts a retrain that makes zero LLM calls and records the book's version on
the registry decision; publishing a pool that adds a worker collects only that worker's episodes;
publishing a pool without it retires the champion that could route to it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from routerops.workers.server import local_llm_server

REPO = Path(__file__).resolve().parents[2]
LLM_CALL = '"POST /v1/chat/completions HTTP/1.1"'
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1500)]


def llm_calls(log: Path) -> int:
    return log.read_text(errors="replace").count(LLM_CALL)


def llm_worker(name: str, url: str, max_tokens: int, system: str) -> dict:
    return {"name": name, "kind": "llm", "endpoint": url, "model": "smollm2-135m-instruct", "primitives": ["answer"],
            "generation": {"max_tokens": max_tokens, "temperature": 0.0, "system": system},
            "attributes": {"params_b": 0.135, "max_tokens": max_tokens}, "concurrency": 2, "timeout_s": 120}


def write_pool(root: Path, name: str, workers: list[dict]) -> Path:
    pool = {"name": "retrain-test", "primitives": {"answer": {"run": "llm", "contract": "Answer."},
                                                   "sympy": {"run": "sympy", "contract": "Evaluate."}},
            "workers": workers}
    path = root / name
    path.write_text(yaml.safe_dump(pool, sort_keys=False))
    return path


def write_book(root: Path, name: str, version: str, cot_input: float) -> Path:
    book = {"version": version, "effective_date": "2026-11-01", "currency": "USD", "prices": {
        "smol-direct": {"input_per_1m": 0.1, "output_per_1m": 0.4},
        "smol-cot": {"input_per_1m": cot_input, "output_per_1m": 10.0},
        "sympy": {"input_per_1m": 0.0, "output_per_1m": 0.0, "per_call": 0.00001}}}
    path = root / name
    path.write_text(yaml.safe_dump(book, sort_keys=False))
    return path


def write_params(root: Path, pool: Path, book: Path) -> None:
    params = {
        "pool": {"file": str(pool)},
        "materialise": {"families": ["basic_arithmetic", "chain_sum"], "ood_families": ["decimal_chain_sum"],
                        "train": 4, "val": 2, "test": 1, "ood": 1, "seed": 7},
        "prices": {"collection": str(book), "evaluation": str(book)},
        "collect": {"budget_usd": 0.01, "turn_limit": 2, "concurrency": 2},
        "routers": {"routers": ["random", "oracle", "logistic"], "seeds": [0], "bootstrap": 0},
        "register": {"candidates": ["logistic", "knn"], "k": 2, "n_boot": 200},
        "track": {"tracking_uri": f"sqlite:///{root / 'mlflow.db'}", "artifact_root": str(root / "artifacts"),
                  "experiment": "retrain-test"},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def publish(root: Path, kind: str, path: Path, api_url: str) -> str:
    env = {**os.environ, "PREFECT_API_URL": api_url}
    out = subprocess.run([sys.executable, "-m", "cli", kind, "publish", str(path), "--root", str(root)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "emitted routerops." in out.stdout, out.stdout
    return out.stdout


async def wait_for_runs(deployment_id, count: int, timeout_s: float = 900):
    """The deployment's flow runs once `count` exist and all are final."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    deadline = time.monotonic() + timeout_s
    async with get_client() as client:
        while time.monotonic() < deadline:
            # sort and limit given: prefect 3.8's server refuses the client's None defaults (422)
            runs = await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=50)
            # The deployment's cron (ops.retrain_cron) has the server's scheduler create future runs
            # whenever its loop comes round: they are not the runs waited for and never final now.
            soon = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5)
            runs = [r for r in runs if not (r.state and r.state.is_scheduled() and r.expected_start_time
                                            and r.expected_start_time > soon)]
            if len(runs) >= count and all(r.state and r.state.is_final() for r in runs):
                return sorted(runs, key=lambda r: r.created)
            await asyncio.sleep(2)
    raise AssertionError(f"{count} flow runs of the retrain deployment did not finish in {timeout_s}s")


def manifest(root: Path, stage: str) -> dict:
    return json.loads((root / "retrain/reports/stages" / f"{stage}.json").read_text())


def test_published_prices_and_pools_retrain_through_the_deployment(tmp_path, monkeypatch):
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deployments import DEPLOYMENTS, deploy, ensure_work_pools
    from routerops.config import OpsConfig
    from services.prefect_server import prefect_server, prefect_worker

    root = tmp_path / "team"
    root.mkdir()
    llm_log = tmp_path / "llm.log"
    mlflow_uri = f"sqlite:///{root / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_uri)
    with local_llm_server(log_path=llm_log, n_threads=1) as url, \
            prefect_server(tmp_path / "prefect-home") as api_url, \
            temporary_settings(updates={PREFECT_API_URL: api_url}):
        direct = llm_worker("smol-direct", url, 16, "Reply with only the final answer.")
        sympy = {"name": "sympy", "kind": "sympy", "primitives": ["sympy"], "attributes": {"params_b": 0}}
        pool = write_pool(root, "pool.yaml", [direct, sympy])
        write_params(root, pool, write_book(root, "book.yaml", "2026-11-01", 2.5))
        ops = OpsConfig()
        asyncio.run(ensure_work_pools(ops))
        spec = next(s for s in DEPLOYMENTS if s.name == "retrain")
        deployment_id = deploy(spec, REPO, ops, params_file="params.yaml", root=root)
        with prefect_worker(ops.work_pool, api_url, cwd=REPO, log_path=tmp_path / "worker.log"):
            first = run_deployment("routerops-retrain/retrain", parameters={"trigger": "manual"}, timeout=900)
            assert first.state.is_completed(), (tmp_path / "worker.log").read_text()[-3000:]
            grid_tasks = manifest(root, "collect-grid")["metrics"]["episodes_collected/smol-direct"]
            assert grid_tasks == llm_calls(llm_log) > 0

            # A price-only change: zero LLM calls, the new version on the decision and the runs.
            calls = llm_calls(llm_log)
            publish(root, "prices", write_book(root, "book2.yaml", "2026-12-01", 1.0), api_url)
            runs = asyncio.run(wait_for_runs(deployment_id, 2))
            assert runs[-1].state.is_completed() and runs[-1].parameters["trigger"] == "prices"
            assert llm_calls(llm_log) == calls
            collected = manifest(root, "collect-grid")["metrics"]
            assert collected["episodes_collected"] == 0 and collected["llm_server_started"] == 0
            registry = json.loads((root / "retrain/reports/registry.json").read_text())
            assert registry["decision"]["evidence"]["data.price_book_version"] == "2026-12-01"
            client = mlflow.MlflowClient(mlflow_uri)
            version = client.get_model_version(registry["name"], registry["version"])
            assert version.tags["data.price_book_version"] == "2026-12-01"
            retrain_runs = client.search_runs(client.get_experiment_by_name("retrain-test").experiment_id,
                                              "tags.`routerops.trigger` = 'prices'")
            assert retrain_runs and retrain_runs[0].data.tags["routerops.price_book_version"] == "2026-12-01"

            # A pool change adding a worker: only that worker's episodes are collected.
            cot = llm_worker("smol-cot", url, 32, "Think step by step, then 'Answer: <answer>'.")
            publish(root, "pool", write_pool(root, "pool2.yaml", [direct, sympy, cot]), api_url)
            runs = asyncio.run(wait_for_runs(deployment_id, 3))
            assert runs[-1].state.is_completed() and runs[-1].parameters["trigger"] == "pool"
            collected = manifest(root, "collect-grid")["metrics"]
            assert collected["episodes_collected/smol-cot"] == grid_tasks
            assert collected["episodes_collected/smol-direct"] == collected["episodes_collected/sympy"] == 0
            assert llm_calls(llm_log) == calls + grid_tasks
            champion = client.get_model_version_by_alias(registry["name"], "champion")
            assert "smol-cot" in champion.tags["workers"].split(",")

            # A pool without it: the champion that could route to smol-cot is retired first.
            publish(root, "pool", write_pool(root, "pool3.yaml", [direct, sympy]), api_url)
            runs = asyncio.run(wait_for_runs(deployment_id, 4))
            assert runs[-1].state.is_completed()
            retired = json.loads((root / "retrain/reports/retire.json").read_text())
            assert retired["changes"]["removed"] == ["smol-cot"]
            assert [r["version"] for r in retired["retired"]] == [str(champion.version)]
            assert client.get_model_version(registry["name"], champion.version).tags["eligible"] == "false"
            assert llm_calls(llm_log) == calls + grid_tasks  # the remaining workers' journals held everything
