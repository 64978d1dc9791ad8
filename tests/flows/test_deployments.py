"""Every flow deployed on a real Prefect server: the cpu and gpu work pools (the gpu pool's job
variables point at the GPU host's CUDA device and vLLM server), the retrain deployment's cron
schedule and its two event triggers (automations on the server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


async def read_back(names: list[str]):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import DeploymentSort
    from prefect.events.schemas.automations import Automation

    async with get_client() as client:
        # sort given: prefect 3.8's server refuses the client's None default (422)
        deployments = {d.name: d for d in await client.read_deployments(sort=DeploymentSort.NAME_ASC, limit=100, offset=0)}
        pools = {name: await client.read_work_pool(name) for name in names}
        # read_automations() sends sort=None and limit=None, which the server refuses (422)
        response = await client.request("POST", "/automations/filter", json={"sort": "NAME_ASC", "limit": 100, "offset": 0})
        automations = [Automation.model_validate(a) for a in response.json()]
    return deployments, pools, automations


def test_every_flow_is_deployed_on_its_work_pool(tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deployments import DEPLOYMENTS, GPU_JOB_ENV, deploy_all
    from routerops.config import OpsConfig
    from services.prefect_server import prefect_server

    ops = OpsConfig(retrain_cron="15 3 * * *")
    with prefect_server(tmp_path / "prefect-home") as api_url, temporary_settings(updates={PREFECT_API_URL: api_url}):
        ids = deploy_all(REPO, ops)
        again = deploy_all(REPO, ops)  # idempotent: the same deployments, updated in place
        deployments, pools, automations = asyncio.run(read_back([ops.work_pool, ops.gpu_work_pool]))

    assert ids == again and set(ids) == {spec.name for spec in DEPLOYMENTS} == set(deployments)
    for spec in DEPLOYMENTS:
        deployment = deployments[spec.name]
        assert deployment.work_pool_name == (ops.gpu_work_pool if spec.gpu else ops.work_pool)
        assert deployment.entrypoint == spec.entrypoint and deployment.parameters["root"] == str(REPO)
    assert deployments["orchestra-paper"].parameters["params_file"] == "configs/paper/orchestra.yaml"
    assert [s.schedule.cron for s in deployments["retrain"].schedules] == ["15 3 * * *"]
    assert all(not deployments[s.name].schedules for s in DEPLOYMENTS if not s.scheduled)
    assert pools[ops.work_pool].type == pools[ops.gpu_work_pool].type == "process"
    gpu_env = pools[ops.gpu_work_pool].base_job_template["variables"]["properties"]["env"]["default"]
    assert gpu_env == GPU_JOB_ENV and "ROUTEROPS_LOCAL_LLM_URL" in gpu_env
    triggers = {a.name: a for a in automations}
    assert {"retrain on prices published", "retrain on pool published"} <= set(triggers)
    assert triggers["retrain on prices published"].trigger.expect == {"routerops.prices.published"}
    action = triggers["retrain on pool published"].actions[0]
    assert action.deployment_id == deployments["retrain"].id and action.parameters == {"trigger": "pool"}
