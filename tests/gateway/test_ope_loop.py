"""The loop on the gateway's own traffic (evaluation/drift.py, flows/ope_loop.py): a champion whose
graded live quality falls far below its gate estimate is in breach; the drift event fires once per
breach; on the real Prefect server the event's automation runs the retrain from the log, which
reads no decision graded after its cut-off, and runs the off-policy gate.

The champion sends every question to the wrong worker (labels swapped) although its gate credited
it with 0.95, so its live SNIPS estimate is 0: a breach by construction.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import mlflow
import pandas as pd
import pytest
import yaml

from evaluation.drift import DriftConfig, check_drift
from gateway.app import Gateway, GatewayConfig
from gateway.store import now_iso, read_decisions
from routerops.workers.chaos import DelayedEndpoint
from tests.gateway.test_gateway import BOOK, NAME, POOL, REPO, register_surface_router, set_champion
from tests.gateway.test_ope import RIGHT, request

pytestmark = pytest.mark.slow


def gate_says(version: str, score: float) -> None:
    mlflow.MlflowClient().set_model_version_tag(NAME, version, "promotion.candidate_score", str(score))


@pytest.fixture(scope="module")
def traffic(mlflow_registry, serve_gateway, tmp_path_factory):
    """The champion's log: 80 graded decisions, then 6 more made but not graded yet (see `grade_late`).

    ε = 0.9: the gate judges the refit on the ~16 held-out decisions (drift.py `held_out`, one in five by
    a hash of the random decision id) where the logged worker is the refit's choice. At ε = 0.5 that
    worker was logged with probability 0.25, and about once in a hundred runs none of the held-out rows
    had it: SNIPS then has no weight to divide by and the candidate's score is undefined (CI, stop 36).
    At ε = 0.9 it is logged with probability 0.45: P(no such row) ≈ 0.55^16 < 10⁻⁴."""
    champion = register_surface_router(workers=["smol-cot", "smol-direct"])
    set_champion(champion.version)
    gate_says(champion.version, 0.95)
    tmp = tmp_path_factory.mktemp("loop")
    db = f"sqlite:///{tmp / 'gateway.db'}"
    with DelayedEndpoint(delay_s=0.0) as workers:
        gw = Gateway(GatewayConfig(routers=(NAME,), db_url=db, local_base_url=workers, watch_interval_s=0.2,
                                   epsilon=0.9, log_texts=True), POOL, BOOK)
        url = serve_gateway(gw)
        key, _ = gw.store.create_key(10.0, "day")
        late = []
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            for i in range(86):
                kind, messages = request(i)
                extra = http.post("/chat/completions", json={"model": "auto", "messages": messages,
                                                              "max_tokens": 4}).json()["routerops"]
                score = float(extra["worker"] == RIGHT[kind])
                if i < 80:
                    assert http.post(f"/decisions/{extra['decision_id']}/feedback", json={"score": score}).is_success
                else:
                    late.append((extra["decision_id"], score))
        gw.store.close()

        def grade_late() -> list[str]:
            for decision_id, score in late:
                assert gw.store.record_score(decision_id, score)
            return [d for d, _ in late]

        yield {"db": db, "version": champion.version, "tmp": tmp, "grade_late": grade_late, "uri": mlflow_registry}


def test_the_drift_event_fires_once_per_breach(traffic, tmp_path):
    cfg = DriftConfig(bound=0.2, min_graded=30, n_boot=200, state_file=str(tmp_path / "drift.json"))
    version = traffic["version"]
    first = check_drift(NAME, traffic["db"], cfg, now_iso())
    assert first["breach"] and first["emit"] and first["live"] == 0.0 and first["gap"] == pytest.approx(0.95)
    assert first["graded"] == 80
    again = check_drift(NAME, traffic["db"], cfg, now_iso())
    assert again["breach"] and not again["emit"]  # the same breach: no second event
    gate_says(version, 0.1)  # the gate's estimate within the bound of the live one: the breach closes
    closed = check_drift(NAME, traffic["db"], cfg, now_iso())
    assert not closed["breach"] and not closed["emit"]
    gate_says(version, 0.95)
    reopened = check_drift(NAME, traffic["db"], cfg, now_iso())
    assert reopened["breach"] and reopened["emit"]  # a new breach: a new event
    assert json.loads((tmp_path / "drift.json").read_text())[NAME]["since"] == reopened["checked_at"]


async def flow_runs(deployment_id) -> list:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    async with get_client() as client:
        return await client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])),
                                           sort=FlowRunSort.EXPECTED_START_TIME_ASC, limit=50)


def wait_final(deployment_id, count: int, timeout_s: float = 600) -> list:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = asyncio.run(flow_runs(deployment_id))
        if len(runs) >= count and all(r.state and r.state.is_final() for r in runs):
            return runs
        time.sleep(2)
    raise AssertionError(f"{count} retrain-from-log runs did not finish in {timeout_s}s")


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_a_breach_retrains_from_the_log_through_the_automation(traffic, tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deployments import DEPLOYMENTS, deploy, ensure_work_pools
    from flows.ope_loop import drift_check
    from routerops.config import OpsConfig
    from services.prefect_server import prefect_server, prefect_worker

    root = tmp_path / "team"
    root.mkdir()
    (root / "params.yaml").write_text(yaml.safe_dump({"track": {
        "tracking_uri": traffic["uri"], "artifact_root": str(tmp_path / "artifacts"), "experiment": "gateway-test"}}))
    with prefect_server(tmp_path / "prefect-home") as api_url, temporary_settings(updates={PREFECT_API_URL: api_url}):
        ops = OpsConfig()
        asyncio.run(ensure_work_pools(ops))
        spec = next(s for s in DEPLOYMENTS if s.name == "retrain-from-log")
        deployment_id = deploy(spec, REPO, ops, params_file="params.yaml", root=root)
        with prefect_worker(ops.work_pool, api_url, cwd=REPO, log_path=tmp_path / "worker.log"):
            verdict = drift_check.fn(traffic["db"], NAME, "params.yaml", str(root), bound=0.2,
                                     state_file="drift.json")
            assert verdict["emit"] and verdict["event_id"]
            late = traffic["grade_late"]()  # made before the cut-off, graded after it
            assert not drift_check.fn(traffic["db"], NAME, "params.yaml", str(root), bound=0.2,
                                      state_file="drift.json")["emit"]
            runs = wait_final(deployment_id, 1)
            time.sleep(3)  # a second event would have started a second run by now
            runs = asyncio.run(flow_runs(deployment_id))
        assert len(runs) == 1 and runs[0].state.is_completed(), (tmp_path / "worker.log").read_text()[-3000:]
    assert runs[0].parameters["cutoff"] == verdict["cutoff"] and runs[0].parameters["name"] == NAME

    report = json.loads((root / "retrain/from_log/retrain_from_log.json").read_text())
    table = pd.read_parquet(report["training_table"])
    graded_late = read_decisions(traffic["db"]).set_index("decision_id").loc[late]
    assert (graded_late.graded_at > verdict["cutoff"]).all()
    assert not set(late) & set(table.decision_id)  # nothing graded after the cut-off reaches the training data
    assert (table.graded_at < verdict["cutoff"]).all() and (table.propensity > 0).all()
    assert report["training_rows"] + report["gate_rows"] == 80 and report["training_rows"] == len(table)
    decision = report["decision"]
    assert decision["evidence"]["champion_version"] == traffic["version"] and decision["reason"]
    # The gate estimated both on the held-out traffic (not refused for want of support): the refit learned
    # from the logged grades to route right, which the labels-swapped champion never does.
    assert decision["candidate_score"] > decision["champion_score"] == 0.0 and decision["evidence"]["ess"] > 0, decision
    print(decision["reason"])
    client = mlflow.MlflowClient(traffic["uri"])
    retrained = client.get_model_version(NAME, report["version"])
    assert retrained.tags["data.log_cutoff"] == verdict["cutoff"]
    assert retrained.tags["promotion.decision"] in ("promoted", "refused")
