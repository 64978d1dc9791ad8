"""Sharded collection on Dask: one Prefect task per shard, on a local cluster or a team's scheduler.

`run_shards_on_dask` is the runner the collect task hands the collect stage (stages/pipeline.py):
the stage keeps the LLM server up and merges the shards' journals; this module only decides where
the shards run. It runs a small sub-flow whose task runner is a DaskTaskRunner:
`collect.dask_address` "" starts a LocalCluster of `collect.dask_workers` processes (one thread
each) for the sub-flow's lifetime; an address ("tcp://host:8786") uses that scheduler's workers,
which need this package installed and the collection's out_dir on a shared file system.

A worker that dies mid-shard loses its Dask task; the scheduler reruns it on another worker (up to
distributed's `allowed-failures`), and the Prefect task's own retries cover the rest. Either way the
shard resumes from its journal under its lock (routerops.shards), so no episode runs twice.
"""

from __future__ import annotations

from pathlib import Path

from prefect import flow, task
from prefect_dask import DaskTaskRunner

from routerops.config import CollectConfig, Params
from routerops.errors import InputError
from routerops.layout import Layout
from stages.pipeline import ShardJob, collect_shard, run_shards_here

collect_shard_task = task(collect_shard, name="collect-shard", retries=2, retry_delay_seconds=5,
                          task_run_name="collect-shard-{job.label}-{job.shard}")


def shard_task_runner(cfg: CollectConfig) -> DaskTaskRunner:
    """The team's scheduler when `dask_address` names one, else a local cluster of worker processes.
    Processes, not threads: a shard runs its own event loop and verifiers use SIGALRM, which only a
    process's main thread may; and a killed process is what the scheduler knows how to recover from."""
    if cfg.dask_address:
        return DaskTaskRunner(address=cfg.dask_address)
    if isinstance(cfg.dask_workers, bool) or not isinstance(cfg.dask_workers, int) or cfg.dask_workers < 1:
        raise InputError("params.yaml", "collect.dask_workers", f"expected a positive integer, got {cfg.dask_workers!r}")
    return DaskTaskRunner(cluster_kwargs={"n_workers": cfg.dask_workers, "processes": True, "threads_per_worker": 1,
                                          "dashboard_address": None})


@flow(name="collect-shards")
def collect_shards(params: Params, layout: Layout, tasks: Path, jobs: list[ShardJob]) -> list[int]:
    """Every shard as its own task run; returns each shard's episode count once all have finished."""
    futures = [collect_shard_task.submit(params, layout, tasks, job) for job in jobs]
    return [future.result() for future in futures]


def run_shards_on_dask(params: Params, layout: Layout, tasks: Path, jobs: list[ShardJob]) -> None:
    """The stage's `run_shards`: the jobs on Dask when there is more than one shard; a single
    shard runs right here, as it always has (no cluster to start for it)."""
    if params.collect.shards == 1:
        return run_shards_here(params, layout, tasks, jobs)
    collect_shards.with_options(task_runner=shard_task_runner(params.collect))(params, layout, tasks, jobs)
