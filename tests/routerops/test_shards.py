"""Sharded collection (routerops.shards) on real workers: the split, the per-shard locked journals, and
the merge that writes tables only when the shards hold exactly the plan."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from routerops import schema
from routerops.envs.qa import QAEnvironment
from routerops.errors import InputError
from routerops.policies import SinglePolicy, UniformRandomRouter
from routerops.pricing import Price, PriceBook, WorkerSpec
from routerops.rollout import JOURNAL_NAME, collect, plan_episodes
from routerops.shards import (
    ShardBusyError, collect_shard, lock_holder, merge_shards, shard_dir, shard_lock, split_plan,
)
from routerops.types import Task
from routerops.workers import LLMWorker, SympyWorker
from routerops.workers.chaos import DelayedEndpoint

REPO = Path(__file__).resolve().parents[2]
SYMPY = WorkerSpec(name="sympy", kind="sympy", primitives=("sympy",), timeout_s=10)
ECHO = WorkerSpec(name="echo", kind="llm", primitives=("answer",), model="echo", concurrency=8,
                  generation={"max_tokens": 16}, timeout_s=10, max_retries=0)
BOOK = PriceBook("shards-1", dt.date(2026, 11, 1), {"sympy": Price(0.0, 0.0, per_call=1e-5), "echo": Price(1.0, 2.0)})
TASKS = [Task(f"add/{i}", "unit/add", "train", f"What is {i} + 30?", str(i + 30)) for i in range(7)]
POLICIES = [SinglePolicy("sympy", "sympy"), SinglePolicy("echo"), UniformRandomRouter(seed=3)]
PLAN = plan_episodes(TASKS, POLICIES, "run-s", 0)  # 21 episodes


@pytest.fixture(scope="module")
def endpoint():
    with DelayedEndpoint(delay_s=0.01) as url:
        yield url


def workers(url: str) -> dict:
    return {"sympy": SympyWorker(SYMPY), "echo": LLMWorker(ECHO, url)}


async def run_shard(out_dir, shard, n_shards, url, plan=PLAN, **kwargs):
    return await collect_shard(plan, shard, n_shards, QAEnvironment(), workers(url), BOOK, 1.0, 3, out_dir, "run-s",
                               0, 3, progress=False, **kwargs)


def journal_ids(path: Path) -> list[str]:
    return [json.loads(line)["episode"]["episode_id"] for line in path.read_text().splitlines()]


# ---------------------------------------------------------------- the split


@pytest.mark.parametrize("n_shards", [1, 2, 3, 5, 21])
def test_split_is_disjoint_covers_the_plan_and_balances_the_shards(n_shards):
    shards = split_plan(PLAN, n_shards)
    ids = [eid for shard in shards for eid, _, _ in shard]
    assert len(shards) == n_shards and sorted(ids) == sorted(eid for eid, _, _ in PLAN)  # union = plan, disjoint
    sizes = [len(s) for s in shards]
    assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
    order = {eid: i for i, (eid, _, _) in enumerate(PLAN)}
    assert all([order[e] for e, _, _ in s] == sorted(order[e] for e, _, _ in s) for s in shards)  # plan order kept


@pytest.mark.slow
def test_split_is_the_same_in_every_process_and_for_any_plan_order():
    """Workers compute their shard on their own: the split must not depend on Python's salted hash()
    or on the order the plan was built in."""
    mine = [[eid for eid, _, _ in shard] for shard in split_plan(PLAN, 3)]
    assert [[eid for eid, _, _ in s] for s in split_plan(list(reversed(PLAN)), 3)] == [list(reversed(s)) for s in mine]
    child = ("import json; from routerops.rollout import plan_episodes; from routerops.shards import split_plan; "
             "from tests.routerops.test_shards import TASKS, POLICIES; "
             "print(json.dumps([[e for e, _, _ in s] for s in split_plan(plan_episodes(TASKS, POLICIES, 'run-s', 0), 3)]))")
    out = subprocess.run([sys.executable, "-c", child], cwd=REPO, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == mine


def test_more_shards_than_episodes_leaves_the_extra_shards_empty_and_bad_counts_name_the_field():
    shards = split_plan(PLAN[:2], 3)
    assert sorted(len(s) for s in shards) == [0, 1, 1]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="shards"):
            split_plan(PLAN, bad)


def test_one_shard_is_the_out_dir_itself(tmp_path):
    """An unsharded collection keeps its journal where it always was."""
    assert shard_dir(tmp_path, 0, 1) == tmp_path and shard_dir(tmp_path, 1, 2) == tmp_path / "shard-1-of-2"


# ---------------------------------------------------------------- collect and merge


async def test_shards_merge_to_the_same_tables_as_one_collection(tmp_path, endpoint):
    whole, _ = await collect(TASKS, POLICIES, QAEnvironment(), workers(endpoint), BOOK, 1.0, 3, tmp_path / "whole",
                             "run-s", 0, 3, progress=False)
    counts = [await run_shard(tmp_path / "sharded", k, 3, endpoint) for k in range(3)]
    episodes, turns = merge_shards(PLAN, 3, tmp_path / "sharded", BOOK, 1.0, 3)
    assert sum(counts) == len(PLAN) and list(episodes["episode_id"]) == [eid for eid, _, _ in PLAN]
    assert list(episodes["episode_id"]) == list(whole["episode_id"])  # plan order, like the unsharded tables
    assert list(episodes["final_answer"]) == list(whole["final_answer"])  # seeded per episode: same choices
    on_disk = schema.read_table(tmp_path / "sharded" / "episodes.parquet", "episodes")
    assert list(on_disk["episode_id"]) == list(episodes["episode_id"]) and len(turns) == episodes["turns"].sum()
    for k, shard in enumerate(split_plan(PLAN, 3)):  # each shard journaled its own episodes, each once
        assert sorted(journal_ids(shard_dir(tmp_path / "sharded", k, 3) / JOURNAL_NAME)) == sorted(e for e, _, _ in shard)


async def test_a_shard_rerun_resumes_past_a_torn_line_and_calls_only_what_is_missing(tmp_path):
    server = DelayedEndpoint(delay_s=0.01)
    with server as url:
        await run_shard(tmp_path, 0, 2, url, plan=PLAN)
        journal = shard_dir(tmp_path, 0, 2) / JOURNAL_NAME
        lines = journal.read_bytes().splitlines(keepends=True)
        kept = lines[: len(lines) // 2]
        journal.write_bytes(b"".join(kept) + lines[len(lines) // 2][:25])  # killed mid-append
        before = server.requests
        await run_shard(tmp_path, 0, 2, url, plan=PLAN)
        redone_calls = server.requests - before
    ids = journal_ids(journal)
    mine = [eid for eid, _, _ in split_plan(PLAN, 2)[0]]
    assert sorted(ids) == sorted(mine) and len(ids) == len(set(ids))  # complete, nothing twice
    assert journal.read_bytes().startswith(b"".join(kept))  # the journaled episodes were kept, not redone
    lost = [json.loads(line) for line in lines[len(lines) // 2:]]
    assert redone_calls == sum(t["worker"] == "echo" for e in lost for t in e["turns"])


async def test_merge_names_the_shard_that_lacks_episodes(tmp_path, endpoint):
    for k in range(2):
        await run_shard(tmp_path, k, 2, endpoint)
    journal = shard_dir(tmp_path, 1, 2) / JOURNAL_NAME
    journal.write_bytes(b"".join(journal.read_bytes().splitlines(keepends=True)[:-2]))
    with pytest.raises(InputError, match=r"shard-1-of-2/journal.jsonl.*shard 1 of 2 lacks 2 of its 10"):
        merge_shards(PLAN, 2, tmp_path, BOOK, 1.0, 3)
    assert not (tmp_path / "episodes.parquet").exists()
    await run_shard(tmp_path, 1, 2, endpoint)  # rerunning that shard is the fix the message names
    episodes, _ = merge_shards(PLAN, 2, tmp_path, BOOK, 1.0, 3)
    assert episodes["episode_id"].is_unique and len(episodes) == len(PLAN)


async def test_merge_refuses_an_episode_journaled_by_two_shards(tmp_path, endpoint):
    for k in range(2):
        await run_shard(tmp_path, k, 2, endpoint)
    first = (shard_dir(tmp_path, 0, 2) / JOURNAL_NAME).read_bytes().splitlines(keepends=True)[0]
    with open(shard_dir(tmp_path, 1, 2) / JOURNAL_NAME, "ab") as fh:
        fh.write(first)  # a worker that split the plan another way collected it again
    eid = json.loads(first)["episode"]["episode_id"]
    with pytest.raises(InputError, match=rf"shard-1-of-2.*{eid} is journaled by shard 1 of 2, but the split "
                                         "gives it to shard 0"):
        merge_shards(PLAN, 2, tmp_path, BOOK, 1.0, 3)
    assert not (tmp_path / "episodes.parquet").exists()


async def test_merge_refuses_shards_collected_under_other_settings(tmp_path, endpoint):
    for k in range(2):
        await run_shard(tmp_path, k, 2, endpoint)
    with pytest.raises(InputError, match="budget_usd"):
        merge_shards(PLAN, 2, tmp_path, BOOK, 0.5, 3)


# ---------------------------------------------------------------- the lock


async def test_a_shard_held_by_another_worker_is_not_run_beside_it(tmp_path, endpoint):
    with shard_lock(shard_dir(tmp_path, 0, 2), wait_s=0):
        with pytest.raises(ShardBusyError, match=rf"shard-0-of-2/lock: held by .*\"pid\": {os.getpid()}"):
            await run_shard(tmp_path, 0, 2, endpoint, lock_wait_s=0.5)
    assert not (shard_dir(tmp_path, 0, 2) / JOURNAL_NAME).exists()  # it ran nothing
    await run_shard(tmp_path, 0, 2, endpoint, lock_wait_s=0.5)  # released: now it runs
    assert lock_holder(tmp_path, 0, 2)["pid"] == os.getpid()


HOLDER = """
import sys, time
from pathlib import Path
from routerops.shards import shard_lock
with shard_lock(Path(sys.argv[1]), wait_s=0):
    print("held", flush=True)
    time.sleep(600)
"""


@pytest.mark.slow
def test_a_killed_workers_lock_is_released_by_the_kernel(tmp_path):
    folder = shard_dir(tmp_path, 1, 2)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ShardBusyError, match=f'"pid": {holder.pid}'):
            with shard_lock(folder, wait_s=0.3):
                pass
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        with shard_lock(folder, wait_s=5):  # no stale lock to clean up by hand
            assert lock_holder(tmp_path, 1, 2)["pid"] == os.getpid()
    finally:
        if holder.poll() is None:
            holder.kill()
