"""Prefect deployments of every flow, on named work pools, with the retrain schedule and triggers.

Work pools (params.yaml `ops`):
- `cpu`: a process pool; `make serve` (`routerops serve`) starts a worker on it on this machine.
- `gpu`: a process pool whose job variables target a GPU host: CUDA_VISIBLE_DEVICES, and
  ROUTEROPS_LOCAL_LLM_URL, the host's vLLM server that stands in for the embedded llama.cpp server
  (routerops/workers/server.py). A team starts `prefect worker start --pool gpu` on its GPU hosts.

Deployments: the main pipeline and MTRouter on `cpu`; the retrain on `cpu`, on a cron schedule and
on the `routerops.prices.published` / `routerops.pool.published` events (services/prefect_server.py);
the retrain from the gateway's log on `routerops.champion.drift` (flows/ope_loop.py);
the orchestrator (collection, SFT, RL) at small scale on `cpu` and at paper scale on `gpu`
(configs/paper/orchestra.yaml); the main pipeline's collection at scale on `gpu`.

Flows are deployed from the repository folder itself (`Flow.from_source`), so a worker on this
machine runs them in place; a team points `source` at its git remote instead (README).
"""

from __future__ import annotations

import asyncio
import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
from prefect.events import DeploymentEventTrigger
from prefect.exceptions import ObjectNotFound
from prefect.flows import Flow
from prefect.workers.process import ProcessWorker

from routerops.config import OpsConfig
from routerops.publishing import published_event_name

GPU_JOB_ENV = {
    "CUDA_VISIBLE_DEVICES": "0",
    # The host's OpenAI-compatible vLLM server (`vllm serve MODEL --port 8001`) serves the pool's
    # "local" endpoint; change it per host with job variables.
    "ROUTEROPS_LOCAL_LLM_URL": "http://127.0.0.1:8001/v1",
    "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
}


@dataclass(frozen=True)
class DeploymentSpec:
    name: str
    entrypoint: str  # path:function, relative to the repository root
    gpu: bool = False
    parameters: dict[str, Any] = field(default_factory=dict)
    scheduled: bool = False  # on ops.retrain_cron
    on_publish: bool = False  # triggered by a published price book or pool
    on_drift: bool = False  # triggered by routerops.champion.drift (flows/ope_loop.py)
    description: str = ""


DEPLOYMENTS = (
    DeploymentSpec("pipeline", "flows/pipeline.py:pipeline", description="the main pipeline (make demo)"),
    DeploymentSpec("retrain", "flows/retrain.py:retrain", scheduled=True, on_publish=True,
                   description="re-price / collect what is missing / retrain / re-gate"),
    DeploymentSpec("retrain-from-log", "flows/ope_loop.py:retrain_from_log_flow", on_drift=True,
                   description="a drifting champion: refit on its graded traffic before the breach, gate off-policy"),
    DeploymentSpec("mtrouter", "flows/mtrouter.py:mtrouter_flow", description="MTRouter at small scale"),
    DeploymentSpec("orchestra", "flows/orchestra.py:orchestra_flow",
                   description="orchestrator: teacher, filter, SFT, RL, evaluate, register (small scale)"),
    DeploymentSpec("orchestra-paper", "flows/orchestra.py:orchestra_flow", gpu=True,
                   parameters={"params_file": "configs/paper/orchestra.yaml"},
                   description="orchestrator at paper scale: CUDA SFT and RL, rollouts on the host's vLLM"),
    DeploymentSpec("pipeline-gpu", "flows/pipeline.py:pipeline", gpu=True,
                   description="the main pipeline with collection on the host's vLLM server"),
)


def work_pool_templates() -> dict[str, dict[str, Any]]:
    """Base job templates: the process worker's default, and the same with the GPU host's env."""
    default = ProcessWorker.get_default_base_job_template()
    gpu = copy.deepcopy(default)
    gpu["variables"]["properties"]["env"]["default"] = dict(GPU_JOB_ENV)
    return {"process": default, "gpu": gpu}


async def ensure_work_pools(ops: OpsConfig) -> list[str]:
    """Create (or update) the `cpu` and `gpu` process pools; returns their names."""
    templates = work_pool_templates()
    wanted = {ops.work_pool: ("routerops CPU work (this machine)", templates["process"]),
              ops.gpu_work_pool: ("routerops GPU hosts: CUDA training, vLLM rollouts", templates["gpu"])}
    async with get_client() as client:
        for name, (description, template) in wanted.items():
            try:
                await client.read_work_pool(name)
                await client.update_work_pool(name, WorkPoolUpdate(description=description, base_job_template=template))
            except ObjectNotFound:
                await client.create_work_pool(WorkPoolCreate(name=name, type="process", description=description,
                                                             base_job_template=template))
    return list(wanted)


def publish_triggers() -> list[DeploymentEventTrigger]:
    """One trigger per published kind; the run's `trigger` parameter says which one fired."""
    return [DeploymentEventTrigger(name=f"retrain on {kind} published", expect={published_event_name(kind)},
                                   match={"prefect.resource.id": f"routerops.{kind}"},
                                   parameters={"trigger": kind})
            for kind in ("prices", "pool")]


def drift_triggers() -> list[DeploymentEventTrigger]:
    """A champion's drift event starts a retrain from its own log, cut off at the event's time."""
    return [DeploymentEventTrigger(name="retrain on champion drift", expect={"routerops.champion.drift"},
                                   match={"prefect.resource.id": "routerops.champion.*"},
                                   parameters={"log": "{{ event.payload.log }}", "name": "{{ event.payload.model }}",
                                               "cutoff": "{{ event.payload.cutoff }}"})]


def deploy(spec: DeploymentSpec, source: Path, ops: OpsConfig, params_file: str = "params.yaml",
           root: Path | None = None) -> str:
    """Register one deployment with the server at PREFECT_API_URL; returns its id. Its flow's code
    comes from `source`; its data (params, published files, workspace) lives under `root` (default:
    the same folder)."""
    flow = Flow.from_source(source=str(source), entrypoint=spec.entrypoint)
    parameters = {"params_file": params_file, "root": str(root or source), **spec.parameters}
    # to_deployment + apply rather than Flow.deploy: deploy() also lists the pool's online workers,
    # a request prefect 3.8's server rejects (422 on limit=None), and it needs nothing else here.
    deployment = flow.to_deployment(
        name=spec.name, work_pool_name=ops.gpu_work_pool if spec.gpu else ops.work_pool,
        parameters=parameters, description=spec.description,
        cron=ops.retrain_cron if spec.scheduled else None,
        triggers=publish_triggers() if spec.on_publish else drift_triggers() if spec.on_drift else None,
    )
    return str(deployment.apply())


def deploy_all(repo: Path, ops: OpsConfig, params_file: str = "params.yaml") -> dict[str, str]:
    """Work pools, then every deployment; {deployment name: id}."""
    asyncio.run(ensure_work_pools(ops))
    return {spec.name: deploy(spec, repo, ops, params_file) for spec in DEPLOYMENTS}
