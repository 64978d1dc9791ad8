"""Two Dask worker processes share one collection through the Prefect collect task: the union of their
shards is exactly the planned episode set, nothing is duplicated, also when one worker is SIGKILLed
mid-shard (the scheduler reruns its shard, which resumes from the journal).

The pool is a sympy tool worker and an OpenAI-compatible endpoint (routerops.workers.chaos, a real
HTTP server answering after a delay, so a shard is still in flight when the worker is killed); the
project is tests/stages/test_collect_shards.py's.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from routerops import schema
from routerops.config import load_params
from routerops.layout import Layout
from routerops.pricing import load_pool
from routerops.rollout import JOURNAL_NAME
from routerops.shards import lock_holder, shard_dir, split_plan
from routerops.workers.chaos import DelayedEndpoint
from stages.pipeline import collection_run_id, planned_parts
from tests.stages.test_collect_shards import write_project

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

def journal_lines(path: Path) -> list[str]:
    return [json.loads(line)["episode"]["episode_id"] for line in path.read_text().splitlines()] if path.exists() else []


def check_exactly_the_plan(layout: Layout, tasks: Path, params, n_shards: int) -> dict[str, list[str]]:
    """Every part's shard journals hold its planned episodes once each, and so does the raw table;
    returns the journal lines by shard folder."""
    run_id = collection_run_id(params, layout, tasks)
    plan = planned_parts(params, load_pool(layout.resolve(params.pool.file)), tasks, run_id)
    lines = {}
    for label, part in plan.items():
        for k, shard in enumerate(split_plan(part, n_shards)):
            folder = shard_dir(layout.journals / run_id / label, k, n_shards)
            ids = journal_lines(folder / JOURNAL_NAME)
            assert len(ids) == len(set(ids)), f"{folder}: an episode journaled twice"
            assert set(ids) == {eid for eid, _, _ in shard}, f"{folder}: not its planned episodes"
            lines[str(folder)] = ids
    episodes = schema.read_table(layout.raw.episodes, "episodes")
    planned = [eid for part in plan.values() for eid, _, _ in part]
    assert list(episodes["episode_id"]) == planned  # the union is the plan, in plan order, nothing twice
    return lines


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes, one thread each, as the runner's default local cluster would start; its
    address goes into collect.dask_address, the path a team's scheduler takes. Shared by the tests
    (starting worker processes is most of their time)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as local:
        with Client(local) as client:
            yield local, client


def run_collect_task(params, layout: Layout, tasks: Path):
    from prefect import flow

    from tasks.stages import collect_task

    @flow(name="sharded-collect-test")
    def collect_flow():
        return collect_task(params, layout, tasks)

    return collect_flow()


def test_two_workers_collect_one_plan_exactly_once(tmp_path, cluster, prefect_api):
    local, client = cluster
    endpoint = DelayedEndpoint(delay_s=0.02)
    with endpoint as url:
        layout, tasks = write_project(tmp_path, url, shards=2, scheduler=local.scheduler_address)
        params = load_params(tmp_path / "params.yaml")
        raw = run_collect_task(params, layout, tasks)
    assert raw.episodes == layout.raw.episodes
    check_exactly_the_plan(layout, tasks, params, 2)
    holders = {lock_holder(layout.journals / collection_run_id(params, layout, tasks) / "train", k, 2)["pid"]
               for k in range(2)}
    workers = set(client.run(os.getpid).values())
    assert holders <= workers and os.getpid() not in holders  # the shards ran in the Dask workers
    episodes = schema.read_table(layout.raw.episodes, "episodes")
    assert endpoint.requests == int((schema.read_table(layout.raw.turns, "turns").worker == "echo").sum())
    assert (episodes.ended_by != "error").all()


def shard_task_runs(name: str) -> list[list[str]]:
    """The state names, oldest first, of every Prefect task run called `name`, newest run first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterName
    from prefect.client.schemas.sorting import TaskRunSort

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(task_run_filter=TaskRunFilter(name=TaskRunFilterName(any_=[name])), limit=10,
                                       sort=TaskRunSort.EXPECTED_START_TIME_DESC)
        return [[state.name for state in client.read_task_run_states(run.id)] for run in runs]


def kill_mid_shard(journal: Path, folder: Path, workers: set[int], at_least: int, report: dict) -> None:
    """SIGKILL the worker process holding the shard's lock once its journal has `at_least` episodes."""
    deadline = time.monotonic() + 120
    while len(journal_lines(journal)) < at_least:
        if time.monotonic() > deadline:
            report["error"] = "the shard never journaled enough episodes"
            return
        time.sleep(0.02)
    pid = json.loads((folder / "lock").read_text())["pid"]
    if pid not in workers:
        report["error"] = f"lock holder {pid} is not a Dask worker {workers}"
        return
    os.kill(pid, signal.SIGKILL)
    report.update(pid=pid, journal_at_kill=journal.read_bytes())


def test_a_worker_killed_mid_shard_loses_nothing_and_duplicates_nothing(tmp_path, cluster, prefect_api):
    local, client = cluster
    endpoint = DelayedEndpoint(delay_s=0.25)  # each echo call takes a while: the shard is in flight
    with endpoint as url:
        layout, tasks = write_project(tmp_path, url, shards=2, scheduler=local.scheduler_address)
        params = load_params(tmp_path / "params.yaml")
        folder = shard_dir(layout.journals / collection_run_id(params, layout, tasks) / "train", 0, 2)
        report: dict = {}
        killer = threading.Thread(target=kill_mid_shard, args=(
            folder / JOURNAL_NAME, folder, set(client.run(os.getpid).values()), 3, report))
        killer.start()
        run_collect_task(params, layout, tasks)
        killer.join()
    assert "error" not in report, report.get("error")
    lines = check_exactly_the_plan(layout, tasks, params, 2)
    assert report["pid"] not in set(client.run(os.getpid).values())  # that process really died (nanny restarted one)
    journal = (folder / JOURNAL_NAME).read_bytes()
    at_kill = report["journal_at_kill"]
    finished = at_kill[: at_kill.rfind(b"\n") + 1]  # a torn line is an episode the kill interrupted
    assert journal.startswith(finished)  # the episodes journaled before the kill were kept...
    assert len(lines[str(folder)]) == len(set(lines[str(folder)]))  # ...and not run again
    assert finished.count(b"\n") < len(lines[str(folder)])  # the kill really was mid-shard
    states = shard_task_runs("collect-shard-train-0")[0]  # this test's run: the newest of that name
    # The scheduler, not a Prefect retry, reran the shard: one task run that ran twice and completed.
    assert states.count("Running") == 2 and states[-1] == "Completed", states
    echo_turns = int((schema.read_table(layout.raw.turns, "turns").worker == "echo").sum())
    # Calls the killed worker had in flight were answered but never journaled, so their episodes ran
    # again; at most `concurrency` (1) of them. Nothing else was called twice.
    assert echo_turns <= endpoint.requests <= echo_turns + params.collect.concurrency * params.collect.turn_limit
